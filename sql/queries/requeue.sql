-- Operator requeue: same delivery_id, fresh retry budget, audited. A delivery in flight (leased,
-- its lease still running) is never requeued: its request may be on the wire, and making it
-- sendable again would let another run send it a second time with no recorded reason
-- (invariant 9). A lease that has expired is ended first, as the sweep ends it, and its
-- delivery requeued like the rest.

-- name: requeue_preview
-- description: What a requeue of this cohort would move, by state (changes nothing): the same
--   selection as requeue_end_expired_leases and requeue_cohort together (an expired lease
--   counts as leased; a lease still running is in flight, counted by requeue_in_flight).
SELECT d.state, count(*)::integer AS matched,
       (array_agg(d.delivery_id ORDER BY d.updated_at DESC))[1:10] AS sample
FROM webhook_delivery_all AS d
WHERE d.state = ANY (%(states)s)
  AND d.state <> 'succeeded'
  AND NOT (d.state = 'leased' AND d.lease_until >= now())
  AND d.closed_reason IS NULL
  AND media_hooks_in_cohort_v2(d.destination_id, d.event_type, d.asset_id, d.created_at,
                               %(destination_ids)s, %(event_types)s, %(asset_ids)s,
                               %(created_after)s, %(created_before)s)
GROUP BY d.state;

-- name: requeue_end_expired_leases
-- description: The cohort's expired leases end before the requeue proper (when it takes leased
--   deliveries): their open attempts are closed as ambiguous through media_hooks_end_leases_v1.
--   Returns the deliveries ended; requeue_cohort moves them on.
-- keeps: invariants 3, 4 and 9 (migration 0005).
SELECT ended.delivery_id
FROM media_hooks_end_leases_v2(
    ARRAY(SELECT s.delivery_id
          FROM delivery_timer AS t
          JOIN delivery_state AS s ON s.delivery_id = t.delivery_id
          WHERE t.kind = 'inflight'
            AND s.state = 'leased'
            AND s.lease_until < now()
            AND media_hooks_in_cohort_v2(s.destination_id, s.event_type, s.asset_id, s.created_at,
                               %(destination_ids)s, %(event_types)s, %(asset_ids)s,
                               %(created_after)s, %(created_before)s)),
    true,
    'lease expiry (ended by a requeue by ' || %(requested_by)s || ')',
    'lease expired before an outcome was recorded; ended by a requeue') AS ended
UNION ALL
SELECT ended.delivery_id
FROM media_hooks_end_previous_leases_v1(
    ARRAY(SELECT d.delivery_id
          FROM webhook_delivery_v1 AS d
          WHERE d.state = 'leased'
            AND d.lease_until < now()
            AND media_hooks_in_cohort(d, %(destination_ids)s, %(event_types)s, %(asset_ids)s,
                                      %(created_after)s, %(created_before)s)),
    true,
    'lease expiry (ended by a requeue by ' || %(requested_by)s || ')',
    'lease expired before an outcome was recorded; ended by a requeue') AS ended;

