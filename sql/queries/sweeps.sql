-- Maintenance sweeps: each a named, bounded, counted statement (STYLE.md, River's services).
-- Each moves at most limit_rows rows; the caller repeats until a page comes back short.

-- name: sweep_expired_leases
-- description: Leases that expired (the worker died or hung) go back to pending, due now, and
--   the attempt each one had open is closed as ambiguous: the request may or may not have
--   reached the receiver. A delivery whose retry budget is spent goes dead instead, so a
--   payload that kills its worker cannot loop forever.
-- keeps: invariant 3 (abandoned work becomes visible again), invariant 4 (the lease token is
--   cleared, so the lost worker can no longer record anything).
WITH expired AS (
    SELECT d.delivery_id, d.lease_token, d.attempt_count,
           d.budget_used >= w.max_attempts AS budget_spent
    FROM webhook_delivery AS d
    JOIN webhook_destination AS w ON w.destination_id = d.destination_id
    WHERE d.state = 'leased' AND d.lease_until < now()
    ORDER BY d.lease_until
    LIMIT %(limit_rows)s
    FOR UPDATE OF d SKIP LOCKED
),
moved AS (
    UPDATE webhook_delivery AS d
    SET state = CASE WHEN expired.budget_spent THEN 'dead' ELSE 'pending' END,
        next_attempt_at = now(),
        lease_until = NULL,
        lease_token = NULL,
        last_outcome = 'ambiguous',
        last_error = 'lease expired before an outcome was recorded',
        wait_reason = CASE WHEN expired.budget_spent
                           THEN 'dead: retry budget spent (the last lease expired)'
                           ELSE 'lease expiry: due again now' END,
        updated_at = now()
    FROM expired
    WHERE d.delivery_id = expired.delivery_id
    RETURNING d.delivery_id, expired.lease_token, expired.attempt_count
),
closed AS (
    UPDATE delivery_attempt AS a
    SET finished_at = now(),
        outcome = 'ambiguous',
        error = 'lease expired before an outcome was recorded (worker lost or too slow)',
        retry_reason = 'lease expiry'
    FROM moved
    WHERE a.delivery_id = moved.delivery_id
      AND a.attempt_no = moved.attempt_count
      AND a.lease_token = moved.lease_token
      AND a.finished_at IS NULL
)
SELECT count(*)::integer AS moved FROM moved;

-- name: sweep_stale_enqueues
-- description: Deliveries enqueued longer than the enqueue timeout (their run died before
--   delivering, and no failure sensor released them) go back to pending, due now.
-- keeps: invariant 3 (the backstop that makes every enqueued row due again eventually).
WITH stale AS (
    SELECT delivery_id
    FROM webhook_delivery
    WHERE state = 'enqueued'
      AND updated_at < now() - make_interval(secs => %(timeout_seconds)s)
    ORDER BY updated_at
    LIMIT %(limit_rows)s
    FOR UPDATE SKIP LOCKED
),
moved AS (
    UPDATE webhook_delivery AS d
    SET state = 'pending',
        next_attempt_at = now(),
        wait_reason = 'stale enqueue: its run did not deliver it within the enqueue timeout',
        updated_at = now()
    FROM stale
    WHERE d.delivery_id = stale.delivery_id
    RETURNING d.delivery_id
)
SELECT count(*)::integer AS moved FROM moved;

-- name: release_run
-- description: Every enqueued or leased delivery whose current dispatch belongs to a run that
--   is known to have failed goes back to pending, due now; open attempts are closed ambiguous.
-- keeps: invariant 3 (a dead run strands nothing), invariant 4 (its leases are revoked).
WITH mine AS (
    SELECT d.delivery_id, d.lease_token, d.attempt_count, d.state
    FROM webhook_delivery AS d
    -- The run's dispatches by the outbox's run index, then each delivery by primary key.
    WHERE d.delivery_id = ANY (ARRAY(SELECT o.delivery_id FROM dispatch_outbox AS o
                                     WHERE o.run_id = %(run_id)s))
      AND d.state IN ('enqueued', 'leased')
      AND EXISTS (SELECT 1 FROM dispatch_outbox AS o
                  WHERE o.message_id = d.current_message_id AND o.run_id = %(run_id)s)
    FOR UPDATE
),
moved AS (
    UPDATE webhook_delivery AS d
    SET state = 'pending',
        next_attempt_at = now(),
        lease_until = NULL,
        lease_token = NULL,
        wait_reason = 'released: run ' || %(run_id)s || ' failed',
        updated_at = now()
    FROM mine
    WHERE d.delivery_id = mine.delivery_id
    RETURNING d.delivery_id, mine.lease_token, mine.attempt_count, mine.state AS previous_state
),
closed AS (
    UPDATE delivery_attempt AS a
    SET finished_at = now(),
        outcome = 'ambiguous',
        error = 'run failed before an outcome was recorded',
        retry_reason = 'run failure'
    FROM moved
    WHERE moved.previous_state = 'leased'
      AND a.delivery_id = moved.delivery_id
      AND a.attempt_no = moved.attempt_count
      AND a.finished_at IS NULL
)
SELECT count(*)::integer AS moved FROM moved;

-- name: trip_circuit_breakers
-- description: Disable each enabled destination whose every attempt has failed for the whole
--   stretch: it was already being tried before the stretch began, at least min_attempts
--   attempts failed within it, and none succeeded. Its deliveries wait in pending; none is
--   lost or killed, and an operator's enable resumes them.
UPDATE webhook_destination AS w
SET enabled = false,
    disabled_at = now(),
    disabled_reason = 'circuit breaker: all ' || failing.failures || ' attempts since '
                      || to_char(failing.since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                      || ' failed (last: ' || coalesce(failing.last_error, 'no error text') || ')',
    updated_at = now()
FROM (
    SELECT a.destination_id,
           count(*) AS failures,
           now() - make_interval(secs => %(stretch_seconds)s) AS since,
           (array_agg(a.error ORDER BY a.started_at DESC))[1] AS last_error
    FROM delivery_attempt AS a
    WHERE a.started_at >= now() - make_interval(secs => %(stretch_seconds)s)
      AND a.outcome IN ('retryable', 'ambiguous', 'rejected')
    GROUP BY a.destination_id
    HAVING count(*) >= %(min_attempts)s
) AS failing
WHERE w.destination_id = failing.destination_id
  AND w.enabled
  AND EXISTS (
      SELECT 1 FROM delivery_attempt AS a
      WHERE a.destination_id = w.destination_id
        AND a.started_at < now() - make_interval(secs => %(stretch_seconds)s)
  )
  AND NOT EXISTS (
      SELECT 1 FROM delivery_attempt AS a
      WHERE a.destination_id = w.destination_id
        AND a.started_at >= now() - make_interval(secs => %(stretch_seconds)s)
        AND a.outcome = 'success'
  )
RETURNING w.destination_id, w.disabled_reason;
