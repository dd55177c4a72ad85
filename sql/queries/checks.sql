-- `media-hooks check` (media_hooks.observe.checks): the invariants (docs/architecture.md) that
-- can be seen in the tables, each one read-only statement returning how many rows break it and
-- up to five of their ids. They run together in one READ ONLY REPEATABLE READ transaction, so
-- every count is of the same snapshot and now() is one instant for all of them.
--
-- Each statement starts from a partial index or a bounded range of one, so the default pass
-- reads the live backlog (leased, enqueued, open attempts, limiter rows) and the history of the
-- window only (%(since)s: attempts and terminal rows newer than it). --all passes '-infinity' as
-- since: the same statements then read the whole history (sequential scans, slower, opt-in).
-- media_hooks_tests/test_query_plans.py holds the default pass to its indexes.

-- name: check_through_indexes
-- description: the default pass reads through the indexes, whatever the statistics say (for
--   this transaction only). A disabled scan is priced at 1e10, which is past every JIT
--   threshold: on a server built with JIT (Debian's PostgreSQL is) each statement then compiled
--   for seconds a plan that runs in a millisecond, so JIT is off with it.
SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true);

-- name: check_clock
-- description: the snapshot's instant, and where the history read begins: the instant given
--   as since (a delivery run's own start), else the window before now.
SELECT now() AS now,
       coalesce(%(since)s::timestamptz,
                now() - make_interval(secs => %(window_seconds)s)) AS since;

-- name: check_open_without_its_timer
-- description: this layout's open deliveries (and dead heads of queues) whose timer is missing,
--   of another destination, or of a kind that is not their state's (pending: due or parked;
--   enqueued and leased: in flight; dead: dead), and timers without a delivery. The claim, the
--   sweeps and `status` find a delivery only by its timer: one without is lost to all of them,
--   and the other checks of the live backlog reach it through its timer too. delivery_state and
--   delivery_timer hold only the live backlog (an ended delivery is history), so this reads
--   both whole, by key: no index names state, which every move changes (migration 0034).
WITH bad AS (
    SELECT coalesce(s.delivery_id, t.delivery_id) AS delivery_id
    FROM delivery_state AS s
    FULL JOIN delivery_timer AS t ON t.delivery_id = s.delivery_id
    WHERE s.delivery_id IS NULL
       OR t.delivery_id IS NULL
       OR t.destination_id <> s.destination_id
       OR t.kind <> ALL (CASE s.state WHEN 'pending' THEN ARRAY['due', 'parked']
                                      WHEN 'dead' THEN ARRAY['dead']
                                      ELSE ARRAY['inflight'] END)
)
SELECT count(*) AS violations, (array_agg(delivery_id ORDER BY delivery_id))[1:5] AS examples
FROM bad;

