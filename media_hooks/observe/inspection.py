"""A delivery's story and verdict: the answer to "is this delivery late, waiting by policy,
or lost?" for one ``delivery_id``.

``inspect_delivery`` reads the delivery, its outbox rows (one per dispatch, each naming the
Dagster run that claimed it), its attempts and the operator requeues that moved it, in four
primary-key or index reads (``sql/queries/inspection.sql``), and puts them in time order. The
verdict is judged against the database clock, so it agrees with what the sweeps and claims
will do next. No Dagster here; ``media-hooks inspect`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from media_hooks.core.errors import UserError
from media_hooks.core.identifiers import validate_identifier
from media_hooks.store.sqlfiles import query

EXCERPT_CHARS = 120
# The due time of a parked delivery, held behind an earlier one of its asset (migration 0013).
PARKED_UNTIL = datetime(9999, 1, 1, tzinfo=UTC)
# The order of events that share an instant: a dispatch follows its requeue, an attempt its
# dispatch.
_KIND_ORDER = {"recorded": 0, "requeued": 1, "dispatched": 2, "attempt": 3}


def format_age(seconds: float | None) -> str:
    """A duration in human units: "0.4s", "42s", "3m 20s", "2h 5m", "3d 4h"; None is "none"."""
    if seconds is None:
        return "none"
    if seconds < 1:
        return f"{seconds:.1f}s"
    whole = int(round(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def format_time(moment: datetime | None) -> str:
    """UTC to the millisecond: attempts of one delivery are often within the same second."""
    if moment is None:
        return "-"
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def relative(moment: datetime, now: datetime) -> str:
    """ "in 3m 20s" or "3m 20s ago", against the database clock."""
    seconds = (moment - now).total_seconds()
    if seconds >= 0:
        return f"in {format_age(seconds)}"
    return f"{format_age(-seconds)} ago"


def _excerpt(text: str | None) -> str | None:
    if text is None:
        return None
    flat = " ".join(text.split())
    return flat if len(flat) <= EXCERPT_CHARS else flat[: EXCERPT_CHARS - 1] + "…"


@dataclass(frozen=True)
class StoryEvent:
    """One line of the story: when, what kind, what happened in words, and the raw fields."""

    at: datetime
    kind: str
    text: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """Where the delivery stands now. ``kind`` is one of: succeeded, dead, superseded and
    discarded (dead, closed unsent), held (behind an earlier delivery of its asset on an ordered
    destination), waiting (by policy: backoff, Retry-After, a paused or disabled destination),
    due (waiting for a run), leased, lease_expired, enqueued."""

    kind: str
    text: str


@dataclass(frozen=True)
class Story:
    delivery: dict[str, Any]
    events: tuple[StoryEvent, ...]
    verdict: Verdict
    run_ids: tuple[str, ...]
    measured_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready document (times as ISO 8601 strings)."""
        return _iso(
            {
                "delivery": self.delivery,
                "verdict": {"kind": self.verdict.kind, "text": self.verdict.text},
                "run_ids": list(self.run_ids),
                "events": [
                    {"at": e.at, "kind": e.kind, "text": e.text, **e.details} for e in self.events
                ],
                "measured_at": self.measured_at,
            }
        )


def _iso(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _iso(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_iso(v) for v in value]
    return value


# -- reading -------------------------------------------------------------------------------


def _rows(conn: psycopg.Connection, name: str, delivery_id: str) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query(name), {"delivery_id": delivery_id})
        return cur.fetchall()


def inspect_delivery(conn: psycopg.Connection, delivery_id: str) -> Story:
    """The delivery's whole story and its verdict; UserError when there is no such delivery."""
    validate_identifier(delivery_id, "delivery id")
    found = _rows(conn, "inspection_delivery", delivery_id)
    if not found:
        raise UserError(f"no delivery {delivery_id!r}")
    row = found[0]
    dispatches = _rows(conn, "inspection_dispatches", delivery_id)
    attempts = _rows(conn, "inspection_attempts", delivery_id)
    requeues = _rows(conn, "inspection_requeues", delivery_id)
    events = sorted(
        [
            _recorded(row),
            *(_dispatched(d) for d in dispatches),
            *(_attempted(a) for a in attempts),
            *(_requeued(r) for r in requeues),
        ],
        key=lambda e: (e.at, _KIND_ORDER[e.kind]),
    )
    return Story(
        delivery=_public_fields(row),
        events=tuple(events),
        verdict=judge(row, dispatches, attempts),
        run_ids=_run_ids(dispatches, attempts),
        measured_at=row["measured_at"],
    )


def _public_fields(row: dict[str, Any]) -> dict[str, Any]:
    hidden = {"measured_at"}
    return {k: v for k, v in row.items() if k not in hidden}


def _run_ids(dispatches: list[dict], attempts: list[dict]) -> tuple[str, ...]:
    """Every Dagster run that claimed or attempted the delivery, first seen first."""
    seen: dict[str, None] = {}
    for item in sorted([*dispatches, *attempts], key=_first_time):
        if item.get("run_id"):
            seen.setdefault(item["run_id"], None)
    return tuple(seen)


