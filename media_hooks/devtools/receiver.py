"""A verifying, deduplicating webhook receiver: for tests, the demo and ``media-hooks receiver``.

It behaves as a careful receiver should: it verifies the Standard Webhooks signature and
timestamp tolerance when it has secrets (401 otherwise), and it deduplicates by ``webhook-id``:
a request whose id was already accepted gets the earlier answer again and has no new effect.
``effects`` counts distinct ids accepted, which is what "delivered exactly once" means to a
receiver.

Misbehaviour is programmable per request, for tests and the demo: a ``script`` maps each
request to a ``Reply`` (status, headers, delay, or "commit then drop the connection without
answering"). It also logs every request with arrival and finish times and tracks the most
requests it had in flight at once, so tests can check rate and concurrency ceilings.
"""

from __future__ import annotations

import json
import random
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from media_hooks.http.signing import (
    DEFAULT_TOLERANCE_SECONDS,
    VerificationError,
    decode_secret,
    verify,
)

OK_BODY = b'{"ok": true}'


@dataclass(frozen=True)
class Reply:
    """How to answer one request."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = OK_BODY
    # Answer this much later (a slow receiver); the effect is committed first.
    delay_seconds: float = 0.0
    # Commit the effect, then close the connection without answering: the sender cannot
    # know the receiver acted.
    drop: bool = False

    @property
    def commits(self) -> bool:
        return self.drop or 200 <= self.status <= 299


@dataclass(frozen=True)
class RequestInfo:
    """What a script sees of a verified, not-yet-accepted request."""

    webhook_id: str
    headers: Mapping[str, str]
    body: bytes
    path: str
    # Earlier requests with this webhook-id, whatever their answer.
    seen_before: int


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as the receiver saw it (the log)."""

    webhook_id: str | None
    idempotency_key: str | None
    path: str
    headers: Mapping[str, str]
    body: bytes
    arrived_monotonic: float
    arrived_at: datetime
    finished_monotonic: float
    finished_at: datetime
    # None when the connection was dropped without an answer.
    status: int | None
    duplicate: bool
    verified: bool | None
    dropped: bool
    error: str | None


Script = Callable[[RequestInfo], Reply]


def scripted(*replies: Reply, then: Reply = Reply()) -> Script:
    """Answer the first requests with ``replies`` in order (across all ids), then ``then``."""
    queue = deque(replies)
    lock = threading.Lock()

    def script(info: RequestInfo) -> Reply:
        with lock:
            return queue.popleft() if queue else then

    return script


def by_attempt(*replies: Reply, then: Reply = Reply()) -> Script:
    """Answer each webhook-id's n-th request with ``replies[n]``, then ``then``."""

    def script(info: RequestInfo) -> Reply:
        return replies[info.seen_before] if info.seen_before < len(replies) else then

    return script


def random_faults(
    fail_rate: float = 0.0,
    rate_limit_rate: float = 0.0,
    delay_seconds: float = 0.0,
    retry_after_seconds: int = 1,
    rng: random.Random | None = None,
) -> Script:
    """Some 500s, some 429s with Retry-After, the rest 200; every answer after a delay."""
    chooser = rng or random.Random()
    lock = threading.Lock()

    def script(info: RequestInfo) -> Reply:
        with lock:
            draw = chooser.random()
        if draw < fail_rate:
            return Reply(
                status=500, body=b'{"error": "injected failure"}', delay_seconds=delay_seconds
            )
        if draw < fail_rate + rate_limit_rate:
            return Reply(
                status=429,
                headers={"Retry-After": str(retry_after_seconds)},
                body=b'{"error": "injected rate limit"}',
                delay_seconds=delay_seconds,
            )
        return Reply(delay_seconds=delay_seconds)

    return script


@dataclass
class _Accepted:
    status: int
    body: bytes


