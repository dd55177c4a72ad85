-- Maintenance sweeps: each a named, bounded, counted statement (STYLE.md, River's services).
-- Each moves at most limit_rows rows; the caller repeats until a page comes back short.

-- name: sweep_expired_leases
-- description: Leases that expired (the worker died or hung) end, oldest first, through the one
--   rule for a lease that ends without an outcome (media_hooks_end_leases_v1, migration 0005):
--   the attempt each had open is closed as ambiguous (the request may or may not have reached
--   the receiver), and the delivery is due again now, or dead once its retry budget or maximum
--   age is spent, so a payload that kills its worker cannot loop for ever. Rows another
--   transaction holds (a takeover in progress) are left to it.
-- keeps: invariant 3 (abandoned work becomes visible again), invariant 4 (the lease token is
--   cleared, so the lost worker can no longer record anything), invariant 9.
SELECT ((SELECT count(*)
         FROM media_hooks_end_leases_v2(
             -- The deliveries in flight (delivery_timer_inflight: what runs hold, not the
             -- backlog), each by primary key, whatever the statistics say of the leased ones.
             ARRAY(SELECT s.delivery_id
                   FROM delivery_state AS s
                   WHERE s.delivery_id = ANY (ARRAY(SELECT t.delivery_id FROM delivery_timer AS t
                                                    WHERE t.kind = 'inflight'))
                     AND s.state = 'leased' AND s.lease_until < now()
                   ORDER BY s.lease_until
                   LIMIT %(limit_rows)s),
             true,
             'lease expiry',
             'lease expired before an outcome was recorded (worker lost or too slow)'))
        -- The previous release's leases, by its rule (its layout).
        + (SELECT count(*)
           FROM media_hooks_end_previous_leases_v1(
               ARRAY(SELECT d.delivery_id
                     FROM webhook_delivery_v1 AS d
                     WHERE d.state = 'leased' AND d.lease_until < now()
                     ORDER BY d.lease_until
                     LIMIT %(limit_rows)s),
               true,
               'lease expiry',
               'lease expired before an outcome was recorded (worker lost or too slow)'))
       )::integer AS moved;

-- name: sweep_stale_enqueues
-- description: Deliveries enqueued longer than the enqueue timeout (their run died before
--   delivering, and no failure sensor released them) go back to pending, due now.
-- keeps: invariant 3 (the backstop that makes every enqueued row due again eventually).
WITH stale AS (
    SELECT t.delivery_id
    FROM delivery_timer AS t
    WHERE t.kind = 'inflight'
      AND t.fire_at < now() - make_interval(secs => %(timeout_seconds)s)
    ORDER BY t.fire_at
    LIMIT %(limit_rows)s
    FOR UPDATE SKIP LOCKED
),
moved AS (
    UPDATE delivery_state AS d
    SET state = 'pending',
        next_attempt_at = now(),
        wait_reason = 'stale enqueue: its run did not deliver it within the enqueue timeout',
        updated_at = now()
    FROM stale
    WHERE d.delivery_id = stale.delivery_id AND d.state = 'enqueued'
    RETURNING d.delivery_id
),
retimed AS (
    UPDATE delivery_timer AS t
    SET kind = 'due', fire_at = now()
    FROM moved
    WHERE t.delivery_id = moved.delivery_id
),
-- The previous release's enqueued deliveries, by its rule.
previous_stale AS (
    SELECT delivery_id
    FROM webhook_delivery_v1
    WHERE state = 'enqueued'
      AND updated_at < now() - make_interval(secs => %(timeout_seconds)s)
    ORDER BY updated_at
    LIMIT %(limit_rows)s
    FOR UPDATE SKIP LOCKED
),
previous_moved AS (
    UPDATE webhook_delivery_v1 AS d
    SET state = 'pending',
        next_attempt_at = now(),
        wait_reason = 'stale enqueue: its run did not deliver it within the enqueue timeout',
        updated_at = now()
    FROM previous_stale
    WHERE d.delivery_id = previous_stale.delivery_id
    RETURNING d.delivery_id
)
SELECT ((SELECT count(*) FROM moved) + (SELECT count(*) FROM previous_moved))::integer AS moved;

-- name: sweep_wake_parked_heads
-- description: The safety net of born-parked deliveries (migration 0013, sql/queries/emit.sql):
--   one page of asset queues after the given one, in queue order (the previous release's that
--   hold parked deliveries, webhook_delivery_parked; this release's, delivery_state_queue), and
--   of each queue its first parked delivery in each layout: when no
--   earlier open delivery of its asset holds it (media_hooks_held_by_v2), or its destination no
--   longer orders by asset, it heads its queue with nobody left to wake it, and is made due now.
--   That happens when the delivery before it left the queue while the producer's transaction
--   that recorded it parked was still open: the trigger media_hooks_release_queue_head_v1 ran
--   in the settling transaction and could not see the uncommitted row. Such a delivery waits
--   for the lag sensor's next tick or the next run's sweeps (they precede its claims), which
--   run this. Returns how many were woken and how many queues were read, and the last queue.
--   Of the previous layout only queues with parked deliveries are read, one index entry per
--   parked delivery and one look-up per queue; of this one each open queue's deliveries, with a
--   look-up of each one's timer (no index orders the parked timers by queue). Nothing is
--   written but the woken rows. A row a worker or a trigger holds
--   is skipped (SKIP LOCKED: whoever holds it is changing it), and a delivery woken that is not
--   in fact a head is still held by the claim's rule, so a race costs at most a pass of the
--   claim, never the order.
-- keeps: invariant 3 (a parked delivery is due again once it heads its queue), invariant 10
--   (only the claim's rule sends; this only makes due).
WITH queues AS (
    SELECT q.destination_id, q.asset_id
    FROM ((SELECT DISTINCT d.destination_id, d.asset_id
           FROM webhook_delivery_v1 AS d
           WHERE d.state = 'pending'
             AND d.next_attempt_at >= timestamptz '9999-01-01 00:00:00+00'
             AND (d.destination_id, d.asset_id) > (%(after_destination)s, %(after_asset)s)
           ORDER BY d.destination_id, d.asset_id
           LIMIT %(limit_rows)s)
          UNION
          (SELECT DISTINCT s.destination_id, s.asset_id
           FROM delivery_state AS s
           WHERE s.queued
             AND (s.destination_id, s.asset_id) > (%(after_destination)s, %(after_asset)s)
           ORDER BY s.destination_id, s.asset_id
           LIMIT %(limit_rows)s)) AS q
    ORDER BY q.destination_id, q.asset_id
    LIMIT %(limit_rows)s
),
-- A queue's first parked delivery in each layout: of two, the later is held by the earlier.
heads AS (
    SELECT h.*
    FROM queues AS q
    CROSS JOIN LATERAL (
        (SELECT d.delivery_id, d.destination_id, d.asset_id, d.created_at, d.emit_seq,
                false AS lean
         FROM webhook_delivery_v1 AS d
         WHERE d.destination_id = q.destination_id AND d.asset_id = q.asset_id
           AND d.state = 'pending'
           AND d.next_attempt_at >= timestamptz '9999-01-01 00:00:00+00'
         ORDER BY d.created_at, d.emit_seq NULLS FIRST, d.delivery_id
         LIMIT 1)
        UNION ALL
        (SELECT s.delivery_id, s.destination_id, s.asset_id, s.created_at, s.emit_seq, true
         FROM delivery_state AS s
         JOIN delivery_timer AS t ON t.delivery_id = s.delivery_id AND t.kind = 'parked'
         WHERE s.destination_id = q.destination_id AND s.asset_id = q.asset_id AND s.queued
         ORDER BY s.created_at, s.emit_seq NULLS FIRST, s.delivery_id
         LIMIT 1)
    ) AS h
),
orphan_heads AS (
    SELECT h.delivery_id, h.lean
    FROM heads AS h
    JOIN webhook_destination AS w ON w.destination_id = h.destination_id
    WHERE w.ordering <> 'asset'
       OR NOT EXISTS (
           SELECT FROM media_hooks_held_by_v2('asset', 'none', h.destination_id,
                                              h.asset_id, '', h.created_at,
                                              h.emit_seq, h.delivery_id))
),
orphan_timers AS (
    SELECT t.delivery_id
    FROM delivery_timer AS t
    WHERE t.delivery_id = ANY (ARRAY(SELECT delivery_id FROM orphan_heads WHERE lean))
      AND t.kind = 'parked'
    FOR UPDATE SKIP LOCKED
),
woken_timers AS (
    UPDATE delivery_timer AS t
    SET kind = 'due', fire_at = now()
    WHERE t.delivery_id = ANY (ARRAY(SELECT delivery_id FROM orphan_timers))
    RETURNING t.delivery_id
),
woken AS (
    UPDATE delivery_state AS s
    SET next_attempt_at = now(),
        wait_reason = 'released by the sweep: nothing earlier of its asset is open',
        updated_at = now()
    FROM woken_timers
    WHERE s.delivery_id = woken_timers.delivery_id
    RETURNING s.delivery_id
),
orphans AS (
    SELECT d.delivery_id
    FROM webhook_delivery_v1 AS d
    WHERE d.delivery_id = ANY (ARRAY(SELECT delivery_id FROM orphan_heads WHERE NOT lean))
      AND d.state = 'pending'
      AND d.next_attempt_at >= timestamptz '9999-01-01 00:00:00+00'
    FOR UPDATE OF d SKIP LOCKED
),
previous_woken AS (
    UPDATE webhook_delivery_v1 AS d
    SET next_attempt_at = now(),
        wait_reason = 'released by the sweep: nothing earlier of its asset is open',
        updated_at = now()
    WHERE d.delivery_id = ANY (ARRAY(SELECT delivery_id FROM orphans))
    RETURNING d.delivery_id
),
last AS (
    SELECT destination_id, asset_id FROM queues
    ORDER BY destination_id DESC, asset_id DESC LIMIT 1
)
SELECT ((SELECT count(*) FROM woken) + (SELECT count(*) FROM previous_woken))::integer AS moved,
       (SELECT count(*) FROM queues)::integer AS scanned,
       last.destination_id AS after_destination, last.asset_id AS after_asset
FROM (SELECT 1) AS one LEFT JOIN last ON true;

-- name: sweep_superseded
-- description: On a destination that coalesces by asset, a pending delivery for which a newer
--   one of the same asset and event type exists (not closed) is closed unsent: dead, with the
--   recorded reason 'superseded' and the newest one's id (closed_by). During a publisher's
--   outage a backlog of revisions collapses to the newest. A delivery in flight is not touched:
--   if it comes back pending, a later sweep closes it (the newer one waits for it meanwhile,
--   media_hooks_held_by_v2).
-- keeps: invariant 3 (the delivery ends terminal, with its reason), invariant 1 (nothing is
--   sent under another id). Each newer look-up reads one asset's open queue
--   (webhook_delivery_queue: a coalescing destination's deliveries are queued, migration 0029).
WITH stale AS (
    SELECT o.delivery_id, newest.delivery_id AS superseded_by
    FROM webhook_destination AS w
    JOIN delivery_state AS o
      ON o.destination_id = w.destination_id AND o.queued AND o.state = 'pending'
    CROSS JOIN LATERAL (
        SELECT n.delivery_id
        FROM delivery_state AS n
        WHERE n.destination_id = o.destination_id AND n.asset_id = o.asset_id AND n.queued
          AND n.event_type = o.event_type
          AND (n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
              > (o.created_at, coalesce(o.emit_seq, 0), o.delivery_id)
        ORDER BY n.created_at DESC, coalesce(n.emit_seq, 0) DESC, n.delivery_id DESC
        LIMIT 1
    ) AS newest
    WHERE w.coalescing = 'asset'
    LIMIT %(limit_rows)s
    FOR UPDATE OF o SKIP LOCKED
),
closed AS (
    DELETE FROM delivery_state AS o
    USING stale
    WHERE o.delivery_id = stale.delivery_id AND o.state = 'pending'
    RETURNING o.delivery_id,
              media_hooks_closed_row_v1(o, 'superseded', stale.superseded_by,
                                        'superseded by ' || stale.superseded_by) AS ended_row
),
history AS (
    INSERT INTO delivery_history SELECT (c.ended_row).* FROM closed AS c
),
untimed AS (
    DELETE FROM delivery_timer AS t USING closed WHERE t.delivery_id = closed.delivery_id
),
-- The previous release's deliveries, by its rule.
previous_stale AS (
    SELECT o.delivery_id, newest.delivery_id AS superseded_by
    FROM webhook_destination AS w
    JOIN webhook_delivery_v1 AS o ON o.destination_id = w.destination_id AND o.state = 'pending'
    CROSS JOIN LATERAL (
        SELECT n.delivery_id
        FROM webhook_delivery_v1 AS n
        WHERE n.destination_id = o.destination_id AND n.asset_id = o.asset_id
          AND n.queued IS NOT FALSE
          AND n.state <> 'succeeded' AND n.closed_reason IS NULL
          AND n.event_type = o.event_type
          AND (n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
              > (o.created_at, coalesce(o.emit_seq, 0), o.delivery_id)
        ORDER BY n.created_at DESC, coalesce(n.emit_seq, 0) DESC, n.delivery_id DESC
        LIMIT 1
    ) AS newest
    WHERE w.coalescing = 'asset'
    LIMIT %(limit_rows)s
    FOR UPDATE OF o SKIP LOCKED
),
previous_moved AS (
    UPDATE webhook_delivery_v1 AS d
    SET state = 'dead',
        closed_reason = 'superseded',
        closed_by = previous_stale.superseded_by,
        wait_reason = 'superseded by ' || previous_stale.superseded_by,
        updated_at = now()
    FROM previous_stale
    WHERE d.delivery_id = previous_stale.delivery_id AND d.state = 'pending'
    RETURNING d.delivery_id
)
SELECT ((SELECT count(*) FROM closed) + (SELECT count(*) FROM previous_moved))::integer AS moved;

-- name: release_run
-- description: Every enqueued or leased delivery whose current dispatch belongs to a run that
--   is known to have failed goes back to pending, due now: enqueued ones directly, leased ones
--   through the one rule for a lease that ends without an outcome (media_hooks_end_leases_v1:
--   the open attempt closed as ambiguous, the budget and age rules applied, so a payload that
--   kills every run that sends it cannot loop for ever). With destination_ids, only those
--   destinations' deliveries: what an earlier attempt of one of the run's steps left claimed
--   (its worker died, its Celery task was delivered again to another worker).
-- keeps: invariant 3 (a dead run strands nothing), invariant 4 (its leases are revoked),
--   invariant 9 (a send after this has an ambiguous attempt before it).
-- The run's dispatches by the outbox's run index, then each delivery by primary key: what the
-- run claimed, not every delivery in flight.
WITH mine AS (
    SELECT s.delivery_id, s.state
    FROM delivery_state AS s
    WHERE s.delivery_id = ANY (ARRAY(SELECT o.delivery_id FROM dispatch_outbox_v3 AS o
                                     WHERE o.run_id = %(run_id)s))
      AND s.state IN ('enqueued', 'leased')
      AND (%(destination_ids)s::text[] IS NULL
           OR s.destination_id = ANY (%(destination_ids)s::text[]))
      AND EXISTS (SELECT 1 FROM dispatch_outbox_v3 AS o
                  WHERE o.message_id = s.current_message_id
                    AND o.delivery_created_at = s.created_at
                    AND o.run_id = %(run_id)s)
),
enqueued AS (
    UPDATE delivery_state AS d
    SET state = 'pending',
        next_attempt_at = now(),
        wait_reason = %(cause)s,
        updated_at = now()
    FROM mine
    WHERE d.delivery_id = mine.delivery_id
      AND mine.state = 'enqueued'
      -- Rechecked on the row as locked: a worker may have leased it since the scan.
      AND d.state = 'enqueued'
    RETURNING d.delivery_id
),
retimed AS (
    UPDATE delivery_timer AS t
    SET kind = 'due', fire_at = now()
    FROM enqueued
    WHERE t.delivery_id = enqueued.delivery_id
),
leases AS (
    SELECT *
    FROM media_hooks_end_leases_v2(
        ARRAY(SELECT delivery_id FROM mine WHERE state = 'leased'),
        false,
        %(cause)s,
        %(error)s)
),
-- The previous release's deliveries, by its rule: the run's dispatches by the outbox's run
-- index, then each delivery by primary key.
previous_mine AS (
    SELECT d.delivery_id, d.state
    FROM webhook_delivery_v1 AS d
    WHERE d.delivery_id = ANY (ARRAY(SELECT o.delivery_id FROM dispatch_outbox_v2 AS o
                                     WHERE o.run_id = %(run_id)s
                                     UNION ALL
                                     SELECT o.delivery_id FROM dispatch_outbox_v1 AS o
                                     WHERE o.run_id = %(run_id)s))
      AND d.state IN ('enqueued', 'leased')
      AND (%(destination_ids)s::text[] IS NULL
           OR d.destination_id = ANY (%(destination_ids)s::text[]))
      AND EXISTS (SELECT 1 FROM dispatch_outbox AS o
                  WHERE o.message_id = d.current_message_id AND o.run_id = %(run_id)s)
),
previous_enqueued AS (
    UPDATE webhook_delivery_v1 AS d
    SET state = 'pending',
        next_attempt_at = now(),
        wait_reason = %(cause)s,
        updated_at = now()
    FROM previous_mine
    WHERE d.delivery_id = previous_mine.delivery_id
      AND previous_mine.state = 'enqueued'
      AND d.state = 'enqueued'
    RETURNING d.delivery_id
),
previous_leases AS (
    SELECT *
    FROM media_hooks_end_previous_leases_v1(
        ARRAY(SELECT delivery_id FROM previous_mine WHERE state = 'leased'),
        false,
        %(cause)s,
        %(error)s)
)
SELECT ((SELECT count(*) FROM enqueued) + (SELECT count(*) FROM leases)
        + (SELECT count(*) FROM previous_enqueued) + (SELECT count(*) FROM previous_leases)
       )::integer AS moved;

-- name: trip_circuit_breakers
-- description: Disable each enabled destination whose every attempt has failed for the whole
--   stretch: it was already being tried before the stretch began, at least min_attempts
--   attempts failed within it, and none succeeded. Its deliveries wait in pending; none is
--   lost or killed, and an operator's enable resumes them.
--   Every delivery run starts with it, so it reads per destination, cheapest test first: a
--   success in the stretch (delivery_attempt_destination from the stretch's start: for a
--   healthy destination, the first few rows), then an attempt before it, and only for a
--   destination that passes both, its failures. Its cost is the failing destinations'
--   attempts, not the stretch's (a day of every destination's attempts, read by every run).
--   The two tests are scalar subqueries in the index's order with LIMIT 1, so that each is a
--   probe of one destination's range: as EXISTS the planner may join them as a hash over the
--   whole stretch, and without the order it may read the table hoping for an early success.
-- keeps: invariant 3 (it stops the sending only: every delivery stays pending and
--   discoverable, due again once an operator enables the destination).
WITH stretch AS (
    SELECT now() - make_interval(secs => %(stretch_seconds)s) AS since
),
suspect AS MATERIALIZED (
    SELECT w.destination_id, stretch.since
    FROM webhook_destination AS w
    CROSS JOIN stretch
    WHERE w.enabled
      AND (SELECT a.started_at FROM delivery_attempt_all AS a
           WHERE a.destination_id = w.destination_id
             AND a.started_at >= stretch.since
             AND a.outcome = 'success'
           ORDER BY a.destination_id, a.started_at
           LIMIT 1) IS NULL
      AND (SELECT a.started_at FROM delivery_attempt_all AS a
           WHERE a.destination_id = w.destination_id
             AND a.started_at < stretch.since
           ORDER BY a.destination_id, a.started_at
           LIMIT 1) IS NOT NULL
),
failing AS (
    SELECT s.destination_id, s.since, f.failures, f.last_error
    FROM suspect AS s
    CROSS JOIN LATERAL (
        SELECT count(*) AS failures,
               (array_agg(a.error ORDER BY a.started_at DESC))[1] AS last_error
        FROM delivery_attempt_all AS a
        WHERE a.destination_id = s.destination_id
          AND a.started_at >= s.since
          AND a.outcome IN ('retryable', 'ambiguous', 'rejected')
    ) AS f
    WHERE f.failures >= %(min_attempts)s
)
UPDATE webhook_destination AS w
SET enabled = false,
    disabled_at = now(),
    disabled_reason = 'circuit breaker: all ' || failing.failures || ' attempts since '
                      || to_char(failing.since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                      || ' failed (last: ' || coalesce(failing.last_error, 'no error text') || ')',
    updated_at = now()
FROM failing
WHERE w.destination_id = failing.destination_id
  AND w.enabled
RETURNING w.destination_id, w.disabled_reason;

-- name: convert_previous_pending
-- description: The previous release's pending deliveries (recorded by its producers, or handed
--   back by its workers or its sweeps) move into this release's layout, one page at a time:
--   each delivery's row, with its ended attempts and its dispatches, is deleted from the
--   previous layout's tables and written into this one's (body, state and timer; attempts and
--   dispatches under its creation time), and its identity row gains its destination and
--   creation time. Only pending rows: no worker holds them (the previous release's workers
--   claim with SKIP LOCKED, as this does). Every delivery run's sweeps run this first, so its
--   claims see them; once the previous release is gone nothing new arrives there.
-- keeps: invariant 3 (the delivery is pending in one layout or the other, never both, never
--   neither: one statement), 1 and 8 (its identity row is the same row), 2 (payload and body
--   are the bytes it was recorded with), 9 (its attempts go with it), 10 (its place in its
--   asset's queue is its creation time and emission order, which move with it).
WITH moving AS (
    SELECT d.delivery_id
    FROM webhook_delivery_v1 AS d
    WHERE d.state = 'pending'
    LIMIT %(limit_rows)s
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM webhook_delivery_v1 AS d
    USING moving
    WHERE d.delivery_id = moving.delivery_id
    RETURNING d.*
),
body AS (
    INSERT INTO delivery_body (delivery_id, created_at, payload, body)
    SELECT g.delivery_id, g.created_at, g.payload, g.body FROM gone AS g
),
state AS (
    INSERT INTO delivery_state
        (delivery_id, destination_id, asset_id, event_type, created_at, emit_seq, queued, state,
         attempt_count, budget_used, budget_started_at, dispatch_count, next_attempt_at,
         current_message_id, last_outcome, last_error, wait_reason, updated_at)
    SELECT g.delivery_id, g.destination_id, g.asset_id, g.event_type, g.created_at, g.emit_seq,
           coalesce(g.queued, true), 'pending', g.attempt_count, g.budget_used,
           g.budget_started_at, g.dispatch_count, g.next_attempt_at, g.current_message_id,
           g.last_outcome, g.last_error, g.wait_reason, g.updated_at
    FROM gone AS g
),
timer AS (
    INSERT INTO delivery_timer (delivery_id, destination_id, kind, fire_at)
    SELECT g.delivery_id, g.destination_id,
           CASE WHEN g.next_attempt_at >= timestamptz '9999-01-01 00:00:00+00'
                THEN 'parked' ELSE 'due' END,
           g.next_attempt_at
    FROM gone AS g
),
identity AS (
    UPDATE delivery_identity AS i
    SET destination_id = g.destination_id, created_at = g.created_at
    FROM gone AS g
    WHERE i.delivery_id = g.delivery_id AND i.created_at IS NULL
),
attempts AS (
    DELETE FROM delivery_attempt_v1 AS a
    USING gone AS g
    WHERE a.delivery_id = g.delivery_id
    RETURNING a.*, g.created_at AS delivery_created_at
),
attempts_moved AS (
    INSERT INTO delivery_attempt_v2
        (delivery_id, attempt_no, destination_id, message_id, run_id, lease_token,
         delivery_created_at, started_at, finished_at, outcome, http_status, error,
         response_excerpt, next_attempt_at, retry_reason)
    SELECT a.delivery_id, a.attempt_no, a.destination_id, a.message_id, a.run_id,
           a.lease_token, a.delivery_created_at, a.started_at, a.finished_at, a.outcome,
           a.http_status, a.error, a.response_excerpt, a.next_attempt_at, a.retry_reason
    FROM attempts AS a
    WHERE a.finished_at IS NOT NULL
),
dispatches AS (
    DELETE FROM dispatch_outbox_v2 AS o
    WHERE o.message_id = ANY (ARRAY(
        SELECT g.delivery_id || ':' || n
        FROM gone AS g, generate_series(1, g.dispatch_count) AS n))
    RETURNING o.*
),
dispatches_v1 AS (
    DELETE FROM dispatch_outbox_v1 AS o
    USING gone AS g
    WHERE o.delivery_id = g.delivery_id
    RETURNING o.message_id, o.delivery_id, o.dispatch_no, o.destination_id, o.run_id,
              o.created_at, o.published_at
),
dispatches_moved AS (
    INSERT INTO dispatch_outbox_v3
        (message_id, delivery_id, dispatch_no, destination_id, run_id, delivery_created_at,
         created_at, published_at)
    SELECT o.message_id, o.delivery_id, o.dispatch_no, o.destination_id, o.run_id,
           g.created_at, o.created_at, o.published_at
    FROM (SELECT message_id, delivery_id, dispatch_no, destination_id, run_id, created_at,
                 published_at FROM dispatches
          UNION ALL
          SELECT * FROM dispatches_v1) AS o
    JOIN gone AS g ON g.delivery_id = o.delivery_id
)
SELECT count(*)::integer AS moved FROM gone;
