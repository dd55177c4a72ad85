"""The outbox in Dagster's catalog: the asset ``media_hooks/outbox`` and the checks an operator
must be able to trust.

Every delivery run materializes the outbox as it leaves it (``record_after_run``, from the
run's summary step): its figures, and a table of every destination with its state (enabled,
paused until when, disabled by what and why), what waits for it and since when, so the asset's
page says which publisher is behind and why. Its checks:

- each invariant ``media-hooks check`` verifies (ERROR), with the ids that break it;
- the oldest due delivery's age and the relay lag against the alert thresholds
  (``MEDIA_HOOKS_ALERT_OLDEST_DUE_SECONDS``, ``MEDIA_HOOKS_ALERT_RELAY_LAG_SECONDS``): WARN past
  the threshold, ERROR past ``ERROR_FACTOR`` times it;
- ``oldest_snapshot``: the same against ``MEDIA_HOOKS_ALERT_OLDEST_SNAPSHOT_SECONDS``, for the
  oldest transaction of another session (it keeps vacuum from what deliveries leave behind),
  naming its pid and application_name;
- ``partitions_ahead``: WARN when the history tables' partitions are made less than
  ``MEDIA_HOOKS_ALERT_PARTITIONS_AHEAD_SECONDS`` ahead, ERROR when none is left ahead (an emit
  would fail);
- ``destinations_sending``: WARN while a destination is disabled (the SSRF guard, a 410, the
  circuit breaker, an operator), naming each;
- ``last_run_delivered``: WARN when the newest delivery run delivered nothing while work was
  due (it also says so in the run list: the run's ``alert`` tag).

They are evaluated after every delivery run, every ``CHECK_INTERVAL_SECONDS`` by
``outbox_checks_sensor`` (evaluations without a run: the run list stays the deliveries'), and
on demand from the asset's page (``outbox_checks``, Dagster's "Execute"). Their history is the
checks' tab of the asset. The freshness policy says when the recovery clock stopped: no
delivery run for ``RECOVERY_CLOCK``. The figures come from ``media_hooks.observe``: nothing is
measured here.
"""

# No `from __future__ import annotations`: Dagster reads the check's context annotation as a
# type, not a string.
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    FreshnessPolicy,
    MetadataValue,
    OpExecutionContext,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    multi_asset_check,
    sensor,
)

from media_hooks.core.config import Settings
from media_hooks.observe import checks, figures, health
from media_hooks.orchestration.alerts import Thresholds
from media_hooks.orchestration.metadata import ALERT_TAG, NOTHING_DELIVERED, markdown_table
from media_hooks.orchestration.resources import DeliverySettingsResource, PostgresResource

OUTBOX = AssetKey(["media_hooks", "outbox"])
DELIVERY_JOB = "deliver_webhooks"
# ERROR once a figure is this many times its alert threshold (WARN from the threshold on).
ERROR_FACTOR = 4
CHECK_INTERVAL_SECONDS = 300
# The nightly run is the recovery clock: without a delivery run for this long, it has stopped
# (the daemon is down, the schedule was turned off).
RECOVERY_CLOCK = timedelta(hours=26)

outbox = AssetSpec(
    OUTBOX,
    description="The transactional outbox in PostgreSQL: webhook_delivery (every delivery and "
    "its state), dispatch_outbox (each dispatch, with the run id), delivery_attempt and the "
    "destinations. Every delivery run (deliver_webhooks) materializes it as it leaves it: its "
    "figures and, per destination, its state, what waits for it and why. Its checks are the "
    "invariants of `media-hooks check`, the lateness figures against the alert thresholds, the "
    "destinations that send nothing, and whether the newest run delivered what was due.",
    group_name="media_hooks",
    kinds={"postgres"},
    freshness_policy=FreshnessPolicy.time_window(fail_window=RECOVERY_CLOCK),
)

