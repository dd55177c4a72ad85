"""``media-hooks demo``: the main job end to end, on whatever database is configured.

A local verifying, deduplicating receiver (a thread of this process) stands in for three
publishers; one of them misbehaves on purpose (a few 500s, two 429s with Retry-After, one
answer slower than its timeout, one rejection). Three destinations with different rates are
registered through the destinations API, a few hundred media events are emitted with
``emit_many``, and the Dagster delivery job runs until the demo's deliveries are idle. The
summary is computed from the database (``sql/queries/demo.sql``), and a chart of request
starts per second against each limit is written under ``MEDIA_HOOKS_HOME/demo``.

The demo touches only its own data: destinations whose id starts with ``demo-`` and their
deliveries, outbox rows, attempts and tombstones, which it deletes before it starts. Its
receiver listens on 127.0.0.1, so it registers its own destinations with
``allow_private_url`` (each of them only: `media-hooks dev`'s runs send to them too) and runs
the job only for them; users' destinations keep the SSRF guard.
"""

from __future__ import annotations

import base64
import dataclasses
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from media_hooks.core.config import Settings
from media_hooks.core.errors import RuntimeFailure
from media_hooks.devtools.chart import Limit, plot_request_rates
from media_hooks.devtools.receiver import Receiver, Reply, RequestInfo
from media_hooks.outbox.destinations import DestinationSpec, upsert_destination
from media_hooks.outbox.emit import Event, emit_many
from media_hooks.outbox.maintenance import sweeps
from media_hooks.store import db
from media_hooks.store.sqlfiles import query

PREFIX = "demo-"
# How long the demo keeps starting runs for deliveries that wait on a retry or a pause.
MAX_DELIVERY_SECONDS = 40.0
EVENT_TYPES = ("transcode.completed", "rights.updated", "transcode.started", "rights.expired")


@dataclass(frozen=True)
class DemoDestination:
    destination_id: str
    rate_per_second: float
    burst: int
    max_in_flight: int
    # Sized by rate so each destination's first attempts take about ten seconds.
    events: int
    timeout_seconds: float = 5.0


DESTINATIONS = (
    DemoDestination("demo-cdn", 20, 2, 4, 200),
    DemoDestination("demo-partner", 10, 2, 4, 100, timeout_seconds=1.0),
    DemoDestination("demo-archive", 5, 1, 2, 50),
)
MISBEHAVING = "demo-partner"
SLOW = 44
REJECTED = 90
# demo-partner's answer to the first request of these event numbers (later requests get 200).
FIRST_ANSWER_FAULTS = {
    7: Reply(500, body=b'{"error": "demo: internal error"}'),
    31: Reply(500, body=b'{"error": "demo: internal error"}'),
    58: Reply(500, body=b'{"error": "demo: internal error"}'),
    83: Reply(500, body=b'{"error": "demo: internal error"}'),
    20: Reply(429, headers={"Retry-After": "1"}, body=b'{"error": "demo: slow down"}'),
    65: Reply(429, headers={"Retry-After": "1"}, body=b'{"error": "demo: slow down"}'),
    # Accepted, but answered after the destination's 1 s timeout: the sender cannot know.
    SLOW: Reply(200, delay_seconds=2.0),
}
REJECTION = Reply(422, body=b'{"error": "demo: unknown asset"}')


def delivery_id(destination_id: str, number: int) -> str:
    return f"{destination_id}:{number:04d}"


def misbehaviour(info: RequestInfo) -> Reply:
    """The receiver's script: only demo-partner misbehaves, by event number."""
    if info.path.strip("/") != MISBEHAVING:
        return Reply()
    number = int(info.webhook_id.rsplit(":", 1)[1])
    if number == REJECTED:
        return REJECTION
    if info.seen_before == 0 and number in FIRST_ANSWER_FAULTS:
        return FIRST_ANSWER_FAULTS[number]
    return Reply()


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def demo_events() -> Iterator[Event]:
    for d in DESTINATIONS:
        for n in range(1, d.events + 1):
            event_type = EVENT_TYPES[n % len(EVENT_TYPES)]
            asset = f"asset-{n:04d}"
            payload: dict[str, Any] = (
                {"rendition": ("1080p", "720p", "480p")[n % 3], "duration_seconds": 60 + n}
                if event_type.startswith("transcode")
                else {"territory": ("FR", "DE", "US", "JP")[n % 4], "license": f"lic-{n}"}
            )
            yield Event(
                d.destination_id, asset, event_type, payload, delivery_id(d.destination_id, n)
            )


