"""A receiver that answers every POST with 200 at once: the far end of throughput benchmarks.

``http.server`` (one thread per connection, a Python parser) tops out well below what the
sender can push, so benchmarks measuring the sender need something faster: this is a minimal
HTTP/1.1 keep-alive server on asyncio's protocol layer, run in its own process so it has its
own core. It does not verify or deduplicate anything; ``GET /stats`` returns the number of
requests answered so far.

From a benchmark in ``bench/`` (its folder is on ``sys.path`` when run as a script)::

    from fast_receiver import fast_receiver
    with fast_receiver() as url:   # "http://127.0.0.1:PORT/"
        ...
    # or: python bench/fast_receiver.py --port 8099
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n" + (
    b'{"ok": true}'
)


class _Counter:
    requests = 0


class _Http(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        answers = []
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
            answers.append(self._answer(head))
        if answers:
            # Pipelined requests are answered in one write.
            self.transport.write(b"".join(answers))

    @staticmethod
    def _answer(head: bytes) -> bytes:
        if head.startswith(b"GET /stats"):
            body = json.dumps({"requests": _Counter.requests}).encode()
            return (
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
        _Counter.requests += 1
        return _OK


async def _serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Http, host, port, backlog=1024)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def fast_receiver(host: str = "127.0.0.1") -> Iterator[str]:
    """Run the server in a subprocess for the duration; yields its URL."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--host", host, "--port", "0"],
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
        process.wait(timeout=10)


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
