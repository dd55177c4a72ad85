-- Operator requeue: same delivery_id, fresh retry budget, audited.

-- name: requeue_preview
-- description: What a requeue of this cohort would move, by state (changes nothing).
SELECT d.state, count(*)::integer AS matched,
       (array_agg(d.delivery_id ORDER BY d.updated_at DESC))[1:10] AS sample
FROM webhook_delivery AS d
WHERE d.state = ANY (%(states)s)
  AND d.state <> 'succeeded'
  AND media_hooks_in_cohort(d, %(destination_ids)s, %(event_types)s, %(asset_ids)s,
                            %(created_after)s, %(created_before)s)
GROUP BY d.state;

-- name: requeue_cohort
-- description: Make every matching delivery due now with a fresh retry budget and age, record
--   who, why and which rows in the audit tables, and return what moved.
-- keeps: invariant 1 (same delivery_id), invariant 5 (only scheduling metadata and counts
--   change), invariant 4 (a revoked lease token fences any worker still holding it).
--   Succeeded deliveries are never requeued: a success is final.
WITH target AS (
    SELECT d.delivery_id, d.state
    FROM webhook_delivery AS d
    WHERE d.state = ANY (%(states)s)
      AND d.state <> 'succeeded'
      AND media_hooks_in_cohort(d, %(destination_ids)s, %(event_types)s, %(asset_ids)s,
                                %(created_after)s, %(created_before)s)
    FOR UPDATE OF d
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
moved AS (
    UPDATE webhook_delivery AS d
    SET state = 'pending',
        next_attempt_at = now(),
        budget_used = 0,
        budget_started_at = now(),
        lease_until = NULL,
        lease_token = NULL,
        wait_reason = 'requeued by ' || %(requested_by)s || ': ' || %(reason)s,
        updated_at = now()
    FROM target
    WHERE d.delivery_id = target.delivery_id
    RETURNING d.delivery_id, target.state AS previous_state
)
SELECT (SELECT requeue_id FROM audit) AS requeue_id, previous_state, count(*)::integer AS moved,
       (array_agg(delivery_id ORDER BY delivery_id))[1:10] AS sample
FROM moved
GROUP BY previous_state;
