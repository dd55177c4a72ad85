-- A delivery's story (media_hooks.observe.inspection): `media-hooks inspect`. Each statement reads one
-- delivery by its primary key or the delivery_id indexes of the tables it touches; none moves
-- state.

-- name: inspection_delivery
-- description: the delivery, its destination's condition, and the database clock the verdict
--   is judged against.
SELECT d.delivery_id, d.destination_id, d.asset_id, d.event_type, d.payload, d.state,
       d.attempt_count, d.budget_used, d.budget_started_at, d.dispatch_count,
       d.next_attempt_at, d.lease_until, d.current_message_id, d.last_outcome, d.last_error,
       d.wait_reason, d.created_at, d.updated_at,
       w.enabled AS destination_enabled, w.disabled_reason, w.disabled_at,
       w.paused_until, w.paused_reason, w.max_attempts,
       d.closed_reason, d.closed_by, w.ordering, w.coalescing,
       head.delivery_id AS held_by, head.state AS held_by_state,
       newer.delivery_id AS newer_id,
       now() AS measured_at
FROM webhook_delivery_all AS d
JOIN webhook_destination AS w ON w.destination_id = d.destination_id
-- On an ordered destination: the head of the asset's queue, when it is an earlier delivery; on
-- a coalescing one, an earlier one of the same type in flight (what media_hooks_held_by_v2
-- holds this one behind; index webhook_delivery_queue: such a destination's deliveries are
-- queued, migration 0029).
LEFT JOIN LATERAL (
    SELECT e.delivery_id, e.state
    FROM (SELECT s.delivery_id, s.state, s.event_type, s.created_at, s.emit_seq
          FROM delivery_state AS s
          WHERE s.destination_id = d.destination_id AND s.asset_id = d.asset_id AND s.queued
          UNION ALL
          SELECT p.delivery_id, p.state, p.event_type, p.created_at, p.emit_seq
          FROM webhook_delivery_v1 AS p
          WHERE p.destination_id = d.destination_id AND p.asset_id = d.asset_id
            AND p.queued IS NOT FALSE
            AND p.state <> 'succeeded' AND p.closed_reason IS NULL) AS e
    WHERE d.state = 'pending'
      AND (w.ordering = 'asset'
           OR (w.coalescing = 'asset' AND e.event_type = d.event_type
               AND e.state IN ('enqueued', 'leased')))
      AND (e.created_at, coalesce(e.emit_seq, 0), e.delivery_id)
          < (d.created_at, coalesce(d.emit_seq, 0), d.delivery_id)
    ORDER BY e.created_at, coalesce(e.emit_seq, 0), e.delivery_id
    LIMIT 1
) AS head ON true
-- On a coalescing destination: the newest open delivery of the same asset and type, when it is
-- newer than this pending one (which the next run closes as superseded by it).
LEFT JOIN LATERAL (
    SELECT n.delivery_id
    FROM (SELECT s.delivery_id, s.created_at, s.emit_seq
          FROM delivery_state AS s
          WHERE s.destination_id = d.destination_id AND s.asset_id = d.asset_id AND s.queued
            AND s.event_type = d.event_type
          UNION ALL
          SELECT p.delivery_id, p.created_at, p.emit_seq
          FROM webhook_delivery_v1 AS p
          WHERE p.destination_id = d.destination_id AND p.asset_id = d.asset_id
            AND p.event_type = d.event_type
            AND p.queued IS NOT FALSE
            AND p.state <> 'succeeded' AND p.closed_reason IS NULL) AS n
    WHERE w.coalescing = 'asset' AND d.state = 'pending'
      AND (n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
          > (d.created_at, coalesce(d.emit_seq, 0), d.delivery_id)
    ORDER BY n.created_at DESC, coalesce(n.emit_seq, 0) DESC, n.delivery_id DESC
    LIMIT 1
) AS newer ON true
WHERE d.delivery_id = %(delivery_id)s;

-- name: inspection_dispatches
-- description: every outbox row of the delivery, one per dispatch, with the run that claimed
--   it: its message ids delivery_id:1 to delivery_id:dispatch_count, by the outbox's primary key
--   (migration 0032).
SELECT o.message_id, o.dispatch_no, o.run_id, o.created_at, o.published_at
FROM dispatch_outbox AS o
WHERE o.message_id = ANY (ARRAY(
    SELECT d.delivery_id || ':' || n
    FROM webhook_delivery_all AS d, generate_series(1, d.dispatch_count) AS n
    WHERE d.delivery_id = %(delivery_id)s))
ORDER BY o.dispatch_no;

-- name: inspection_attempts
-- description: every HTTP attempt of the delivery, in order (primary key of delivery_attempt).
SELECT attempt_no, message_id, run_id, started_at, finished_at, outcome, http_status, error,
       response_excerpt, next_attempt_at, retry_reason
FROM delivery_attempt_all
WHERE delivery_id = %(delivery_id)s
ORDER BY attempt_no;

-- name: inspection_requeues
-- description: every operator requeue that moved the delivery: who, why, when, from which
--   state (index delivery_requeue_item_delivery).
SELECT r.requeue_id, r.requested_by, r.reason, r.requested_at, i.previous_state
FROM delivery_requeue_item AS i
JOIN delivery_requeue AS r ON r.requeue_id = i.requeue_id
WHERE i.delivery_id = %(delivery_id)s
ORDER BY r.requested_at, r.requeue_id;

-- name: inspection_event
-- description: an event emitted without a destination, with the destinations it fanned out to
--   (its deliveries' ids follow from them: media_hooks_event_delivery_id_v1).
SELECT event_id, event_type, asset_id, destination_ids, created_at,
       ARRAY(SELECT media_hooks_event_delivery_id_v1(event_id, d)
             FROM unnest(destination_ids) AS d) AS delivery_ids
FROM webhook_event
WHERE event_id = %(event_id)s;