@dataclass
class DemoResult:
    destinations: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    receiver: dict[str, int]
    chart: Path
    seconds: float
    examples: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "chart": str(self.chart)}


def _fetch(conn: psycopg.Connection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query(name), params)
        return cur.fetchall()


def _ids() -> list[str]:
    return [d.destination_id for d in DESTINATIONS]


def reset(conn: psycopg.Connection) -> dict[str, int]:
    """Delete the demo's own previous data (see demo_reset); nothing else."""
    return _fetch(conn, "demo_reset", {"prefix": PREFIX})[0]


def register(conn: psycopg.Connection, url: str, keys: dict[str, str], settings: Settings) -> None:
    # The demo's receiver is on loopback: these destinations, and only they, may reach it.
    for d in DESTINATIONS:
        spec = DestinationSpec(
            destination_id=d.destination_id,
            url=f"{url}{d.destination_id}",
            secrets=(keys[d.destination_id],),
            rate_per_second=d.rate_per_second,
            burst=d.burst,
            max_in_flight=d.max_in_flight,
            timeout_seconds=d.timeout_seconds,
            max_attempts=5,
            backoff_base_seconds=1.0,
            backoff_cap_seconds=3.0,
            allow_private_url=True,
        )
        upsert_destination(conn, spec, settings)


def _unfinished(url: str) -> dict[str, Any]:
    with db.connect(url, autocommit=True) as conn:
        return _fetch(conn, "demo_unfinished", {"destination_ids": _ids()})[0]


def left_to_send(left: dict[str, Any]) -> str:
    """What a run left behind, from ``demo_unfinished``: how many, and why they failed."""
    why = [f"{n} {outcome}" for outcome, n in sorted(left["last_outcomes"].items())]
    if left["held_by_a_run"]:
        why.append(f"{left['held_by_a_run']} still held by a run")
    return f"{left['unfinished']} delivery(ies) to send again (last outcome: {', '.join(why)})"


def next_run(wait_seconds: float) -> str:
    if wait_seconds <= 0:
        return "due now, so the next run starts at once"
    return (
        f"the first is due in {wait_seconds:.1f}s (retry backoff, or a pause a 429's "
        "Retry-After asked for); the next run starts then"
    )


# A run's counts, in the order they add up to what it claimed.
RUN_COUNTS = (
    ("succeeded", "succeeded"),
    ("retried", "retried"),
    ("rate_limited", "rate-limited"),
    ("dead", "dead"),
    ("deferred", "handed back unsent"),
    ("skipped", "skipped"),
    ("guard_refused", "refused by the SSRF guard"),
)


def run_line(run_id: str, claimed: int, totals: dict[str, int]) -> str:
    """A run's progress line: what it claimed, and where each claimed delivery went (the
    counts that are zero, after the first four, are left out)."""
    parts = [
        f"{words} {totals.get(key, 0)}"
        for number, (key, words) in enumerate(RUN_COUNTS)
        if number < 4 or totals.get(key, 0)
    ]
    return f"  run {run_id}: claimed {claimed} = " + " + ".join(parts)


def deliver_until_idle(settings: Settings, url: str, say: Callable[[str], None]) -> list[dict]:
    """Run the Dagster delivery job for the demo's destinations until none of their deliveries
    is left to send; deliveries waiting on a retry time or a pause are waited for, up to
    MAX_DELIVERY_SECONDS."""
    # Dagster loads only here: the rest of the demo (and its errors) stays fast.
    from media_hooks.orchestration.instance import open_instance
    from media_hooks.orchestration.running import execute_delivery

    runs: list[dict] = []
    instance = open_instance(settings)
    deadline = time.monotonic() + MAX_DELIVERY_SECONDS
    while True:
        run = execute_delivery(
            instance, {"destination_ids": _ids()}, tags={"media_hooks/trigger": "demo"}
        )
        if not run.success:
            with db.connect(url, autocommit=True) as conn:
                sweeps.release_run(conn, run.run_id)
            raise RuntimeFailure(
                f"delivery run {run.run_id} failed; its steps' errors are in the Dagster UI "
                "(`media-hooks dev`)"
            )
        runs.append(run.summary.as_dict())
        say(run_line(run.run_id, run.summary.claimed, run.summary.totals))
        left = _unfinished(url)
        if not left["unfinished"] or left["due_in_seconds"] is None:
            return runs
        wait = max(left["due_in_seconds"], 0.0)
        if time.monotonic() + wait > deadline:
            say(
                f"  {left_to_send(left)}, the first due in {wait:.1f}s: past the demo's "
                f"{MAX_DELIVERY_SECONDS:.0f}s, so it stops here"
            )
            return runs
        say(f"  {left_to_send(left)}: {next_run(wait)}")
        # The next run is worth starting only once something is due again.
        time.sleep(wait)


