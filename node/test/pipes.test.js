import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import { decodeParam, encodeParam, normalizeMetadata, openPipes, PROTOCOL_VERSION } from '../src/pipes.js';
import { vectors } from './vectors.js';

test('parameters are base64 of zlib of JSON, both ways, as dagster_pipes encodes them', () => {
  const shared = vectors('pipes');
  assert.deepEqual(decodeParam(shared.encoded), shared.value);
  assert.deepEqual(decodeParam(encodeParam(shared.value)), shared.value);
});

test('a session writes opened, its messages and closed, one JSON line each', (t) => {
  const folder = mkdtempSync(join(tmpdir(), 'pipes-'));
  t.after(() => rmSync(folder, { recursive: true, force: true }));
  const contextPath = join(folder, 'context.json');
  const messagesPath = join(folder, 'messages');
  writeFileSync(contextPath, JSON.stringify({ run_id: 'r-1', asset_keys: ['deliveries'], extras: {} }));
  const pipes = openPipes({
    DAGSTER_PIPES_CONTEXT: encodeParam({ path: contextPath }),
    DAGSTER_PIPES_MESSAGES: encodeParam({ path: messagesPath }),
  });
  assert.equal(pipes.context.run_id, 'r-1');
  pipes.log('delivering', 'INFO');
  pipes.reportCustomMessage({ cdn: { succeeded: 3 } });
  pipes.reportAssetMaterialization({ metadata: { succeeded: 3 } });
  pipes.close(new Error('boom'));
  pipes.close();
  const messages = readFileSync(messagesPath, 'utf8').trim().split('\n').map((line) => JSON.parse(line));
  assert.deepEqual(messages.map((m) => m.method), ['opened', 'log', 'report_custom_message', 'report_asset_materialization', 'closed']);
  assert.ok(messages.every((m) => m.__dagster_pipes_version === PROTOCOL_VERSION));
  assert.deepEqual(messages[0].params, { extras: {} });
  assert.deepEqual(messages[1].params, { message: 'delivering', level: 'INFO' });
  assert.deepEqual(messages[2].params, { payload: { cdn: { succeeded: 3 } } });
  assert.deepEqual(messages[3].params, {
    asset_key: 'deliveries',
    metadata: { succeeded: { raw_value: 3, type: '__infer__' } },
    data_version: null,
  });
  assert.equal(messages[4].params.exception.name, 'Error');
  assert.equal(messages[4].params.exception.message, 'Error: boom\n');
  assert.throws(() => pipes.log('late'), /after the session closed/);
});

test('context given inline, and no Pipes at all when the context variable is unset', () => {
  assert.equal(openPipes({}), null);
  const lines = [];
  const write = process.stdout.write;
  process.stdout.write = (line) => lines.push(line);
  try {
    const pipes = openPipes({
      DAGSTER_PIPES_CONTEXT: encodeParam({ data: { run_id: 'r-2', asset_keys: null } }),
      DAGSTER_PIPES_MESSAGES: encodeParam({ stdio: 'stdout' }),
    });
    pipes.close();
  } finally {
    process.stdout.write = write;
  }
  assert.deepEqual(lines.map((l) => JSON.parse(l).method), ['opened', 'closed']);
  assert.deepEqual(JSON.parse(lines[1]).params, {});
});

test('typed metadata is passed as it is', () => {
  assert.deepEqual(normalizeMetadata({ a: { raw_value: 1, type: 'int' }, b: 'x' }), {
    a: { raw_value: 1, type: 'int' },
    b: { raw_value: 'x', type: '__infer__' },
  });
});
