/**
 * Connections in a role, with the bounds media_hooks/store/db.py gives every connection of that role
 * (statement_timeout, lock_timeout, idle_in_transaction_session_timeout as session settings,
 * application_name `media_hooks:<role>:g<generation>`, the generation being the newest
 * migration's version, as db.py names a session of the same release), and `retrying` for a
 * statement that meets a lock or a timeout (run again with a growing, jittered pause, then one
 * line: DatabaseBusy).
 */

import pg from 'pg';

import { RuntimeFailure, UserError, firstLine } from './errors.js';
import { bind, contractVersions, migrationVersions } from './statements.js';

// Each role's statement timeout in units of MEDIA_HOOKS_STATEMENT_TIMEOUT_SECONDS (db.py).
const STATEMENT_SCALE = { worker: 1, reconciler: 1, sweeps: 2, operator: 5, producer: 10 };
export const BUSY_TRIES = 5;
const FIRST_PAUSE_SECONDS = 0.1;
const LONGEST_PAUSE_SECONDS = 2.0;

/** A statement kept meeting a lock held elsewhere or its timeout, and was given up. */
export class DatabaseBusy extends RuntimeFailure {
  /** @param {string} message @param {{cause?: unknown}} [options] */
  constructor(message, options) {
    super(message, options);
    this.name = 'DatabaseBusy';
  }
}

/** @param {number} seconds */
function milliseconds(seconds) {
  return String(seconds ? Math.max(Math.round(seconds * 1000), 1) : 0);
}

/**
 * The session settings of a role.
 * @param {keyof typeof STATEMENT_SCALE} role
 * @param {import('./config.js').Settings} settings
 */
export function sessionSettings(role, settings) {
  const statement = settings.statementTimeoutSeconds * STATEMENT_SCALE[role];
  return {
    statement_timeout: milliseconds(statement),
    lock_timeout: milliseconds(settings.lockTimeoutSeconds),
    idle_in_transaction_session_timeout: milliseconds(statement),
  };
}

/**
 * The URL with any password replaced, for messages.
 * @param {string} url
 */
export function redact(url) {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = '***';
    return parsed.toString();
  } catch {
    return url.replace(/password\s*=\s*('(?:\\.|[^'\\])*'|\S*)/g, 'password=***');
  }
}

const TIMESTAMPTZ = 1184;
const TIMESTAMP_TEXT = /^(\d{4,}-\d\d-\d\d) (\d\d:\d\d:\d\d)(\.\d+)?([+-]\d\d)(?::?(\d\d))?(?::?(\d\d))?$/;

/**
 * A timestamptz as PostgreSQL writes it, as Unix seconds to the microsecond (a Date keeps
 * milliseconds only: a start granted for a moment must not be sent before it).
 * @param {string} text
 */
export function preciseSeconds(text) {
  const m = TIMESTAMP_TEXT.exec(text);
  if (m === null) throw new Error(`unexpected timestamptz ${text}`);
  const [, date, time, fraction = '', hours, minutes = '00', seconds = '00'] = m;
  const sign = hours.startsWith('-') ? -1 : 1;
  const offset = sign * (Math.abs(Number(hours)) * 3600 + Number(minutes) * 60 + Number(seconds));
  return Date.parse(`${date}T${time}Z`) / 1000 - offset + Number(`0${fraction || '.0'}`);
}

/** Result types for the worker's connections: timestamptz as precise seconds, the rest as pg
 * parses them. */
const WORKER_TYPES = {
  getTypeParser: (oid, format) =>
    oid === TIMESTAMPTZ && format !== 'binary' ? preciseSeconds : pg.types.getTypeParser(oid, format),
};

const KEYWORDS = {
  host: 'host',
  hostaddr: 'host',
  port: 'port',
  dbname: 'database',
  user: 'user',
  password: 'password',
  application_name: 'application_name',
  options: 'options',
  sslmode: 'sslmode',
};

/**
 * A libpq keyword/value string (`host=/tmp port=5432 dbname=x user=y`, values optionally in
 * single quotes with backslash escapes) as pg's connection settings.
 * @param {string} text
 * @returns {Record<string, string>}
 */
export function parseKeywords(text) {
  const found = {};
  const pair = /\s*([A-Za-z_]+)\s*=\s*('((?:\\.|[^'\\])*)'|(\S*))/y;
  let m;
  while (pair.lastIndex < text.trim().length && (m = pair.exec(text))) {
    const value = m[3] !== undefined ? m[3].replace(/\\(.)/g, '$1') : m[4];
    if (!(m[1] in KEYWORDS)) continue;
    found[KEYWORDS[m[1]]] = value;
  }
  if (!Object.keys(found).length) throw new Error('not a PostgreSQL URL or libpq key=value string');
  return found;
}

/**
 * pg's settings for a database URL (postgresql://...) or a libpq keyword/value string, with
 * the role's session settings added to any `options` it has.
 * @param {string} url
 * @param {string} options
 */
export function connectionConfig(url, options) {
  if (/^[a-z]+:\/\//i.test(url)) {
    const parsed = new URL(url);
    const given = parsed.searchParams.get('options');
    parsed.searchParams.set('options', given ? `${given} ${options}` : options);
    return { connectionString: parsed.toString() };
  }
  const { sslmode, options: given, ...config } = parseKeywords(url);
  const ssl = { require: { rejectUnauthorized: false }, 'verify-ca': true, 'verify-full': true }[sslmode];
  return { ...config, options: given ? `${given} ${options}` : options, ...(ssl ? { ssl } : {}) };
}

