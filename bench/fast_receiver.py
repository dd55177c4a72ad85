"""The benchmarks' receiver: many destinations on one asyncio server, each with its own latency.

``http.server`` (one thread per connection, a Python parser) tops out well below what the
sender can push, so benchmarks need something faster: this is a minimal HTTP/1.1 keep-alive
server on asyncio's protocol layer, run in its own process so it has its own core. It answers
every POST with 200 and verifies nothing.

A path's first segment, when it is a number, is that destination's latency in milliseconds:
``/200/dest-3`` answers after 200 ms, ``/0/dest-1`` (or ``/``) at once. A segment ``fail-N``
makes a failing publisher: ``/0/fail-50/dest-9`` answers 500 to N% of its POSTs, at random (the
sustained-load benchmark's retries and dead letters). The answer waits on a
timer, never on a thread, so a thousand slow requests in flight cost nothing. Every POST is
recorded when its head and body have arrived (its start, as the receiver sees it): its
wall-clock time (``time.time()``, comparable with the harness's on this machine), its path and
its ``webhook-id``. ``GET /log`` returns the records since the last ``GET /log`` and forgets
them; ``GET /stats`` returns the number of requests answered so far and the CPU seconds the
receiver has used (user + system).

    from bench.fast_receiver import fast_receiver, take_log
    with fast_receiver() as url:   # "http://127.0.0.1:PORT/"
        ...                        # destinations at url + "200/dest-1", ...
        starts = take_log(url)     # [Start(at, path, webhook_id), ...]
    # or: python -m bench.fast_receiver --port 8099
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import NamedTuple

import requests

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
_WEBHOOK_ID = re.compile(rb"\r\nwebhook-id:\s*([^\r\n]*)", re.IGNORECASE)
_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n" + (
    b'{"ok": true}'
)
# How soon the receiver notices that the process that started it is gone.
PARENT_POLL_SECONDS = 0.5
_FAILED = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
_FAIL_SHARE = re.compile(r"/fail-(\d+)(?:/|$)")


class Start(NamedTuple):
    """One request as the receiver saw it arrive."""

    at: float  # time.time()
    path: str
    webhook_id: str


class _Server:
    answered = 0
    log: list[tuple[float, str, str]] = []


def _json_answer(document: object) -> bytes:
    body = json.dumps(document, separators=(",", ":")).encode()
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def latency_of(path: str) -> float:
    """The latency in seconds a path asks for (its first segment in ms; none: 0)."""
    first = path.lstrip("/").split("/", 1)[0]
    return int(first) / 1000 if first.isdigit() else 0.0


def _answer_for(path: str) -> bytes:
    """200, or 500 for the share of POSTs a ``fail-N`` segment of the path asks to fail."""
    failing = _FAIL_SHARE.search(path)
    if failing and random.random() * 100 < int(failing.group(1)):
        return _FAILED
    return _OK


class _Http(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = bytearray()
        # Answers on one connection leave in request order, whatever each one's latency.
        self.last_due = 0.0

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        now = asyncio.get_running_loop().time()
        immediate = []
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                break
            head = bytes(self.buffer[:head_end])
            match = _CONTENT_LENGTH.search(head)
            end = head_end + 4 + (int(match.group(1)) if match else 0)
            if len(self.buffer) < end:
                break
            del self.buffer[:end]
            answer, delay = self._answer(head)
            due = max(now + delay, self.last_due)
            if due <= now:
                immediate.append(answer)
            else:
                self.last_due = due
                asyncio.get_running_loop().call_at(due, self._write, answer)
        if immediate:
            # Pipelined requests are answered in one write.
            self.transport.write(b"".join(immediate))

    def _write(self, answer: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(answer)

    @staticmethod
    def _answer(head: bytes) -> tuple[bytes, float]:
        method, path = head.split(b" ", 2)[:2]
        if method == b"GET" and path == b"/stats":
            used = os.times()
            document = {"requests": _Server.answered, "cpu_seconds": used.user + used.system}
            return _json_answer(document), 0.0
        if method == b"GET" and path == b"/log":
            taken, _Server.log = _Server.log, []
            return _json_answer(taken), 0.0
        text = path.decode("latin-1")
        found = _WEBHOOK_ID.search(head)
        webhook_id = found.group(1).decode("latin-1").strip() if found else ""
        _Server.log.append((time.time(), text, webhook_id))
        _Server.answered += 1
        return _answer_for(text), latency_of(text)


async def _serve(host: str, port: int) -> None:
    parent = os.getppid()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Http, host, port, backlog=4096)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        # It serves the process that started it, and ends with it: a benchmark ended by
        # SIGTERM or SIGKILL never reaches the `finally` that stops it, and its receiver would
        # otherwise serve on for nobody.
        while os.getppid() == parent:
            await asyncio.sleep(PARENT_POLL_SECONDS)


@contextlib.contextmanager
def fast_receiver(host: str = "127.0.0.1") -> Iterator[str]:
    """Run the server in a subprocess for the duration; yields its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.fast_receiver", "--host", host, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        if not line.startswith("listening "):
            raise RuntimeError(f"fast receiver did not start: {line!r}")
        yield f"http://{host}:{int(line.split()[1])}/"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # started ignoring SIGTERM, as its parent was
            process.kill()
            process.wait()


def _stats(url: str) -> dict:
    with requests.Session() as session:
        session.trust_env = False
        return session.get(url + "stats", timeout=30).json()


def answered(url: str) -> int:
    """How many requests the receiver at ``url`` has answered since it started."""
    return _stats(url)["requests"]


def receiver_cpu_seconds(url: str) -> float:
    """The CPU seconds the receiver at ``url`` has used since it started."""
    return _stats(url)["cpu_seconds"]


def take_log(url: str) -> list[Start]:
    """The requests the receiver at ``url`` recorded since the last call, oldest first."""
    with requests.Session() as session:
        session.trust_env = False
        records = session.get(url + "log", timeout=30).json()
    return sorted(Start(*record) for record in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    try:
        asyncio.run(_serve(args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
