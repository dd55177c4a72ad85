/**
 * One destination's HTTP sender: the request exactly as docs/contract.md says (the same bytes and
 * headers as media_hooks/http/sender.py), and its outcome classified (outcomes.js).
 *
 * A Sender owns one keep-alive agent of at most `maxInFlight` connections for one destination
 * URL. `send` never rejects: every answer, timeout or refused connection comes back as an
 * AttemptResult. No redirect is followed, no cookie kept, no body decompressed; a response
 * body is read up to MAX_RESPONSE_READ_BYTES (a longer one is cut and its connection closed),
 * and never past the attempt's deadline. Timeouts: each wait on the socket (connect, the
 * answer, each part of the body) is bounded by the destination's timeout; the body by twice it
 * from the start; so an attempt ends within `worstCaseSeconds`.
 *
 * The SSRF guard judges every address a connection is made to, after resolution and before
 * the socket connects (ssrf.guardedLookup), and an address given as itself before the request
 * (ssrf.checkHost). The environment's proxy variables are not used (the worker connects
 * directly); a CA bundle named by REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE is trusted instead of
 * Node's own, as the Python sender does.
 */

import { existsSync, readFileSync, statSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';

import * as crashpoints from './crashpoints.js';
import { AMBIGUOUS, SUCCESS, classifyFailure, classifyResponse } from './outcomes.js';
import { decodeSecret, sign } from './signing.js';
import { checkHost, guardedLookup } from './ssrf.js';

export const USER_AGENT = 'media-hooks/0.1';
export const MAX_RESPONSE_READ_BYTES = 64 * 1024;
export const MAX_EXCERPT_CHARS = 4 * 1024;
// An idle keep-alive connection is closed before a receiver's own idle timeout (often 5 s)
// can close it under a request.
const IDLE_SOCKET_MS = 4000;

/**
 * @typedef {object} AttemptResult what one HTTP attempt did
 * @property {string} outcome
 * @property {number | null} httpStatus
 * @property {string | null} error
 * @property {string | null} responseExcerpt
 * @property {number | null} retryAfterSeconds
 * @property {boolean} requestSent false only when nothing can have reached the receiver
 * @property {boolean} configurationFault the SSRF guard refused the address
 * @property {number} finishedMonotonic when it ended, on performance.now() (seconds)
 */

const now = () => performance.now() / 1000;

/** PostgreSQL text cannot hold NUL, and a receiver chooses its body and reason phrase.
 * @param {string} text */
const storable = (text) => text.replaceAll('\u0000', '\ufffd');

/** @param {Buffer} data */
function excerpt(data) {
  if (!data.length) return null;
  return [...storable(data.toString('utf8'))].slice(0, MAX_EXCERPT_CHARS).join('');
}

/** @param {import('./outcomes.js').Failure} failure @returns {AttemptResult} */
function failed(failure) {
  return {
    outcome: failure.outcome,
    httpStatus: null,
    error: storable(failure.error),
    responseExcerpt: null,
    retryAfterSeconds: null,
    requestSent: failure.requestSent,
    configurationFault: failure.configurationFault,
    finishedMonotonic: now(),
  };
}

/** The CA bundle the environment names (a file), as `requests` finds it; else Node's own. */
function environmentCa() {
  const bundle = process.env.REQUESTS_CA_BUNDLE || process.env.CURL_CA_BUNDLE;
  if (bundle && existsSync(bundle) && statSync(bundle).isFile()) return readFileSync(bundle);
  return undefined;
}

export class Sender {
  /**
   * @param {{url: string, secrets: readonly string[], timeoutSeconds: number,
   *   allowPrivate: boolean, maxInFlight: number}} options
   */
  constructor({ url, secrets, timeoutSeconds, allowPrivate, maxInFlight }) {
    for (const secret of secrets) decodeSecret(secret); // a malformed secret fails here
    this.url = new URL(url);
    this.secrets = [...secrets];
    this.timeoutSeconds = timeoutSeconds;
    this.allowPrivate = allowPrivate;
    this.host = this.url.hostname.replace(/^\[(.*)\]$/, '$1');
    this.https = this.url.protocol === 'https:';
    const Agent = this.https ? https.Agent : http.Agent;
    this.agent = new Agent({
      keepAlive: true,
      maxSockets: Math.max(1, maxInFlight),
      timeout: IDLE_SOCKET_MS,
      scheduling: 'lifo',
      ...(allowPrivate ? {} : { lookup: guardedLookup(this.host) }),
      ...(this.https ? { ca: environmentCa() } : {}),
    });
  }

  /** The longest one `send` can take: connect, wait for the answer, read the body. */
  get worstCaseSeconds() {
    return 3 * this.timeoutSeconds;
  }

  close() {
    this.agent.destroy();
  }

  /**
   * @param {string} deliveryId
   * @param {Buffer} body
   */
  headers(deliveryId, body) {
    const timestamp = Math.floor(Date.now() / 1000);
    /** @type {Record<string, string>} */
    const headers = {
      'User-Agent': USER_AGENT,
      'Content-Type': 'application/json',
      'webhook-id': deliveryId,
      'Idempotency-Key': deliveryId,
      'webhook-timestamp': String(timestamp),
      'Content-Length': String(body.length),
    };
    if (this.secrets.length) headers['webhook-signature'] = sign(this.secrets, deliveryId, timestamp, body);
    return headers;
  }

  /**
   * One attempt: POST the body, classify the answer. Never rejects.
   * @param {string} deliveryId
   * @param {Buffer} body
   * @returns {Promise<AttemptResult>}
   */
  async send(deliveryId, body) {
    try {
      checkHost(this.host, this.allowPrivate);
      return await this.#post(deliveryId, body);
    } catch (error) {
      if (error?.code === 'MEDIA_HOOKS_FORBIDDEN_ADDRESS') {
        return failed(classifyFailure(error, { connected: false, timedOut: false }));
      }
      // A bug, not the receiver: the request may have gone out, so the attempt is ambiguous.
      const text = `sender failed: ${error?.name ?? 'Error'}: ${error?.message ?? error}`;
      return failed({ outcome: AMBIGUOUS, requestSent: true, error: text.slice(0, 500), configurationFault: false });
    }
  }

  /**
   * @param {string} deliveryId
   * @param {Buffer} body
   * @returns {Promise<AttemptResult>}
   */
  #post(deliveryId, body) {
    const timeoutMs = this.timeoutSeconds * 1000;
    const deadline = performance.now() + 2 * timeoutMs;
    return new Promise((resolve) => {
      let connected = false;
      let timedOut = false;
      let responded = false;
      let done = false;
      const finish = (result) => {
        if (!done) {
          done = true;
          resolve(result);
        }
      };
      const transport = this.https ? https : http;
      const request = transport.request(this.url, {
        method: 'POST',
        agent: this.agent,
        headers: this.headers(deliveryId, body),
        timeout: timeoutMs,
      });
      request.on('socket', (socket) => {
        if (!socket.connecting && (!this.https || socket.encrypted)) connected = true;
        else socket.once(this.https ? 'secureConnect' : 'connect', () => { connected = true; });
      });
      request.on('timeout', () => {
        timedOut = true;
        request.destroy(new Error(`no answer within ${this.timeoutSeconds} s`));
      });
      request.on('error', (error) => {
        // Once the status line arrived it is the receiver's answer: a broken body does not
        // change it (readLimited says why the body stopped).
        if (!responded) finish(failed(classifyFailure(error, { connected, timedOut })));
      });
      request.on('response', (response) => {
        responded = true;
        crashpoints.hit(crashpoints.AFTER_RECEIVER_ACCEPTED);
        readLimited(response, request, deadline).then(([data, readError]) =>
          finish(answered(response, data, readError)),
        );
      });
      request.end(body);
    });
  }
}

