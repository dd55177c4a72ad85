/**
 * The project's statements, read from the same `sql/queries/*.sql` files the Python engine
 * reads (media_hooks/store/sqlfiles.py): blocks headed `-- name: query_name`, with psycopg's named
 * parameters `%(name)s` and `%%` for a literal percent sign. At load time each statement is
 * translated to PostgreSQL's positional form (`$1`, `$2`, ...), a name used twice keeping its
 * number, so no SQL is ever written in JavaScript.
 */

import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository's `sql/queries` folder, beside this package. */
export const QUERIES_DIR = fileURLToPath(new URL('../../sql/queries/', import.meta.url));
/** The repository's `sql/migrations` folder. */
export const MIGRATIONS_DIR = fileURLToPath(new URL('../../sql/migrations/', import.meta.url));

const NAME = /^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$/gm;
const PLACEHOLDER = /%(\(([A-Za-z_][A-Za-z0-9_]*)\)s|%)/g;

/**
 * @typedef {object} Statement
 * @property {string} name
 * @property {string} text the statement with `$n` placeholders
 * @property {string[]} params the parameter names, in `$n` order
 */

/**
 * Split a queries file into {name: statement text}, as sqlfiles.parse_queries does.
 * @param {string} text
 * @returns {Map<string, string>}
 */
export function parseQueries(text) {
  const found = new Map();
  const heads = [...text.matchAll(NAME)];
  heads.forEach((head, i) => {
    const end = i + 1 < heads.length ? heads[i + 1].index : text.length;
    const body = text.slice(head.index + head[0].length, end).trim().replace(/;+$/, '');
    if (found.has(head[1])) throw new Error(`query '${head[1]}' is defined twice`);
    found.set(head[1], body);
  });
  return found;
}

/**
 * psycopg's named parameters as PostgreSQL's positional ones.
 * @param {string} name
 * @param {string} text
 * @returns {Statement}
 */
export function translate(name, text) {
  const params = [];
  // Whole comment lines (a statement's description) go: only code is sent, and a comment's
  // '%' is prose, not a placeholder.
  const code = text
    .split('\n')
    .filter((line) => !line.trimStart().startsWith('--'))
    .join('\n');
  const stray = code.replace(PLACEHOLDER, '').indexOf('%');
  if (stray >= 0) {
    throw new Error(`query '${name}': a '%' that is neither %(name)s nor %% (at ${stray})`);
  }
  const translated = code.replace(PLACEHOLDER, (_, whole, param) => {
    if (whole === '%') return '%';
    let index = params.indexOf(param);
    if (index < 0) index = params.push(param) - 1;
    return `$${index + 1}`;
  });
  return { name, text: translated, params };
}

/**
 * Every statement of a queries folder, by name (a name in two files is an error).
 * @param {string} [folder]
 * @returns {Map<string, Statement>}
 */
export function loadStatements(folder = QUERIES_DIR) {
  const merged = new Map();
  for (const file of readdirSync(folder).filter((f) => f.endsWith('.sql')).sort()) {
    for (const [name, text] of parseQueries(readFileSync(join(folder, file), 'utf8'))) {
      if (merged.has(name)) throw new Error(`query '${name}' is defined in two files`);
      merged.set(name, translate(name, text));
    }
  }
  return merged;
}

let loaded = null;

/**
 * A statement by name (loaded once), ready for `client.query`: its text and its values in
 * order. A parameter missing from `values` is an error, as it is for psycopg.
 * @param {string} name
 * @param {Record<string, unknown>} [values]
 * @returns {{text: string, values: unknown[]}}
 */
export function bind(name, values = {}) {
  loaded ??= loadStatements();
  const statement = loaded.get(name);
  if (statement === undefined) throw new Error(`no statement named '${name}' in sql/queries`);
  return {
    text: statement.text,
    values: statement.params.map((param) => {
      if (!(param in values)) throw new Error(`statement '${name}' needs parameter '${param}'`);
      return values[param];
    }),
  };
}

const CONTRACT = /^--\s*migrate:\s*contract\s*$/;
/** A migration file's name, `NNNN_name.sql`, its version captured. */
const MIGRATION_FILE = /^(\d{4})_[a-z0-9_]+\.sql$/;

/**
 * Whether a migration's leading comment block marks it `-- migrate: contract` (sqlfiles.py):
 * it removes what only earlier releases use, and this release runs with it still pending.
 * @param {string} text
 */
export function isContract(text) {
  for (const line of text.split('\n')) {
    const stripped = line.trim();
    if (!stripped) continue;
    if (!stripped.startsWith('--')) return false;
    if (CONTRACT.test(stripped)) return true;
  }
  return false;
}

/**
 * The versions of this checkout's contract migrations.
 * @param {string} [folder]
 * @returns {Set<number>}
 */
export function contractVersions(folder = MIGRATIONS_DIR) {
  return new Set(
    readdirSync(folder)
      .filter((f) => MIGRATION_FILE.test(f) && isContract(readFileSync(join(folder, f), 'utf8')))
      .map((f) => Number(f.slice(0, 4))),
  );
}

/**
 * The migration versions this checkout's files define (`NNNN_name.sql`).
 * @param {string} [folder]
 * @returns {number[]}
 */
export function migrationVersions(folder = MIGRATIONS_DIR) {
  return readdirSync(folder)
    .map((f) => MIGRATION_FILE.exec(f))
    .filter(Boolean)
    .map((m) => Number(m[1]))
    .sort((a, b) => a - b);
}
