"""The outbox in Dagster's catalog (media_hooks.orchestration.outbox_asset), executed by Dagster:
its checks run as the UI's "Execute" runs them, by the sensor that evaluates them without a run,
and by every delivery run, which materializes the outbox and tags a run that needs a look."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from dagster import AssetCheckSeverity, DagsterEventType, build_sensor_context

from bench.sustained_history import preload
from media_hooks.observe import checks, figures
from media_hooks.orchestration import outbox_asset
from media_hooks.orchestration.alerts import Thresholds
from media_hooks.orchestration.definitions import defs, outbox_checks_sensor
from media_hooks.orchestration.metadata import ALERT_TAG
from media_hooks.orchestration.resources import DeliverySettingsResource, PostgresResource
from media_hooks.outbox.destinations import disable_destination
from media_hooks_tests.factories import add_deliveries, add_destination
from media_hooks_tests.interleaving import snapshot_held, wait_for
from media_hooks_tests.observe.test_checks import BREAKS, history  # noqa: F401 (a fixture)
from media_hooks_tests.orchestration.conftest import deliver
from media_hooks_tests.plans import rows_fetched

INVARIANT_NAMES = [c.name for c in (*checks.CHECKS, checks.COUNTS)]


def _execute_checks(instance, database_url: str) -> dict[str, object]:
    """The outbox's checks run by Dagster as the asset page's "Execute all" runs them: {check
    name: its evaluation}."""
    job = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection=set(),
        asset_check_selection={spec.key for spec in outbox_asset.SPECS},
    )
    result = job.execute_in_process(
        instance=instance,
        run_config={"resources": {"postgres": {"config": {"database_url": database_url}}}},
    )
    assert result.success
    evaluations = [
        event.event_specific_data
        for event in result.all_events
        if event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
    ]
    return {e.check_name: e for e in evaluations}


def test_a_clean_outbox_passes_every_check(own_instance, database_url, history):  # noqa: F811
    found = _execute_checks(own_instance, database_url)
    assert sorted(found) == sorted(spec.name for spec in outbox_asset.SPECS)
    assert [name for name, e in found.items() if not e.passed] == []


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_broken_invariant_fails_its_check_with_the_ids(
    own_instance,
    database_url,
    history,  # noqa: F811
    name,
):
    """The database broken as test_checks.py breaks it: the invariant's check fails (ERROR)
    with the id that breaks it in its metadata, as `media-hooks check` reports it."""
    statement, example = BREAKS[name]
    history.execute(statement)
    found = _execute_checks(own_instance, database_url)
    reported = {r.name for r in checks.run(history).failed()}
    assert {n for n in INVARIANT_NAMES if not found[n].passed} == reported
    evaluation = found[name]
    assert evaluation.severity == AssetCheckSeverity.ERROR
    assert evaluation.metadata["ids"].value == [example]
    assert evaluation.metadata["violations"].value == 1
    assert example in evaluation.description
    # The history of every check is kept by Dagster: this evaluation is the newest.
    newest = own_instance.event_log_storage.get_asset_check_execution_history(
        check_key=next(s.key for s in outbox_asset.SPECS if s.name == name), limit=1
    )
    assert newest[0].status.value == "FAILED"


def _tick_checks(instance, database_url: str):
    with build_sensor_context(
        instance=instance,
        resources={
            "postgres": PostgresResource(database_url=database_url),
            "delivery_settings": DeliverySettingsResource(),
        },
    ) as context:
        return outbox_checks_sensor(context)


def test_the_sensor_evaluates_every_check_without_a_run(own_instance, database_url, history):  # noqa: F811
    history.execute(BREAKS["delivery_without_identity"][0])
    result = _tick_checks(own_instance, database_url)
    by_name = {e.check_name: e for e in result.asset_events}
    assert sorted(by_name) == sorted(spec.name for spec in outbox_asset.SPECS)
    assert [name for name, e in by_name.items() if not e.passed] == ["delivery_without_identity"]
    assert result.run_requests == []
    # The sensor's page shows each tick's cursor: what fails, in words.
    assert result.cursor.startswith(
        f"1 of {len(outbox_asset.SPECS)} outbox checks fail: delivery_without_identity (ERROR): 1 row(s) break it "
        "(d-pub-2): every delivery holds its identity row (invariant 8)"
    )


def test_a_runs_reading_checks_the_live_rows_and_what_happened_since_it_began(
    history,  # noqa: F811
    settings,
):
    """A delivery run's summary reads the outbox since the run began: the live rows (leases,
    open attempts) whenever they were made, the history from that instant on, and no count of
    the succeeded history. The reading of the sensor and of the asset page stays whole."""
    for name in ("open_attempt_past_lease", "two_successes"):
        history.execute(BREAKS[name][0])
    began = history.execute("SELECT now() AS began").fetchone()["began"]

    run = outbox_asset.measure(history, settings, since=began, history=False)
    whole = outbox_asset.measure(history, settings)

    assert {r.name for r in whole.invariants.failed()} == {
        "open_attempt_past_lease",
        "two_successes",
        "send_without_reason",  # the second success's send, after a success
    }
    # The two successes began before the run: the day's reading answers for them.
    assert {r.name for r in run.invariants.failed()} == {"open_attempt_past_lease"}
    assert (run.invariants.since, whole.invariants.since < began) == (began, True)
    verdicts = {v.name: v for v in outbox_asset.verdicts(run, Thresholds(), _no_run())}
    shown = verdicts["open_attempt_past_lease"].metadata["history_read_since"]
    assert shown == began.isoformat("T", "seconds")
    # Counts without the succeeded history, on both sides of counts_by_state, which holds.
    assert (run.figures.totals["succeeded"], whole.figures.totals["succeeded"]) == (0, 3)
    assert "counts_by_state" not in {r.name for r in run.invariants.failed()}
    run_metadata = outbox_asset.materialization(run).metadata
    assert "succeeded" not in run_metadata and run_metadata["leased"].value == 3
    assert outbox_asset.materialization(whole).metadata["succeeded"].value == 3


def _no_run() -> outbox_asset.Verdict:
    return outbox_asset.last_run_verdict(None, {})


def test_each_reading_costs_what_its_span_did_not_the_history_beside_it(
    own_instance, conn, database_url, settings
):
    """Beside an hour of 3,000 delivered deliveries (each in history with its body, dispatch,
    attempt and identity, in their partitions): a run's summary fetches a few rows; a tick of the sensor reads the day's checks
    but counts no succeeded history; the asset page's "Execute" reads it all."""
    add_destination(conn, "cdn", url="http://127.0.0.1:9/")
    preload(database_url, 3_000, ["cdn"], span_seconds=3_600)
    add_deliveries(conn, "cdn", 5)
    began = conn.execute("SELECT now() AS began").fetchone()["began"]

    def fetched(read) -> int:
        before = rows_fetched(conn)
        read()
        return rows_fetched(conn) - before

    by_run = fetched(lambda: outbox_asset.measure(conn, settings, since=began, history=False))
    by_tick = fetched(lambda: _tick_checks(own_instance, database_url))
    by_execute = fetched(lambda: _execute_checks(own_instance, database_url))

    # Seen: 68, 24,078 and 39,080 (each check reads the hour through its own index; the whole
    # reading also counts the 3,000 succeeded deliveries, twice, and the day's attempts).
    assert by_run < 300, by_run
    assert by_tick > 6_000 and by_execute - by_tick >= 6_000, (by_tick, by_execute)


