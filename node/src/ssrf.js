/**
 * The SSRF guard (media_hooks/http/ssrf.py, the same ranges and the same opt-in): a destination may
 * reach only globally reachable addresses, unless MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1.
 *
 * Refused: every range of the IANA IPv4 and IPv6 Special-Purpose Address Registries that is not
 * globally reachable, multicast, reserved IPv4 space, deprecated site-local IPv6 and IPv6
 * outside 2000::/3. An IPv6 address that carries an IPv4 one (IPv4-mapped, NAT64, 6to4) is
 * judged by the address it carries; Teredo and IPv4-compatible addresses are refused outright.
 *
 * The guard judges the address a connection is about to be made to: `guardedLookup` is the
 * `lookup` of the sender's HTTP agent, so every connection's resolution is checked before the
 * socket connects (a name that resolved to a public address when the destination was added
 * and to a private one now is refused before a packet leaves: DNS rebinding cannot slip
 * through); an address given as itself is checked before the request (`checkHost`).
 */

import { lookup as dnsLookup } from 'node:dns';
import { isIP } from 'node:net';

export const SETTING = 'MEDIA_HOOKS_ALLOW_PRIVATE_URLS';

/** The destination resolves to an address the guard refuses. */
export class ForbiddenAddress extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'ForbiddenAddress';
    this.code = 'MEDIA_HOOKS_FORBIDDEN_ADDRESS';
  }
}

/**
 * @typedef {{version: 4 | 6, value: bigint}} Address
 * @typedef {{text: string, version: 4 | 6, base: bigint, prefix: number, name: string}} Network
 */

/** @param {string} text @returns {bigint | null} */
function parseV4(text) {
  const parts = text.split('.');
  if (parts.length !== 4 || !parts.every((p) => /^\d{1,3}$/.test(p) && Number(p) <= 255)) {
    return null;
  }
  return parts.reduce((acc, p) => (acc << 8n) | BigInt(Number(p)), 0n);
}

/** @param {string} text @returns {bigint | null} */
function parseV6(text) {
  let address = text.split('%')[0];
  const lastColon = address.lastIndexOf(':');
  const last = address.slice(lastColon + 1);
  if (last.includes('.')) {
    // A dotted IPv4 tail stands for the last two groups.
    const v4 = parseV4(last);
    if (v4 === null) return null;
    address = `${address.slice(0, lastColon + 1)}${(v4 >> 16n).toString(16)}:${(v4 & 0xffffn).toString(16)}`;
  }
  const halves = address.split('::');
  if (halves.length > 2) return null;
  const split = (s) => (s === '' ? [] : s.split(':'));
  const head = split(halves[0]);
  const rest = halves.length === 2 ? split(halves[1]) : [];
  const missing = 8 - head.length - rest.length;
  if (halves.length === 2 ? missing < 1 : missing !== 0) return null;
  const groups = [...head, ...Array(halves.length === 2 ? missing : 0).fill('0'), ...rest];
  if (!groups.every((g) => /^[0-9A-Fa-f]{1,4}$/.test(g))) return null;
  return groups.reduce((acc, g) => (acc << 16n) | BigInt(parseInt(g, 16)), 0n);
}

/**
 * An IP address as a number, or null when `text` is not one.
 * @param {string} text
 * @returns {Address | null}
 */
export function parseAddress(text) {
  const kind = isIP(text.split('%')[0]);
  if (kind === 4) {
    const value = parseV4(text);
    return value === null ? null : { version: 4, value };
  }
  if (kind === 6) {
    const value = parseV6(text);
    return value === null ? null : { version: 6, value };
  }
  return null;
}

/** @param {bigint} value */
export function formatV4(value) {
  return [24n, 16n, 8n, 0n].map((s) => Number((value >> s) & 0xffn)).join('.');
}

/** Python's str() of an IPv6 address: hextets, the longest run of zeros (two or more) as `::`.
 * @param {bigint} value */
export function formatV6(value) {
  const hextets = [];
  for (let s = 112n; s >= 0n; s -= 16n) hextets.push(Number((value >> s) & 0xffffn).toString(16));
  let best = -1;
  let bestLength = 0;
  for (let i = 0; i < 8; ) {
    if (hextets[i] !== '0') {
      i += 1;
      continue;
    }
    let j = i;
    while (j < 8 && hextets[j] === '0') j += 1;
    if (j - i > bestLength) [best, bestLength] = [i, j - i];
    i = j;
  }
  if (bestLength < 2) return hextets.join(':');
  const left = hextets.slice(0, best).join(':');
  const right = hextets.slice(best + bestLength).join(':');
  return `${left}::${right}`;
}

