/**
 * Emit: a Node.js producer records deliveries inside its own `pg` transaction, with the
 * identity rules, the request body bytes and the errors of the Python producer
 * (media_hooks/outbox/emit.py), through the same statements (sql/queries/emit.sql).
 *
 * These functions never commit or roll back the caller's transaction: on a client inside a
 * transaction (after BEGIN) the rows commit or vanish with the producer's own work; outside one
 * each call is all or nothing on its own. Bad input (an unknown destination, a payload that is
 * not an object, a conflicting duplicate, an oversized field) throws one UserError naming the
 * problem and writes nothing, and the caller's transaction stays usable: a single emit checks
 * before it writes (the statement writes nothing for an unknown destination), a bulk emit
 * works in a savepoint.
 *
 * The request body is serialized here, once, around its timestamp, which the recording
 * statement stamps with the database clock of the producer's transaction; every attempt then
 * sends these bytes.
 */

import { createHash } from 'node:crypto';

import { hasLoneSurrogate, payloadJson, quote } from './canonical.js';
import { UserError } from './errors.js';
import { codePoints, pyRepr, validateIdentifier } from './identifiers.js';
import { bind } from './statements.js';

export const MAX_PAYLOAD_BYTES = 1024 * 1024;
export const MAX_ASSET_ID_CHARS = 1024;
export const MAX_EVENT_TYPE_CHARS = 256;
export const DERIVED_ID_PREFIX = 'evt_';
// A fan-out event's key in staging: '/' is in no identifier's alphabet (sql/queries/emit.sql).
const EVENT_KEY = '/';
// Rows sent to the staging table per statement of a bulk emit.
const STAGING_CHUNK = 1000;
// How often a bulk insert runs again after meeting a concurrent purge's identity row.
const RACE_TRIES = 3;

const EVENT_FIELDS = ['destinationId', 'assetId', 'eventType', 'payload', 'deliveryId'];
const FAN_OUT_FIELDS = ['eventId', 'assetId', 'eventType', 'payload'];

/**
 * @typedef {object} Event one business event for one destination
 * @property {string} destinationId
 * @property {string} assetId
 * @property {string} eventType
 * @property {Record<string, unknown>} payload
 * @property {string} [deliveryId] omitted: derived from the event, so the same event twice
 *   records one delivery
 *
 * @typedef {object} FanOutEvent one business event for every destination subscribed to its type
 * @property {string} eventId
 * @property {string} assetId
 * @property {string} eventType
 * @property {Record<string, unknown>} payload
 *
 * @typedef {{query: (config: {text: string, values?: unknown[]}) => Promise<any>}} Queryable
 *   a `pg` Client or PoolClient (a Pool cannot hold a transaction)
 */

/**
 * @param {string} destinationId
 * @param {string} eventType
 * @param {string} assetId
 * @param {string} payloadText
 */
function derivedId(destinationId, eventType, assetId, payloadText) {
  const canonical = `[${quote(destinationId)},${quote(eventType)},${quote(assetId)},${payloadText}]`;
  const digest = createHash('sha256').update(canonical, 'utf8').digest('hex');
  return DERIVED_ID_PREFIX + digest.slice(0, 32);
}

/**
 * The delivery_id of an event given none (emit.py's derive_delivery_id).
 * @param {string} destinationId
 * @param {string} eventType
 * @param {string} assetId
 * @param {Record<string, unknown>} payload
 */
export function deriveDeliveryId(destinationId, eventType, assetId, payload) {
  return derivedId(destinationId, eventType, assetId, payloadJson(payload));
}

/**
 * The delivery_id of an event's delivery to one destination (media_hooks_event_delivery_id_v1).
 * @param {string} eventId
 * @param {string} destinationId
 */
export function eventDeliveryId(eventId, destinationId) {
  const digest = createHash('sha256').update(`${eventId}/${destinationId}`, 'utf8').digest('hex');
  return `fan_${digest.slice(0, 32)}`;
}

