-- 0011: events, subscriptions, per-asset order and latest-wins (issue 14).
--
-- A producer may emit an event once (event id, type, asset, payload) instead of one delivery per
-- destination; the destinations subscribed to its type each get one delivery whose id is derived
-- from the event id and the destination. A destination may ask for its deliveries of one asset in
-- emission order, and for only the newest of an asset's deliveries of one event type.
-- Everything here is new or a nullable column without a default: no table is rewritten or
-- scanned (0012 adds the checks and the index that need a scan, without blocking writers).

-- Both tables this file alters, locked at once and in the order a producer takes them (an
-- emit holds webhook_delivery, then its foreign key reads webhook_destination). Locked one at
-- a time, destination first, the migration and a producer each waited on the other, and with
-- producers emitting steadily every attempt ran into its lock timeout and was retried forever.
LOCK TABLE webhook_delivery, webhook_destination IN ACCESS EXCLUSIVE MODE;

-- A destination's subscriptions: exact event types or `prefix.*` patterns. A destination with
-- none receives every type (as before subscriptions existed).
CREATE TABLE destination_subscription (
    destination_id  text NOT NULL REFERENCES webhook_destination (destination_id),
    pattern         text NOT NULL
                    CONSTRAINT subscription_pattern_form CHECK (
                        length(pattern) BETWEEN 1 AND 256
                        AND pattern !~ '[[:space:][:cntrl:]]'
                        AND (strpos(pattern, '*') = 0 OR pattern ~ '^[^*]+\.\*$')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (destination_id, pattern)
);

-- Every event emitted without a destination, with the destinations its type matched when it was
-- recorded (its deliveries' ids follow from them): an event that matched none is kept, so a
-- typo in a type is visible.
CREATE TABLE webhook_event (
    event_id         text PRIMARY KEY
                     CONSTRAINT event_id_form CHECK (event_id ~ '^[A-Za-z0-9_:-]+$' AND length(event_id) <= 200),
    event_type       text NOT NULL,
    asset_id         text NOT NULL,
    destination_ids  text[] NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- Retention forgets events with the tombstones of their deliveries (the duplicate window).
CREATE INDEX webhook_event_created ON webhook_event (created_at);

-- Per destination: 'asset' sends an asset's deliveries strictly in emission order (ordering),
-- or closes an asset's older unsent deliveries of one event type when a newer one exists
-- (coalescing). The allowed values are checked by 0012.
ALTER TABLE webhook_destination
    ADD COLUMN ordering text NOT NULL DEFAULT 'none',
    ADD COLUMN coalescing text NOT NULL DEFAULT 'none';

-- Emission order: created_at (the producer's transaction), then this sequence's number, taken
-- in the order the producer emitted (a bulk emit takes them in file order). Rows recorded
-- before 0011 have none and come first among equal times.
CREATE SEQUENCE media_hooks_emit_seq AS bigint;

-- closed_reason: why a dead delivery was closed without being sent: 'superseded' (a newer one
-- of its asset and type exists on a coalescing destination; closed_by names it) or 'discarded'
-- (an operator closed it, with the reason in last_error). A dead delivery without one failed.
ALTER TABLE webhook_delivery
    ADD COLUMN emit_seq bigint,
    ADD COLUMN closed_reason text,
    ADD COLUMN closed_by text;

-- Whether a destination is subscribed to an event type.
CREATE FUNCTION media_hooks_subscribed_v1(p_destination_id text, p_event_type text)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT NOT EXISTS (SELECT 1 FROM destination_subscription s
                       WHERE s.destination_id = p_destination_id)
        OR EXISTS (SELECT 1 FROM destination_subscription s
                   WHERE s.destination_id = p_destination_id
                     AND (s.pattern = p_event_type
                          OR (right(s.pattern, 2) = '.*'
                              AND starts_with(p_event_type, left(s.pattern, -1)))))
$$;

-- The delivery id of an event's delivery to one destination: the same event and destination
-- always give the same id (invariant 1: the receiver's idempotency key is stable, and emitting
-- the event again records nothing new). '/' is in neither identifier's alphabet, so the pair is
-- unambiguous.
CREATE FUNCTION media_hooks_event_delivery_id_v1(p_event_id text, p_destination_id text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT 'fan_' || left(encode(sha256(convert_to(p_event_id || '/' || p_destination_id, 'UTF8')), 'hex'), 32)
$$;

-- The claim rule of ordering and coalescing, ANDed into the claim of due deliveries: whether
-- the pending delivery may be dispatched now. A destination with neither answers true at once.
--   ordering 'asset': not while an earlier delivery of the same destination and asset is not
--     terminal, or is dead without being closed (a dead head holds its successors until an
--     operator requeues or discards it: sending past it would break the order it exists for).
--   coalescing 'asset': not while a newer delivery of the same destination, asset and event type
--     exists that is not closed (the sweep sweep_superseded closes this one), nor while an older
--     one of them is in flight (enqueued or leased): it may fail and come back, and is then
--     superseded by this one instead of being retried after it.
-- "Earlier" is emission order: (created_at, emit_seq), then delivery_id among rows recorded
-- before 0011. Both look-ups read one asset's open queue (index webhook_delivery_asset_queue,
-- 0012), whose rows are those with closed_reason NULL that are not succeeded.
-- keeps: invariant 10 (no delivery of an ordered destination is sent while an earlier one of
--   its asset is not terminal: a delivery is sent only after it was claimed).
CREATE FUNCTION media_hooks_may_claim_v1(
    p_ordering text,
    p_coalescing text,
    p_destination_id text,
    p_asset_id text,
    p_event_type text,
    p_created_at timestamptz,
    p_emit_seq bigint,
    p_delivery_id text
)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_ordering = 'none' AND p_coalescing = 'none' THEN
        RETURN true;
    END IF;
    IF p_ordering = 'asset' AND EXISTS (
        SELECT 1 FROM webhook_delivery AS e
        WHERE e.destination_id = p_destination_id
          AND e.asset_id = p_asset_id
          AND e.state <> 'succeeded' AND e.closed_reason IS NULL
          AND (e.created_at, coalesce(e.emit_seq, 0), e.delivery_id)
              < (p_created_at, coalesce(p_emit_seq, 0), p_delivery_id)
    ) THEN
        RETURN false;
    END IF;
    IF p_coalescing = 'asset' AND EXISTS (
        SELECT 1 FROM webhook_delivery AS n
        WHERE n.destination_id = p_destination_id
          AND n.asset_id = p_asset_id
          AND n.state <> 'succeeded' AND n.closed_reason IS NULL
          AND n.event_type = p_event_type
          AND n.delivery_id <> p_delivery_id
          AND ((n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
                   > (p_created_at, coalesce(p_emit_seq, 0), p_delivery_id)
               OR n.state IN ('enqueued', 'leased'))
    ) THEN
        RETURN false;
    END IF;
    RETURN true;
END;
$$;

-- An ordered destination's held deliveries are parked out of the claim's way: the sweep
-- sweep_park_held moves a due delivery held behind an earlier one of its asset to
-- next_attempt_at = 9999-01-01 (past the claim's due scan; a time every client library reads,
-- unlike 'infinity'), and when a delivery leaves its asset's open queue (succeeded, closed
-- unsent, or purged) this trigger makes the new head of the queue due again if it was parked.
-- The claim then passes each held delivery once, not once per page.
-- The head is updated even when it was not parked (its due time kept): the update waits for a
-- sweep parking it at that moment, then sees the parking, so no head is left parked.
-- keeps: invariant 3 (a parked delivery is due again once it heads its queue), invariant 10.
CREATE FUNCTION media_hooks_release_queue_head_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM webhook_destination AS w
               WHERE w.destination_id = OLD.destination_id AND w.ordering = 'asset') THEN
        UPDATE webhook_delivery AS d
        SET next_attempt_at = CASE WHEN d.next_attempt_at >= timestamptz '9999-01-01 00:00:00+00'
                                   THEN now() ELSE d.next_attempt_at END,
            wait_reason = CASE WHEN d.next_attempt_at >= timestamptz '9999-01-01 00:00:00+00'
                               THEN 'released: the earlier deliveries of its asset are done'
                               ELSE d.wait_reason END
        WHERE d.delivery_id = (
                SELECT e.delivery_id
                FROM webhook_delivery AS e
                WHERE e.destination_id = OLD.destination_id AND e.asset_id = OLD.asset_id
                  AND e.state <> 'succeeded' AND e.closed_reason IS NULL
                  AND e.delivery_id <> OLD.delivery_id
                ORDER BY e.created_at, coalesce(e.emit_seq, 0), e.delivery_id
                LIMIT 1)
          AND d.state = 'pending';
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER webhook_delivery_release_queue_head
    AFTER UPDATE OF state, closed_reason ON webhook_delivery
    FOR EACH ROW
    WHEN ((NEW.state = 'succeeded' AND OLD.state <> 'succeeded')
          OR (NEW.closed_reason IS NOT NULL AND OLD.closed_reason IS NULL))
    EXECUTE FUNCTION media_hooks_release_queue_head_v1();

CREATE TRIGGER webhook_delivery_release_queue_head_on_purge
    AFTER DELETE ON webhook_delivery
    FOR EACH ROW
    WHEN (OLD.state <> 'succeeded' AND OLD.closed_reason IS NULL)
    EXECUTE FUNCTION media_hooks_release_queue_head_v1();