/** @param {[string, string][]} rows @returns {Network[]} */
function table(rows) {
  return rows.map(([text, name]) => {
    const [address, prefix] = text.split('/');
    const parsed = parseAddress(address);
    return { text, version: parsed.version, base: parsed.value, prefix: Number(prefix), name };
  });
}

const IPV4_REFUSED = table([
  ['0.0.0.0/8', '"this network", RFC 791'],
  ['10.0.0.0/8', 'private use, RFC 1918'],
  ['100.64.0.0/10', 'shared address space, carrier-grade NAT, RFC 6598'],
  ['127.0.0.0/8', 'loopback, RFC 1122'],
  ['169.254.0.0/16', 'link-local, cloud metadata services, RFC 3927'],
  ['172.16.0.0/12', 'private use, RFC 1918'],
  ['192.0.0.0/24', 'IETF protocol assignments, RFC 6890'],
  ['192.0.2.0/24', 'documentation, TEST-NET-1, RFC 5737'],
  ['192.88.99.0/24', 'deprecated 6to4 relay anycast, RFC 7526'],
  ['192.168.0.0/16', 'private use, RFC 1918'],
  ['198.18.0.0/15', 'benchmarking, RFC 2544'],
  ['198.51.100.0/24', 'documentation, TEST-NET-2, RFC 5737'],
  ['203.0.113.0/24', 'documentation, TEST-NET-3, RFC 5737'],
  ['224.0.0.0/4', 'multicast, RFC 5771'],
  ['240.0.0.0/4', 'reserved, including the limited broadcast address, RFC 1112'],
]);
const IPV4_ALLOWED = table([
  ['192.0.0.9/32', 'port control protocol anycast, RFC 7723'],
  ['192.0.0.10/32', 'traversal using relays around NAT anycast, RFC 8155'],
]);
const IPV6_REFUSED = table([
  ['::1/128', 'loopback, RFC 4291'],
  ['::/128', 'unspecified, RFC 4291'],
  ['64:ff9b:1::/48', 'local-use IPv4/IPv6 translation, RFC 8215'],
  ['100::/64', 'discard-only, RFC 6666'],
  ['100:0:0:1::/64', 'dummy prefix, RFC 9780'],
  ['2001::/23', 'IETF protocol assignments, RFC 2928'],
  ['2001:db8::/32', 'documentation, RFC 3849'],
  ['3fff::/20', 'documentation, RFC 9637'],
  ['5f00::/16', 'segment routing SIDs, RFC 9602'],
  ['fc00::/7', 'unique local, RFC 4193'],
  ['fe80::/10', 'link-local, RFC 4291'],
  ['fec0::/10', 'site-local, deprecated, RFC 3879'],
  ['ff00::/8', 'multicast, RFC 4291'],
]);
const IPV6_ALLOWED = table([
  ['2001:1::1/128', 'port control protocol anycast, RFC 7723'],
  ['2001:1::2/128', 'traversal using relays around NAT anycast, RFC 8155'],
  ['2001:1::3/128', 'DNS-SD service registration protocol anycast, RFC 9665'],
  ['2001:3::/32', 'AMT, RFC 7450'],
  ['2001:4:112::/48', 'AS112-v6, RFC 7535'],
  ['2001:20::/28', 'ORCHIDv2, RFC 7343'],
  ['2001:30::/28', 'drone remote ID protocol entity tags, RFC 9374'],
]);
const [GLOBAL_UNICAST, NAT64, IPV4_COMPATIBLE, TEREDO, SIX_TO_FOUR, IPV4_MAPPED] = table([
  ['2000::/3', ''],
  ['64:ff9b::/96', ''],
  ['::/96', ''],
  ['2001::/32', ''],
  ['2002::/16', ''],
  ['::ffff:0:0/96', ''],
]);

/** @param {bigint} value @param {Network} network */
function within(value, network) {
  const bits = BigInt(network.version === 4 ? 32 : 128);
  const shift = bits - BigInt(network.prefix);
  return value >> shift === network.base >> shift;
}

