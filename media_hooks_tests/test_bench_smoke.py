"""``python -m bench --smoke``: every measurement runs and the report is well formed.

The figures of a tiny run mean nothing and vary with the machine, so this checks the shape of
what the benchmark writes (the JSON, the Markdown report, the plots), never the values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from bench import cpu
from media_hooks_tests.conftest import REPO

MEASUREMENTS = [
    "emit",
    "claim",
    "deliver",
    "fixed_cost",
    "publishers",
    "fidelity",
    "memory",
    "latency",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.one_server
def test_smoke_run_writes_a_well_formed_report(server_url: str, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIA_HOOKS_", "DAGSTER_"))}
    env.update(MEDIA_HOOKS_DATABASE_URL=server_url, MEDIA_HOOKS_HOME=str(tmp_path / "home"))
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    document = json.loads((out / "latest.json").read_text())
    assert document["size"] == "smoke"
    machine = document["machine"]
    for key in ("cpu_model", "cpus", "memory_gib", "python", "load_average_before"):
        assert machine[key], key
    assert len(machine["load_average_after"]) == 3
    assert machine["own_sessions"] is False
    assert document["postgres"]["version"]
    assert set(document["measurements"]) == set(MEASUREMENTS)

    # The server's CPU is read from this machine's processes: none for a server elsewhere.
    server_here = cpu.postmaster(server_url) is not None
    measured = {n: m for n, m in document["measurements"].items() if "skipped" not in m}
    # Smoke skips only the fixed cost (two job runs of up to 16 destinations).
    assert set(measured) == set(MEASUREMENTS) - {"fixed_cost"}
    for name, measurement in measured.items():
        assert "error" not in measurement, (name, measurement.get("error"))
        assert measurement["title"] and measurement["size"], name
        assert measurement["figures"], name
        for path, figures in measurement["figures"].items():
            assert "errors" not in figures, (name, path, figures["errors"])
            for metric in measurement["metrics"]:
                summary = figures[metric]
                if metric == "server_cpu_ms_per_delivery" and not server_here:
                    continue
                assert summary["n"] >= 1, (name, path, metric)
                assert summary["min"] <= summary["median"] <= summary["max"], (name, path)
        for target in measurement["targets"]:
            assert {"target", "value", "met"} <= set(target), (name, target)
        for ratio in measurement["ratios"]:
            assert ratio["of"] in measurement["figures"], (name, ratio)
            assert ratio["to"] in measurement["figures"], (name, ratio)

    deliver = document["measurements"]["deliver"]
    # Each peer ran, or says why not (Procrastinate comes with the `bench` extra).
    for path in ("engine", "job", "bare_requests", "rejected_design", "procrastinate"):
        assert path in deliver["figures"] or path in deliver["not_measured"], path
    assert deliver["figures"]["job"]["per_second"]["median"] > 0
    for figures in deliver["figures"].values():
        # The delivering side's CPU is the machine's less the server's (and the receiver's);
        # a path that barely touches the server (the bare requests loop) can round to equal.
        machine, client = (figures[f"{part}_cpu_ms_per_delivery"] for part in ("machine", "client"))
        assert 0 < machine["median"]
        if server_here:
            assert 0 < client["median"] <= machine["median"]
    latency = document["measurements"]["latency"]["figures"]["sensor"]
    assert latency["dagster_runs"]["median"] >= 1

    report = (out / "REPORT.md").read_text()
    assert report.startswith("# media_hooks benchmark report")
    assert "| measured processes | each a process group in the benchmark's session;" in report
    for heading in (
        "## The machine",
        "## Targets",
        "## 1. Emit",
        "## 7. Latency",
        "## Performance",
    ):
        assert heading in report, heading
    assert document["plots"], "no plot was drawn"
    for filename in document["plots"].values():
        assert f"]({filename})" in report, filename
        assert (out / filename).read_bytes().startswith(PNG_MAGIC), filename


def test_a_local_servers_cpu_is_read_and_counts_its_backends_work(server_url: str):
    host = psycopg.conninfo.conninfo_to_dict(server_url).get("host") or ""
    if host not in ("", "localhost", "127.0.0.1", "::1") and not host.startswith("/"):
        pytest.skip("the test server is not on this machine")
    server = cpu.postmaster(server_url)
    if server is None and os.environ.get("MEDIA_HOOKS_TEST_DATABASE_URL"):
        # A server we did not start may listen on this machine's address from another PID
        # namespace (a container, CI's sandbox): its backends are not processes we can see.
        pytest.skip("the configured server's processes are not visible from here")
    assert server is not None
    with psycopg.connect(server_url) as conn:
        before = cpu.cpu_seconds(server)
        conn.execute("SELECT count(*) FROM generate_series(1, 3000000)").fetchone()
        # Read while connected: an exited backend's time reaches the postmaster when reaped.
        after = cpu.cpu_seconds(server)
    assert after - before >= 0.05


@pytest.mark.parametrize("own_sessions", [False, True])
def test_a_measured_process_leads_its_own_group_in_the_benchmarks_session_unless_asked(
    monkeypatch: pytest.MonkeyPatch, own_sessions: bool
):
    from bench import processes

    monkeypatch.setattr(processes, "own_sessions", own_sessions)
    child = processes.start(
        [sys.executable, "-c", "import os; print(os.getsid(0), os.getpgid(0))"], capture=True
    )
    out, _ = child.communicate(timeout=30)
    session, group = map(int, out.split())
    assert group == child.pid  # stop_group reaches all it starts
    assert session == (child.pid if own_sessions else os.getsid(0))


def test_envelope_excess_is_the_worst_window_over_burst_plus_rate_t():
    from bench.stats import envelope_excess

    # Paced at 10/s with a burst of 2 at the start: within the envelope, with no slack left
    # in the burst's own window.
    paced = [0.0, 0.0, *(0.1 * n for n in range(1, 20))]
    excess, _ = envelope_excess(paced, rate=10, burst=2)
    assert excess == 0
    # Three starts 10 ms apart, later in the run: one more than burst 2 + 10/s x 20 ms allows.
    bunched = [0.0, 1.0, 1.01, 1.02]
    excess, window = envelope_excess(bunched, rate=10, burst=2)
    assert abs(excess - (3 - 2 - 10 * 0.02)) < 1e-9
    assert abs(window - 0.02) < 1e-9
    # Against the definition, every pair of starts as a window's ends.
    times = [0.0, 0.05, 0.3, 0.31, 0.32, 0.9, 1.4, 1.41]
    brute = max(
        (j - i + 1) - 3 - 4 * (times[j] - times[i])
        for i in range(len(times))
        for j in range(i, len(times))
    )
    assert abs(envelope_excess(times, rate=4, burst=3)[0] - brute) < 1e-9


def test_steady_rate_of_evenly_paced_starts_is_their_rate_whatever_the_edges():
    from bench.stats import steady_rate, steady_window

    starts = [7.0 + n / 20 for n in range(101)]  # 20/s for 5 s
    assert abs(steady_rate(starts) - 20) < 1e-6
    assert steady_window(starts) == (7.5, 11.5)
    # A burst at the start and a straggler at the end fall outside the middle 80%.
    ragged = [7.0] * 10 + starts + [13.0]
    assert abs(steady_rate(ragged) - 20) < 1e-6


def test_the_soak_publisher_flags_rate_and_in_flight_violations():
    """The soak's table fails loudly: starts over the envelope and requests over the in-flight
    ceiling at its publisher are violations; a timed-out request stops counting at its sender's
    timeout; a paced destination has none."""
    from datetime import UTC, datetime

    from bench.soak_receiver import ChaosPublisher, Limits
    from media_hooks.devtools.receiver import ReceivedRequest

    publisher = ChaosPublisher(0, Limits(10, 2, 2, 1.0), seed=1)  # allows 5 over the envelope

    def seen(path: str, arrived: float, finished: float) -> None:
        now = datetime.now(UTC)
        publisher._seen(
            ReceivedRequest(
                "id", "id", path, {}, b"", arrived, now, finished, now, 200, False, None, False,
                None,
            )
        )  # fmt: skip

    for n in range(20):  # paced: 10/s, one at a time
        seen("/paced", n * 0.1, n * 0.1 + 0.01)
    for n in range(9):  # nine starts at once, all in flight together
        seen("/bursty", n * 0.01, 0.5)
    # A slow answer past the 1 s timeout overlaps the next two only until its sender gave up.
    seen("/slow", 0.0, 2.0)
    seen("/slow", 1.2, 1.3)
    seen("/slow", 1.25, 1.35)
    found = publisher.violations()
    assert found["paced"]["rate_excess"] == -1.0 and found["paced"]["max_in_flight"] == 1
    assert not found["paced"]["rate_violation"]
    assert found["bursty"]["rate_violation"] and found["bursty"]["max_in_flight"] == 9
    assert found["slow"]["max_in_flight"] == 2 and not found["slow"]["rate_violation"]


def test_a_repeat_the_measurements_time_ran_out_on_is_dropped(monkeypatch, tmp_path: Path):
    import dataclasses
    from types import SimpleNamespace

    from bench import session as session_module
    from bench.sizes import SMOKE

    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(session_module, "time", SimpleNamespace(monotonic=lambda: clock.now))
    timed = session_module.Session(
        dataclasses.replace(SMOKE, rounds=3), None, "", tmp_path, deadline=10.0
    )
    slow_runs = iter([(3.0, True), (None, False)])

    def quick() -> dict:
        clock.now += 1.0
        return {"complete": True, "path": "quick"}

    def slow() -> dict:
        seconds, complete = next(slow_runs)
        # The repeat runs into the end of its slice and is stopped there.
        clock.now = clock.now + seconds if seconds else timed.deadline
        return {"complete": complete, "path": "slow"}

    results = timed.interleaved({"quick": quick, "slow": slow})

    assert results["slow"] == [{"complete": True, "path": "slow"}]
    assert len(results["quick"]) == 2  # the third round found no time left


STARTS_A_RECEIVER = """
import sys
from bench.fast_receiver import fast_receiver
with fast_receiver() as url:
    print(url, flush=True)
    sys.stdin.read()  # until the test kills this process
"""


def test_the_fast_receiver_ends_with_the_process_that_started_it():
    """A benchmark killed outright (SIGKILL: no `finally` runs) leaves no receiver behind."""
    import psutil

    from bench.fast_receiver import answered
    from media_hooks_tests.interleaving import wait_for

    starter = subprocess.Popen(
        [sys.executable, "-c", STARTS_A_RECEIVER],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    receiver = None
    try:
        url = starter.stdout.readline().strip()
        assert answered(url) == 0  # it serves
        (receiver,) = psutil.Process(starter.pid).children()
        starter.kill()
        starter.wait(timeout=10)

        def ended() -> bool:
            return not receiver.is_running() or receiver.status() == psutil.STATUS_ZOMBIE

        wait_for(ended, "the receiver to end after its starter", 15)
    finally:
        starter.kill()
        if receiver is not None and receiver.is_running():
            receiver.kill()
