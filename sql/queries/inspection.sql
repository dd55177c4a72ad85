-- A delivery's story (media_hooks.inspection): `media-hooks inspect`. Each statement reads one
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
       now() AS measured_at
FROM webhook_delivery AS d
JOIN webhook_destination AS w ON w.destination_id = d.destination_id
WHERE d.delivery_id = %(delivery_id)s;

-- name: inspection_dispatches
-- description: every outbox row of the delivery, one per dispatch, with the run that claimed
--   it (index one_row_per_dispatch).
SELECT message_id, dispatch_no, run_id, created_at, published_at
FROM dispatch_outbox
WHERE delivery_id = %(delivery_id)s
ORDER BY dispatch_no;

-- name: inspection_attempts
-- description: every HTTP attempt of the delivery, in order (primary key of delivery_attempt).
SELECT attempt_no, message_id, run_id, started_at, finished_at, outcome, http_status, error,
       response_excerpt, next_attempt_at, retry_reason
FROM delivery_attempt
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