/** @param {bigint} value @param {Network[]} networks */
function match(value, networks) {
  const found = networks.find((n) => within(value, n));
  return found ? `${found.text} (${found.name})` : null;
}

/** @param {bigint} value */
function ipv4Range(value) {
  return match(value, IPV4_ALLOWED) ? null : match(value, IPV4_REFUSED);
}

/** @param {bigint} value @returns {string | null} */
function ipv6Verdict(value) {
  const ip = formatV6(value);
  const low32 = value & 0xffffffffn;
  let carried = null;
  if (within(value, IPV4_MAPPED)) carried = ['an IPv4-mapped address', low32];
  else if (within(value, NAT64)) carried = ['a NAT64 address (64:ff9b::/96)', low32];
  else if (within(value, SIX_TO_FOUR)) {
    carried = ['a 6to4 address (2002::/16)', (value >> 80n) & 0xffffffffn];
  }
  if (carried) {
    const [how, inner] = carried;
    const found = ipv4Range(inner);
    return found ? `${ip} is ${how} of ${formatV4(inner)}, which is in ${found}` : null;
  }
  if (within(value, TEREDO)) {
    const server = formatV4((value >> 64n) & 0xffffffffn);
    const client = formatV4(~value & 0xffffffffn);
    return `${ip} is a Teredo tunnel address (2001::/32) of server ${server}, client ${client}`;
  }
  if (within(value, IPV4_COMPATIBLE)) {
    const found = match(value, IPV6_REFUSED);
    if (found) return `${ip} is in ${found}`;
    return `${ip} is a deprecated IPv4-compatible address (::/96, RFC 4291) of ${formatV4(low32)}`;
  }
  if (match(value, IPV6_ALLOWED)) return null;
  const found = match(value, IPV6_REFUSED);
  if (found) return `${ip} is in ${found}`;
  if (!within(value, GLOBAL_UNICAST)) return `${ip} is outside IPv6 global unicast (2000::/3)`;
  return null;
}

/**
 * Why the guard refuses `address`, or null when it is globally reachable.
 * @param {string} address an IPv4 or IPv6 address
 */
export function refusal(address) {
  const parsed = parseAddress(address);
  if (parsed === null) throw new TypeError(`not an IP address: ${address}`);
  if (parsed.version === 6) return ipv6Verdict(parsed.value);
  const found = ipv4Range(parsed.value);
  return found ? `${formatV4(parsed.value)} is in ${found}` : null;
}

/**
 * Refuse `address` unless the guard allows it (or private addresses are allowed).
 * @param {string} address
 * @param {boolean} allowPrivate
 */
export function checkAddress(address, allowPrivate) {
  if (allowPrivate) return;
  const why = refusal(address);
  if (why !== null) {
    throw new ForbiddenAddress(`${why}: not globally reachable; set ${SETTING}=1 to allow it`);
  }
}

/**
 * Refuse a host given as an IP address (no lookup happens for one) that the guard refuses.
 * @param {string} host a URL's hostname (an IPv6 one without its brackets)
 * @param {boolean} allowPrivate
 */
export function checkHost(host, allowPrivate) {
  if (allowPrivate || parseAddress(host) === null) return;
  try {
    checkAddress(host, false);
  } catch (error) {
    throw new ForbiddenAddress(`connecting to ${host}: ${error.message}`);
  }
}

/**
 * A `lookup` for net.connect / an HTTP agent that resolves as dns.lookup does and refuses the
 * connection when any address it found is one the guard refuses.
 * @param {string} host the destination's host, for the message
 * @param {typeof dnsLookup} [resolve]
 */
export function guardedLookup(host, resolve = dnsLookup) {
  return (hostname, options, callback) => {
    resolve(hostname, { ...options, all: true }, (error, addresses) => {
      if (error) return callback(error);
      for (const { address } of addresses) {
        const why = refusal(address);
        if (why !== null) {
          return callback(
            new ForbiddenAddress(
              `connecting to ${host}: ${why}: not globally reachable; set ${SETTING}=1 to allow it`,
            ),
          );
        }
      }
      if (options.all) return callback(null, addresses);
      return callback(null, addresses[0].address, addresses[0].family);
    });
  };
}
