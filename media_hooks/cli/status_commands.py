"""``media-hooks status``: the operator's dashboard in a terminal (media_hooks.observe.figures)."""

from __future__ import annotations

import argparse

from media_hooks.cli.output import print_json, table
from media_hooks.core.config import Settings
from media_hooks.observe import figures
from media_hooks.observe.inspection import format_age, format_time
from media_hooks.store import db, migrations


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "status",
        help="counts by state and destination, oldest due age, relay lag, leases, dead letters",
    )
    parser.add_argument(
        "--by",
        choices=tuple(figures.GROUPINGS),
        default="destination",
        help="group the counts by destination (default) or by event type",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document (seconds)")
    parser.set_defaults(handler=run_status)


def _headline(f: figures.Figures) -> list[list[str]]:
    newest_dead = f" (newest {format_time(f.newest_dead_at)})" if f.newest_dead_at else ""
    return [
        ["oldest due (sendable)", format_age(f.oldest_due_age_seconds)],
        ["oldest due (any)", format_age(f.oldest_due_any_age_seconds)],
        ["relay lag", format_age(f.relay_lag_seconds)],
        ["oldest enqueued", format_age(f.oldest_enqueued_age_seconds)],
        ["expired leases", str(f.expired_leases)],
        ["dead letters", f"{f.dead_letters}{newest_dead}"],
        ["oldest snapshot", f.oldest_snapshot.describe() if f.oldest_snapshot else "none"],
        ["partitions made ahead", format_age(f.partitions_ahead_seconds)],
    ]


def _counts(f: figures.Figures) -> str:
    rows = [
        [key, *(by_state.get(s, 0) for s in figures.COUNTED), sum(by_state.values())]
        for key, by_state in sorted(f.counts.items())
    ]
    totals = f.totals
    rows.append(["total", *(totals[s] for s in figures.COUNTED), sum(totals.values())])
    heading = "event type" if f.counts_by == "event-type" else "destination"
    return table([heading, *figures.COUNTED, "all"], rows)


def _dead_heads(f: figures.Figures) -> list[str]:
    if not f.dead_heads:
        return []
    rows = [
        [
            h.destination_id,
            h.asset_id,
            f"held behind dead delivery {h.delivery_id}",
            h.holding,
        ]
        for h in f.dead_heads
    ]
    note = "(requeue or discard the dead delivery to let the asset's later deliveries go)"
    return [table(["destination", "asset", "ordered queue", "held"], rows) + "\n" + note]


def _flags(f: figures.Figures) -> str:
    rows = [
        [p.destination_id, "paused", f"until {format_time(p.paused_until)}", p.paused_reason]
        for p in f.paused
    ] + [
        [d.destination_id, "disabled", f"since {format_time(d.disabled_at)}", d.disabled_reason]
        for d in f.disabled
    ]
    if not rows:
        return "no destination is paused or disabled"
    return table(["destination", "condition", "when", "why"], rows)


def _attempts(f: figures.Figures) -> str:
    outcomes = sorted(set(f.attempts_last_day) | set(f.attempts_last_hour))
    if not outcomes:
        return "no attempts finished in the last day"
    rows = [[o, f.attempts_last_hour.get(o, 0), f.attempts_last_day.get(o, 0)] for o in outcomes]
    return table(["attempt outcome", "last hour", "last day"], rows)


def _sessions(f: figures.Figures, deferred: list[str]) -> str:
    if not f.sessions:
        text = "connected: no other media_hooks session"
    else:
        text = "connected:\n" + "\n".join(f"  {r.describe()}" for r in f.sessions)
    if deferred:
        earlier = any(r.release == "earlier" for r in f.sessions)
        when = "once the earlier release has gone" if earlier else "now (no earlier release)"
        text += (
            f"\ncontract migrations pending: {', '.join(deferred)}; "
            f"`media-hooks db migrate` applies them {when}"
        )
    return text


def render(f: figures.Figures, deferred: list[str] | None = None) -> str:
    return "\n\n".join(
        [
            f"measured at {format_time(f.measured_at)}\n"
            + table(["figure", "value"], _headline(f)),
            _counts(f),
            *_dead_heads(f),
            _flags(f),
            _attempts(f),
            _sessions(f, deferred or []),
        ]
    )


def run_status(args: argparse.Namespace) -> int:
    url = db.ready_url(Settings.from_env())
    with db.connect(url, autocommit=True) as conn:
        measured = figures.measure(conn, by=args.by)
        deferred = migrations.require_current(conn)
    if args.json:
        print_json({**measured.as_dict(), "contract_migrations_pending": deferred})
    else:
        print(render(measured, deferred))
    return 0