def summarize(conn: psycopg.Connection) -> list[dict[str, Any]]:
    return _fetch(conn, "demo_summary", {"destination_ids": _ids()})


def rate_limit_pauses(conn: psycopg.Connection) -> dict[str, list[tuple[float, float]]]:
    """Each demo destination's pauses a 429 asked for, for the chart."""
    pauses: dict[str, list[tuple[float, float]]] = {d: [] for d in _ids()}
    for row in _fetch(conn, "demo_pauses", {"destination_ids": _ids()}):
        pauses[row["destination_id"]].append((row["paused_at"], row["resumed_at"]))
    return pauses


def request_starts(conn: psycopg.Connection) -> dict[str, dict[int, int]]:
    series: dict[str, dict[int, int]] = {d: {} for d in _ids()}
    for row in _fetch(conn, "demo_request_starts", {"destination_ids": _ids()}):
        series[row["destination_id"]][row["second"]] = row["starts"]
    return series


def run_demo(settings: Settings, say: Callable[[str], None] = print) -> DemoResult:
    started = time.monotonic()
    url = db.ready_url(settings)
    keys = {d.destination_id: new_secret() for d in DESTINATIONS}
    with Receiver(secrets=list(keys.values()), script=misbehaviour) as receiver:
        say(f"receiver listening on {receiver.url} (verifying signatures, deduplicating)")
        with db.connect(url, autocommit=True) as conn:
            removed = reset(conn)
            if removed["deliveries"] or removed["destinations"]:
                say(f"removed the previous demo's {removed['deliveries']} delivery(ies)")
            register(conn, receiver.url, keys, settings)
            counts = emit_many(conn, demo_events())
        limits = ", ".join(f"{d.destination_id} {d.rate_per_second:g}/s" for d in DESTINATIONS)
        say(f"registered {len(DESTINATIONS)} destinations ({limits})")
        say(f"emitted {counts.inserted} media events; running the Dagster delivery job")
        runs = deliver_until_idle(settings, url, say)
        seen = {
            "requests": receiver.request_count,
            "accepted_ids": receiver.effects,
            "duplicate_requests": sum(1 for r in receiver.requests if r.duplicate),
            "rejected_signatures": sum(1 for r in receiver.requests if r.verified is False),
        }
    with db.connect(url, autocommit=True) as conn:
        rows = summarize(conn)
        series = request_starts(conn)
        pauses = rate_limit_pauses(conn)
    unfinished = _unfinished(url)["earliest"]
    chart = plot_request_rates(
        series,
        {d.destination_id: Limit(d.rate_per_second, d.burst) for d in DESTINATIONS},
        settings.home / "demo" / "request_rate.png",
        title="media-hooks demo: request starts against each destination's limit",
        pauses=pauses,
    )
    return DemoResult(
        destinations=rows,
        runs=runs,
        receiver=seen,
        chart=chart,
        seconds=round(time.monotonic() - started, 1),
        examples={
            "succeeded": delivery_id("demo-cdn", 1),
            "ambiguous_then_succeeded": delivery_id(MISBEHAVING, SLOW),
            "rate_limited_then_succeeded": delivery_id(MISBEHAVING, 20),
            "dead": delivery_id(MISBEHAVING, REJECTED),
            # The earliest delivery still pending when the demo stopped (rarely any).
            **({"unfinished": unfinished} if unfinished else {}),
        },
    )