/**
 * The body's bytes before and after its timestamp, with the contract's key order.
 * @param {string} eventType
 * @param {string} assetId
 * @param {string} payloadText
 */
export function bodyParts(eventType, assetId, payloadText) {
  return [
    Buffer.from(`{"type":${quote(eventType)},"timestamp":"`, 'utf8'),
    Buffer.from(`","asset_id":${quote(assetId)},"data":${payloadText}}`, 'utf8'),
  ];
}

/**
 * @param {unknown} value
 * @param {string} what
 * @param {number} maxChars
 */
function textField(value, what, maxChars) {
  if (typeof value !== 'string' || !value) throw new UserError(`${what} must be a non-empty string`);
  const length = codePoints(value);
  if (length > maxChars) {
    throw new UserError(`${what} is ${length} characters long; at most ${maxChars} are allowed`);
  }
  if (value.includes('\u0000')) throw new UserError(`${what} contains a NUL character`);
  return value;
}

/**
 * @param {object} event
 * @param {string[]} allowed
 * @param {string[]} required
 */
function checkFields(event, allowed, required) {
  if (event === null || typeof event !== 'object' || Array.isArray(event)) {
    throw new UserError('an event must be an object');
  }
  const unknown = Object.keys(event).filter((k) => !allowed.includes(k)).sort();
  if (unknown.length) {
    throw new UserError(`unknown field '${unknown[0]}' (fields: ${allowed.join(', ')})`);
  }
  const missing = required.find((k) => event[k] === undefined);
  if (missing) throw new UserError(`missing field '${missing}'`);
}

/**
 * @typedef {object} Row a validated event, as stored
 * @property {string} deliveryId
 * @property {string | null} destinationId
 * @property {string | null} eventId
 * @property {string} assetId
 * @property {string} eventType
 * @property {string} payload
 * @property {Buffer} bodyHead
 * @property {Buffer} bodyTail
 */

/**
 * Validate one event and serialize it, or throw a UserError naming the problem (in emit.py's
 * order, so the same bad event gets the same message).
 * @param {Event | FanOutEvent} event
 * @param {boolean} fanOut
 * @param {number} maxPayloadBytes
 * @returns {Row}
 */
function prepare(event, fanOut, maxPayloadBytes) {
  if (fanOut) checkFields(event, FAN_OUT_FIELDS, FAN_OUT_FIELDS);
  else checkFields(event, EVENT_FIELDS, EVENT_FIELDS.slice(0, 4));
  const eventId = fanOut ? validateIdentifier(event.eventId, 'event_id') : null;
  const destinationId = fanOut ? null : validateIdentifier(event.destinationId, 'destination_id');
  const assetId = textField(event.assetId, 'asset_id', MAX_ASSET_ID_CHARS);
  const eventType = textField(event.eventType, 'event_type', MAX_EVENT_TYPE_CHARS);
  const payload = payloadJson(event.payload);
  if ([assetId, eventType, payload].some(hasLoneSurrogate)) {
    throw new UserError('the event contains text that is not valid Unicode');
  }
  const size = Buffer.byteLength(payload, 'utf8');
  if (size > maxPayloadBytes) {
    throw new UserError(
      `payload is ${size} bytes serialized; at most ${maxPayloadBytes} are allowed`,
    );
  }
  let deliveryId;
  if (fanOut) deliveryId = EVENT_KEY + eventId;
  else if (event.deliveryId === undefined || event.deliveryId === null) {
    deliveryId = derivedId(destinationId, eventType, assetId, payload);
  } else deliveryId = validateIdentifier(event.deliveryId, 'delivery_id');
  const [bodyHead, bodyTail] = bodyParts(eventType, assetId, payload);
  return { deliveryId, destinationId, eventId, assetId, eventType, payload, bodyHead, bodyTail };
}

/** @param {Row} row */
function statementValues(row) {
  return {
    delivery_id: row.deliveryId,
    destination_id: row.destinationId,
    event_id: row.eventId,
    asset_id: row.assetId,
    event_type: row.eventType,
    payload: row.payload,
    body_head: row.bodyHead,
    body_tail: row.bodyTail,
  };
}

