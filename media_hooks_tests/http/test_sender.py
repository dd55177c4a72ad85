"""The HTTP sender against a real receiver on 127.0.0.1: the contract's request and outcomes
(docs/contract.md)."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from standardwebhooks import Webhook

from media_hooks.core import crashpoints
from media_hooks.devtools.receiver import Receiver, Reply, by_attempt
from media_hooks.http import sender as sender_module
from media_hooks.http.outcomes import AMBIGUOUS, RATE_LIMITED, REJECTED, RETRYABLE, SUCCESS
from media_hooks.http.send_loop import SendLoop, new_event_loop
from media_hooks.http.sender import MAX_EXCERPT_CHARS, Sender

BODY = b'{"type":"asset.transcoded","timestamp":"2026-03-01T12:00:00Z","asset_id":"a-1","data":{"t":"caf\xc3\xa9 \\u00e9"}}'


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(**kwargs) -> Receiver:
        rx = Receiver(**kwargs).start()
        started.append(rx)
        return rx

    yield start
    for rx in started:
        rx.stop()


def sender_for(url: str, secrets=(), timeout: float = 2.0, allow_private: bool = True) -> Sender:
    return Sender(url, list(secrets), timeout_seconds=timeout, allow_private=allow_private)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_429_with_an_http_date_retry_after_waits_until_then(receiver) -> None:
    # The date is made when the test runs: made at collection it could be past already.
    in_a_minute = format_datetime(datetime.now(UTC) + timedelta(seconds=61), usegmt=True)
    rx = receiver(reply=Reply(429, headers={"Retry-After": in_a_minute}))
    with sender_for(rx.url) as sender:
        result = sender.send("dlv_row", BODY)
    assert result.outcome == RATE_LIMITED
    assert 55 <= result.retry_after_seconds <= 61


@pytest.mark.parametrize(
    ("reply", "outcome", "retry_after", "disable"),
    [
        (Reply(200), SUCCESS, None, False),
        (Reply(202), SUCCESS, None, False),
        (Reply(429), RATE_LIMITED, None, False),
        (Reply(429, headers={"Retry-After": "2"}), RATE_LIMITED, 2.0, False),
        (Reply(503, headers={"Retry-After": "5"}), RATE_LIMITED, 5.0, False),
        (Reply(503), RETRYABLE, None, False),
        (Reply(408), RETRYABLE, None, False),
        (Reply(425), RETRYABLE, None, False),
        (Reply(500), RETRYABLE, None, False),
        (Reply(410), REJECTED, None, True),
        (Reply(400), REJECTED, None, False),
    ],
    ids=lambda v: (
        repr(v) if not isinstance(v, Reply) else f"{v.status}{'+RA' if v.headers else ''}"
    ),
)
def test_each_answer_has_its_contract_outcome(
    receiver, reply, outcome, retry_after, disable
) -> None:
    rx = receiver(reply=reply)
    with sender_for(rx.url) as sender:
        result = sender.send("dlv_row", BODY)
    assert result.outcome == outcome
    assert result.http_status == reply.status
    assert result.disable_destination is disable
    assert result.request_sent is True
    assert result.retry_after_seconds == retry_after
    assert (result.error is None) == (outcome == SUCCESS)
    assert result.started_at <= result.finished_at
    assert result.started_at.tzinfo is UTC


def test_redirect_is_rejected_and_not_followed(receiver) -> None:
    rx = receiver(reply=Reply(302, headers={"Location": "/elsewhere"}))
    with sender_for(rx.url) as sender:
        result = sender.send("dlv_redirect", BODY)
    assert (result.outcome, result.http_status) == (REJECTED, 302)
    assert rx.wait_for_requests(1, timeout=5)
    # Give a followed redirect the chance to arrive: a second request would be logged by now,
    # since the sender returned only after reading the first answer.
    assert [r.path for r in rx.requests] == ["/"]


def test_connection_refused_is_retryable_and_not_sent() -> None:
    with sender_for(f"http://127.0.0.1:{free_port()}/hook") as sender:
        result = sender.send("dlv_refused", BODY)
    assert (result.outcome, result.request_sent, result.http_status) == (RETRYABLE, False, None)
    assert "refused" in result.error.lower()


def test_dns_failure_is_retryable_and_not_sent() -> None:
    with sender_for("http://no-such-receiver.invalid/hook") as sender:
        result = sender.send("dlv_dns", BODY)
    assert (result.outcome, result.request_sent) == (RETRYABLE, False)
    assert result.error.startswith("DNS failure")


def test_read_timeout_is_ambiguous(receiver) -> None:
    rx = receiver(reply=Reply(delay_seconds=5))
    started = time.monotonic()
    with sender_for(rx.url, timeout=0.3) as sender:
        result = sender.send("dlv_slow", BODY)
    assert time.monotonic() - started < 2
    assert (result.outcome, result.request_sent, result.http_status) == (AMBIGUOUS, True, None)
    assert "timeout" in result.error
    # The slow receiver had acted: that is why the outcome cannot be "retryable".
    assert rx.accepted_ids == {"dlv_slow"}


def test_commit_then_drop_is_ambiguous_and_the_retry_is_deduplicated(receiver) -> None:
    rx = receiver(script=by_attempt(Reply(drop=True)))
    with sender_for(rx.url) as sender:
        first = sender.send("dlv_drop", BODY)
        second = sender.send("dlv_drop", BODY)
    assert (first.outcome, first.request_sent, first.http_status) == (AMBIGUOUS, True, None)
    assert "connection lost" in first.error
    assert (second.outcome, second.http_status) == (SUCCESS, 200)
    assert rx.effects == 1
    assert [(r.dropped, r.duplicate) for r in rx.requests] == [(True, False), (False, True)]


def test_headers_and_body_are_exactly_the_contract(receiver) -> None:
    secret = new_secret()
    rx = receiver(secrets=[secret])
    before = int(time.time())
    with sender_for(rx.url, [secret]) as sender:
        assert sender.send("dlv:abc_1-2", BODY).outcome == SUCCESS
    after = int(time.time())
    (seen,) = rx.requests
    assert seen.body == BODY
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["webhook-id"] == "dlv:abc_1-2"
    assert seen.headers["idempotency-key"] == "dlv:abc_1-2"
    assert before <= int(seen.headers["webhook-timestamp"]) <= after
    assert seen.headers["webhook-signature"].startswith("v1,")
    assert seen.verified is True


def test_no_signature_header_without_secrets(receiver) -> None:
    rx = receiver()
    with sender_for(rx.url) as sender:
        sender.send("dlv_unsigned", BODY)
    (seen,) = rx.requests
    assert "webhook-signature" not in seen.headers
    assert seen.headers["webhook-id"] == "dlv_unsigned"


def test_two_active_secrets_verify_independently_with_the_reference(receiver) -> None:
    old, new = new_secret(), new_secret()
    rx = receiver()
    with sender_for(rx.url, [old, new]) as sender:
        sender.send("dlv_rotation", BODY)
    (seen,) = rx.requests
    assert len(seen.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        Webhook(secret).verify(seen.body, dict(seen.headers))


def test_ssrf_guard_refuses_the_connected_address_before_sending(receiver) -> None:
    rx = receiver()
    with sender_for(rx.url, allow_private=False) as guarded:
        refused = guarded.send("dlv_guarded", BODY)
    assert (refused.outcome, refused.request_sent) == (RETRYABLE, False)
    assert "SSRF guard" in refused.error and "127.0.0.1" in refused.error
    with sender_for(rx.url, allow_private=True) as allowed:
        assert allowed.send("dlv_allowed", BODY).outcome == SUCCESS
    assert rx.wait_for_requests(1, timeout=5)
    # Requests arrive in order on one receiver; the refused one never did.
    assert [r.webhook_id for r in rx.requests] == ["dlv_allowed"]


def test_ssrf_guard_refuses_an_embedded_address_at_connect_time(receiver) -> None:
    """An IPv4-mapped spelling of the receiver's loopback address: the socket's peer is
    ::ffff:127.0.0.1, judged by the IPv4 address it carries (issue 11, part 2)."""
    rx = receiver()
    mapped = rx.url.replace("127.0.0.1", "[::ffff:127.0.0.1]")
    with sender_for(mapped, allow_private=True) as allowed:
        assert allowed.send("dlv_mapped_allowed", BODY).outcome == SUCCESS, "it does reach rx"
    with sender_for(mapped, allow_private=False) as guarded:
        refused = guarded.send("dlv_mapped_guarded", BODY)
    assert (refused.outcome, refused.request_sent) == (RETRYABLE, False)
    assert "IPv4-mapped address of 127.0.0.1, which is in 127.0.0.0/8" in refused.error
    assert rx.wait_for_requests(1, timeout=5)
    assert [r.webhook_id for r in rx.requests] == ["dlv_mapped_allowed"]


def test_response_excerpt_is_capped(receiver) -> None:
    rx = receiver(reply=Reply(500, body=b"e" * 200_000))
    with sender_for(rx.url) as sender:
        result = sender.send("dlv_big", BODY)
    assert result.outcome == RETRYABLE
    assert result.response_excerpt == "e" * MAX_EXCERPT_CHARS


def test_binary_response_excerpt_is_storable_text(receiver) -> None:
    rx = receiver(reply=Reply(400, body=b"bad\x00\xff\xfeinput"))
    with sender_for(rx.url) as sender:
        result = sender.send("dlv_binary", BODY)
    assert "\x00" not in result.response_excerpt
    assert result.response_excerpt.startswith("bad")


def test_keep_alive_reuses_one_connection(receiver) -> None:
    rx = receiver()
    with sender_for(rx.url) as sender:
        results = [sender.send(f"dlv_{n}", BODY) for n in range(20)]
    assert {r.outcome for r in results} == {SUCCESS}
    assert rx.connections_opened == 1


def test_a_receivers_cookie_never_rides_along_on_the_next_delivery(receiver) -> None:
    rx = receiver(reply=Reply(200, headers={"Set-Cookie": "session=abc; Path=/"}))
    with sender_for(rx.url) as sender:
        sender.send("dlv_first", BODY)
        sender.send("dlv_second", BODY)
    assert [r.headers.get("cookie") for r in rx.requests] == [None, None]


def test_each_send_is_its_own_request_from_the_shared_template(receiver) -> None:
    """The prepared request is copied per send: no header or body leaks into the next one."""
    secret = new_secret()
    rx = receiver(secrets=[secret])
    with sender_for(rx.url, [secret]) as sender:
        sender.send("dlv_a", BODY)
        sender.send("dlv_b", b"{}")
    first, second = rx.requests
    assert (first.webhook_id, first.body) == ("dlv_a", BODY)
    assert (second.webhook_id, second.body, second.headers["content-length"]) == (
        "dlv_b",
        b"{}",
        "2",
    )
    assert first.verified and second.verified
    assert first.headers["user-agent"] == second.headers["user-agent"] == "media-hooks/0.1"


def test_a_reason_phrase_with_a_nul_byte_is_storable_text() -> None:
    """A receiver chooses its reason phrase; PostgreSQL text cannot hold NUL."""
    answer = b"HTTP/1.1 500 Bad\x00Thing\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    with socket.create_server(("127.0.0.1", 0)) as server:

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(answer)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{server.getsockname()[1]}/"
        with sender_for(url) as sender:
            result = sender.send("dlv_nul", BODY)
        thread.join(timeout=10)
    assert (result.outcome, result.http_status) == (RETRYABLE, 500)
    assert result.error == "HTTP 500 Bad\ufffdThing"


def test_concurrent_sends_from_threads(receiver) -> None:
    rx = receiver(reply=Reply(delay_seconds=0.01))
    outcomes: list[str] = []
    with Sender(rx.url, [], timeout_seconds=5, allow_private=True, max_in_flight=4) as sender:

        def work(worker: int) -> None:
            for n in range(25):
                outcomes.append(sender.send(f"dlv_{worker}_{n}", BODY).outcome)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert outcomes == [SUCCESS] * 100
    assert rx.effects == 100
    assert 1 < rx.max_in_flight <= 4
    assert rx.connections_opened <= 4


@pytest.fixture(params=["uvloop", "asyncio"])
def loop_kind(request, monkeypatch) -> str:
    """Send loops on uvloop (where it is installed) and on asyncio's own loop (where it is not:
    an import of it fails)."""
    if request.param == "uvloop":
        pytest.importorskip("uvloop")
    else:
        monkeypatch.setitem(sys.modules, "uvloop", None)
    made = new_event_loop()
    made.close()
    assert type(made).__module__.split(".")[0] == request.param
    return request.param


def test_senders_sharing_a_loop_wait_together_and_close_apart(receiver, loop_kind) -> None:
    """A run's destinations share one event loop: requests submitted from one thread are all in
    flight at once, closing one destination's sender leaves the others sending, and closing
    the loop ends its thread."""
    rx = receiver(reply=Reply(delay_seconds=0.3))
    with SendLoop(name="send-loop-test") as loop:
        first = Sender(rx.url + "first", [], 5, True, max_in_flight=2, loop=loop)
        second = Sender(rx.url + "second", [], 5, True, max_in_flight=2, loop=loop)
        futures = [s.submit(f"dlv_{n}", BODY) for n, s in enumerate([first, second] * 2)]
        assert [f.result(timeout=10).outcome for f in futures] == [SUCCESS] * 4
        assert rx.max_in_flight == 4
        first.close()
        assert second.send("dlv_after", BODY).outcome == SUCCESS
        second.close()
    assert "send-loop-test" not in {t.name for t in threading.enumerate()}


def test_senders_made_together_load_the_tls_bundle_once_and_off_the_loop(monkeypatch) -> None:
    """A run's workers make their senders at about the same moment: the bundle (20-35 ms of
    CPU) is loaded once, by a worker, never on the loop where it would hold up every request
    in flight."""
    workers = 4
    arrived = threading.Semaphore(0)
    loaders: list[str] = []
    trust, create = sender_module._tls_trust, sender_module.ssl.create_default_context

    def arriving():
        arrived.release()
        return trust()

    def loading(**kwargs):
        loaders.append(threading.current_thread().name)
        # Held until every worker has come for the bundle: without the lock, each loads it.
        for _ in range(workers):
            assert arrived.acquire(timeout=10)
        return create(**kwargs)

    monkeypatch.setattr(sender_module, "_tls_trust", arriving)
    monkeypatch.setattr(sender_module.ssl, "create_default_context", loading)
    sender_module._loaded_tls_context.cache_clear()
    made: list[Sender] = []
    with SendLoop(name="send-loop-tls") as loop:
        threads = [
            threading.Thread(
                target=lambda n=n: made.append(
                    Sender(f"https://example.invalid/{n}", [], 5, False, loop=loop)
                ),
                name=f"worker-{n}",
            )
            for n in range(workers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        for sender in made:
            sender.close()
    sender_module._loaded_tls_context.cache_clear()
    assert len(made) == workers
    assert len(loaders) == 1 and loaders[0].startswith("worker-")
    assert len({id(sender._tls) for sender in made}) == 1


def test_proxy_from_the_environment_is_resolved_once_and_used(receiver, monkeypatch) -> None:
    proxy = receiver()
    for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", proxy.url)
    sender = sender_for("http://destination.invalid/hook")
    # Resolved at construction: changing the environment later changes nothing.
    monkeypatch.delenv("http_proxy")
    with sender:
        assert sender.send("dlv_proxied", BODY).outcome == SUCCESS
    assert [r.path for r in proxy.requests] == ["http://destination.invalid/hook"]


def test_through_a_proxy_the_guard_checks_the_destination_name(receiver, monkeypatch) -> None:
    proxy = receiver()
    for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", proxy.url)
    with sender_for("http://localhost:9/hook", allow_private=False) as sender:
        result = sender.send("dlv_proxied_private", BODY)
    assert (result.outcome, result.request_sent) == (RETRYABLE, False)
    assert "SSRF guard" in result.error
    assert proxy.request_count == 0


def test_an_unusable_proxy_setting_is_each_sends_retryable_outcome(receiver, monkeypatch) -> None:
    """A proxy the transport cannot use (a SOCKS proxy, no scheme) is the environment's fault:
    each send says so as a retryable attempt that sent nothing; the sender is still built, so
    the worker records it instead of failing its batch."""
    rx = receiver()
    for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", "socks5://127.0.0.1:1080")
    with sender_for(rx.url + "hook") as sender:
        results = [sender.send(f"dlv_socks_{n}", BODY) for n in range(2)]
    assert [(r.outcome, r.request_sent) for r in results] == [(RETRYABLE, False)] * 2
    assert all(r.error.startswith("invalid request: ") for r in results)
    assert "socks5" in results[0].error
    assert rx.request_count == 0


def test_crash_point_after_the_receiver_accepted(receiver) -> None:
    rx = receiver()
    code = (
        "import sys\n"
        "from media_hooks.http.sender import Sender\n"
        f"Sender({rx.url!r}, [], 5, True).send('dlv_crash', b'{{}}')\n"
        "print('survived')\n"
    )
    env = {**os.environ, "MEDIA_HOOKS_CRASH_AT": crashpoints.AFTER_RECEIVER_ACCEPTED}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == crashpoints.CRASH_EXIT_STATUS, done.stderr
    assert "survived" not in done.stdout
    assert rx.accepted_ids == {"dlv_crash"}


def test_malformed_secret_fails_at_construction_without_echoing_it() -> None:
    with pytest.raises(Exception) as caught:
        Sender("http://127.0.0.1:9/", ["whsec_%%%secretish%%%"], 1, True)
    assert "secretish" not in str(caught.value)


def test_a_huge_response_body_is_not_read_to_its_end(receiver) -> None:
    rx = receiver(script=by_attempt(Reply(body=b"x" * 5_000_000)))
    with sender_for(rx.url) as sender:
        huge = sender.send("dlv_huge", BODY)
        after = sender.send("dlv_after", BODY)
    assert (huge.outcome, after.outcome) == (SUCCESS, SUCCESS)
    assert len(huge.response_excerpt) == MAX_EXCERPT_CHARS
    # Read to its end, the connection would have gone back to the pool and been reused;
    # cut at 64 KiB it is closed instead, so the next request needs a new one.
    assert rx.connections_opened == 2


def test_a_small_body_read_to_its_end_keeps_the_connection(receiver) -> None:
    rx = receiver(reply=Reply(body=b"y" * 60_000))
    with sender_for(rx.url) as sender:
        for n in range(3):
            assert sender.send(f"dlv_{n}", BODY).outcome == SUCCESS
    assert rx.connections_opened == 1


def _self_signed(folder) -> tuple[str, str]:
    """A certificate for 127.0.0.1 signed by its own key: (certificate file, key file)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_file), str(key_file)


@pytest.fixture
def tls_receiver(tmp_path) -> Iterator[tuple[str, str]]:
    """An HTTPS server on 127.0.0.1 answering 204 to every POST: (its URL, its certificate)."""
    import ssl
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Answer(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    cert_file, key_file = _self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/hook", cert_file
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_an_unverifiable_certificate_is_a_tls_failure_and_nothing_is_sent(
    tls_receiver, monkeypatch
) -> None:
    url, _ = tls_receiver
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    with sender_for(url) as sender:
        result = sender.send("dlv_tls", BODY)
    assert result.outcome == RETRYABLE
    assert result.error.startswith("TLS failure: ")
    assert "certificate verify failed" in result.error
    assert result.request_sent is False


def test_the_environments_ca_bundle_is_trusted_as_requests_trusts_it(
    tls_receiver, monkeypatch
) -> None:
    url, cert_file = tls_receiver
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", cert_file)
    with sender_for(url) as sender:
        results = [sender.send(f"dlv_tls_{n}", BODY) for n in range(2)]
    assert [(r.outcome, r.http_status) for r in results] == [(SUCCESS, 204), (SUCCESS, 204)]
