import { readFileSync } from 'node:fs';

/** A shared vector file (test/vectors/NAME.json), which the Python tests check too. */
export function vectors(name) {
  return JSON.parse(readFileSync(new URL(`./vectors/${name}.json`, import.meta.url), 'utf8'));
}
