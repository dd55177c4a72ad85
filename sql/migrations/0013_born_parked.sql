-- migrate: no-transaction
-- 0013: per-asset order without rewriting held deliveries (issue 14).
--
-- Until now every delivery was born due, and the sweep sweep_park_held rewrote each one held
-- behind an earlier delivery of its asset (next_attempt_at 9999-01-01: a new row version in
-- every index), then the claim tested each due row with media_hooks_may_claim_v1, a PL/pgSQL
-- function the planner cannot see into, whose look-up read every earlier row of the asset's
-- queue from the heap. Now the emit statements record a held delivery already parked (its
-- first and only write), the claim's rule is a SQL function the planner inlines into the
-- claim, and a sweep wakes the rare parked delivery that heads its queue with nobody left to
-- wake it. media_hooks_may_claim_v1 stays for the release that runs while this one rolls out.
--
-- Applied one statement at a time outside a transaction (as 0010 and 0012): the functions are
-- created or replaced, the index is built CONCURRENTLY, so producers keep writing. Every
-- statement is idempotent: an interrupted run starts the file again.

-- The open deliveries that hold a pending delivery back from being claimed, given its
-- destination's rules (the rule of media_hooks_may_claim_v1: the delivery may be claimed when
-- this returns no row):
--   ordering 'asset': an earlier delivery of the same destination and asset that is not
--     terminal, or is dead without being closed (a dead head holds its successors);
--   coalescing 'asset': a newer delivery of the same destination, asset and event type that is
--     not closed, or an older one in flight.
-- "Earlier" is emission order, as in v1: created_at, then emit_seq, where a row recorded before
-- 0011 (emit_seq NULL) comes first among equal times, then delivery_id among those. (v1 writes
-- it (created_at, coalesce(emit_seq, 0), delivery_id); the sequence starts at 1, so the order
-- is the same.) The first branch is that order as a row comparison on the columns of
-- webhook_delivery_asset_queue (0012), which the index answers by itself: a queue's head costs
-- one descent of the index and no read of an earlier row. The second branch is the rows
-- recorded before 0011 at the same instant, an index descent that finds none today.
-- LANGUAGE sql, STABLE, one query, not STRICT: the planner inlines it where it is called in a
-- FROM clause (`NOT EXISTS (SELECT FROM media_hooks_held_by_v2(...))`), the rules a
-- destination does not use fall away as one-time filters, and nothing runs per row but the
-- index look-ups themselves.
CREATE OR REPLACE FUNCTION media_hooks_held_by_v2(
    p_ordering text,
    p_coalescing text,
    p_destination_id text,
    p_asset_id text,
    p_event_type text,
    p_created_at timestamptz,
    p_emit_seq bigint,
    p_delivery_id text
)
RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT e.delivery_id
    FROM webhook_delivery AS e
    WHERE p_ordering = 'asset'
      AND e.destination_id = p_destination_id AND e.asset_id = p_asset_id
      AND e.state <> 'succeeded' AND e.closed_reason IS NULL
      AND (e.created_at, e.emit_seq) < (p_created_at, p_emit_seq)
    UNION ALL
    SELECT e.delivery_id
    FROM webhook_delivery AS e
    WHERE p_ordering = 'asset'
      AND e.destination_id = p_destination_id AND e.asset_id = p_asset_id
      AND e.state <> 'succeeded' AND e.closed_reason IS NULL
      AND e.created_at = p_created_at AND e.emit_seq IS NULL
      AND (p_emit_seq IS NOT NULL OR e.delivery_id < p_delivery_id)
    UNION ALL
    SELECT n.delivery_id
    FROM webhook_delivery AS n
    WHERE p_coalescing = 'asset'
      AND n.destination_id = p_destination_id AND n.asset_id = p_asset_id
      AND n.state <> 'succeeded' AND n.closed_reason IS NULL
      AND n.event_type = p_event_type
      AND n.delivery_id <> p_delivery_id
      AND ((n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
               > (p_created_at, coalesce(p_emit_seq, 0), p_delivery_id)
           OR n.state IN ('enqueued', 'leased'))
$$;

-- A new delivery's due time and wait reason: due at p_due, or, held behind an earlier delivery
-- of its asset, parked at 9999-01-01 (past the claim's due scan; a time every client library
-- reads, unlike 'infinity'; the time sweep_park_held parked at) until it heads its queue. One
-- place for the emit statements' three paths; inlined where it is called.
CREATE OR REPLACE FUNCTION media_hooks_parking_v2(p_held boolean, p_due timestamptz)
RETURNS TABLE (next_attempt_at timestamptz, wait_reason text)
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_held THEN timestamptz '9999-01-01 00:00:00+00' ELSE p_due END,
           CASE WHEN p_held THEN 'held behind an earlier delivery of its asset (ordered destination)' END
$$;

-- The parked deliveries (born held at emit, or parked before 0013), in the order of their
-- asset queues: what sweep_wake_parked_heads walks to find a parked delivery that heads its
-- queue. Only held deliveries have an entry, written once when they are recorded; a delivery
-- made due again leaves it.
-- In queue order exactly (emission order, a row recorded before 0011 first among equal times),
-- so the first entry of a queue is its first parked delivery, and the walk reads the index only.
CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_delivery_parked
    ON webhook_delivery (destination_id, asset_id, created_at, emit_seq NULLS FIRST, delivery_id)
    WHERE state = 'pending' AND next_attempt_at >= timestamptz '9999-01-01 00:00:00+00';