/**
 * At most MAX_RESPONSE_READ_BYTES of the body, stopping at the deadline; and why reading
 * stopped early. A body read to its end leaves the connection to the pool; one cut short
 * closes it.
 * @param {http.IncomingMessage} response
 * @param {http.ClientRequest} request
 * @param {number} deadline performance.now() ms
 * @returns {Promise<[Buffer, string | null]>}
 */
function readLimited(response, request, deadline) {
  return new Promise((resolve) => {
    const chunks = [];
    let size = 0;
    let settled = false;
    const settle = (error, cut) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (cut) request.destroy();
      resolve([Buffer.concat(chunks, size), error]);
    };
    const timer = setTimeout(
      () => settle('response body read stopped at the deadline', true),
      Math.max(deadline - performance.now(), 0),
    );
    response.on('data', (chunk) => {
      const room = MAX_RESPONSE_READ_BYTES - size;
      chunks.push(chunk.length > room ? chunk.subarray(0, room) : chunk);
      size += Math.min(chunk.length, room);
      if (size >= MAX_RESPONSE_READ_BYTES) settle(null, true);
    });
    response.on('end', () => settle(null, false));
    response.on('aborted', () => settle('response body read failed: the connection was lost', true));
    response.on('error', (error) =>
      settle(`response body read failed: ${error?.name ?? 'Error'}`, true),
    );
    request.on('error', (error) => settle(`response body read failed: ${error?.name ?? 'Error'}`, true));
  });
}

/**
 * @param {http.IncomingMessage} response
 * @param {Buffer} data
 * @param {string | null} readError
 * @returns {AttemptResult}
 */
function answered(response, data, readError) {
  const status = response.statusCode ?? 0;
  const classification = classifyResponse(status, response.headers);
  let error = null;
  if (classification.outcome !== SUCCESS) {
    error = storable(`HTTP ${status} ${response.statusMessage ?? ''}`.trimEnd());
  }
  if (readError) error = error ? `${error}; ${readError}` : readError;
  return {
    outcome: classification.outcome,
    httpStatus: status,
    error,
    responseExcerpt: excerpt(data),
    retryAfterSeconds: classification.retryAfterSeconds,
    requestSent: true,
    configurationFault: false,
    finishedMonotonic: now(),
  };
}
