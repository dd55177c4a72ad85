/**
 * The Dagster Pipes protocol, external side (the `dagster-pipes` Python package's
 * open_dagster_pipes, for a process Dagster launches with PipesSubprocessClient): the
 * `@dagster-io/dagster-pipes` npm package is not used.
 *
 * Dagster passes two parameters in the environment, each JSON compressed with zlib and
 * encoded in base64: DAGSTER_PIPES_CONTEXT (where the context is: `{"path": file}` or
 * `{"data": {...}}`) and DAGSTER_PIPES_MESSAGES (where messages go: `{"path": file}`, one
 * JSON message a line appended to it, or `{"stdio": "stderr" | "stdout"}`, or
 * `{"buffered_stdio": ...}`, written at close). Every message is
 * `{"__dagster_pipes_version": "0.1", "method": ..., "params": ...}`: `opened` first, then
 * `log`, `report_asset_materialization`, `report_custom_message`, and `closed` last (with the
 * exception that ended the process, if one did).
 */

import { appendFileSync, readFileSync } from 'node:fs';
import { deflateSync, inflateSync } from 'node:zlib';

export const CONTEXT_ENV = 'DAGSTER_PIPES_CONTEXT';
export const MESSAGES_ENV = 'DAGSTER_PIPES_MESSAGES';
export const PROTOCOL_VERSION = '0.1';
export const PROTOCOL_VERSION_FIELD = '__dagster_pipes_version';
const LEVELS = ['DEBUG', 'INFO', 'WARNING', 'ERROR', 'CRITICAL'];

/**
 * base64(zlib(JSON)) of a value (dagster_pipes.encode_param).
 * @param {unknown} value
 */
export function encodeParam(value) {
  return deflateSync(Buffer.from(JSON.stringify(value), 'utf8')).toString('base64');
}

/**
 * The value of an encoded parameter (dagster_pipes.decode_param).
 * @param {string} text
 */
export function decodeParam(text) {
  return JSON.parse(inflateSync(Buffer.from(text, 'base64')).toString('utf8'));
}

/**
 * @param {string} method
 * @param {Record<string, unknown> | null} params
 */
export function makeMessage(method, params) {
  return { [PROTOCOL_VERSION_FIELD]: PROTOCOL_VERSION, method, params };
}

/**
 * Where messages go, from the messages parameter.
 * @param {Record<string, unknown>} params
 * @returns {{write: (line: string) => void, flush: () => void}}
 */
function channel(params) {
  if (typeof params.path === 'string') {
    const path = params.path;
    return { write: (line) => appendFileSync(path, line, 'utf8'), flush: () => {} };
  }
  const stdio = params.stdio ?? params.buffered_stdio;
  if (stdio !== 'stderr' && stdio !== 'stdout') {
    throw new Error(
      `${MESSAGES_ENV}: expected a "path", "stdio" or "buffered_stdio" of stderr or stdout, got ` +
        JSON.stringify(params),
    );
  }
  const stream = stdio === 'stderr' ? process.stderr : process.stdout;
  if (params.stdio !== undefined) return { write: (line) => stream.write(line), flush: () => {} };
  const lines = [];
  return { write: (line) => lines.push(line), flush: () => stream.write(lines.splice(0).join('')) };
}

/**
 * Metadata as Pipes sends it: `{key: {raw_value, type}}`, a raw value's type inferred by Dagster.
 * @param {Record<string, unknown>} metadata
 */
export function normalizeMetadata(metadata) {
  return Object.fromEntries(
    Object.entries(metadata).map(([key, value]) => {
      const typed = value !== null && typeof value === 'object' && 'raw_value' in value && 'type' in value;
      return [key, typed ? value : { raw_value: value, type: '__infer__' }];
    }),
  );
}

/** An open Pipes connection to the Dagster step that launched this process. */
export class PipesSession {
  /**
   * @param {Record<string, any>} context the step's context data (run_id, asset_keys, extras...)
   * @param {{write: (line: string) => void, flush: () => void}} out
   */
  constructor(context, out) {
    this.context = context;
    this.out = out;
    this.closed = false;
    this.send('opened', { extras: {} });
  }

  /** @param {string} method @param {Record<string, unknown> | null} params */
  send(method, params) {
    if (this.closed) throw new Error('cannot send a Pipes message after the session closed');
    this.out.write(`${JSON.stringify(makeMessage(method, params))}\n`);
  }

  /** @param {string} message @param {string} [level] */
  log(message, level = 'INFO') {
    this.send('log', { message, level: LEVELS.includes(level) ? level : 'INFO' });
  }

  /**
   * @param {{metadata?: Record<string, unknown>, dataVersion?: string | null,
   *   assetKey?: string | null}} [materialization]
   */
  reportAssetMaterialization({ metadata = {}, dataVersion = null, assetKey = null } = {}) {
    const keys = this.context.asset_keys ?? [];
    const key = assetKey ?? (keys.length === 1 ? keys[0] : null);
    if (key === null) throw new Error('a materialization needs an asset key: none or several are in scope');
    this.send('report_asset_materialization', {
      asset_key: key,
      metadata: normalizeMetadata(metadata),
      data_version: dataVersion,
    });
  }

  /** @param {unknown} payload any JSON value */
  reportCustomMessage(payload) {
    this.send('report_custom_message', { payload });
  }

  /**
   * Close the session (idempotent), with the error that ended the process, if one did.
   * @param {unknown} [error]
   */
  close(error) {
    if (this.closed) return;
    this.send('closed', error ? { exception: pipesException(error) } : {});
    this.closed = true;
    this.out.flush();
  }
}

/**
 * An error as Pipes' PipesException: name, message, stack frames, cause.
 * @param {unknown} error
 * @returns {Record<string, unknown>}
 */
export function pipesException(error) {
  const err = error instanceof Error ? error : new Error(String(error));
  const frames = (err.stack ?? '').split('\n').slice(1).map((line) => `${line.trim()}\n`);
  return {
    name: err.name,
    message: `${err.name}: ${err.message}\n`,
    stack: frames,
    cause: err.cause ? pipesException(err.cause) : null,
    context: null,
  };
}

/**
 * The Pipes session Dagster asked for in `env`, or null when this process was not launched
 * through Pipes (DAGSTER_PIPES_CONTEXT is unset).
 * @param {NodeJS.ProcessEnv} [env]
 * @returns {PipesSession | null}
 */
export function openPipes(env = process.env) {
  if (env[CONTEXT_ENV] === undefined) return null;
  const contextParams = decodeParam(env[CONTEXT_ENV]);
  const messagesParams = decodeParam(env[MESSAGES_ENV] ?? encodeParam({ stdio: 'stderr' }));
  let context;
  if (typeof contextParams.path === 'string') {
    context = JSON.parse(readFileSync(contextParams.path, 'utf8'));
  } else if (contextParams.data && typeof contextParams.data === 'object') {
    context = contextParams.data;
  } else {
    throw new Error(`${CONTEXT_ENV}: expected a "path" or "data", got ${JSON.stringify(contextParams)}`);
  }
  return new PipesSession(context, channel(messagesParams));
}