-- name: requeue_cohort
-- description: Make every matching delivery due now with a fresh retry budget and age, record
--   who, why and which rows in the audit tables, and return what moved. Deliveries in flight
--   are not matched: their rows are left as they are, and requeue_in_flight counts them.
--   The expired leases requeue_end_expired_leases ended (ended_ids) are requeued as 'leased'.
-- keeps: invariant 1 (same delivery_id), invariant 5 (only scheduling metadata and counts
--   change), invariant 9 (nothing in flight is made sendable again: a row leased while this
--   statement waited for it is rechecked as locked and skipped). Succeeded deliveries are never
--   requeued: a success is final; nor are deliveries closed unsent (superseded, discarded).
WITH target_state AS (
    SELECT s.delivery_id,
           CASE WHEN s.delivery_id = ANY (%(ended_ids)s) THEN 'leased' ELSE s.state END AS state
    FROM delivery_state AS s
    WHERE ((s.state = ANY (%(states)s) AND s.state <> 'leased')
           OR (s.delivery_id = ANY (%(ended_ids)s) AND s.state IN ('pending', 'dead')))
      AND media_hooks_in_cohort_v2(s.destination_id, s.event_type, s.asset_id, s.created_at,
                               %(destination_ids)s, %(event_types)s, %(asset_ids)s,
                               %(created_after)s, %(created_before)s)
    FOR UPDATE OF s
),
-- Dead letters in history (closed ones stay closed: sending one now would put an older
-- revision after a newer one, or break its asset's order).
target_history AS (
    SELECT h.delivery_id, h.created_at,
           CASE WHEN h.delivery_id = ANY (%(ended_ids)s) THEN 'leased' ELSE h.state END AS state
    FROM delivery_history AS h
    WHERE h.state = 'dead'
      AND ('dead' = ANY (%(states)s) OR h.delivery_id = ANY (%(ended_ids)s))
      AND h.closed_reason IS NULL
      AND media_hooks_in_cohort_v2(h.destination_id, h.event_type, h.asset_id, h.created_at,
                               %(destination_ids)s, %(event_types)s, %(asset_ids)s,
                               %(created_after)s, %(created_before)s)
    FOR UPDATE OF h
),
-- The previous release's deliveries, by its rule.
target_previous AS (
    SELECT d.delivery_id,
           CASE WHEN d.delivery_id = ANY (%(ended_ids)s) THEN 'leased' ELSE d.state END AS state
    FROM webhook_delivery_v1 AS d
    WHERE ((d.state = ANY (%(states)s) AND d.state NOT IN ('succeeded', 'leased'))
           OR (d.delivery_id = ANY (%(ended_ids)s) AND d.state IN ('pending', 'dead')))
      AND d.closed_reason IS NULL
      AND media_hooks_in_cohort(d, %(destination_ids)s, %(event_types)s, %(asset_ids)s,
                                %(created_after)s, %(created_before)s)
    FOR UPDATE OF d
),
target AS (
    SELECT delivery_id, state FROM target_state
    UNION ALL
    SELECT delivery_id, state FROM target_history
    UNION ALL
    SELECT delivery_id, state FROM target_previous
),
audit AS (
    INSERT INTO delivery_requeue (requested_by, reason, cohort, moved)
    SELECT %(requested_by)s, %(reason)s, %(cohort)s::jsonb, count(*) FROM target
    RETURNING requeue_id
),
items AS (
    INSERT INTO delivery_requeue_item (requeue_id, delivery_id, previous_state)
    SELECT audit.requeue_id, target.delivery_id, target.state
    FROM target CROSS JOIN audit
),
moved_state AS (
    UPDATE delivery_state AS d
    SET state = 'pending',
        next_attempt_at = now(),
        budget_used = 0,
        budget_started_at = now(),
        wait_reason = 'requeued by ' || %(requested_by)s || ': ' || %(reason)s,
        updated_at = now()
    FROM target_state
    WHERE d.delivery_id = target_state.delivery_id
    RETURNING d.delivery_id, d.destination_id, target_state.state AS previous_state
),
revived AS (
    DELETE FROM delivery_history AS h
    USING target_history
    WHERE h.delivery_id = target_history.delivery_id
      AND h.created_at = target_history.created_at
    RETURNING h.*, target_history.state AS previous_state
),
revived_state AS (
    INSERT INTO delivery_state
        (delivery_id, destination_id, asset_id, event_type, created_at, emit_seq, queued, state,
         attempt_count, budget_used, budget_started_at, dispatch_count, next_attempt_at,
         current_message_id, last_outcome, last_error, wait_reason, updated_at)
    SELECT r.delivery_id, r.destination_id, r.asset_id, r.event_type, r.created_at, r.emit_seq,
           r.queued, 'pending', r.attempt_count, 0, now(), r.dispatch_count, now(),
           r.current_message_id, r.last_outcome, r.last_error,
           'requeued by ' || %(requested_by)s || ': ' || %(reason)s, now()
    FROM revived AS r
),
timers AS (
    INSERT INTO delivery_timer AS t (delivery_id, destination_id, kind, fire_at)
    SELECT m.delivery_id, m.destination_id, 'due', now() FROM moved_state AS m
    UNION ALL
    SELECT r.delivery_id, r.destination_id, 'due', now() FROM revived AS r
    ON CONFLICT (delivery_id) DO UPDATE SET kind = 'due', fire_at = now()
),
moved_previous AS (
    UPDATE webhook_delivery_v1 AS d
    SET state = 'pending',
        next_attempt_at = now(),
        budget_used = 0,
        budget_started_at = now(),
        wait_reason = 'requeued by ' || %(requested_by)s || ': ' || %(reason)s,
        updated_at = now()
    FROM target_previous
    WHERE d.delivery_id = target_previous.delivery_id
    RETURNING d.delivery_id, target_previous.state AS previous_state
),
moved AS (
    SELECT delivery_id, previous_state FROM moved_state
    UNION ALL
    SELECT delivery_id, previous_state FROM revived
    UNION ALL
    SELECT delivery_id, previous_state FROM moved_previous
)
SELECT (SELECT requeue_id FROM audit) AS requeue_id, previous_state, count(*)::integer AS moved,
       (array_agg(delivery_id ORDER BY delivery_id))[1:10] AS sample
FROM moved
GROUP BY previous_state;

-- name: requeue_in_flight
-- description: The cohort's deliveries in flight (leased, the lease still running) that a
--   requeue of states a delivery can be in flight from (enqueued, leased) leaves alone.
SELECT count(*)::integer AS in_flight
FROM webhook_delivery_all AS d
WHERE d.state = 'leased'
  AND d.lease_until >= now()
  AND %(states)s::text[] && ARRAY['enqueued', 'leased']
  AND media_hooks_in_cohort_v2(d.destination_id, d.event_type, d.asset_id, d.created_at,
                               %(destination_ids)s, %(event_types)s, %(asset_ids)s,
                               %(created_after)s, %(created_before)s);

-- name: discard_dead
-- description: An operator closes dead deliveries unsent: each keeps state dead and gains the
--   recorded reason 'discarded' (with who and why in wait_reason; its last error is kept). On an
--   ordered destination a discarded head no longer holds its asset's later deliveries. Only a
--   dead delivery not already closed is discarded; returns the ids discarded.
-- keeps: invariant 3 (the delivery was terminal and stays so), invariant 10 (its successors go
--   only once it is closed, in order).
WITH closed_state AS (
    DELETE FROM delivery_state AS s
    WHERE s.delivery_id = ANY (%(delivery_ids)s::text[])
      AND s.state = 'dead'
    RETURNING s.delivery_id,
              media_hooks_closed_row_v1(
                  s, 'discarded', NULL,
                  'discarded by ' || %(requested_by)s || ': ' || %(reason)s) AS ended_row
),
closed_history AS (
    INSERT INTO delivery_history SELECT (c.ended_row).* FROM closed_state AS c
    RETURNING delivery_id
),
closed_timers AS (
    DELETE FROM delivery_timer AS t USING closed_state AS c WHERE t.delivery_id = c.delivery_id
),
closed_ended AS (
    UPDATE delivery_history AS h
    SET closed_reason = 'discarded',
        wait_reason = 'discarded by ' || %(requested_by)s || ': ' || %(reason)s,
        finished_at = now()
    WHERE h.delivery_id = ANY (%(delivery_ids)s::text[])
      AND h.state = 'dead'
      AND h.closed_reason IS NULL
    RETURNING h.delivery_id
),
closed_previous AS (
    UPDATE webhook_delivery_v1 AS d
    SET closed_reason = 'discarded',
        wait_reason = 'discarded by ' || %(requested_by)s || ': ' || %(reason)s,
        updated_at = now()
    WHERE d.delivery_id = ANY (%(delivery_ids)s::text[])
      AND d.state = 'dead'
      AND d.closed_reason IS NULL
    RETURNING d.delivery_id
)
SELECT delivery_id FROM closed_history
UNION ALL
SELECT delivery_id FROM closed_ended
UNION ALL
SELECT delivery_id FROM closed_previous;

-- name: discard_candidates
-- description: The states of the deliveries an operator asked to discard (to say why one was
--   not: not dead, already closed, unknown).
SELECT delivery_id, state, closed_reason
FROM webhook_delivery_all
WHERE delivery_id = ANY (%(delivery_ids)s::text[]);