OLDEST_DUE = "oldest_due_age"
RELAY_LAG = "relay_lag"
OLDEST_SNAPSHOT = "oldest_snapshot"
PARTITIONS_AHEAD = "partitions_ahead"
DESTINATIONS = "destinations_sending"
LAST_RUN = "last_run_delivered"
_FIGURE_CHECKS = {
    OLDEST_DUE: (
        "The oldest delivery due now and sendable waits less than the alert threshold "
        "(MEDIA_HOOKS_ALERT_OLDEST_DUE_SECONDS, 900 s): WARN past it, ERROR past "
        f"{ERROR_FACTOR} times it."
    ),
    RELAY_LAG: (
        "The oldest outbox message still waited for was published within the alert threshold "
        f"(MEDIA_HOOKS_ALERT_RELAY_LAG_SECONDS, 900 s): WARN past it, ERROR past {ERROR_FACTOR} "
        "times it."
    ),
    OLDEST_SNAPSHOT: (
        "No other session has held a transaction open past the alert threshold "
        "(MEDIA_HOOKS_ALERT_OLDEST_SNAPSHOT_SECONDS, 3600 s): while one is open, vacuum keeps "
        "every row version deliveries leave behind and claims slow down. WARN past it, naming "
        f"the session (pid, application_name), ERROR past {ERROR_FACTOR} times it."
    ),
    PARTITIONS_AHEAD: (
        "The history tables' partitions are made at least the alert threshold ahead "
        "(MEDIA_HOOKS_ALERT_PARTITIONS_AHEAD_SECONDS, 86400 s; delivery runs and the retention "
        "job make a week ahead): WARN under it, ERROR when none is left ahead, where every emit "
        "fails."
    ),
    DESTINATIONS: (
        "No destination is disabled (by the SSRF guard, a 410, the circuit breaker, settings out "
        "of range or an operator): WARN naming each, what disabled it and what waits for it."
    ),
    LAST_RUN: (
        "The newest delivery run delivered something when work was due: WARN when it claimed "
        "deliveries and delivered none, or found only deliveries of disabled destinations."
    ),
}
INVARIANTS = (*checks.CHECKS, checks.COUNTS)
SPECS = [
    AssetCheckSpec(c.name, asset=OUTBOX, description=f"Invariant: {c.invariant}.")
    for c in INVARIANTS
] + [AssetCheckSpec(name, asset=OUTBOX, description=text) for name, text in _FIGURE_CHECKS.items()]


@dataclass(frozen=True)
class Verdict:
    """One check's result, as a run's step yields it or a sensor records it without a run."""

    name: str
    passed: bool
    description: str
    severity: AssetCheckSeverity = AssetCheckSeverity.ERROR
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def result(self) -> AssetCheckResult:
        return AssetCheckResult(
            check_name=self.name,
            asset_key=OUTBOX,
            passed=self.passed,
            severity=self.severity,
            description=self.description,
            metadata=dict(self.metadata),
        )

    def evaluation(self) -> AssetCheckEvaluation:
        return AssetCheckEvaluation(
            asset_key=OUTBOX,
            check_name=self.name,
            passed=self.passed,
            severity=self.severity,
            description=self.description,
            metadata=dict(self.metadata),
        )


@dataclass(frozen=True)
class OutboxHealth:
    """One reading of the outbox: the figures, each destination's oldest due delivery, and the
    invariants."""

    figures: figures.Figures
    oldest_due: dict[str, datetime]
    invariants: checks.Report

    @property
    def disabled(self) -> list[health.Disabled]:
        return health.disabled_destinations(self.figures)


def measure(
    conn: psycopg.Connection,
    settings: Settings,
    *,
    since: datetime | None = None,
    history: bool = True,
) -> OutboxHealth:
    """Reads the outbox (``conn``: autocommit, in the operator's role), as `media-hooks status`
    and `media-hooks check` read it. ``since``: the checks read the history from that instant
    (the database's clock) instead of the last day: a delivery run's summary reads what
    happened since the run began. ``history=False``: nothing counts the succeeded history
    retention keeps (figures.measure, checks.Options.succeeded), so the reading costs what the
    day or the run did, not what the weeks before it left (a run's summary, the sensor's
    ticks; the asset page's "Execute" reads it all)."""
    options = checks.Options(hold_seconds=settings.lease_seconds, since=since, succeeded=history)
    return OutboxHealth(
        figures=figures.measure(conn, history=history),
        oldest_due=figures.oldest_due_by_destination(conn),
        invariants=checks.run(conn, options),
    )


