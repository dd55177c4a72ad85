"""A real process that takes rate-limit permits, for the multi-process tests.

``send``: several threads (one connection each) take permits one at a time as fast as the
limiter allows, hold each for ``--hold-ms`` (the request), release it, and write one JSON line
per permit to stdout: the database time of the grant and the wall-clock interval the slot was
surely held (after acquire returned, before release was called). Runs until stdin closes or
``--seconds`` pass.

``hold``: takes ``--want`` permits, prints them with their expiry, and waits for stdin to close
without releasing — to be killed.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import psycopg

from media_hooks.outbox import rate_limits


def _emit(lock: threading.Lock, record: dict) -> None:
    with lock:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


def _send_loop(args: argparse.Namespace, thread_no: int, stop: threading.Event, out) -> None:
    holder = f"{args.name}:{thread_no}"
    end = time.monotonic() + args.seconds
    with psycopg.connect(args.url, autocommit=True) as conn:
        while not stop.is_set() and time.monotonic() < end:
            grant = rate_limits.wait_for_permits(
                conn, args.destination, 1, holder, args.hold_seconds, deadline=end
            )
            if not grant.slots:
                continue
            held_from = time.time()
            time.sleep(args.hold_ms / 1000)  # the request in flight
            held_to = time.time()
            rate_limits.release(conn, args.destination, grant.slots, holder)
            _emit(
                out,
                {
                    "process": args.name,
                    "holder": holder,
                    "slot": grant.slots[0],
                    "granted_at": grant.granted_at.timestamp(),
                    "held_from": held_from,
                    "held_to": held_to,
                },
            )


def _stop_when_stdin_closes(stop: threading.Event) -> None:
    sys.stdin.read()
    stop.set()


def send(args: argparse.Namespace) -> None:
    stop = threading.Event()
    threading.Thread(target=_stop_when_stdin_closes, args=(stop,), daemon=True).start()
    out = threading.Lock()
    threads = [
        threading.Thread(target=_send_loop, args=(args, n, stop, out)) for n in range(args.threads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def hold(args: argparse.Namespace) -> None:
    with psycopg.connect(args.url, autocommit=True) as conn:
        grant = rate_limits.acquire(conn, args.destination, args.want, args.name, args.hold_seconds)
        held = rate_limits.in_flight(conn, args.destination)
        expiry = max(row["held_until"] for row in held if row["slot_no"] in grant.slots)
        print(json.dumps({"slots": grant.slots, "held_until": expiry.timestamp()}), flush=True)
        sys.stdin.read()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["send", "hold"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--destination", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--hold-ms", type=float, default=100.0)
    parser.add_argument("--hold-seconds", type=float, default=5.0)
    parser.add_argument("--want", type=int, default=1)
    args = parser.parse_args()
    send(args) if args.mode == "send" else hold(args)


if __name__ == "__main__":
    main()