class Receiver:
    """An HTTP/1.1 keep-alive receiver on a daemon thread; a context manager."""

    def __init__(
        self,
        secrets: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int = 0,
        script: Script | None = None,
        reply: Reply = Reply(),
        tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
        on_request: Callable[[ReceivedRequest], None] | None = None,
        history: int | None = None,
    ) -> None:
        for secret in secrets:
            decode_secret(secret)
        self.secrets = tuple(secrets)
        self.tolerance_seconds = tolerance_seconds
        self._script = script or (lambda info: reply)
        self._on_request = on_request
        self._address = (host, port)
        self._changed = threading.Condition(threading.RLock())
        self._log: deque[ReceivedRequest] = deque(maxlen=history)
        self._accepted: dict[str, _Accepted] = {}
        self._seen: dict[str, int] = {}
        self._in_flight = 0
        self._max_in_flight = 0
        self._request_count = 0
        self._connections_opened = 0
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Receiver:
        self._stopping.clear()
        server = _Server(self._address, _handler_for(self), bind_and_activate=False)
        server.daemon_threads = True
        server.request_queue_size = 256
        server.allow_reuse_address = True
        server.server_bind()
        server.server_activate()
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._stopping.set()
        self._server.shutdown()
        with self._changed:
            open_connections = list(self._connections)
        # Idle keep-alive connections would otherwise hold their handler threads.
        for conn in open_connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()
        self._server = None

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the receiver is not started")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        host = self._address[0]
        return f"http://{host}:{self.port}/"

    # -- what it saw -----------------------------------------------------------------------

    @property
    def requests(self) -> list[ReceivedRequest]:
        with self._changed:
            return list(self._log)

    @property
    def request_count(self) -> int:
        """Requests answered (or dropped) so far, even those the bounded log forgot."""
        with self._changed:
            return self._request_count

    @property
    def effects(self) -> int:
        """Distinct webhook-ids accepted: the logical effects."""
        with self._changed:
            return len(self._accepted)

    @property
    def accepted_ids(self) -> set[str]:
        with self._changed:
            return set(self._accepted)

    @property
    def requests_by_id(self) -> dict[str, int]:
        """How many requests each webhook-id arrived in (verified ones, any answer)."""
        with self._changed:
            return dict(self._seen)

    @property
    def connections_opened(self) -> int:
        """TCP connections accepted so far (keep-alive reuses one for many requests)."""
        with self._changed:
            return self._connections_opened

    @property
    def max_in_flight(self) -> int:
        with self._changed:
            return self._max_in_flight

    def wait_for(self, predicate: Callable[[Receiver], bool], timeout: float) -> bool:
        """Block until ``predicate(self)`` holds (re-checked on every request) or timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout=timeout)

    def wait_for_requests(self, count: int, timeout: float) -> bool:
        return self.wait_for(lambda r: r.request_count >= count, timeout)

    # -- the request protocol (called from handler threads) ---------------------------------

    def _connected(self, conn: socket.socket, opened: bool) -> None:
        with self._changed:
            if opened:
                self._connections.add(conn)
                self._connections_opened += 1
            else:
                self._connections.discard(conn)

    def _arrive(self) -> None:
        with self._changed:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            self._changed.notify_all()

    def _decide(self, headers: Mapping[str, str], body: bytes, path: str) -> _Decision:
        """Verify, deduplicate and pick the answer; commits the effect when it accepts."""
        webhook_id = headers.get("webhook-id")
        verified: bool | None = None
        if self.secrets:
            try:
                verify(self.secrets, headers, body, self.tolerance_seconds)
                verified = True
            except VerificationError as exc:
                return _Decision(
                    Reply(401, body=_error_body(str(exc))), webhook_id, False, False, str(exc)
                )
        if not webhook_id:
            error = "missing webhook-id header"
            return _Decision(Reply(400, body=_error_body(error)), None, False, verified, error)
        with self._changed:
            seen_before = self._seen.get(webhook_id, 0)
            self._seen[webhook_id] = seen_before + 1
            prior = self._accepted.get(webhook_id)
            if prior is not None:
                return _Decision(
                    Reply(prior.status, body=prior.body), webhook_id, True, verified, None
                )
        reply = self._script(RequestInfo(webhook_id, headers, body, path, seen_before))
        if reply.commits:
            with self._changed:
                # A concurrent request with the same id may have committed meanwhile.
                prior = self._accepted.get(webhook_id)
                if prior is None:
                    self._accepted[webhook_id] = _Accepted(reply.status, reply.body)
            if prior is not None:
                return _Decision(
                    Reply(prior.status, body=prior.body), webhook_id, True, verified, None
                )
        return _Decision(reply, webhook_id, False, verified, None)

    def _pause(self, seconds: float) -> None:
        # A slow receiver is the behaviour under test; stop() cuts it short.
        if seconds > 0:
            self._stopping.wait(seconds)

    def _finish(self, entry: ReceivedRequest) -> None:
        with self._changed:
            self._in_flight -= 1
            self._request_count += 1
            self._log.append(entry)
            self._changed.notify_all()
        if self._on_request is not None:
            self._on_request(entry)


@dataclass(frozen=True)
class _Decision:
    reply: Reply
    webhook_id: str | None
    duplicate: bool
    verified: bool | None
    error: str | None


def _error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class _CaseInsensitiveHeaders(dict):
    """Request headers keyed in lower case (HTTP header names are case-insensitive)."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that goes away (reset, broken pipe) is normal for a receiver under test.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


