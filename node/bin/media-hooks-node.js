#!/usr/bin/env node
/**
 * media-hooks-node: the Node.js delivery worker's command line.
 *
 *   media-hooks-node worker DESTINATION_ID... [--run-id ID] [--page-size N] [--max-rows N]
 *                           [--max-wait-seconds S] [--json]
 *
 * Delivers the due deliveries of the destinations named, each on a connection of its own, until
 * none is due (or --max-rows are claimed), then prints what it did (--json: one JSON document).
 * The database is MEDIA_HOOKS_DATABASE_URL. Exit 0 when every destination's worker ended
 * normally; 2 for bad usage or settings (one line on stderr, nothing done); 1 for a runtime
 * failure (database unreachable, schema not current, a worker that failed: what it held was
 * handed back first). SIGTERM or SIGINT stops it: what it holds is handed back, then it exits
 * 143 or 130. Launched by Dagster through Pipes (DAGSTER_PIPES_CONTEXT set), its log lines and
 * per-destination counts go to the step as Pipes messages too.
 */

import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';

import { COUNT, parseNumber, Range, settingsFromEnv } from '../src/config.js';
import { RuntimeFailure, UserError, firstLine } from '../src/errors.js';
import { validateIdentifier } from '../src/identifiers.js';
import { openPipes } from '../src/pipes.js';
import { DEFAULT_MAX_WAIT_SECONDS, DEFAULT_PAGE_SIZE, deliverDestinations, preflight } from '../src/worker.js';

const USAGE =
  'usage: media-hooks-node worker DESTINATION_ID... [--run-id ID] [--page-size N] ' +
  '[--max-rows N] [--max-wait-seconds S] [--json]';
const PAGE_SIZE = new Range(1, 10_000, { lowInclusive: true, integer: true });
const WAIT_SECONDS = new Range(0, 86_400, { lowInclusive: true, unit: 'seconds' });
const SIGNAL_EXIT = { SIGINT: 130, SIGTERM: 143 };

/** @param {string[]} argv */
function parseCommand(argv) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      strict: true,
      options: {
        'run-id': { type: 'string' },
        'page-size': { type: 'string' },
        'max-rows': { type: 'string' },
        'max-wait-seconds': { type: 'string' },
        json: { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h', default: false },
      },
    });
  } catch (error) {
    throw new UserError(`${firstLine(error)} (${USAGE})`);
  }
  const { values, positionals } = parsed;
  if (values.help) return { help: true };
  const [command, ...destinations] = positionals;
  if (command !== 'worker') {
    throw new UserError(command ? `unknown command '${command}' (${USAGE})` : USAGE);
  }
  if (!destinations.length) throw new UserError(`worker needs at least one destination id (${USAGE})`);
  for (const id of destinations) validateIdentifier(id, 'destination id');
  if (new Set(destinations).size !== destinations.length) {
    throw new UserError('a destination id is given twice');
  }
  const runId = values['run-id'];
  if (runId !== undefined && (!runId.trim() || runId.length > 200)) {
    throw new UserError('--run-id must be 1 to 200 characters');
  }
  return {
    help: false,
    destinations,
    runId,
    pageSize: values['page-size'] === undefined
      ? DEFAULT_PAGE_SIZE
      : parseNumber(values['page-size'], '--page-size', PAGE_SIZE),
    maxRows: values['max-rows'] === undefined ? null : parseNumber(values['max-rows'], '--max-rows', COUNT),
    maxWaitSeconds: values['max-wait-seconds'] === undefined
      ? DEFAULT_MAX_WAIT_SECONDS
      : parseNumber(values['max-wait-seconds'], '--max-wait-seconds', WAIT_SECONDS),
    json: values.json,
  };
}

/** @param {import('../src/worker.js').DestinationResult[]} results */
function summary(runId, results) {
  return {
    run_id: runId,
    destinations: Object.fromEntries(
      results.map((r) => [
        r.destinationId,
        { claimed: r.claimed, ...r.counts.toJSON(), ...(r.error ? { error: firstLine(r.error) } : {}) },
      ]),
    ),
  };
}

async function main() {
  let pipes = null;
  try {
    // First: a launching step then learns why even a usage or settings error ended it.
    try {
      pipes = openPipes();
    } catch (error) {
      throw new RuntimeFailure(`cannot open Dagster Pipes: ${firstLine(error)}`);
    }
    const command = parseCommand(process.argv.slice(2));
    if (command.help) {
      process.stdout.write(`${USAGE}\n`);
      pipes?.close();
      return 0;
    }
    const settings = settingsFromEnv();
    const log = (line, level = 'INFO') => {
      process.stderr.write(`media-hooks-node: ${line}\n`);
      pipes?.log(line, level);
    };
    const runId = command.runId ?? pipes?.context.run_id ?? `node-${randomUUID()}`;
    await preflight(settings, command.destinations);

    const stop = new AbortController();
    let stoppedBy = null;
    for (const name of Object.keys(SIGNAL_EXIT)) {
      process.on(name, () => {
        if (stoppedBy === null) log(`${name}: stopping, handing back what it holds`, 'WARNING');
        stoppedBy ??= name;
        stop.abort();
      });
    }
    log(`run ${runId}: delivering to ${command.destinations.join(', ')}`);
    const results = await deliverDestinations({
      settings,
      runId,
      destinationIds: command.destinations,
      pageSize: command.pageSize,
      maxRows: command.maxRows,
      maxWaitSeconds: command.maxWaitSeconds,
      signal: stop.signal,
      log: (line) => log(line, 'WARNING'),
    });
    const report = summary(runId, results);
    for (const [id, counts] of Object.entries(report.destinations)) {
      log(`${id}: ${JSON.stringify(counts)}`, counts.error ? 'ERROR' : 'INFO');
    }
    pipes?.reportCustomMessage(report);
    if ((pipes?.context.asset_keys ?? []).length === 1) {
      pipes.reportAssetMaterialization({ metadata: { deliveries: { raw_value: report, type: 'json' } } });
    }
    process.stdout.write(command.json ? `${JSON.stringify(report)}\n` : '');
    const failed = results.find((r) => r.error);
    if (failed) {
      const error = new RuntimeFailure(`${failed.destinationId}: ${firstLine(failed.error)}`, { cause: failed.error });
      process.stderr.write(`media-hooks-node: ${error.message}\n`);
      pipes?.close(error);
      return 1;
    }
    pipes?.close(stoppedBy ? new Error(`stopped by ${stoppedBy}`) : undefined);
    return stoppedBy ? SIGNAL_EXIT[stoppedBy] : 0;
  } catch (error) {
    const code = error instanceof UserError ? 2 : 1;
    process.stderr.write(`media-hooks-node: ${firstLine(error)}\n`);
    try {
      pipes?.close(error);
    } catch {
      // The step learns of the failure from the exit status.
    }
    return code;
  }
}

process.exit(await main());
