-- 0003: retention. Terminal deliveries are purged after a retention window (with their outbox
-- and attempt rows); a slim tombstone of each delivery_id outlives them for the longer
-- duplicate window, so a re-emitted old event is still recognised (invariant 1: one identity,
-- never a second logical delivery under the same delivery_id).

CREATE TABLE delivery_tombstone (
    delivery_id     text PRIMARY KEY,
    destination_id  text NOT NULL,
    final_state     text NOT NULL CONSTRAINT tombstone_final_state CHECK (final_state IN ('succeeded', 'dead')),
    -- The delivery's creation time: the duplicate window is measured from the event.
    created_at      timestamptz NOT NULL,
    purged_at       timestamptz NOT NULL DEFAULT now()
);

-- Tombstone expiry, oldest events first.
CREATE INDEX delivery_tombstone_created ON delivery_tombstone (created_at);

-- The retention sweep: terminal deliveries by the time they became terminal.
CREATE INDEX webhook_delivery_terminal ON webhook_delivery (updated_at)
    WHERE state IN ('succeeded', 'dead');
