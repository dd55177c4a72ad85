"""Named crash points: fault injection for the failure-boundary tests.

``MEDIA_HOOKS_CRASH_AT=<point>`` makes the process die on the spot (``os._exit``, no cleanup,
no commit) the first time it reaches that point; ``MEDIA_HOOKS_CRASH_AFTER=N`` lets the point
pass N times first. Unset, ``hit`` is two comparisons.

Both are read once, at the first point the process reaches.
"""

from __future__ import annotations

import os
import sys

BEFORE_CLAIM_COMMIT = "before_claim_commit"
AFTER_OUTBOX_COMMIT = "after_outbox_commit"
AFTER_LEASE_BEFORE_REQUEST = "after_lease_before_request"
AFTER_RECEIVER_ACCEPTED = "after_receiver_accepted"
AFTER_RESPONSE_BEFORE_RECORD = "after_response_before_record"

POINTS = (
    BEFORE_CLAIM_COMMIT,
    AFTER_OUTBOX_COMMIT,
    AFTER_LEASE_BEFORE_REQUEST,
    AFTER_RECEIVER_ACCEPTED,
    AFTER_RESPONSE_BEFORE_RECORD,
)

CRASH_EXIT_STATUS = 86

CRASH_AT = "MEDIA_HOOKS_CRASH_AT"
CRASH_AFTER = "MEDIA_HOOKS_CRASH_AFTER"
_read = False
_armed: str | None = None
_passes_left = 0


def hit(point: str) -> None:
    """Die here if this point is armed."""
    global _read, _armed, _passes_left
    if not _read:
        _armed = os.environ.get(CRASH_AT)
        _passes_left = int(os.environ.get(CRASH_AFTER) or 0)
        _read = True
    if _armed != point:
        return
    if _passes_left > 0:
        _passes_left -= 1
        return
    sys.stderr.write(f"media-hooks: crash point {point} reached: exiting\n")
    sys.stderr.flush()
    os._exit(CRASH_EXIT_STATUS)
