"""Discard: an operator closes dead deliveries unsent (``media-hooks discard``).

A dead delivery is terminal already; discarding records that an operator decided it will not be
sent (its recorded reason becomes 'discarded', with who and why). On a destination with
per-asset order a dead delivery holds the later deliveries of its asset (docs/architecture.md,
invariant 10); discarding it lets them go, in order. The alternative, a requeue, sends it again
first.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg.rows import dict_row

from media_hooks.core.errors import UserError
from media_hooks.core.identifiers import validate_identifier
from media_hooks.store.sqlfiles import query


@dataclass(frozen=True)
class DiscardResult:
    discarded: tuple[str, ...]
    # delivery_id -> why it was not discarded ("succeeded", "pending", "already superseded", ...)
    refused: dict[str, str]


def discard(
    conn: psycopg.Connection, delivery_ids: list[str], *, reason: str, requested_by: str
) -> DiscardResult:
    """Discard the dead ones of ``delivery_ids`` in one transaction; say why the others were not.
    UserError for a malformed id, a missing reason, or no such delivery at all."""
    reason = (reason or "").strip()
    if not reason:
        raise UserError("discarding needs a reason (--reason TEXT)")
    ids = sorted({validate_identifier(d, "delivery id") for d in delivery_ids})
    if not ids:
        raise UserError("name at least one delivery to discard")
    params = {"delivery_ids": ids, "reason": reason, "requested_by": requested_by}
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        found = {r["delivery_id"]: r for r in cur.execute(query("discard_candidates"), params)}
        unknown = [d for d in ids if d not in found]
        if unknown:
            raise UserError(f"no delivery {unknown[0]!r}")
        done = {r["delivery_id"] for r in cur.execute(query("discard_dead"), params)}
    refused = {
        d: (f"already {row['closed_reason']}" if row["closed_reason"] else row["state"])
        for d, row in found.items()
        if d not in done
    }
    return DiscardResult(discarded=tuple(sorted(done)), refused=refused)