-- name: check_leased_without_one_open_attempt
-- description: leased deliveries that do not have exactly one open attempt, their newest, under
--   their lease token (webhook_delivery_lease; this layout's by its timers in flight,
--   delivery_timer_inflight, which check_open_without_its_timer holds to their states; then
--   delivery_attempt's key per delivery).
WITH leased AS (
    SELECT d.delivery_id, d.attempt_count, d.lease_token
    FROM webhook_delivery_v1 AS d
    WHERE d.state = 'leased'
    UNION ALL
    SELECT s.delivery_id, s.attempt_count, s.lease_token
    FROM delivery_timer AS t
    JOIN delivery_state AS s ON s.delivery_id = t.delivery_id
    WHERE t.kind = 'inflight' AND s.state = 'leased'
),
bad AS (
    SELECT d.delivery_id
    FROM leased AS d
    WHERE ((SELECT count(*) FROM delivery_attempt_all AS a
             WHERE a.delivery_id = d.delivery_id AND a.finished_at IS NULL) <> 1
           OR NOT EXISTS (SELECT 1 FROM delivery_attempt_all AS a
                           WHERE a.delivery_id = d.delivery_id
                             AND a.attempt_no = d.attempt_count
                             AND a.lease_token = d.lease_token
                             AND a.finished_at IS NULL))
)
SELECT count(*) AS violations, (array_agg(delivery_id ORDER BY delivery_id))[1:5] AS examples
FROM bad;

-- name: check_open_attempt_without_lease
-- description: open attempts started in the window whose delivery is not leased under the
--   attempt's token as its newest attempt (delivery_attempt_destination by start, then the delivery's key).
--   No index names finished_at (an attempt's ending is a heap-only update: migration 0023), so
--   open attempts are found among those started in the window; a leased delivery's own attempt
--   is checked whatever its age by check_leased_without_one_open_attempt.
WITH bad AS (
    SELECT a.delivery_id || '#' || a.attempt_no AS id
    FROM delivery_attempt_all AS a
    JOIN webhook_delivery_all AS d ON d.delivery_id = a.delivery_id
    WHERE a.destination_id = ANY (ARRAY(SELECT destination_id FROM webhook_destination))
      AND a.started_at >= %(since)s
      AND a.finished_at IS NULL
      AND NOT (d.state = 'leased'
               AND d.lease_token = a.lease_token
               AND d.attempt_count = a.attempt_no)
)
SELECT count(*) AS violations, (array_agg(id ORDER BY id))[1:5] AS examples
FROM bad;

-- name: check_open_attempt_past_lease
-- description: open attempts whose lease ended more than the margin ago: a lost worker's lease
--   that no sweep has ended (webhook_delivery_lease up to the margin, then delivery_attempt's
--   key per delivery).
WITH bad AS (
    SELECT a.delivery_id || '#' || a.attempt_no AS id
    FROM webhook_delivery_all AS d
    JOIN delivery_attempt_all AS a ON a.delivery_id = d.delivery_id
    WHERE d.state = 'leased'
      AND d.lease_until < now() - make_interval(secs => %(lease_margin_seconds)s)
      AND a.finished_at IS NULL
)
SELECT count(*) AS violations, (array_agg(id ORDER BY id))[1:5] AS examples
FROM bad;

-- name: check_two_successes
-- description: deliveries with a success attempt started in the window and another success
--   attempt (delivery_attempt_destination by start, then delivery_attempt's key per delivery).
WITH bad AS (
    SELECT DISTINCT a.delivery_id
    FROM delivery_attempt_all AS a
    WHERE a.destination_id = ANY (ARRAY(SELECT destination_id FROM webhook_destination))
      AND a.started_at >= %(since)s
      AND a.outcome = 'success'
      AND EXISTS (SELECT 1 FROM delivery_attempt_all AS b
                   WHERE b.delivery_id = a.delivery_id
                     AND b.attempt_no <> a.attempt_no
                     AND b.outcome = 'success')
)
SELECT count(*) AS violations, (array_agg(delivery_id ORDER BY delivery_id))[1:5] AS examples
FROM bad;

-- name: check_send_without_reason
-- description: attempts started in the window that follow an earlier attempt of their delivery
--   without a recorded reason to send again: the previous attempt must have finished before,
--   as retryable, rate limited or ambiguous, or as rejected and then requeued by an operator
--   (delivery_attempt_destination by start, then delivery_attempt's key and
--   delivery_requeue_item_delivery).
WITH bad AS (
    SELECT a.delivery_id || '#' || a.attempt_no AS id
    FROM delivery_attempt_all AS a
    LEFT JOIN delivery_attempt_all AS p
      ON p.delivery_id = a.delivery_id AND p.attempt_no = a.attempt_no - 1
    WHERE a.destination_id = ANY (ARRAY(SELECT destination_id FROM webhook_destination))
      AND a.started_at >= %(since)s
      AND a.attempt_no > 1
      AND NOT coalesce(
          p.finished_at <= a.started_at
          AND (p.outcome IN ('retryable', 'rate_limited', 'ambiguous')
               OR (p.outcome = 'rejected'
                   AND EXISTS (SELECT 1 FROM delivery_requeue_item AS r
                                WHERE r.delivery_id = a.delivery_id))),
          false)
)
SELECT count(*) AS violations, (array_agg(id ORDER BY id))[1:5] AS examples
FROM bad;

-- name: check_success_matches_state
-- description: deliveries that succeeded in the window without a success attempt, and success
--   attempts started in the window whose delivery is not succeeded (webhook_delivery_terminal
--   and delivery_attempt_destination by time, then keys).
WITH bad AS (
    SELECT d.delivery_id
    FROM webhook_delivery_v1 AS d
    WHERE d.state IN ('succeeded', 'dead')
      AND d.updated_at >= %(since)s
      AND d.state = 'succeeded'
      AND NOT EXISTS (SELECT 1 FROM delivery_attempt_all AS a
                       WHERE a.delivery_id = d.delivery_id AND a.outcome = 'success')
    UNION
    -- This layout's successes of the window (delivery_history_finished), their attempts in their
    -- creation time's partition.
    SELECT h.delivery_id
    FROM delivery_history AS h
    WHERE h.state = 'succeeded'
      AND h.finished_at >= %(since)s
      AND NOT EXISTS (SELECT 1 FROM delivery_attempt_v2 AS a
                       WHERE a.delivery_id = h.delivery_id
                         AND a.delivery_created_at = h.created_at AND a.outcome = 'success')
    UNION
    SELECT a.delivery_id
    FROM delivery_attempt_all AS a
    JOIN webhook_delivery_all AS d ON d.delivery_id = a.delivery_id
    WHERE a.destination_id = ANY (ARRAY(SELECT destination_id FROM webhook_destination))
      AND a.started_at >= %(since)s
      AND a.outcome = 'success'
      AND d.state <> 'succeeded'
)
SELECT count(*) AS violations, (array_agg(delivery_id ORDER BY delivery_id))[1:5] AS examples
FROM bad;

-- name: check_tombstone_beside_live
-- description: tombstones (delivery_identity with a final state, the delivery_tombstone view of
--   migration 0005) that share their id with a live delivery. The default pass starts from the
--   live deliveries an emit, a run or a requeue could have written since the window began: the
--   open ones (webhook_delivery_due_by_destination, _parked, _enqueued, _lease) and those that
--   ended in the window (_terminal), then looks each id up among the identities (delivery_identity's key). The
--   tombstones themselves are a year of purged ids by default (tombstone_days): only --all
--   reads them all, and only it would find a tombstone beside a delivery that ended before the
--   window (the purge deletes what it tombstones, in one statement).
WITH bad AS (
    SELECT d.delivery_id
    FROM webhook_delivery_all AS d
    JOIN delivery_identity AS i ON i.delivery_id = d.delivery_id
    WHERE i.final_state IS NOT NULL
      -- One arm per partial index, read as a BitmapOr.
      AND (%(since)s = '-infinity'::timestamptz
           OR d.state = 'pending'
           OR d.state = 'enqueued'
           OR d.state = 'leased'
           OR (d.state IN ('succeeded', 'dead') AND d.updated_at >= %(since)s))
)
SELECT count(*) AS violations, (array_agg(delivery_id ORDER BY delivery_id))[1:5] AS examples
FROM bad;

-- name: check_delivery_without_identity
-- description: deliveries updated in the window with no identity row (migration 0005: every
--   emit records the id first). With --all, every delivery (an anti-join of the two keys).
WITH touched AS (
    SELECT d.delivery_id
    FROM webhook_delivery_v1 AS d
    -- One arm per partial index (_terminal, _enqueued, _lease), which the planner reads as a
    -- BitmapOr: a list of states (state IN ...) would read a whole index of the table.
    WHERE %(since)s = '-infinity'::timestamptz
       OR (d.state IN ('succeeded', 'dead') AND d.updated_at >= %(since)s)
       OR d.state = 'enqueued'
       OR d.state = 'leased'
    UNION ALL
    -- This layout's deliveries in flight (delivery_timer_inflight); with --all, every open one.
    SELECT t.delivery_id
    FROM delivery_timer AS t
    WHERE %(since)s = '-infinity'::timestamptz OR t.kind = 'inflight'
    UNION ALL
    -- And those that ended in the window (delivery_history_finished).
    SELECT h.delivery_id
    FROM delivery_history AS h
    WHERE h.finished_at >= %(since)s
),
bad AS (
    SELECT c.delivery_id
    FROM touched AS c
    WHERE NOT EXISTS (SELECT 1 FROM delivery_identity AS i WHERE i.delivery_id = c.delivery_id)
)
SELECT count(*) AS violations, (array_agg(delivery_id ORDER BY delivery_id))[1:5] AS examples
FROM bad;

-- name: check_enqueued_without_outbox
-- description: enqueued deliveries without a committed outbox row for their current dispatch
--   (webhook_delivery_enqueued; this layout's by their timers in flight, delivery_timer_inflight;
--   then dispatch_outbox's key).
WITH enqueued AS (
    SELECT d.delivery_id, d.current_message_id, d.dispatch_count
    FROM webhook_delivery_v1 AS d
    WHERE d.state = 'enqueued'
    UNION ALL
    SELECT s.delivery_id, s.current_message_id, s.dispatch_count
    FROM delivery_timer AS t
    JOIN delivery_state AS s ON s.delivery_id = t.delivery_id
    WHERE t.kind = 'inflight' AND s.state = 'enqueued'
),
bad AS (
    SELECT d.delivery_id
    FROM enqueued AS d
    LEFT JOIN dispatch_outbox AS o ON o.message_id = d.current_message_id
    WHERE (o.message_id IS NULL
           OR o.delivery_id <> d.delivery_id
           OR o.dispatch_no <> d.dispatch_count)
)
SELECT count(*) AS violations, (array_agg(delivery_id ORDER BY delivery_id))[1:5] AS examples
FROM bad;

-- name: check_attempt_without_delivery
-- description: attempts started in the window whose delivery has no row (delivery_attempt_destination
--   by start, then the delivery's key). The purge deletes a delivery's attempts with it; since
--   migration 0031 no foreign key refuses one left behind (its check locked the delivery's row
--   again at every lease).
-- keeps: invariant 9 (an attempt is the evidence of a send: it is read with its delivery).
WITH bad AS (
    SELECT a.delivery_id || '#' || a.attempt_no AS id
    FROM delivery_attempt_all AS a
    WHERE a.destination_id = ANY (ARRAY(SELECT destination_id FROM webhook_destination))
      AND a.started_at >= %(since)s
      AND NOT EXISTS (SELECT 1 FROM webhook_delivery_all AS d WHERE d.delivery_id = a.delivery_id)
)
SELECT count(*) AS violations, (array_agg(id ORDER BY id))[1:5] AS examples
FROM bad;

-- name: check_sent_out_of_order
-- description: dispatched deliveries (enqueued or leased) of a destination that orders by asset
--   while an earlier delivery of the same asset is not terminal or is dead without being closed
--   (webhook_delivery_enqueued and _lease, then the asset's queue, webhook_delivery_queue:
--   the rule of media_hooks_held_by_v2, migrations 0013 and 0029). A dispatch made (enqueued)
--   or an attempt started (leased) before ordering began on the destination (ordered_since,
--   migration 0021) is not counted: it cannot be recalled, and the lease hands back what it had
--   not sent.
WITH bad AS (
    SELECT d.delivery_id
    FROM webhook_delivery_all AS d
    JOIN webhook_destination AS w ON w.destination_id = d.destination_id
    -- Two arms, each its partial index (_enqueued, _lease), read as a BitmapOr.
    WHERE (d.state = 'enqueued' OR d.state = 'leased')
      AND w.ordering = 'asset'
      AND NOT EXISTS (
          SELECT 1 FROM dispatch_outbox AS o
          WHERE d.state = 'enqueued' AND o.message_id = d.current_message_id
            AND o.created_at < w.ordered_since)
      AND NOT EXISTS (
          SELECT 1 FROM delivery_attempt_all AS a
          WHERE d.state = 'leased' AND a.delivery_id = d.delivery_id
            AND a.attempt_no = d.attempt_count AND a.started_at < w.ordered_since)
      AND EXISTS (
          SELECT 1 FROM webhook_delivery_all AS e
          WHERE e.destination_id = d.destination_id
            AND e.asset_id = d.asset_id
            AND e.queued IS NOT FALSE
            AND e.state <> 'succeeded' AND e.closed_reason IS NULL
            AND (e.created_at, coalesce(e.emit_seq, 0), e.delivery_id)
                < (d.created_at, coalesce(d.emit_seq, 0), d.delivery_id))
)
SELECT count(*) AS violations, (array_agg(delivery_id ORDER BY delivery_id))[1:5] AS examples
FROM bad;

-- name: check_left_out_of_queue
-- description: open deliveries (and dead ones not closed) of a destination that orders or
--   coalesces by asset that are not in their asset's queue (queued false, migration 0029): the
--   claim's rule, the queue-head trigger and latest-wins read the queue, and would not see them.
--   Such a destination's deliveries are queued when emitted, and its backlog when it starts
--   ordering or coalescing. Per such destination, each open state's partial index.
-- keeps: invariant 10, as every check of it above assumes (they read the queue).
WITH queues AS (
    SELECT w.destination_id FROM webhook_destination AS w
    WHERE w.ordering = 'asset' OR w.coalescing = 'asset'
),
bad AS (
    SELECT d.delivery_id
    FROM queues AS w
    JOIN webhook_delivery_v1 AS d ON d.destination_id = w.destination_id
    -- One arm per partial index, read as a BitmapOr.
    WHERE (d.state = 'pending' OR d.state = 'enqueued' OR d.state = 'leased' OR d.state = 'dead')
      AND d.closed_reason IS NULL
      AND d.queued = false
    UNION ALL
    -- This layout's open deliveries, by their timers: each kind's partial index.
    SELECT s.delivery_id
    FROM queues AS w
    JOIN delivery_timer AS t ON t.destination_id = w.destination_id
    JOIN delivery_state AS s ON s.delivery_id = t.delivery_id
    WHERE (t.kind = 'due' OR t.kind = 'parked' OR t.kind = 'inflight' OR t.kind = 'dead')
      AND NOT s.queued
    UNION ALL
    -- And its dead letters that ended out of their queue (delivery_history_dead).
    SELECT h.delivery_id
    FROM queues AS w
    JOIN delivery_history AS h ON h.destination_id = w.destination_id
    WHERE h.state = 'dead' AND h.closed_reason IS NULL AND NOT h.queued
)
SELECT count(*) AS violations, (array_agg(delivery_id ORDER BY delivery_id))[1:5] AS examples
FROM bad;

-- name: check_permits_past_hold
-- description: in-flight permits held until later than one hold from now: no grant holds a slot
--   longer than the hold (the lease, stretched for a slow destination to its worst-case send,
--   3 x its timeout: media_hooks.engine.delivery.lease_seconds_for), so such a slot would never come
--   back by expiry (destination_limiter: one row per destination).
WITH bad AS (
    SELECT l.destination_id || '#' || held.slot AS id
    FROM destination_limiter AS l
    JOIN webhook_destination AS w ON w.destination_id = l.destination_id
    CROSS JOIN LATERAL unnest(l.slot_until) WITH ORDINALITY AS held(until, slot)
    WHERE held.until > now() + make_interval(
        secs => greatest(%(hold_seconds)s, 3 * w.timeout_seconds) + %(clock_slack_seconds)s)
)
SELECT count(*) AS violations, (array_agg(id ORDER BY id))[1:5] AS examples
FROM bad;

-- name: check_counts_by_state
-- description: deliveries per state, counted through other indexes than `status`'s counts
--   (figures_open_counts_by_state, figures_succeeded_counts), so that an index no longer
--   maintained, or a timer that says another state than its delivery's, shows as a difference.
--   This release's open deliveries are counted by their own states (status counts their
--   timers' kinds): the queued ones through delivery_state_queue, the others by key from their
--   timers; its dead ones in history as the history's rows less its successes (status reads
--   delivery_history_dead), its successes as status counts them. The previous release's: the
--   open and unclosed dead rows of queued deliveries through webhook_delivery_queue (no
--   `status` statement reads that index; migration 0029), the others' through the open states'
--   indexes, as a bitmap that reads each row's own state (the same indexes as status: for them
--   only a statement of status that reads the wrong rows shows; --all may read the table), the
--   dead ones closed unsent through webhook_delivery_dead, the succeeded ones as the terminal
--   rows less the dead (webhook_delivery_terminal). The history is read only when the
--   succeeded are asked for (0 otherwise, and their subqueries never run; the dead in history
--   then through delivery_history_dead, as status): a delivery run's reading leaves out the
--   history retention keeps.
WITH open AS (
    SELECT count(*) FILTER (WHERE o.state = 'pending') AS pending,
           count(*) FILTER (WHERE o.state = 'enqueued') AS enqueued,
           count(*) FILTER (WHERE o.state = 'leased') AS leased,
           count(*) FILTER (WHERE o.state = 'dead') AS dead,
           count(*) FILTER (WHERE o.state = 'dead' AND o.previous) AS previous_dead
    FROM (
        SELECT s.state, false AS previous FROM delivery_state AS s WHERE s.queued
        UNION ALL
        SELECT s.state, false
        FROM delivery_timer AS t
        JOIN delivery_state AS s ON s.delivery_id = t.delivery_id
        WHERE NOT s.queued
        UNION ALL
        SELECT state, true FROM webhook_delivery_v1
        WHERE queued IS NOT FALSE AND state <> 'succeeded' AND closed_reason IS NULL
        UNION ALL
        SELECT state, true FROM webhook_delivery_v1
        WHERE queued = false
          AND (state = 'pending' OR state = 'enqueued' OR state = 'leased' OR state = 'dead')
          AND closed_reason IS NULL
    ) AS o
),
closed AS (
    SELECT count(*) AS n FROM webhook_delivery_v1 WHERE state = 'dead' AND closed_reason IS NOT NULL
),
ended AS (
    SELECT CASE WHEN %(succeeded)s
                THEN (SELECT count(*) FROM delivery_history WHERE state = 'succeeded')
                ELSE 0 END AS succeeded
)
SELECT open.pending, open.enqueued, open.leased,
       CASE WHEN %(succeeded)s
            THEN ended.succeeded
                 + (SELECT count(*) FROM webhook_delivery_v1 WHERE state IN ('succeeded', 'dead'))
                 - open.previous_dead - closed.n
            ELSE 0 END AS succeeded,
       open.dead + closed.n
       + CASE WHEN %(succeeded)s
              THEN (SELECT count(*) FROM delivery_history) - ended.succeeded
              ELSE (SELECT count(*) FROM delivery_history WHERE state = 'dead') END AS dead
FROM open, closed, ended;
