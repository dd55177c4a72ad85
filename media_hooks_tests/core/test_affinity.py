"""A delivery's threads on one CPU (MEDIA_HOOKS_DELIVERY_CPU), and only its threads."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest

from media_hooks.core import affinity
from media_hooks.core.errors import UserError
from media_hooks.devtools.receiver import Receiver
from media_hooks.engine.delivery_run import deliver_due
from media_hooks.http.sender import Sender
from media_hooks_tests.conftest import run_cli
from media_hooks_tests.factories import add_deliveries, add_destination, states

ALLOWED = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
several_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs a process allowed 2 CPUs")


@pytest.mark.parametrize(
    ("raw", "value"), [(None, "auto"), ("", "auto"), (" OFF ", "off"), ("1", "1")]
)
def test_the_setting_is_auto_off_or_a_cpu_number(raw, value):
    assert affinity.parse(raw) == value


@pytest.mark.parametrize("raw", ["fast", "-1", "1.5", "0,1"])
def test_any_other_setting_is_refused_by_name(raw):
    with pytest.raises(UserError, match=r"MEDIA_HOOKS_DELIVERY_CPU must be 'auto', 'off' or a CPU"):
        affinity.parse(raw)


def test_off_leaves_threads_where_they_are():
    assert affinity.resolve("off", batches=10) is None


def test_auto_leaves_a_lone_batch_to_the_scheduler():
    """Dagster runs each batch in a process of its own: those are better left to move."""
    assert affinity.resolve("auto", batches=1) is None


@several_cpus
def test_auto_picks_one_cpu_the_process_may_use():
    assert affinity.resolve("auto", batches=2) in ALLOWED


@several_cpus
def test_a_cpu_outside_the_allowed_set_is_refused():
    outside = max(ALLOWED) + 1
    with pytest.raises(UserError, match=f"MEDIA_HOOKS_DELIVERY_CPU={outside} is not a CPU"):
        affinity.parse(str(outside))


@several_cpus
def test_threads_started_inside_are_pinned_and_the_caller_gets_its_cpus_back():
    cpu = min(ALLOWED)
    seen: list[set[int]] = []

    def record() -> None:
        seen.append(os.sched_getaffinity(0))

    bystander_seen: list[set[int]] = []
    release = threading.Event()

    def bystander() -> None:  # started before: keeps its own affinity
        release.wait(10)
        bystander_seen.append(os.sched_getaffinity(0))

    before = threading.Thread(target=bystander)
    before.start()
    with affinity.pinned(cpu):
        inside = threading.Thread(target=record)
        inside.start()
        inside.join()
        release.set()
    before.join()
    after = threading.Thread(target=record)
    after.start()
    after.join()
    assert seen == [{cpu}, ALLOWED]
    assert bystander_seen == [ALLOWED]
    assert os.sched_getaffinity(0) == ALLOWED


@several_cpus
@pytest.mark.parametrize(
    ("setting", "destinations", "pinned"),
    [
        ("auto", 3, True),
        ("off", 3, False),
        ("auto", 1, False),
        (str(min(ALLOWED, default=0)), 1, True),
    ],
)
def test_a_run_sends_from_one_cpu_when_it_runs_several_batches_or_is_told_to(
    conn, pool, settings, monkeypatch, setting, destinations, pinned
):
    seen: set[frozenset[int]] = set()
    post = Sender._post

    async def observed(self, *args):
        seen.add(frozenset(os.sched_getaffinity(0)))  # the run's event loop, where it sends
        return await post(self, *args)

    monkeypatch.setattr(Sender, "_post", observed)
    names = ["cdn", "rights", "archive"][:destinations]
    with Receiver() as receiver:
        for name in names:
            add_destination(conn, name, url=receiver.url, rate_per_second=1000, burst=100)
            add_deliveries(conn, name, 20, prefix=f"{name}-")
        report = deliver_due(pool, "run-cpu", dataclasses.replace(settings, delivery_cpu=setting))
    assert report.totals.succeeded == 20 * destinations
    assert states(conn) == {"succeeded": 20 * destinations}
    if pinned:
        assert len(seen) == 1 and len(next(iter(seen))) == 1  # one CPU, the same for every send
    else:
        assert seen == {frozenset(ALLOWED)}
    assert os.sched_getaffinity(0) == ALLOWED
    # The run's event loop ended with it.
    assert not [t for t in threading.enumerate() if t.name.startswith("send-loop")]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("fast", "MEDIA_HOOKS_DELIVERY_CPU must be 'auto', 'off' or a CPU number"),
        ("4096", "MEDIA_HOOKS_DELIVERY_CPU=4096 is not a CPU this process may run on"),
    ],
)
def test_the_cli_refuses_a_bad_setting_in_one_line_before_claiming(conn, cli_env, value, message):
    add_destination(conn, "cdn")
    add_deliveries(conn, "cdn", 3)
    done = run_cli("run", env={**cli_env, "MEDIA_HOOKS_DELIVERY_CPU": value})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip().count("\n") == 0
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert states(conn) == {"pending": 3}  # nothing claimed


@several_cpus
def test_a_cpu_that_cannot_be_had_leaves_the_delivery_where_it_is():
    """Pinning only saves CPU time: a refusal (a container, an offline CPU) is no failure."""
    ran = []
    with affinity.pinned(max(ALLOWED) + 1):
        ran.append(os.sched_getaffinity(0))
    assert ran == [ALLOWED]
    assert os.sched_getaffinity(0) == ALLOWED
