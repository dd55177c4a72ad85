// Test driver: calls the Node package's emit functions on one pg connection, as a Node.js
// producer would, and prints each call's result or error as JSON (media_hooks_tests/node).
// stdin: {"url", "transaction": "commit" | "rollback" | "none", "calls": [{"fn", ...}]}.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';

import { connectionConfig } from '../../node/src/db.js';
import { emit, emitEvent, emitMany } from '../../node/src/index.js';

const pg = createRequire(new URL('../../node/package.json', import.meta.url))('pg');
const scenario = JSON.parse(readFileSync(0, 'utf8'));
const client = new pg.Client(connectionConfig(scenario.url, '-c application_name=producer'));
await client.connect();
const results = [];
try {
  if (scenario.transaction !== 'none') await client.query('BEGIN');
  for (const call of scenario.calls) {
    try {
      if (call.fn === 'emit') results.push({ ok: await emit(client, call.event) });
      else if (call.fn === 'emitEvent') results.push({ ok: await emitEvent(client, call.event) });
      else if (call.fn === 'emitMany') results.push({ ok: await emitMany(client, call.events) });
      else throw new Error(`unknown call ${call.fn}`);
    } catch (error) {
      results.push({ error: { name: error.name, message: error.message } });
    }
  }
  if (scenario.transaction === 'commit') await client.query('COMMIT');
  if (scenario.transaction === 'rollback') await client.query('ROLLBACK');
} finally {
  await client.end();
}
process.stdout.write(JSON.stringify(results));