def _first_time(item: dict[str, Any]) -> datetime:
    return item.get("created_at") or item["started_at"]


# -- the story's lines ---------------------------------------------------------------------


def _recorded(row: dict[str, Any]) -> StoryEvent:
    return StoryEvent(
        at=row["created_at"],
        kind="recorded",
        text=f"recorded: {row['event_type']} for asset {row['asset_id']}, "
        f"to destination {row['destination_id']}",
    )


def _publication(d: dict[str, Any]) -> str:
    """A claim publishes what it writes; an earlier release's relay published just after it."""
    if d["published_at"] is None:
        return "not published"
    if d["published_at"] == d["created_at"]:
        return "published by its claim"
    return f"published {format_time(d['published_at'])}"


def _dispatched(d: dict[str, Any]) -> StoryEvent:
    published = _publication(d)
    return StoryEvent(
        at=d["created_at"],
        kind="dispatched",
        text=f"dispatch {d['dispatch_no']} by run {d['run_id']} "
        f"(outbox message {d['message_id']}, {published})",
        details=dict(d),
    )


def _attempt_result(a: dict[str, Any]) -> str:
    if a["finished_at"] is None:
        return "no finish recorded (in flight, or its worker was lost)"
    took = format_age((a["finished_at"] - a["started_at"]).total_seconds())
    parts = [f"{a['outcome']} after {took}"]
    if a["http_status"] is not None:
        parts.append(f"HTTP {a['http_status']}")
    said = _excerpt(a["error"]) or _excerpt(a["response_excerpt"])
    if said:
        parts.append(said)
    result = ", ".join(parts)
    if a["next_attempt_at"] is not None:
        result += f"; next attempt {format_time(a['next_attempt_at'])}"
    if a["retry_reason"]:
        result += f" ({a['retry_reason']})"
    return result


def _attempted(a: dict[str, Any]) -> StoryEvent:
    return StoryEvent(
        at=a["started_at"],
        kind="attempt",
        text=f"attempt {a['attempt_no']} by run {a['run_id'] or '-'}: {_attempt_result(a)}",
        details=dict(a),
    )


def _requeued(r: dict[str, Any]) -> StoryEvent:
    return StoryEvent(
        at=r["requested_at"],
        kind="requeued",
        text=f"requeued by {r['requested_by']} (requeue {r['requeue_id']}, was "
        f"{r['previous_state']}): {r['reason']}",
        details=dict(r),
    )


# -- the verdict ---------------------------------------------------------------------------


def judge(row: dict[str, Any], dispatches: list[dict], attempts: list[dict]) -> Verdict:
    """The one-line verdict for the delivery's current state, judged at ``measured_at``."""
    state = row["state"]
    if state == "succeeded":
        return _succeeded(row, attempts)
    if state == "dead":
        return _dead(row)
    if state == "pending":
        return _pending(row)
    run_id = _current_run(row, dispatches, attempts)
    if state == "leased":
        return _leased(row, run_id)
    return Verdict(
        "enqueued",
        f"enqueued by run {run_id} since {format_time(row['updated_at'])} "
        f"({relative(row['updated_at'], row['measured_at'])}): waiting for that run to send it",
    )


def _succeeded(row: dict[str, Any], attempts: list[dict]) -> Verdict:
    success = next((a for a in reversed(attempts) if a["outcome"] == "success"), None)
    at = success["finished_at"] if success else row["updated_at"]
    n = row["attempt_count"]
    return Verdict("succeeded", f"succeeded at {format_time(at)} after {n} attempt(s)")


def _closed(row: dict[str, Any]) -> Verdict:
    """A dead delivery closed without being sent: superseded, or discarded by an operator."""
    since = format_time(row["updated_at"])
    if row["closed_reason"] == "superseded":
        return Verdict(
            "superseded",
            f"superseded by {row['closed_by']} (a newer {row['event_type']} for asset "
            f"{row['asset_id']}; destination {row['destination_id']} sends only the latest), "
            f"closed unsent at {since}",
        )
    why = _excerpt(row["wait_reason"]) or "discarded"
    error = _excerpt(row["last_error"])
    return Verdict(
        "discarded",
        f"{why} (at {since}; it had died: {error or 'no error text'}); it is not sent, and it "
        "no longer holds the asset's later deliveries",
    )


def _dead(row: dict[str, Any]) -> Verdict:
    if row.get("closed_reason"):
        return _closed(row)
    error = _excerpt(row["last_error"])
    if row["wait_reason"]:
        reason = row["wait_reason"].removeprefix("dead: ")
        if error:
            reason += f"; last error: {error}"
    elif row["last_outcome"] == "rejected":
        reason = f"the receiver rejected it: {error or 'no error text'}"
    else:
        reason = f"its last attempt was {row['last_outcome']}: {error or 'no error text'}"
    return Verdict(
        "dead",
        f"dead because {reason} (after {row['attempt_count']} attempt(s), "
        f"since {format_time(row['updated_at'])}); `media-hooks requeue` sends it again",
    )