# Checks whose examples are not deliveries: permits (destination#slot) and the counts.
_NOT_DELIVERIES = {"permits_past_hold", checks.COUNTS.name}


def invariant_verdict(result: checks.Result, since: datetime | None) -> Verdict:
    """``since``: where the history the check read begins (a run's start, a day ago; None: all
    of it), shown beside the verdict."""
    read = {"history_read_since": "all of it" if since is None else since.isoformat("T", "seconds")}
    if result.holds:
        return Verdict(
            result.name, True, f"Holds: {result.invariant}.", metadata={"violations": 0, **read}
        )
    ids = list(result.examples)
    metadata: dict[str, Any] = {
        "violations": result.violations,
        "ids": MetadataValue.json(ids),
        **read,
    }
    if result.name not in _NOT_DELIVERIES:
        # An attempt is named delivery#attempt: its delivery's story is what to read.
        deliveries = dict.fromkeys(i.split("#")[0] for i in ids)
        metadata["inspect"] = MetadataValue.md(
            "\n".join(f"- `media-hooks inspect {d}`" for d in deliveries)
        )
    return Verdict(
        result.name,
        False,
        f"{result.violations} row(s) break it ({', '.join(ids)}): {result.invariant}.",
        metadata=metadata,
    )


def _age(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds:.0f} s"


def threshold_verdict(name: str, what: str, seconds: float | None, threshold: float) -> Verdict:
    """WARN from ``threshold`` on, ERROR from ``ERROR_FACTOR`` times it."""
    value = seconds or 0.0
    metadata = {
        f"{name}_seconds": MetadataValue.float(value),
        "warn_at_seconds": MetadataValue.float(threshold),
        "error_at_seconds": MetadataValue.float(threshold * ERROR_FACTOR),
    }
    if value < threshold:
        return Verdict(
            name, True, f"{what}: {_age(seconds)}, below {threshold:g} s.", metadata=metadata
        )
    severity = (
        AssetCheckSeverity.ERROR if value >= threshold * ERROR_FACTOR else AssetCheckSeverity.WARN
    )
    return Verdict(
        name,
        False,
        f"{what}: {value:.0f} s, past {threshold:g} s (`media-hooks status`).",
        severity,
        metadata,
    )


def snapshot_verdict(f: figures.Figures, threshold: float) -> Verdict:
    """``threshold_verdict`` on the oldest snapshot, naming the session that holds it."""
    verdict = threshold_verdict(
        OLDEST_SNAPSHOT, "oldest snapshot", f.oldest_snapshot_age_seconds, threshold
    )
    if verdict.passed or f.oldest_snapshot is None:
        return verdict
    return replace(
        verdict,
        description=f"{f.oldest_snapshot.describe()} holds back vacuum, past {threshold:g} s: "
        "end the session or let it finish (`media-hooks status`).",
    )


def partitions_verdict(f: figures.Figures, threshold: float) -> Verdict:
    """WARN under ``threshold`` of partitions made ahead, ERROR when none is left ahead."""
    ahead = f.partitions_ahead_seconds
    metadata = {
        "partitions_ahead_seconds": MetadataValue.float(ahead or 0.0),
        "warn_under_seconds": MetadataValue.float(threshold),
    }
    if ahead is None or ahead >= threshold:
        return Verdict(
            PARTITIONS_AHEAD,
            True,
            f"history partitions made {_age(ahead)} ahead, at least {threshold:g} s.",
            metadata=metadata,
        )
    return Verdict(
        PARTITIONS_AHEAD,
        False,
        f"history partitions made only {max(ahead, 0):.0f} s ahead, under {threshold:g} s: an "
        "emit past them fails; a delivery run or the retention job makes more.",
        AssetCheckSeverity.ERROR if ahead <= 0 else AssetCheckSeverity.WARN,
        metadata,
    )