def test_lateness_warns_past_its_threshold_and_errs_past_four_times_it(
    own_instance, database_url, conn, monkeypatch
):
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_OLDEST_DUE_SECONDS", "60")
    add_destination(conn, "late")
    add_deliveries(conn, "late", 1, due_seconds_ago=120)
    warned = _execute_checks(own_instance, database_url)["oldest_due_age"]
    assert (warned.passed, warned.severity) == (False, AssetCheckSeverity.WARN)
    assert warned.metadata["error_at_seconds"].value == 240
    conn.execute("UPDATE webhook_delivery_all SET next_attempt_at = now() - interval '5 minutes'")
    erred = _execute_checks(own_instance, database_url)["oldest_due_age"]
    assert (erred.passed, erred.severity) == (False, AssetCheckSeverity.ERROR)
    assert _execute_checks(own_instance, database_url)["relay_lag"].passed


def test_a_transaction_left_open_fails_the_snapshot_check_naming_its_session(
    own_instance, database_url, conn, monkeypatch
):
    """A session idle in its transaction keeps vacuum from what deliveries leave behind: past
    four times the threshold the check is an ERROR naming the session; ended, it passes."""
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_OLDEST_SNAPSHOT_SECONDS", "0.25")
    with snapshot_held(database_url) as pid:
        wait_for(
            lambda: (figures.measure(conn).oldest_snapshot_age_seconds or 0) >= 1,
            "the open transaction to be a second old",
        )
        erred = _execute_checks(own_instance, database_url)["oldest_snapshot"]
    assert (erred.passed, erred.severity) == (False, AssetCheckSeverity.ERROR)
    assert f"(pid {pid}, application_name 'nightly-report', idle in transaction)" in (
        erred.description
    )
    assert _execute_checks(own_instance, database_url)["oldest_snapshot"].passed