/**
 * What a session of this release in `role` calls itself (db.py's `session_name`).
 * @param {string} role
 */
export function sessionName(role) {
  return `media_hooks:${role}:g${Math.max(...migrationVersions())}`;
}

/**
 * One connection in `role`, its timestamptz results as Unix seconds to the microsecond; a
 * failure to connect is one line naming the server (never its password).
 * @param {string} url
 * @param {keyof typeof STATEMENT_SCALE} role
 * @param {import('./config.js').Settings} settings
 * @returns {Promise<pg.Client>}
 */
export async function connect(url, role, settings) {
  const options = Object.entries(sessionSettings(role, settings))
    .map(([name, value]) => `-c ${name}=${value}`)
    .join(' ');
  let config;
  try {
    config = connectionConfig(url, options);
  } catch {
    throw new UserError(
      'MEDIA_HOOKS_DATABASE_URL is not a valid PostgreSQL URL (expected ' +
        'postgresql://user@host:port/dbname)',
    );
  }
  const client = new pg.Client({
    application_name: sessionName(role),
    ...config,
    connectionTimeoutMillis: 10_000,
    types: WORKER_TYPES,
  });
  // An idle connection that the server or the network drops must not crash the process: the
  // next statement on it fails, and that failure is reported.
  client.on('error', () => {});
  try {
    await client.connect();
  } catch (error) {
    await client.end().catch(() => {});
    throw new RuntimeFailure(`cannot connect to PostgreSQL at ${redact(url)}: ${firstLine(error)}`);
  }
  return client;
}

/**
 * Refuse a database whose schema is missing or older than this checkout's migrations
 * (migrations.require_current: contract migrations pending at the end excepted), naming the fix.
 * @param {pg.Client} client
 */
export async function requireCurrent(client) {
  let applied;
  try {
    const { rows } = await client.query('SELECT version FROM schema_migrations');
    applied = new Set(rows.map((r) => Number(r.version)));
  } catch (error) {
    if (error?.code !== '42P01') throw error;
    applied = new Set();
  }
  const problem = schemaProblem(applied, migrationVersions(), contractVersions());
  if (problem) throw new RuntimeFailure(problem);
}

/**
 * What keeps this release from running on a schema with these migrations applied, or null: the
 * migrations it lacks and the fix (migrations.require_current's words). Contract migrations
 * still pending at the end are not lacking: this release runs without them.
 * @param {Set<number>} applied
 * @param {number[]} versions this release's migrations, in order
 * @param {Set<number>} contract those of them that are contract migrations
 */
export function schemaProblem(applied, versions, contract) {
  const migrationName = (v) => String(v).padStart(4, '0');
  const missing = versions.filter((v) => !applied.has(v));
  while (applied.size && missing.length && contract.has(missing[missing.length - 1])) missing.pop();
  if (!missing.length) return null;
  if (!applied.size) return 'the database has no media_hooks schema: run `media-hooks db migrate`';
  let fix = 'run `media-hooks db migrate`';
  const held = missing.find((v) => contract.has(v));
  if (held !== undefined) {
    // This release's own migrations come after a contract migration still waiting.
    fix += `, which applies ${migrationName(held)} and those after it once no session of a release before it is connected`;
  }
  return `the database has pending migrations (${missing.map(migrationName).join(', ')}): ${fix}`;
}

/**
 * Why a statement was refused, when the cause is another session or a bound; null otherwise.
 * @param {any} error
 */
export function busyCause(error) {
  switch (error?.code) {
    case '55P03':
      return 'a lock held by another session outlasted lock_timeout';
    case '57014':
      return /statement timeout/.test(error.message) ? 'the statement outlasted statement_timeout' : null;
    case '40P01':
      return 'a deadlock with another session';
    case '40001':
      return 'a serialization conflict with another session';
    default:
      return null;
  }
}

/** @param {number} ms */
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Run `action` until it is not refused by a lock, a timeout or a conflict: up to BUSY_TRIES
 * times, or for as long as `until` (a `performance.now()` instant, in ms) allows when longer,
 * pausing 0.1 s doubling up to 2 s, jittered. Then DatabaseBusy, naming `what`.
 * @template T
 * @param {string} what
 * @param {() => Promise<T>} action
 * @param {{until?: number, log?: (line: string) => void}} [options]
 * @returns {Promise<T>}
 */
export async function retrying(what, action, { until, log } = {}) {
  let pause = FIRST_PAUSE_SECONDS;
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await action();
    } catch (error) {
      const cause = busyCause(error);
      if (cause === null) throw error;
      const wait = pause * (0.8 + 0.4 * Math.random());
      const moreTime = until !== undefined && performance.now() + wait * 1000 < until;
      if (attempt >= BUSY_TRIES && !moreTime) {
        throw new DatabaseBusy(
          `${what}: ${cause}, ${attempt} times; gave up (try again, or look for a long ` +
            'transaction in pg_stat_activity)',
          { cause: error },
        );
      }
      log?.(`${what}: ${cause}; retrying in ${wait.toFixed(2)} s (try ${attempt})`);
      await sleep(wait * 1000);
      pause = Math.min(pause * 2, LONGEST_PAUSE_SECONDS);
    }
  }
}

/**
 * Run a named statement (sql/queries) and return its rows.
 * @param {pg.Client} client
 * @param {string} name
 * @param {Record<string, unknown>} [values]
 */
export async function run(client, name, values) {
  return (await client.query(bind(name, values))).rows;
}
