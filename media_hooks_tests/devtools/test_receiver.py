"""The verifying, deduplicating receiver used by tests, the demo and ``media-hooks receiver``."""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from media_hooks.devtools.receiver import Receiver, Reply, by_attempt, random_faults, scripted
from media_hooks.http.signing import sign

BODY = b'{"type": "rights.updated", "data": {}}'


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


SECRET = new_secret()


def post(url: str, msg_id: str, secrets=(SECRET,), timestamp: int | None = None, body=BODY):
    timestamp = int(time.time()) if timestamp is None else timestamp
    headers = {
        "Content-Type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
    }
    if secrets:
        headers["webhook-signature"] = sign(list(secrets), msg_id, timestamp, body)
    return requests.post(url, data=body, headers=headers, timeout=5)


@pytest.fixture
def verifying() -> Iterator[Receiver]:
    with Receiver(secrets=[SECRET]) as rx:
        yield rx


def test_accepts_a_good_signature(verifying: Receiver) -> None:
    answer = post(verifying.url, "dlv_good")
    assert answer.status_code == 200
    assert verifying.effects == 1
    (seen,) = verifying.requests
    assert (seen.webhook_id, seen.verified, seen.status, seen.body) == ("dlv_good", True, 200, BODY)


def test_accepts_any_active_secret_during_rotation() -> None:
    old, new = new_secret(), new_secret()
    with Receiver(secrets=[old, new]) as rx:
        assert post(rx.url, "dlv_old", secrets=[old]).status_code == 200
        assert post(rx.url, "dlv_new", secrets=[new]).status_code == 200
        assert post(rx.url, "dlv_other", secrets=[new_secret()]).status_code == 401
        assert rx.accepted_ids == {"dlv_old", "dlv_new"}


def test_rejects_a_bad_signature(verifying: Receiver) -> None:
    answer = post(verifying.url, "dlv_bad", secrets=[new_secret()])
    assert answer.status_code == 401
    assert "signature" in answer.json()["error"]
    assert verifying.effects == 0
    assert verifying.requests[0].verified is False


def test_rejects_a_tampered_body(verifying: Receiver) -> None:
    timestamp = int(time.time())
    headers = {
        "webhook-id": "dlv_tampered",
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign([SECRET], "dlv_tampered", timestamp, BODY),
    }
    answer = requests.post(verifying.url, data=BODY + b" ", headers=headers, timeout=5)
    assert answer.status_code == 401
    assert verifying.effects == 0


def test_rejects_a_stale_timestamp(verifying: Receiver) -> None:
    answer = post(verifying.url, "dlv_stale", timestamp=int(time.time()) - 600)
    assert answer.status_code == 401
    assert "tolerance" in answer.json()["error"]
    assert verifying.effects == 0


def test_tolerance_is_configurable() -> None:
    with Receiver(secrets=[SECRET], tolerance_seconds=3600) as rx:
        assert post(rx.url, "dlv_old_ok", timestamp=int(time.time()) - 600).status_code == 200


def test_rejects_a_request_without_signature_when_it_has_secrets(verifying: Receiver) -> None:
    assert post(verifying.url, "dlv_unsigned", secrets=()).status_code == 401


def test_without_secrets_it_accepts_unsigned_requests_but_needs_a_webhook_id() -> None:
    with Receiver() as rx:
        assert post(rx.url, "dlv_plain", secrets=()).status_code == 200
        assert requests.post(rx.url, data=BODY, timeout=5).status_code == 400
        assert [r.verified for r in rx.requests] == [None, None]


def test_duplicate_gets_the_prior_answer_and_no_new_effect(verifying: Receiver) -> None:
    first = post(verifying.url, "dlv_twice")
    again = post(verifying.url, "dlv_twice")
    assert first.status_code == again.status_code == 200
    assert again.content == first.content
    assert verifying.effects == 1
    assert [r.duplicate for r in verifying.requests] == [False, True]


def test_failed_attempts_are_not_effects_and_the_retry_is() -> None:
    with Receiver(script=by_attempt(Reply(500), Reply(429, headers={"Retry-After": "1"}))) as rx:
        statuses = [post(rx.url, "dlv_retry", secrets=()).status_code for _ in range(4)]
        assert statuses == [500, 429, 200, 200]
        assert rx.effects == 1
        assert rx.requests_by_id == {"dlv_retry": 4}
        assert [r.duplicate for r in rx.requests] == [False, False, False, True]