def destinations_table(reading: OutboxHealth) -> str:
    """Every destination with something to say: its state, why, what waits and since when."""
    f = reading.figures
    paused = {p.destination_id: p for p in f.paused}
    disabled = {d.destination_id: d for d in reading.disabled}
    rows = []
    for destination in sorted(set(f.counts) | set(paused) | set(disabled)):
        counts = f.counts.get(destination, {})
        oldest = reading.oldest_due.get(destination)
        late = _age((f.measured_at - oldest).total_seconds()) if oldest else "none"
        if destination in disabled:
            off = disabled[destination]
            state, why = f"disabled {off.cause_words}", off.reason
        elif destination in paused:
            state = f"paused until {paused[destination].paused_until:%Y-%m-%d %H:%M:%S} UTC"
            why = paused[destination].paused_reason or ""
        else:
            state, why = "enabled", ""
        rows.append(
            [
                destination,
                state,
                counts.get("pending", 0),
                late,
                counts.get("dead", 0),
                why.replace("|", "/"),
            ]
        )
    return markdown_table(["destination", "state", "pending", "oldest due", "dead", "why"], rows)


def destinations_verdict(reading: OutboxHealth) -> Verdict:
    table = MetadataValue.md(destinations_table(reading))
    off = reading.disabled
    if not off:
        return Verdict(
            DESTINATIONS, True, "Every destination is enabled.", metadata={"destinations": table}
        )
    return Verdict(
        DESTINATIONS,
        False,
        "; ".join(d.describe() for d in off)
        + ". Nothing is lost; `media-hooks destination enable ID` once fixed.",
        AssetCheckSeverity.WARN,
        {
            "disabled": MetadataValue.json({d.destination_id: d.cause for d in off}),
            "destinations": table,
        },
    )


def last_run_verdict(run_id: str | None, tags: Mapping[str, str]) -> Verdict:
    """From a delivery run's tags (its summary writes them): did it deliver what was due?"""
    if run_id is None:
        return Verdict(LAST_RUN, True, "No delivery run has finished yet.")
    metadata = {
        "run_id": run_id,
        "outcome": tags.get("media_hooks/outcome", "none (the run ended before its summary)"),
        "claimed": tags.get("media_hooks/claimed", "?"),
        "delivered": tags.get("media_hooks/delivered", "?"),
    }
    alert = tags.get(ALERT_TAG)
    if alert != NOTHING_DELIVERED:
        return Verdict(LAST_RUN, True, f"Run {run_id}: {metadata['outcome']}.", metadata=metadata)
    return Verdict(
        LAST_RUN,
        False,
        f"Run {run_id} delivered nothing while work was due ({metadata['outcome']}, claimed "
        f"{metadata['claimed']}): see `destinations_sending` and the run's page.",
        AssetCheckSeverity.WARN,
        metadata,
    )


def verdicts(reading: OutboxHealth, thresholds: Thresholds, last_run: Verdict) -> list[Verdict]:
    f = reading.figures
    late = threshold_verdict(
        OLDEST_DUE, "oldest due delivery", f.oldest_due_age_seconds, thresholds.oldest_due_seconds
    )
    # Which publisher is behind: each destination's oldest due delivery, beside the figure.
    table = MetadataValue.md(destinations_table(reading))
    late = replace(late, metadata={**late.metadata, "destinations": table})
    return [
        *(invariant_verdict(r, reading.invariants.since) for r in reading.invariants.results),
        late,
        threshold_verdict(
            RELAY_LAG, "relay lag", f.relay_lag_seconds, thresholds.relay_lag_seconds
        ),
        snapshot_verdict(f, thresholds.oldest_snapshot_seconds),
        partitions_verdict(f, thresholds.partitions_ahead_seconds),
        destinations_verdict(reading),
        last_run,
    ]


