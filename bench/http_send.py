"""HTTP send throughput to a local receiver that answers 200 at once.

Measures, in one run against the same fast receiver (bench.fast_receiver, its own process):
a bare ``requests.Session`` POST loop with the environment's proxy lookup on every request
(``trust_env`` True, requests' default) and without it; ``Sender.send`` in a loop (signed and
unsigned) and from 4 threads, spread over the CPUs and kept on one; and, for scale, the bare
loop against the in-process ``media_hooks.devtools.receiver.Receiver`` (http.server), which is why the
fast receiver exists.

    .venv/bin/python -m bench.http_send [--requests 4000]

Prints a table and writes bench/results/http_send.json.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import threading
import time
from collections.abc import Callable

import requests

from bench import stats
from bench.fast_receiver import fast_receiver
from bench.scratch import write_results
from media_hooks.core import affinity
from media_hooks.devtools.receiver import Receiver
from media_hooks.http.sender import Sender

BODY = json.dumps(
    {
        "type": "asset.transcoded",
        "timestamp": "2026-03-01T12:00:00Z",
        "asset_id": "asset-000123",
        "data": {"rendition": "1080p", "bitrate_kbps": 6000, "codec": "h264", "ok": True},
    }
).encode()
SECRET = "whsec_" + base64.b64encode(b"benchmark-secret-benchmark-secret").decode()
WARMUP = 200


def _rate(count: int, send: Callable[[int], None]) -> float:
    for n in range(WARMUP):
        send(n)
    started = time.perf_counter()
    for n in range(count):
        send(n)
    return count / (time.perf_counter() - started)


def raw_socket_loop(url: str, count: int) -> float:
    """The receiver's capacity with almost no client cost: one keep-alive socket, no parser."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    request = (
        f"POST / HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"webhook-id: dlv_raw\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = sock.makefile("rb")

        def send(n: int) -> None:
            sock.sendall(request)
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            reader.read(length)

        return _rate(count, send)


def bare_loop(url: str, count: int, trust_env: bool) -> float:
    with requests.Session() as session:
        session.trust_env = trust_env

        def send(n: int) -> None:
            headers = {"Content-Type": "application/json", "webhook-id": f"dlv_{n}"}
            response = session.post(url, data=BODY, headers=headers, timeout=5)
            response.raise_for_status()

        return _rate(count, send)


def sender_loop(url: str, count: int, secrets: list[str]) -> float:
    with Sender(url, secrets, timeout_seconds=5, allow_private=True) as sender:

        def send(n: int) -> None:
            result = sender.send(f"dlv_{n}", BODY)
            assert result.outcome == "success", result

        return _rate(count, send)


def sender_threads(
    url: str, count: int, threads: int, secrets: list[str], cpu: int | None = None
) -> float:
    """Requests/s of ``threads`` threads sharing one Sender; on one CPU when ``cpu`` is given."""
    with (
        affinity.pinned(cpu),
        Sender(
            url, secrets, timeout_seconds=5, allow_private=True, max_in_flight=threads
        ) as sender,
    ):
        for n in range(WARMUP):
            sender.send(f"warm_{n}", BODY)
        failures: list[object] = []

        def work(worker: int) -> None:
            for n in range(count // threads):
                result = sender.send(f"dlv_{worker}_{n}", BODY)
                if result.outcome != "success":
                    failures.append(result)

        pool = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
        started = time.perf_counter()
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        elapsed = time.perf_counter() - started
        assert not failures, failures[:3]
        return (count // threads) * threads / elapsed


MEASUREMENTS: dict[str, Callable[[str, int], float]] = {
    "raw_socket_client": raw_socket_loop,
    "bare_requests_trust_env_true": lambda url, n: bare_loop(url, n, trust_env=True),
    "bare_requests_trust_env_false": lambda url, n: bare_loop(url, n, trust_env=False),
    "sender_unsigned_1_thread": lambda url, n: sender_loop(url, n, []),
    "sender_signed_1_thread": lambda url, n: sender_loop(url, n, [SECRET]),
    "sender_signed_4_threads": lambda url, n: sender_threads(url, n, 4, [SECRET]),
    # What MEDIA_HOOKS_DELIVERY_CPU=auto is for: the same threads kept on one CPU.
    "sender_signed_4_threads_one_cpu": lambda url, n: sender_threads(
        url, n, 4, [SECRET], cpu=affinity.resolve(affinity.AUTO, batches=2)
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, interleaved")
    args = parser.parse_args()
    runs: dict[str, list[float]] = {name: [] for name in MEASUREMENTS}
    slow_runs: dict[str, list[float]] = {
        "raw_socket_client": [],
        "bare_requests_trust_env_false": [],
    }
    load_before = os.getloadavg()[0]
    with fast_receiver() as url:
        # Interleaved rounds, so a neighbour's load burst does not land on one figure only.
        for _ in range(args.rounds):
            for name, measure in MEASUREMENTS.items():
                runs[name].append(measure(url, args.requests))
        answered = requests.get(url + "stats", timeout=5).json()["requests"]
    with Receiver() as slow:
        for _ in range(args.rounds):
            for name in slow_runs:
                slow_runs[name].append(MEASUREMENTS[name](slow.url, args.requests // 2))
    figures = {name: stats.summary(values) for name, values in runs.items()}
    document = {
        "requests_per_measurement": args.requests,
        "rounds": args.rounds,
        "fast_receiver_req_per_s": figures,
        "http_server_receiver_req_per_s": {k: stats.summary(v) for k, v in slow_runs.items()},
        "sender_signed_vs_bare_trust_env_false_median": round(
            figures["sender_signed_1_thread"]["median"]
            / figures["bare_requests_trust_env_false"]["median"],
            2,
        ),
        "fast_receiver_answered": answered,
        "load_average_1min_before": round(load_before, 2),
        "load_average_1min_after": round(os.getloadavg()[0], 2),
    }
    print(f"{'fast receiver':40}  {'median':>8}  {'max':>8}  (req/s)")
    for name, summary in figures.items():
        print(f"{name:40}  {summary['median']:8.0f}  {summary['max']:8.0f}")
    print("http.server Receiver (media_hooks.devtools.receiver)")
    for name, summary in document["http_server_receiver_req_per_s"].items():
        print(f"{name:40}  {summary['median']:8.0f}  {summary['max']:8.0f}")
    print(
        "Sender (signed) / bare loop without proxy lookup, medians: "
        f"{document['sender_signed_vs_bare_trust_env_false_median']}"
    )
    print(
        f"load average before/after: {document['load_average_1min_before']}"
        f" / {document['load_average_1min_after']}"
    )
    print(f"wrote {write_results('http_send', document)}")


if __name__ == "__main__":
    main()
