"""The chaos soak's table (issue 12): each figure, what it must be, and whether it is.

Read from the database after the final runs and from what the publisher saw
(``bench.soak_receiver``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench.soak_receiver import ChaosPublisher

FIGURES = """
SELECT count(*) AS recorded,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state = 'dead') AS dead,
       count(*) FILTER (WHERE state IN ('pending', 'enqueued', 'leased')) AS open,
       (SELECT count(*) FROM (SELECT 1 FROM delivery_attempt WHERE outcome = 'success'
                               GROUP BY delivery_id HAVING count(*) > 1) AS twice)
           AS succeeded_twice,
       (SELECT count(*) FROM delivery_attempt) AS attempts,
       (SELECT count(*) FROM destination_limiter AS l, unnest(l.slot_until) AS until
         WHERE until > now()) AS permits_held,
       (SELECT count(*) FROM delivery_attempt WHERE outcome = 'ambiguous') AS ambiguous
FROM webhook_delivery
WHERE delivery_id = ANY (%(ids)s)
"""

DEAD_REASONS = """
SELECT left(coalesce(wait_reason, last_outcome || ': ' || coalesce(last_error, '?')), 120)
           AS reason,
       count(*) AS n
FROM webhook_delivery
WHERE state = 'dead'
GROUP BY 1
ORDER BY 2 DESC
"""

AMBIGUOUS_BY_ID = """
SELECT delivery_id, count(*) FILTER (WHERE outcome = 'ambiguous') AS ambiguous
FROM delivery_attempt
WHERE delivery_id = ANY (%(ids)s)
GROUP BY delivery_id
"""


@dataclass(frozen=True)
class Outcome:
    rows: list[dict[str, Any]] = field(default_factory=list)
    dead_reasons: dict[str, int] = field(default_factory=dict)
    per_destination: dict[str, dict[str, float]] = field(default_factory=dict)
    check: dict[str, Any] = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        return all(row["ok"] for row in self.rows)


def _row(figure: str, value: Any, must_be: str, ok: bool) -> dict[str, Any]:
    return {"figure": figure, "value": value, "must be": must_be, "ok": ok}


def measure(
    url: str,
    ids: list[str],
    publisher: ChaosPublisher,
    check: dict[str, Any],
    check_exit: int,
    *,
    kills: tuple[int, int],
    outages: tuple[int, int],
) -> Outcome:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        f = conn.execute(FIGURES, {"ids": ids}).fetchone()
        reasons = {r["reason"]: r["n"] for r in conn.execute(DEAD_REASONS)}
        duplicated = list(publisher.duplicates)
        ambiguous = {
            r["delivery_id"]: r["ambiguous"]
            for r in conn.execute(AMBIGUOUS_BY_ID, {"ids": duplicated})
        }
    unexplained = sum(
        max(0, count - ambiguous.get(webhook_id, 0))
        for webhook_id, count in publisher.duplicates.items()
    )
    emitted = len(ids)
    # A recorded row is in one of the five states, each discoverable: lost means not recorded.
    lost = emitted - f["recorded"]
    limits = publisher.violations()
    ceiling = publisher.limits.max_in_flight
    rate_broken = sorted(d for d, v in limits.items() if v["rate_violation"])
    flight_broken = sorted(d for d, v in limits.items() if v["max_in_flight"] > ceiling)
    effects = publisher.receiver.effects
    broken_checks = [c["name"] for c in check.get("checks", []) if not c["holds"]]
    rows = [
        _row(
            "deliveries emitted / succeeded / dead",
            f"{emitted} / {f['succeeded']} / {f['dead']}",
            "add up",
            emitted == f["succeeded"] + f["dead"],
        ),
        _row("still due or leased after the final runs", f["open"], "0", f["open"] == 0),
        _row("lost (emitted, not terminal, not discoverable)", lost, "0", lost == 0),
        _row(
            "succeeded twice in the database", f["succeeded_twice"], "0", not f["succeeded_twice"]
        ),
        _row(
            "duplicate requests at the receiver without a recorded fault",
            f"{unexplained} (of {sum(publisher.duplicates.values())} duplicates; "
            f"{f['ambiguous']} ambiguous attempts recorded)",
            "0",
            unexplained == 0,
        ),
        _row(
            "distinct effects at the deduplicating receiver vs succeeded",
            f"{effects} vs {f['succeeded']}",
            "equal",
            effects == f["succeeded"],
        ),
        _row(
            "start-rate or in-flight violations at the receiver",
            f"{len(rate_broken)} rate {rate_broken}, {len(flight_broken)} in flight "
            f"{flight_broken}",
            "0",
            not rate_broken and not flight_broken,
        ),
        _row(
            "permits still held after the final runs (every run handed back, or its holds expired)",
            f["permits_held"],
            "0",
            f["permits_held"] == 0,
        ),
        _row("kills survived", f"{kills[0]} of {kills[1]}", "as set", kills[0] == kills[1]),
        _row(
            "outages survived", f"{outages[0]} of {outages[1]}", "as set", outages[0] == outages[1]
        ),
        _row(
            "media-hooks check",
            "every invariant holds" if check_exit == 0 else f"exit {check_exit}: {broken_checks}",
            "holds",
            check_exit == 0,
        ),
    ]
    return Outcome(rows, reasons, limits, check)


def render(document: dict[str, Any]) -> str:
    lines = [
        f"soak ({document['size']}): {document['settings']['deliveries']} deliveries, "
        f"{document['settings']['destinations']} destinations, {document['settings']['runs']} "
        f"runs; {document['seconds']} s; `{document['command']}`",
        "",
        "| figure | value | must be | ok |",
        "|---|---|---|---|",
    ]
    for row in document["rows"]:
        ok = "yes" if row["ok"] else "**NO**"
        lines.append(f"| {row['figure']} | {row['value']} | {row['must be']} | {ok} |")
    lines += ["", "dead, by reason:"]
    lines += [f"- {n} {reason}" for reason, n in document["dead_reasons"].items()] or ["- none"]
    lines += [
        "",
        "publisher answers: "
        + ", ".join(f"{k} {v}" for k, v in sorted(document["answers"].items())),
    ]
    return "\n".join(lines)
