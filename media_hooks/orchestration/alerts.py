"""Alerts: thresholds on the figures, one message per incident, one when it clears.

The decision is a pure function of the figures and the previous state (kept in the sensor's
JSON cursor), so it is tested without a clock or a network; ``post`` is the only side effect.
Thresholds come from the environment, so an operator tunes them without a deploy.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from datetime import datetime

import requests

from media_hooks.core.numeric import COUNT, SECONDS_UP_TO_30_DAYS, from_env
from media_hooks.observe import health
from media_hooks.observe.figures import Figures

log = logging.getLogger("media_hooks.alerts")


@dataclass(frozen=True)
class Thresholds:
    oldest_due_seconds: float = 900.0
    relay_lag_seconds: float = 900.0
    expired_leases: int = 1
    # A snapshot held this long keeps vacuum from every row version deliveries left behind since.
    oldest_snapshot_seconds: float = 3600.0
    # Delivery runs and the retention job make a week of partitions ahead; under a day left
    # means neither has run for six days, and emits fail once none is left.
    partitions_ahead_seconds: float = 86400.0

    @classmethod
    def from_env(cls) -> Thresholds:
        # Each default is the field's own, so the two cannot drift apart.
        return cls(
            oldest_due_seconds=from_env(
                "MEDIA_HOOKS_ALERT_OLDEST_DUE_SECONDS",
                cls.oldest_due_seconds,
                SECONDS_UP_TO_30_DAYS,
            ),
            relay_lag_seconds=from_env(
                "MEDIA_HOOKS_ALERT_RELAY_LAG_SECONDS", cls.relay_lag_seconds, SECONDS_UP_TO_30_DAYS
            ),
            expired_leases=from_env("MEDIA_HOOKS_ALERT_EXPIRED_LEASES", cls.expired_leases, COUNT),
            oldest_snapshot_seconds=from_env(
                "MEDIA_HOOKS_ALERT_OLDEST_SNAPSHOT_SECONDS",
                cls.oldest_snapshot_seconds,
                SECONDS_UP_TO_30_DAYS,
            ),
            partitions_ahead_seconds=from_env(
                "MEDIA_HOOKS_ALERT_PARTITIONS_AHEAD_SECONDS",
                cls.partitions_ahead_seconds,
                SECONDS_UP_TO_30_DAYS,
            ),
        )

    def breaches(self, f: Figures) -> list[str]:
        """The figures over their thresholds, each as words an operator reads."""
        found = []
        if (f.oldest_due_age_seconds or 0) >= self.oldest_due_seconds:
            found.append(
                f"oldest due delivery is {f.oldest_due_age_seconds:.0f}s late "
                f"(threshold {self.oldest_due_seconds:.0f}s)"
            )
        if (f.relay_lag_seconds or 0) >= self.relay_lag_seconds:
            found.append(
                f"relay lag {f.relay_lag_seconds:.0f}s (threshold {self.relay_lag_seconds:.0f}s)"
            )
        if f.expired_leases >= self.expired_leases:
            found.append(f"{f.expired_leases} expired lease(s) (threshold {self.expired_leases})")
        holder = f.oldest_snapshot
        if holder is not None and holder.age_seconds >= self.oldest_snapshot_seconds:
            found.append(
                f"{holder.describe()} holds back vacuum "
                f"(threshold {self.oldest_snapshot_seconds:.0f}s)"
            )
        ahead = f.partitions_ahead_seconds
        if ahead is not None and ahead < self.partitions_ahead_seconds:
            found.append(
                f"history partitions are made only {max(ahead, 0):.0f}s ahead "
                f"(threshold {self.partitions_ahead_seconds:.0f}s): emits fail past them; "
                "a delivery run or the retention job makes more"
            )
        return found


@dataclass(frozen=True)
class AlertState:
    """What the cursor remembers between ticks."""

    in_incident: bool = False
    newest_dead_at: str | None = None
    # Destinations alerted as disabled, so each is alerted once until it is enabled again.
    disabled: tuple[str, ...] = ()

    def dumps(self, health: str | None = None) -> str:
        """The cursor, led by ``health``: the one line a reader of the sensor's page should see.

        The cursor is the only part of a tick that the sensor page shows in every row of its tick
        history and in its header (a skip reason is a tooltip), so the tick's health line rides
        in it; ``loads`` ignores it."""
        state = {
            "in_incident": self.in_incident,
            "newest_dead_at": self.newest_dead_at,
            "disabled": list(self.disabled),
        }
        return json.dumps({"health": health, **state} if health else state)

    @classmethod
    def loads(cls, cursor: str | None) -> AlertState:
        if not cursor:
            return cls()
        try:
            raw = json.loads(cursor)
            disabled = tuple(str(d) for d in raw.get("disabled") or ())
            return cls(bool(raw.get("in_incident")), raw.get("newest_dead_at"), disabled)
        except (ValueError, AttributeError, TypeError):
            return cls()  # a cursor from an older version: start afresh


@dataclass(frozen=True)
class AlertDecision:
    state: AlertState
    messages: list[str] = field(default_factory=list)


def _later(newest: str | None, seen: str | None) -> bool:
    if newest is None or seen is None:
        return False
    return datetime.fromisoformat(newest) > datetime.fromisoformat(seen)


def decide(f: Figures, previous: AlertState, thresholds: Thresholds) -> AlertDecision:
    """Alert on entering an incident, say so once when it clears, and note new dead letters."""
    breaches = thresholds.breaches(f)
    messages = []
    if breaches and not previous.in_incident:
        messages.append("media_hooks: delivery incident: " + "; ".join(breaches))
    elif not breaches and previous.in_incident:
        messages.append("media_hooks: recovered: " + f.headline())
    newest_dead = f.newest_dead_at.isoformat() if f.newest_dead_at else None
    if _later(newest_dead, previous.newest_dead_at):
        messages.append(
            f"media_hooks: new dead letter(s); {f.dead_letters} in all. "
            "See `media-hooks status` and requeue with `media-hooks requeue`."
        )
    disabled = health.disabled_destinations(f)
    messages += [_disabled_alert(d) for d in disabled if d.destination_id not in previous.disabled]
    now_disabled = {d.destination_id for d in disabled}
    messages += [
        f"media_hooks: destination {gone} is enabled again; its deliveries go out."
        for gone in previous.disabled
        if gone not in now_disabled
    ]
    state = AlertState(
        in_incident=bool(breaches),
        newest_dead_at=newest_dead or previous.newest_dead_at,
        disabled=tuple(sorted(now_disabled)),
    )
    return AlertDecision(state=state, messages=messages)


def _disabled_alert(d: health.Disabled) -> str:
    return (
        f"media_hooks: {d.describe()}: {d.reason}. Nothing is lost; once fixed, "
        f"`media-hooks destination enable {d.destination_id}` sends them."
    )


def alert_url() -> str | None:
    return os.environ.get("MEDIA_HOOKS_ALERT_URL") or None


def post(url: str, text: str, *, timeout: float = 5.0) -> bool:
    """POST ``{"text": ...}`` (Slack-compatible); False when the receiver did not take it."""
    try:
        response = requests.post(url, json={"text": text}, timeout=timeout)
    except requests.RequestException as exc:
        log.warning("alert POST failed: %s", type(exc).__name__)
        return False
    if response.status_code >= 300:
        log.warning("alert POST answered %s", response.status_code)
        return False
    return True