def _destination_hold(row: dict[str, Any]) -> str | None:
    """Why the destination itself keeps the delivery waiting, if it does."""
    now = row["measured_at"]
    if not row["destination_enabled"]:
        why = row["disabled_reason"] or "no reason given"
        return f"destination {row['destination_id']} is disabled ({why}); it goes out when enabled"
    if row["paused_until"] is not None and row["paused_until"] > now:
        why = row["paused_reason"] or "no reason given"
        return (
            f"destination {row['destination_id']} is paused until "
            f"{format_time(row['paused_until'])} ({why})"
        )
    return None


def _rule_hold(row: dict[str, Any]) -> Verdict | None:
    """Why the destination's per-asset rules keep this pending delivery from being claimed."""
    if row.get("newer_id"):
        return Verdict(
            "superseded",
            f"to be superseded by {row['newer_id']} (a newer {row['event_type']} for asset "
            f"{row['asset_id']}): the next run closes it unsent",
        )
    if row.get("held_by"):
        if row["held_by_state"] == "dead":
            return Verdict(
                "held",
                f"held behind dead delivery {row['held_by']} (destination "
                f"{row['destination_id']} sends asset {row['asset_id']} in order): requeue it "
                "(`media-hooks requeue`) or discard it (`media-hooks discard`) to let this go",
            )
        return Verdict(
            "held",
            f"held behind {row['held_by']} ({row['held_by_state']}), the earlier delivery of "
            f"asset {row['asset_id']}: it goes once that one is succeeded or closed",
        )
    return None


def _pending(row: dict[str, Any]) -> Verdict:
    rule = _rule_hold(row)
    if rule is not None:
        return rule
    now = row["measured_at"]
    due_at = row["next_attempt_at"]
    hold = _destination_hold(row)
    reason = row["wait_reason"] or "first attempt"
    if due_at >= PARKED_UNTIL:
        return Verdict(
            "waiting",
            f"parked, and nothing earlier of asset {row['asset_id']} is open any more (it "
            "settled while this delivery was being recorded): the lag sensor's next tick or the next "
            "run's sweeps make it due",
        )
    if due_at > now:
        text = f"waiting by policy until {format_time(due_at)} ({relative(due_at, now)}): {reason}"
        return Verdict("waiting", text + (f"; and {hold}" if hold else ""))
    if hold:
        return Verdict("waiting", f"waiting by policy: {hold} (due since {format_time(due_at)})")
    return Verdict(
        "due",
        f"due now, waiting for a run (since {format_time(due_at)}, {relative(due_at, now)}; "
        f"{reason})",
    )


def _current_run(row: dict[str, Any], dispatches: list[dict], attempts: list[dict]) -> str:
    """The run holding the delivery: the one attempting it, else the one that claimed it."""
    latest = attempts[-1] if attempts else None
    if (
        row["state"] == "leased"
        and latest
        and latest["attempt_no"] == row["attempt_count"]
        and latest["finished_at"] is None
        and latest["run_id"]
    ):
        return latest["run_id"]
    current = next((d for d in dispatches if d["message_id"] == row["current_message_id"]), None)
    return current["run_id"] if current else "unknown"


def _leased(row: dict[str, Any], run_id: str) -> Verdict:
    until = row["lease_until"]
    if until < row["measured_at"]:
        return Verdict(
            "lease_expired",
            f"leased by run {run_id} until {format_time(until)}: lease expired at "
            f"{format_time(until)} ({relative(until, row['measured_at'])}), "
            "the next sweep makes it due again",
        )
    return Verdict(
        "leased",
        f"leased by run {run_id} until {format_time(until)} "
        f"({relative(until, row['measured_at'])}): an attempt is in flight",
    )


# -- events --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventStory:
    """An event emitted without a destination, and each of its deliveries' stories."""

    event: dict[str, Any]
    deliveries: tuple[Story, ...]

    def as_dict(self) -> dict[str, Any]:
        return _iso(
            {
                "event": self.event,
                "deliveries": [
                    {
                        "delivery_id": s.delivery["delivery_id"],
                        "destination_id": s.delivery["destination_id"],
                        "state": s.delivery["state"],
                        "verdict": {"kind": s.verdict.kind, "text": s.verdict.text},
                    }
                    for s in self.deliveries
                ],
            }
        )


def find_event(conn: psycopg.Connection, event_id: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("inspection_event"), {"event_id": event_id}).fetchone()


def inspect_event(conn: psycopg.Connection, event_id: str) -> EventStory:
    """The event and its deliveries with their verdicts; UserError when there is no such
    event. A delivery retention purged is left out (its tombstone keeps its id)."""
    validate_identifier(event_id, "event id")
    event = find_event(conn, event_id)
    if event is None:
        raise UserError(f"no event {event_id!r}")
    stories = []
    for delivery_id in event["delivery_ids"]:
        try:
            stories.append(inspect_delivery(conn, delivery_id))
        except UserError:
            continue
    return EventStory(event=event, deliveries=tuple(stories))