/** @param {string} destinationId */
function unknownDestination(destinationId) {
  return new UserError(
    `unknown destination ${pyRepr(destinationId)} (add it with \`media-hooks destination add\`)`,
  );
}

/**
 * Record one pending delivery in the caller's transaction. Re-emitting a delivery_id that is
 * already recorded writes nothing: `inserted` is false.
 * @param {Queryable} client
 * @param {Event} event
 * @param {{maxPayloadBytes?: number}} [options]
 * @returns {Promise<{deliveryId: string, inserted: boolean}>}
 */
export async function emit(client, event, { maxPayloadBytes = MAX_PAYLOAD_BYTES } = {}) {
  const row = prepare(event, false, maxPayloadBytes);
  const { rows } = await client.query(bind('emit_one', statementValues(row)));
  if (!rows[0].destination_known) throw unknownDestination(row.destinationId);
  return { deliveryId: row.deliveryId, inserted: rows[0].inserted };
}

/**
 * Record one event and its deliveries to every subscribed destination (enabled or disabled),
 * in one statement in the caller's transaction. An event_id already recorded writes nothing
 * (`recorded` false); one given again for a different type or asset is refused.
 * @param {Queryable} client
 * @param {FanOutEvent} event
 * @param {{maxPayloadBytes?: number}} [options]
 * @returns {Promise<{eventId: string, recorded: boolean, destinationIds: string[],
 *   deliveryIds: string[], inserted: number}>}
 */
export async function emitEvent(client, event, { maxPayloadBytes = MAX_PAYLOAD_BYTES } = {}) {
  const row = prepare(event, true, maxPayloadBytes);
  const { rows } = await client.query(bind('emit_event_one', statementValues(row)));
  const result = rows[0];
  const stored = [result.stored_event_type, result.stored_asset_id];
  if (
    !result.recorded &&
    stored[0] !== null &&
    (stored[0] !== row.eventType || stored[1] !== row.assetId)
  ) {
    throw new UserError(
      `event_id ${pyRepr(row.eventId)} is already recorded for a different event ` +
        `(${pyRepr(stored[0])} for asset ${pyRepr(stored[1])}): a new event needs a new event_id`,
    );
  }
  const destinationIds = result.destination_ids ?? [];
  return {
    eventId: row.eventId,
    recorded: result.recorded,
    destinationIds,
    deliveryIds: destinationIds.map((d) => eventDeliveryId(row.eventId, d)),
    inserted: result.inserted,
  };
}

/**
 * Record many deliveries (and fan-out events, told apart by their `eventId`), all or nothing,
 * in the caller's transaction: staged in the session's temporary table, checked together,
 * recorded in one statement (sql/queries/emit.sql). A delivery_id given twice counts once; two
 * different events under one id are refused. Errors name the event's position (1-based).
 * @param {Queryable & {getTransactionStatus: () => string | null}} client
 * @param {Iterable<Event | FanOutEvent>} events
 * @param {{maxPayloadBytes?: number}} [options]
 */
export async function emitMany(client, events, { maxPayloadBytes = MAX_PAYLOAD_BYTES } = {}) {
  if (typeof client.getTransactionStatus !== 'function') {
    // A Pool runs each statement on any of its connections: it cannot hold the savepoint.
    throw new TypeError('emitMany needs a pg Client or a pool\'s client (pool.connect()), not a Pool');
  }
  const rows = [];
  let number = 0;
  for (const event of events) {
    number += 1;
    try {
      const fanOut = event !== null && typeof event === 'object' && 'eventId' in event;
      rows.push(prepare(event, fanOut, maxPayloadBytes));
    } catch (error) {
      if (error instanceof UserError) throw new UserError(`event ${number}: ${error.message}`);
      throw error;
    }
  }
  return inSavepoint(client, () => recordStaged(client, rows));
}

