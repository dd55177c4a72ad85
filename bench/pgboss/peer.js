/**
 * The benchmark's pg-boss peer: a Node.js PostgreSQL queue used as a webhook sender, its job
 * POSTing one delivery's body (bench/node_rate.py runs it beside the Node worker).
 *
 *   node bench/pgboss/peer.js enqueue
 *   node bench/pgboss/peer.js work [--workers W] [--batch-size B] [--sockets S]
 *
 * The database is given as libpq gives it, in PGHOST, PGPORT, PGDATABASE, PGUSER and
 * PGPASSWORD (which pg reads; the harness sets them from the scratch database's URL).
 *
 * enqueue: one job per pending delivery of the database (its destination's URL, its id
 * and its body), inserted with boss.insert in batches of INSERT_BATCH: the queue's equivalent of
 * emit. pg-boss makes its own schema (PGBOSS_SCHEMA) on the first start.
 *
 * work: W workers (boss.work) on the queue, each fetching up to B jobs at a time and POSTing
 * them at once over one keep-alive agent of at most S sockets, until no job is left before the
 * completed state; then prints one JSON line: seconds from the first fetch to the last
 * completion seen, jobs completed and failed, the process's CPU time (user + system) in ms
 * over that span and over its whole life, and the settings.
 */

import http from 'node:http';
import { parseArgs } from 'node:util';

import PgBoss from 'pg-boss';

const QUEUE = 'webhooks';
const PGBOSS_SCHEMA = 'pgboss';
const INSERT_BATCH = 1000;
// pg-boss polls each worker's queue at most every 0.5 s (its minimum): the fastest it allows.
const POLLING_SECONDS = 0.5;
// How often the end of the run is looked for (a count of the jobs not yet completed).
const DONE_POLL_MS = 50;
const PENDING = `
SELECT d.delivery_id AS id, w.url, convert_from(d.body, 'UTF8') AS body
FROM webhook_delivery AS d JOIN webhook_destination AS w USING (destination_id)
WHERE d.state = 'pending'
ORDER BY d.next_attempt_at, d.delivery_id`;

function boss(options = {}) {
  const instance = new PgBoss({ schema: PGBOSS_SCHEMA, ...options });
  instance.on('error', (error) => console.error(`pg-boss: ${error.message}`));
  return instance;
}

async function enqueue() {
  const queue = boss();
  await queue.start();
  try {
    await queue.createQueue(QUEUE);
    const { rows } = await queue.getDb().executeSql(PENDING, []);
    for (let start = 0; start < rows.length; start += INSERT_BATCH) {
      const batch = rows.slice(start, start + INSERT_BATCH);
      await queue.insert(batch.map((data) => ({ name: QUEUE, data })));
    }
    // As after any bulk load (and as the Procrastinate peer does): the fetch is planned from
    // the job table's statistics.
    await queue.getDb().executeSql(`ANALYZE ${PGBOSS_SCHEMA}.job`, []);
    return { enqueued: rows.length };
  } finally {
    await queue.stop({ graceful: false, wait: true });
  }
}

function post(agent, { url, id, body }) {
  return new Promise((resolve, reject) => {
    const request = http.request(url, {
      method: 'POST',
      agent,
      headers: {
        'Content-Type': 'application/json',
        'Content-Length': Buffer.byteLength(body),
        'webhook-id': id,
        'Idempotency-Key': id,
      },
    });
    request.on('response', (response) => {
      response.resume();
      response.on('end', () =>
        response.statusCode < 300 ? resolve() : reject(new Error(`HTTP ${response.statusCode}`)));
    });
    request.on('error', reject);
    request.end(body);
  });
}

function cpuMs(since) {
  const used = process.cpuUsage(since);
  return (used.user + used.system) / 1000;
}

async function work({ workers, batchSize, sockets }) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: sockets });
  // A connection per worker's fetch and a few for completions; no maintenance or scheduling
  // in the measured run (the queue is the measurement, not pg-boss's housekeeping).
  const queue = boss({ max: workers + 4, supervise: false, schedule: false, migrate: false });
  await queue.start();
  const cpuBefore = process.cpuUsage();
  const started = performance.now();
  for (let n = 0; n < workers; n += 1) {
    await queue.work(QUEUE, { batchSize, pollingIntervalSeconds: POLLING_SECONDS }, (jobs) =>
      Promise.all(jobs.map((job) => post(agent, job.data))));
  }
  // Completions are sent by pg-boss after each batch without being awaited: the run ends when
  // the database holds no job before the completed state.
  while ((await queue.getQueueSize(QUEUE, { before: 'completed' })) > 0) {
    await new Promise((resolve) => setTimeout(resolve, DONE_POLL_MS));
  }
  const seconds = (performance.now() - started) / 1000;
  const spanCpuMs = cpuMs(cpuBefore);
  const { rows } = await queue.getDb().executeSql(
    `SELECT state, count(*)::int AS n FROM ${PGBOSS_SCHEMA}.job WHERE name = $1 GROUP BY state`,
    [QUEUE]);
  await queue.stop({ graceful: true, wait: true });
  agent.destroy();
  const count = (state) => rows.find((row) => row.state === state)?.n ?? 0;
  return {
    seconds,
    delivered: count('completed'),
    failed: count('failed'),
    cpu_ms: spanCpuMs,
    process_cpu_ms: cpuMs(),
    settings: { workers, batch_size: batchSize, sockets, polling_seconds: POLLING_SECONDS },
  };
}

function positive(text, name) {
  const value = Number(text);
  if (!Number.isInteger(value) || value < 1) throw new Error(`${name} must be a positive integer`);
  return value;
}

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      workers: { type: 'string', default: '10' },
      'batch-size': { type: 'string', default: '100' },
      sockets: { type: 'string', default: '40' },
    },
  });
  const [command] = positionals;
  if (!['enqueue', 'work'].includes(command) || positionals.length !== 1) {
    throw new Error('usage: peer.js enqueue|work [--workers W] [--batch-size B] [--sockets S]');
  }
  const result = command === 'enqueue'
    ? await enqueue()
    : await work({
      workers: positive(values.workers, '--workers'),
      batchSize: positive(values['batch-size'], '--batch-size'),
      sockets: positive(values.sockets, '--sockets'),
    });
  console.log(JSON.stringify(result));
}

main().catch((error) => {
  console.error(`pg-boss peer: ${error.message}`);
  process.exit(1);
});