def test_the_snapshot_check_warns_from_its_threshold_and_errs_from_four_times_it():
    holder = figures.SnapshotHolder(42, "nightly-report", "active", datetime.now(UTC), 0.0)
    at = datetime.now(UTC)

    def verdict(age: float | None) -> outbox_asset.Verdict:
        held = None if age is None else replace(holder, age_seconds=age)
        f = figures.Figures(at, {}, None, None, None, None, None, 0, 0, None, oldest_snapshot=held)
        return outbox_asset.snapshot_verdict(f, 3600.0)

    assert verdict(None).passed and verdict(3599.0).passed
    assert (verdict(3600.0).passed, verdict(3600.0).severity) == (False, AssetCheckSeverity.WARN)
    assert verdict(14400.0).severity == AssetCheckSeverity.ERROR
    assert "pid 42" in verdict(3600.0).description


def test_partitions_made_less_than_the_threshold_ahead_warn_from_the_asset_check(
    own_instance, database_url, monkeypatch
):
    """Migrations and delivery runs make a week of partitions ahead: a threshold of thirty days
    finds them short, and the check names how far ahead they reach; at its default it passes."""
    assert _execute_checks(own_instance, database_url)["partitions_ahead"].passed
    monkeypatch.setenv("MEDIA_HOOKS_ALERT_PARTITIONS_AHEAD_SECONDS", str(30 * 86400))
    warned = _execute_checks(own_instance, database_url)["partitions_ahead"]
    assert (warned.passed, warned.severity) == (False, AssetCheckSeverity.WARN)
    assert "an emit past them fails" in warned.description


def test_the_partitions_check_errs_once_none_is_left_ahead():
    at = datetime.now(UTC)

    def verdict(ahead: float | None) -> outbox_asset.Verdict:
        f = figures.Figures(at, {}, None, None, None, None, None, 0, 0, None)
        return outbox_asset.partitions_verdict(replace(f, partitions_ahead_seconds=ahead), 86400.0)

    assert verdict(None).passed and verdict(86400.0).passed
    assert (verdict(3600.0).passed, verdict(3600.0).severity) == (False, AssetCheckSeverity.WARN)
    assert verdict(0.0).severity == AssetCheckSeverity.ERROR
    assert verdict(-60.0).severity == AssetCheckSeverity.ERROR


def _evaluations_of(instance, run_id: str) -> dict[str, object]:
    records = instance.get_records_for_run(
        run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION
    ).records
    return {
        r.event_log_entry.dagster_event.event_specific_data.check_name: (
            r.event_log_entry.dagster_event.event_specific_data
        )
        for r in records
    }