/**
 * Run `work` in a savepoint of the caller's transaction, or in a transaction of its own when
 * the client is outside one; undone on any error, leaving the caller's transaction usable.
 * @template T
 * @param {Queryable & {getTransactionStatus?: () => string | null}} client
 * @param {() => Promise<T>} work
 * @returns {Promise<T>}
 */
async function inSavepoint(client, work) {
  const inTransaction = client.getTransactionStatus?.() === 'T';
  await client.query(inTransaction ? 'SAVEPOINT media_hooks_emit' : 'BEGIN');
  try {
    const result = await work();
    await client.query(inTransaction ? 'RELEASE SAVEPOINT media_hooks_emit' : 'COMMIT');
    return result;
  } catch (error) {
    await client.query(inTransaction ? 'ROLLBACK TO SAVEPOINT media_hooks_emit' : 'ROLLBACK');
    if (inTransaction) await client.query('RELEASE SAVEPOINT media_hooks_emit');
    throw error;
  }
}

/**
 * @param {Queryable} client
 * @param {Row[]} rows
 */
async function recordStaged(client, rows) {
  await client.query(bind('emit_staging_create'));
  await client.query(bind('emit_staging_clear'));
  for (let start = 0; start < rows.length; start += STAGING_CHUNK) {
    const chunk = rows.slice(start, start + STAGING_CHUNK);
    await client.query(
      bind('emit_staging_rows', {
        ordinals: chunk.map((_, i) => start + i + 1),
        delivery_ids: chunk.map((r) => r.deliveryId),
        destination_ids: chunk.map((r) => r.destinationId),
        event_ids: chunk.map((r) => r.eventId),
        asset_ids: chunk.map((r) => r.assetId),
        event_types: chunk.map((r) => r.eventType),
        payloads: chunk.map((r) => r.payload),
        body_heads: chunk.map((r) => r.bodyHead),
        body_tails: chunk.map((r) => r.bodyTail),
      }),
    );
  }
  const duplicate = (await client.query(bind('emit_staging_conflicting_duplicate'))).rows[0];
  if (duplicate) {
    const key = duplicate.delivery_id;
    const name = key.startsWith(EVENT_KEY) ? 'event_id' : 'delivery_id';
    const shown = key.startsWith(EVENT_KEY) ? key.slice(1) : key;
    throw new UserError(
      `event ${duplicate.ordinal}: ${name} ${pyRepr(shown)} is already used by event ` +
        `${duplicate.first_ordinal} for a different event (one ${name}, one event: a changed ` +
        `event needs a new ${name})`,
    );
  }
  const unknown = (await client.query(bind('emit_staging_unknown_destination'))).rows[0];
  if (unknown) {
    throw new UserError(`event ${unknown.ordinal}: ${unknownDestination(unknown.destination_id).message}`);
  }
  const counts = await insertStaged(client);
  await client.query(bind('emit_staging_clear'));
  return {
    inserted: Number(counts.inserted),
    alreadyPresent: Number(counts.already_present),
    eventsRecorded: Number(counts.events_recorded),
    eventsAlreadyPresent: Number(counts.events_already_present),
    eventsUnmatched: Number(counts.events_unmatched),
    unmatchedSample: counts.unmatched_sample,
  };
}

/**
 * emit_staging_insert, run again when a purge committing meanwhile made it meet a tombstone its
 * snapshot did not show (sql/queries/emit.sql): the next run sees it.
 * @param {Queryable} client
 */
async function insertStaged(client) {
  for (let attempt = 1; ; attempt += 1) {
    await client.query('SAVEPOINT media_hooks_emit_insert');
    try {
      const { rows } = await client.query(bind('emit_staging_insert'));
      await client.query('RELEASE SAVEPOINT media_hooks_emit_insert');
      return rows[0];
    } catch (error) {
      await client.query('ROLLBACK TO SAVEPOINT media_hooks_emit_insert');
      await client.query('RELEASE SAVEPOINT media_hooks_emit_insert');
      const race = error?.code === '23505' && error?.constraint === 'delivery_identity_pkey';
      if (!race || attempt === RACE_TRIES) throw error;
    }
  }
}