def _handler_for(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(_ReceiverHandler):
        pass

    Handler.receiver = receiver
    return Handler


class _ReceiverHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # An idle keep-alive connection is closed after this long.
    timeout = 60
    receiver: Receiver

    def setup(self) -> None:
        super().setup()
        self.receiver._connected(self.connection, opened=True)

    def finish(self) -> None:
        self.receiver._connected(self.connection, opened=False)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        """Silenced: the receiver's own log is structured, and the CLI prints it."""

    def do_POST(self) -> None:
        arrived_monotonic, arrived_at = time.monotonic(), datetime.now(UTC)
        self.receiver._arrive()
        headers = _CaseInsensitiveHeaders((k.lower(), v) for k, v in self.headers.items())
        body = b""
        decision = _Decision(Reply(400), None, False, None, "request could not be read")
        try:
            length = headers.get("content-length")
            if length is None or not length.isdigit():
                error = "Content-Length required"
                decision = _Decision(Reply(411, body=_error_body(error)), None, False, None, error)
            else:
                body = self.rfile.read(int(length))
                decision = self.receiver._decide(headers, body, self.path)
            self.receiver._pause(decision.reply.delay_seconds)
        except OSError:
            decision = _Decision(Reply(drop=True), None, False, None, "client went away")
        finally:
            dropped = decision.reply.drop and not decision.duplicate
            # Logged before answering, so a client holding the answer finds it in the log.
            self.receiver._finish(
                ReceivedRequest(
                    webhook_id=headers.get("webhook-id"),
                    idempotency_key=headers.get("idempotency-key"),
                    path=self.path,
                    headers=dict(headers),
                    body=body,
                    arrived_monotonic=arrived_monotonic,
                    arrived_at=arrived_at,
                    finished_monotonic=time.monotonic(),
                    finished_at=datetime.now(UTC),
                    status=None if dropped else decision.reply.status,
                    duplicate=decision.duplicate,
                    verified=decision.verified,
                    dropped=dropped,
                    error=decision.error,
                )
            )
        if dropped:
            self._drop()
        else:
            self._answer(decision.reply)
        if decision.reply.status == 411:
            # The unread body (if any) would be taken for the next request.
            self.close_connection = True

    def _answer(self, reply: Reply) -> None:
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply.body)))
        # Headers and body in one write: two small writes meet Nagle and delayed ACK (40 ms).
        self._headers_buffer.append(b"\r\n" + reply.body)
        try:
            self.flush_headers()
        except OSError:
            self.close_connection = True

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