def test_a_run_against_a_guard_disabled_destination_is_not_green_anywhere(
    own_instance, database_url, conn, receiver, monkeypatch
):
    """Issue 35's first webhook: a run with the guard on meets a destination on 127.0.0.1.
    It delivers nothing and disables it: the run says so in its first tag, the outbox's
    destination check turns WARN naming it, and so does the next run, which finds nothing it
    may send."""
    add_destination(conn, "mine", receiver.url + "hook", max_in_flight=1)
    add_deliveries(conn, "mine", 3)
    # This in-process run reads the guard from the environment as it starts its step.
    monkeypatch.setenv("MEDIA_HOOKS_ALLOW_PRIVATE_URLS", "0")

    first = deliver(own_instance, database_url)
    second = deliver(own_instance, database_url)

    assert first.success and second.success  # what receivers answered never fails a run
    assert receiver.request_count == 0
    tags = [own_instance.get_run_by_id(r.run_id).tags for r in (first, second)]
    assert [(t["media_hooks/outcome"], t[ALERT_TAG]) for t in tags] == [
        ("nothing-delivered", "nothing delivered"),
        ("nothing-sendable", "nothing delivered"),
    ]
    # In the run list's key order, the alert comes first.
    assert sorted(tags[0])[0] == ALERT_TAG
    for run in (first, second):
        evaluations = _evaluations_of(own_instance, run.run_id)
        sending = evaluations["destinations_sending"]
        assert (sending.passed, sending.severity) == (False, AssetCheckSeverity.WARN)
        assert sending.metadata["disabled"].value == {"mine": "ssrf_guard"}
        assert "destination mine disabled by the SSRF guard, 3 delivery(ies) waiting" in (
            sending.description
        )
        assert "| mine | disabled by the SSRF guard | 3 |" in (
            sending.metadata["destinations"].value
        )
        assert not evaluations["last_run_delivered"].passed
        assert all(evaluations[name].passed for name in INVARIANT_NAMES)
    # Each run materialized the outbox as it left it.
    materialized = own_instance.fetch_materializations(outbox_asset.OUTBOX, limit=5).records
    assert {m.run_id for m in materialized} == {first.run_id, second.run_id}
    newest = materialized[0].asset_materialization.metadata
    assert (newest["pending"].value, newest["destinations_disabled"].value) == (3, 1)


def test_a_run_that_delivers_is_green_with_passing_checks(
    own_instance, database_url, conn, receiver
):
    add_destination(conn, "cdn", receiver.url + "cdn")
    add_deliveries(conn, "cdn", 2)
    run_started = conn.execute("SELECT now() AS t").fetchone()["t"]
    run = deliver(own_instance, database_url)
    tags = own_instance.get_run_by_id(run.run_id).tags
    assert tags["media_hooks/outcome"] == "all-delivered" and ALERT_TAG not in tags
    evaluations = _evaluations_of(own_instance, run.run_id)
    assert [name for name, e in evaluations.items() if not e.passed] == []
    assert len(evaluations) == len(outbox_asset.SPECS)
    # The run checked the history since it began, and counted no succeeded history.
    began = datetime.fromisoformat(
        evaluations["two_successes"].metadata["history_read_since"].value
    )
    assert run_started - timedelta(seconds=1) <= began <= datetime.now(UTC)
    (materialized,) = own_instance.fetch_materializations(outbox_asset.OUTBOX, limit=5).records
    assert "succeeded" not in materialized.asset_materialization.metadata


def test_a_disabled_destination_tags_the_runs_that_answer_for_it(
    own_instance, database_url, conn, receiver
):
    """A run that delivers while a destination is disabled says so; a run for other named
    destinations does not answer for it."""
    add_destination(conn, "cdn", receiver.url + "cdn")
    add_destination(conn, "mine", "http://127.0.0.1:9/hook")
    disable_destination(conn, "mine", "publisher's maintenance window")
    add_deliveries(conn, "mine", 1)
    add_deliveries(conn, "cdn", 1, prefix="first")
    every = deliver(own_instance, database_url)
    add_deliveries(conn, "cdn", 1, prefix="second")
    named = deliver(own_instance, database_url, {"destination_ids": ["cdn"]})
    # Nothing due for cdn: its run found nothing to do, whatever waits for "mine".
    idle = deliver(own_instance, database_url, {"destination_ids": ["cdn"]})
    tags = [own_instance.get_run_by_id(r.run_id).tags for r in (every, named, idle)]
    assert [(t["media_hooks/outcome"], t.get(ALERT_TAG)) for t in tags] == [
        ("all-delivered", "destination disabled"),
        ("all-delivered", None),
        ("nothing-due", None),
    ]
    # The outbox's check names it whatever the run's cohort: it is the outbox's state.
    assert not _evaluations_of(own_instance, named.run_id)["destinations_sending"].passed


def test_the_recovery_clock_is_the_outboxs_freshness():
    spec = outbox_asset.outbox
    assert spec.freshness_policy.fail_window.to_timedelta() == outbox_asset.RECOVERY_CLOCK