def test_scripted_replies_in_order_then_the_default() -> None:
    script = scripted(Reply(503, headers={"Retry-After": "3"}), Reply(410), then=Reply(204))
    with Receiver(script=script) as rx:
        answers = [post(rx.url, f"dlv_{n}", secrets=()) for n in range(3)]
    assert [a.status_code for a in answers] == [503, 410, 204]
    assert answers[0].headers["Retry-After"] == "3"


def test_commit_then_drop_records_the_effect_and_closes_without_answer() -> None:
    with Receiver(reply=Reply(drop=True)) as rx:
        with pytest.raises(requests.ConnectionError):
            post(rx.url, "dlv_dropped", secrets=())
        assert rx.accepted_ids == {"dlv_dropped"}
        (seen,) = rx.requests
        assert (seen.dropped, seen.status) == (True, None)


def test_counts_the_most_requests_in_flight_at_once() -> None:
    release = threading.Event()

    def hold(info):
        release.wait(5)
        return Reply()

    with Receiver(script=hold) as rx:
        threads = [
            threading.Thread(target=post, args=(rx.url, f"dlv_{n}"), kwargs={"secrets": ()})
            for n in range(5)
        ]
        for t in threads:
            t.start()
        # All five are inside the receiver at once before any is released.
        assert rx.wait_for(lambda r: r.max_in_flight == 5, timeout=5)
        release.set()
        assert rx.wait_for(lambda r: r.effects == 5, timeout=5)
        for t in threads:
            t.join(5)
    assert rx.max_in_flight == 5
    times = [(r.arrived_monotonic, r.finished_monotonic) for r in rx.requests]
    assert all(arrived <= finished for arrived, finished in times)


def test_wait_for_times_out_with_false() -> None:
    with Receiver() as rx:
        started = time.monotonic()
        assert rx.wait_for(lambda r: r.effects > 0, timeout=0.2) is False
        assert time.monotonic() - started < 2


def test_stop_cuts_a_slow_answer_short_and_frees_the_port() -> None:
    rx = Receiver(reply=Reply(delay_seconds=30)).start()
    url = rx.url
    worker = threading.Thread(target=lambda: _ignore_errors(post, url, "dlv_slow", secrets=()))
    worker.start()
    assert rx.wait_for(lambda r: r.max_in_flight == 1, timeout=5)
    started = time.monotonic()
    rx.stop()
    worker.join(5)
    assert not worker.is_alive()
    assert time.monotonic() - started < 3


def _ignore_errors(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except requests.RequestException:
        pass


def test_random_faults_mix_is_reproducible_and_roughly_as_asked() -> None:
    import random

    script = random_faults(fail_rate=0.2, rate_limit_rate=0.1, rng=random.Random(3))
    from media_hooks.devtools.receiver import RequestInfo

    replies = [script(RequestInfo(f"d{n}", {}, b"", "/", 0)) for n in range(2000)]
    statuses = [r.status for r in replies]
    assert 0.15 < statuses.count(500) / 2000 < 0.25
    assert 0.06 < statuses.count(429) / 2000 < 0.14
    assert all(r.headers.get("Retry-After") == "1" for r in replies if r.status == 429)


def test_a_malformed_secret_is_refused_at_construction() -> None:
    from media_hooks.http.signing import InvalidSecret

    with pytest.raises(InvalidSecret):
        Receiver(secrets=["not-a-secret"])


def test_a_bounded_log_keeps_counting() -> None:
    with Receiver(history=2) as rx:
        for n in range(5):
            post(rx.url, f"dlv_{n}", secrets=())
        assert rx.wait_for_requests(5, timeout=5)
        assert [r.webhook_id for r in rx.requests] == ["dlv_3", "dlv_4"]
        assert (rx.request_count, rx.effects) == (5, 5)


def test_a_stopped_receiver_can_start_again() -> None:
    rx = Receiver(reply=Reply(delay_seconds=0.05))
    rx.start()
    rx.stop()
    with rx:
        started = time.monotonic()
        assert post(rx.url, "dlv_again", secrets=()).status_code == 200
        # The delay is honoured again after the earlier stop.
        assert time.monotonic() - started >= 0.05
