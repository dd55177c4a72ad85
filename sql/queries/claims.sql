-- The reconciler: due deliveries into the outbox, one page per transaction.

-- name: run_dispatched
-- description: Whether a run dispatched anything into this database's outbox: one probe of
--   dispatch_outbox_by_run. (A Dagster instance may serve several deployments, each with its own
--   database: a run unknown here is another's.)
SELECT EXISTS (SELECT 1 FROM dispatch_outbox WHERE run_id = %(run_id)s) AS dispatched;

-- name: plan_by_index
-- description: For the rest of the transaction, plans that read rows in index order: no
--   sequential scan, no sort. A backlog loaded in bulk has no statistics until ANALYZE runs
--   (autovacuum may be slow or off), and then the planner guesses: it read a destination's due
--   rows by the wrong index and sorted them, or every destination's, before the first one.
--   The statements that run after it (due_destinations, claim_destination_page) each have a plan
--   by delivery_timer_due in order, which these settings leave the cheapest.
--   A disabled node is priced at 1e10, past every JIT threshold: on a server built with JIT
--   each claim would compile for seconds what runs in a millisecond, so JIT is off with them.
--   Each plan is made for its parameters: the driver prepares a statement run five times, and
--   the server's generic plan of the claim, which cannot see the destination or the page size,
--   read a 100,000-row backlog for 7.4 s a page of 1,000 (20 ms planned for them).
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_sort', 'off', true),
       set_config('jit', 'off', true), set_config('plan_cache_mode', 'force_custom_plan', true);

-- name: due_destinations
-- description: The destinations of a cohort that have due pending deliveries and may be sent
--   to now (enabled, not paused): the ones a delivery run serves. One probe of
--   delivery_timer_due per destination (migration 0034), after plan_by_index.
SELECT w.destination_id
FROM webhook_destination AS w
CROSS JOIN LATERAL (
    SELECT 1
    FROM delivery_timer AS t
    JOIN delivery_state AS d ON d.delivery_id = t.delivery_id
    WHERE t.destination_id = w.destination_id
      AND t.kind = 'due'
      AND t.fire_at <= now()
      AND media_hooks_in_cohort_v2(d.destination_id, d.event_type, d.asset_id, d.created_at,
                                   %(destination_ids)s, %(event_types)s, %(asset_ids)s,
                                   %(created_after)s, %(created_before)s)
    ORDER BY t.fire_at, t.delivery_id
    LIMIT 1
) AS first_due
WHERE w.enabled
  AND (w.paused_until IS NULL OR w.paused_until <= now())
  AND (cardinality(%(destination_ids)s::text[]) = 0 OR w.destination_id = ANY (%(destination_ids)s))
ORDER BY w.destination_id;

-- name: claim_destination_page
-- description: Claim one page of one destination's due pending deliveries of a cohort for a
--   run, oldest first: one outbox row per dispatch, published, and the rows flipped to
--   enqueued, in one statement. A run's delivery of each destination claims its own pages as
--   it needs them (bounded, round-robin across destinations: none waits behind another's
--   backlog).
-- keeps: invariant 3 (a claimed row is enqueued with a committed outbox row naming its run, so
--   a sweep can always find it again), invariant 1 (the message is per dispatch; the receiver's
--   key stays delivery_id), invariant 7 (one bounded page). SKIP LOCKED lets runs at once
--   divide the rows; a disabled or paused destination keeps its rows pending. The plan reads
--   delivery_timer_due in order (migration 0034): no sort, no scan of other
--   destinations' rows, whatever the statistics (after plan_by_index, in the same
--   transaction). A per-row eligibility rule is one more condition in the WHERE of `due`.
--   invariant 10: on an ordered destination only the head of an asset's queue is claimed
--   (media_hooks_held_by_v2 returns no row for it).
WITH due AS (
    SELECT t.delivery_id
    FROM delivery_timer AS t
    JOIN delivery_state AS d ON d.delivery_id = t.delivery_id
    WHERE t.destination_id = %(destination_id)s
      AND t.kind = 'due'
      AND t.fire_at <= now()
      AND media_hooks_in_cohort_v2(d.destination_id, d.event_type, d.asset_id, d.created_at,
                                   %(destination_ids)s, %(event_types)s, %(asset_ids)s,
                                   %(created_after)s, %(created_before)s)
      AND EXISTS (
          SELECT 1
          FROM webhook_destination AS w
          WHERE w.destination_id = d.destination_id
            AND w.enabled
            AND (w.paused_until IS NULL OR w.paused_until <= now())
            -- Per-asset order and latest-wins (migration 0013, inlined: index look-ups on
            -- ordered or coalescing destinations, nothing elsewhere).
            AND NOT EXISTS (
                SELECT FROM media_hooks_held_by_v2(w.ordering, w.coalescing, d.destination_id,
                                                   d.asset_id, d.event_type, d.created_at,
                                                   d.emit_seq, d.delivery_id))
      )
    ORDER BY t.fire_at, t.delivery_id
    LIMIT %(page_size)s
    FOR UPDATE OF t SKIP LOCKED
),
-- In flight from now: the sweeps look at it again if its run leaves it (stale enqueue,
-- expired lease).
timed AS (
    UPDATE delivery_timer AS t
    SET kind = 'inflight', fire_at = now()
    WHERE t.delivery_id = ANY (ARRAY(SELECT delivery_id FROM due))
),
-- Heap-only: no index of delivery_state names a column this changes.
enqueued AS (
    UPDATE delivery_state AS d
    SET state = 'enqueued',
        dispatch_count = d.dispatch_count + 1,
        current_message_id = d.delivery_id || ':' || (d.dispatch_count + 1),
        wait_reason = NULL,
        updated_at = now()
    -- = ANY(ARRAY(...)) keeps this a primary-key index scan (a join on the CTE may not).
    WHERE d.delivery_id = ANY (ARRAY(SELECT delivery_id FROM due))
      AND d.state = 'pending'
    RETURNING d.delivery_id, d.destination_id, d.dispatch_count, d.current_message_id,
              d.created_at
)
-- The dispatch, written once and published: the worker that claims a page is the one that
-- sends it, so the claim is the hand-over. Its body is its delivery's (dispatch_outbox).
INSERT INTO dispatch_outbox_v3
    (message_id, delivery_id, dispatch_no, destination_id, run_id, delivery_created_at,
     published_at)
SELECT current_message_id, delivery_id, dispatch_count, destination_id, %(run_id)s, created_at,
       now()
FROM enqueued
RETURNING message_id, delivery_id;