def materialization(reading: OutboxHealth) -> AssetMaterialization:
    f = reading.figures
    totals = f.totals
    # A delivery run's reading leaves the succeeded history out: no count beats a wrong 0.
    states = ("pending", "enqueued", "leased", *(("succeeded",) if f.history else ()))
    return AssetMaterialization(
        asset_key=OUTBOX,
        description=f.headline(),
        metadata={
            **{state: totals[state] for state in states},
            "dead_letters": f.dead_letters,
            "oldest_due_age_seconds": MetadataValue.float(f.oldest_due_age_seconds or 0.0),
            "oldest_due_any_age_seconds": MetadataValue.float(f.oldest_due_any_age_seconds or 0.0),
            "relay_lag_seconds": MetadataValue.float(f.relay_lag_seconds or 0.0),
            "expired_leases": f.expired_leases,
            "destinations_disabled": len(f.disabled),
            "destinations_paused": len(f.paused),
            "destinations": MetadataValue.md(destinations_table(reading)),
        },
    )


def record_after_run(
    context: OpExecutionContext, reading: OutboxHealth, run_tags: Mapping[str, str]
) -> list[Verdict]:
    """A delivery run's end: the outbox materialized as the run leaves it, every check
    evaluated; the verdicts, for the run's summary."""
    context.log_event(materialization(reading))
    found = verdicts(reading, Thresholds.from_env(), last_run_verdict(context.run_id, run_tags))
    for verdict in found:
        context.log_event(verdict.evaluation())
    return found


def newest_delivery_run(instance: DagsterInstance) -> tuple[str | None, Mapping[str, str]]:
    finished = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]
    records = instance.get_run_records(
        filters=RunsFilter(job_name=DELIVERY_JOB, statuses=finished), limit=1
    )
    if not records:
        return None, {}
    run = records[0].dagster_run
    return run.run_id, run.tags


def _current(
    instance: DagsterInstance, conn, settings: Settings, *, history: bool = True
) -> list[Verdict]:
    reading = measure(conn, settings, history=history)
    return verdicts(
        reading, Thresholds.from_env(), last_run_verdict(*newest_delivery_run(instance))
    )


@multi_asset_check(
    specs=SPECS,
    name="outbox_checks",
    description="Reads the outbox once (one snapshot for the invariants) and evaluates the "
    "checks of media_hooks/outbox that were asked for (each can be executed on its own).",
    can_subset=True,
)
def outbox_checks(
    context: AssetCheckExecutionContext,
    postgres: PostgresResource,
    delivery_settings: DeliverySettingsResource,
) -> Iterator[AssetCheckResult]:
    with postgres.connection() as conn:
        found = _current(context.instance, conn, delivery_settings.settings())
    asked = {key.name for key in context.selected_asset_check_keys}
    for verdict in found:
        if verdict.name in asked:
            yield verdict.result()


def summary_line(found: Sequence[Verdict]) -> str:
    failing = [v for v in found if not v.passed]
    if not failing:
        return f"all {len(found)} outbox checks pass"
    return f"{len(failing)} of {len(found)} outbox checks fail: " + "; ".join(
        f"{v.name} ({v.severity.value}): {v.description.rstrip('.')}" for v in failing
    )


def build_outbox_checks_sensor(
    *, interval_seconds: int = CHECK_INTERVAL_SECONDS, name: str = "outbox_checks_sensor"
) -> SensorDefinition:
    @sensor(
        name=name,
        minimum_interval_seconds=interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description="Evaluates the checks of media_hooks/outbox every "
        f"{interval_seconds // 60} minutes, without a run (the run list stays the "
        "deliveries'); their history is on the asset's checks tab.",
    )
    def _outbox_checks(
        context: SensorEvaluationContext,
        postgres: PostgresResource,
        delivery_settings: DeliverySettingsResource,
    ) -> SensorResult:
        with postgres.connection() as conn:
            # Every few minutes: the day's history, not the weeks retention keeps.
            found = _current(context.instance, conn, delivery_settings.settings(), history=False)
        line = summary_line(found)
        context.log.info(line)
        return SensorResult(asset_events=[v.evaluation() for v in found], cursor=line[:1000])

    return _outbox_checks
