-- The operator's figures (media_hooks.observe.figures): what `status`, `metrics` and the lag sensor
-- read. Each statement is a bounded number of index scans over the partial indexes of 0001;
-- none moves state. The measuring instant is the parameter now (NULL means the server clock).

-- name: figures_open_counts_by_state
-- description: deliveries per destination in the states that are not history (pending,
--   enqueued, leased, dead), each through its own partial index (this release's timers:
--   delivery_timer_due and _parked, _inflight, _dead; the previous release's rows:
--   webhook_delivery_due_by_destination, _enqueued, _lease, _dead): what every delivery run and
--   every sensor tick read. Bounded by the backlog and the dead letters, never by the succeeded
--   history retention keeps for weeks (figures_succeeded_counts counts that: status, the asset
--   page).
SELECT key, state, sum(n)::bigint AS n
FROM (
    -- This release's open deliveries by their timers' kinds: pending while due or parked, dead
    -- while a dead letter holds its asset's queue (delivery_state has no index on its state,
    -- which each move changes). check_counts_by_state counts the rows' own states.
    SELECT destination_id AS key, 'pending' AS state, count(*) AS n
    FROM delivery_timer WHERE kind = 'due' GROUP BY destination_id
    UNION ALL
    SELECT destination_id, 'pending', count(*)
    FROM delivery_timer WHERE kind = 'parked' GROUP BY destination_id
    UNION ALL
    SELECT destination_id, 'dead', count(*)
    FROM delivery_timer WHERE kind = 'dead' GROUP BY destination_id
    UNION ALL
    -- In flight: enqueued or leased, as each row says (by key: what runs hold).
    SELECT s.destination_id, s.state, count(*)
    FROM delivery_state AS s
    WHERE s.delivery_id = ANY (ARRAY(SELECT t.delivery_id FROM delivery_timer AS t
                                     WHERE t.kind = 'inflight'))
    GROUP BY s.destination_id, s.state
    UNION ALL
    -- Dead deliveries in history (delivery_history_dead; figures_closed_counts tells the ones
    -- closed unsent).
    SELECT destination_id, 'dead', count(*)
    FROM delivery_history WHERE state = 'dead'
    GROUP BY destination_id
    UNION ALL
    -- The previous release's.
    SELECT destination_id, 'pending', count(*)
    FROM webhook_delivery_v1 WHERE state = 'pending' GROUP BY destination_id
    UNION ALL
    SELECT destination_id, 'enqueued', count(*)
    FROM webhook_delivery_v1 WHERE state = 'enqueued' GROUP BY destination_id
    UNION ALL
    SELECT destination_id, 'leased', count(*)
    FROM webhook_delivery_v1 WHERE state = 'leased' GROUP BY destination_id
    UNION ALL
    SELECT destination_id, 'dead', count(*)
    FROM webhook_delivery_v1 WHERE state = 'dead' GROUP BY destination_id
) AS counts
GROUP BY key, state
ORDER BY 1, 2;

-- name: figures_succeeded_counts
-- description: succeeded deliveries per destination (index webhook_delivery_succeeded_by_
--   destination, migration 0025, which only the success move writes): the history retention
--   keeps, counted for `status`, the asset page's "Execute" and the metrics.
SELECT key, 'succeeded' AS state, sum(n)::bigint AS n
FROM (
    SELECT destination_id AS key, count(*) AS n
    FROM delivery_history WHERE state = 'succeeded' GROUP BY destination_id
    UNION ALL
    SELECT destination_id, count(*)
    FROM webhook_delivery_v1 WHERE state = 'succeeded' GROUP BY destination_id
) AS counts
GROUP BY key
ORDER BY 1;

-- name: figures_closed_counts
-- description: dead deliveries closed unsent (superseded, discarded) per destination: counted
-- under their reason, not as dead (index webhook_delivery_dead).
SELECT key, state, sum(n)::bigint AS n
FROM (
    SELECT destination_id AS key, closed_reason AS state, count(*) AS n
    FROM delivery_history
    WHERE state = 'dead' AND closed_reason IS NOT NULL
    GROUP BY 1, 2
    UNION ALL
    SELECT destination_id, closed_reason, count(*)
    FROM webhook_delivery_v1
    WHERE state = 'dead' AND closed_reason IS NOT NULL
    GROUP BY 1, 2
) AS counts
GROUP BY key, state;

-- name: figures_counts_by_event_type
-- description: deliveries per event type and state, dead deliveries closed unsent under their
-- reason (`status --by event-type`: an operator's question, a scan of the table).
SELECT event_type AS key, coalesce(closed_reason, state) AS state, count(*) AS n
FROM webhook_delivery_all
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: figures_dead_heads
-- description: dead deliveries at the head of an asset's queue on an ordered destination that
-- hold later deliveries of their asset (media_hooks_held_by_v2), oldest first, with how many
-- they hold: each waits for an operator's requeue or discard (indexes delivery_timer_dead and
-- webhook_delivery_dead, then each layout's asset queue per dead row: an ordered destination's
-- deliveries are queued).
SELECT d.delivery_id, d.destination_id, d.asset_id, held.n AS holding
FROM (
    SELECT s.delivery_id, s.destination_id, s.asset_id, s.created_at, s.emit_seq, s.updated_at
    FROM delivery_timer AS t
    JOIN delivery_state AS s ON s.delivery_id = t.delivery_id
    WHERE t.kind = 'dead'
    UNION ALL
    SELECT p.delivery_id, p.destination_id, p.asset_id, p.created_at, p.emit_seq, p.updated_at
    FROM webhook_delivery_v1 AS p
    WHERE p.state = 'dead' AND p.closed_reason IS NULL
) AS d
JOIN webhook_destination AS w ON w.destination_id = d.destination_id AND w.ordering = 'asset'
CROSS JOIN LATERAL (
    SELECT (SELECT count(*)
            FROM delivery_state AS s
            WHERE s.destination_id = d.destination_id AND s.asset_id = d.asset_id AND s.queued
              AND (s.created_at, coalesce(s.emit_seq, 0), s.delivery_id)
                  > (d.created_at, coalesce(d.emit_seq, 0), d.delivery_id))
         + (SELECT count(*)
            FROM webhook_delivery_v1 AS s
            WHERE s.destination_id = d.destination_id AND s.asset_id = d.asset_id
              AND s.queued IS NOT FALSE
              AND s.state <> 'succeeded' AND s.closed_reason IS NULL
              AND (s.created_at, coalesce(s.emit_seq, 0), s.delivery_id)
                  > (d.created_at, coalesce(d.emit_seq, 0), d.delivery_id)) AS n
) AS held
WHERE held.n > 0
ORDER BY d.updated_at, d.delivery_id
LIMIT %(limit)s;

-- name: figures_scalars
-- description: the single-number figures, each one scan of its own partial index.
WITH clock AS (
    SELECT COALESCE(%(now)s::timestamptz, now()) AS now
)
SELECT
    clock.now AS measured_at,
    -- Oldest due that could go out now: pending, due, destination enabled and not paused, and
    -- on an ordered destination not held behind an earlier delivery of its asset (one recorded
    -- due while that was invisible to its producer is not work a run can do: counted, it
    -- would start run after run behind a dead head). Per sendable destination, walks its due
    -- timers (delivery_timer_due) in order to the first eligible one, as the claim does; and
    -- the previous release's due rows (webhook_delivery_due_by_destination) the same way.
    least(
    (SELECT min(first.next_attempt_at)
       FROM webhook_destination w
       CROSS JOIN LATERAL (
           SELECT t.fire_at AS next_attempt_at
           FROM delivery_timer t
           JOIN delivery_state d ON d.delivery_id = t.delivery_id
           WHERE t.destination_id = w.destination_id
             AND t.kind = 'due'
             AND t.fire_at <= clock.now
             AND NOT EXISTS (SELECT FROM media_hooks_held_by_v2(w.ordering, 'none',
                                                                d.destination_id, d.asset_id,
                                                                d.event_type, d.created_at,
                                                                d.emit_seq, d.delivery_id))
           ORDER BY t.fire_at, t.delivery_id
           LIMIT 1) AS first
      WHERE w.enabled
        AND (w.paused_until IS NULL OR w.paused_until <= clock.now)),
    (SELECT min(first.next_attempt_at)
       FROM webhook_destination w
       CROSS JOIN LATERAL (
           SELECT d.next_attempt_at
           FROM webhook_delivery_v1 d
           WHERE d.destination_id = w.destination_id
             AND d.state = 'pending'
             AND d.next_attempt_at <= clock.now
             AND NOT EXISTS (SELECT FROM media_hooks_held_by_v2(w.ordering, 'none',
                                                                d.destination_id, d.asset_id,
                                                                d.event_type, d.created_at,
                                                                d.emit_seq, d.delivery_id))
           ORDER BY d.next_attempt_at, d.delivery_id
           LIMIT 1) AS first
      WHERE w.enabled
        AND (w.paused_until IS NULL OR w.paused_until <= clock.now))) AS oldest_due_at,
    -- Relay lag: the oldest outbox message not yet published that is still waited for: the
    -- current dispatch of a delivery that is still enqueued. This release's claims write their
    -- dispatches published; the previous release's (webhook_delivery_enqueued, oldest first:
    -- while enqueued, updated_at is the claim's time) may wait for their relay.
    least(
        (SELECT o.created_at
           FROM delivery_timer t
           JOIN delivery_state d ON d.delivery_id = t.delivery_id
           JOIN dispatch_outbox_v3 o
             ON o.message_id = d.current_message_id AND o.delivery_created_at = d.created_at
          WHERE t.kind = 'inflight' AND d.state = 'enqueued'
            AND o.published_at IS NULL
          ORDER BY t.fire_at
          LIMIT 1),
        (SELECT o.created_at
           FROM webhook_delivery_v1 d
           JOIN dispatch_outbox o ON o.message_id = d.current_message_id
          WHERE d.state = 'enqueued'
            AND o.published_at IS NULL
          ORDER BY d.updated_at
          LIMIT 1)) AS oldest_unpublished_at,
    -- Leases past their end: work a dead worker left behind (the timers in flight, then each
    -- delivery by key; webhook_delivery_lease for the previous release's).
    (SELECT count(*)
       FROM delivery_timer t
       JOIN delivery_state d ON d.delivery_id = t.delivery_id
      WHERE t.kind = 'inflight' AND d.state = 'leased' AND d.lease_until < clock.now)
    + (SELECT count(*)
         FROM webhook_delivery_v1 d
        WHERE d.state = 'leased' AND d.lease_until < clock.now) AS expired_leases,
    -- Enqueued deliveries by age: the oldest waits for its run.
    least((SELECT min(d.updated_at)
             FROM delivery_timer t
             JOIN delivery_state d ON d.delivery_id = t.delivery_id
            WHERE t.kind = 'inflight' AND d.state = 'enqueued'),
          (SELECT min(d.updated_at)
             FROM webhook_delivery_v1 d
            WHERE d.state = 'enqueued')) AS oldest_enqueued_at,
    -- Dead letters and the newest one, so a sensor can tell new ones. (A dead delivery closed
    -- unsent, superseded or discarded, is not a dead letter.)
    (SELECT count(*) FROM delivery_timer t WHERE t.kind = 'dead')
    + (SELECT count(*) FROM delivery_history d
        WHERE d.state = 'dead' AND d.closed_reason IS NULL)
    + (SELECT count(*) FROM webhook_delivery_v1 d
        WHERE d.state = 'dead' AND d.closed_reason IS NULL) AS dead_letters,
    greatest((SELECT max(t.fire_at) FROM delivery_timer t WHERE t.kind = 'dead'),
             (SELECT max(d.finished_at) FROM delivery_history d
               WHERE d.state = 'dead' AND d.closed_reason IS NULL),
             (SELECT max(d.updated_at) FROM webhook_delivery_v1 d
               WHERE d.state = 'dead' AND d.closed_reason IS NULL)) AS newest_dead_at
FROM clock;

-- name: figures_destination_flags
-- description: destinations that are paused (until when, why) or disabled (why); a small table.
SELECT destination_id, enabled, paused_until, paused_reason, disabled_reason, disabled_at
FROM webhook_destination
WHERE NOT enabled OR paused_until > COALESCE(%(now)s::timestamptz, now())
ORDER BY destination_id;

-- name: figures_oldest_snapshot
-- description: the session whose snapshot or transaction id is the oldest this database's
--   vacuum must keep rows for, other than the measuring one: while it stays open, no row
--   version a delivery leaves behind (every state move leaves one) can be removed, and claims,
--   leases and status step over more of them each minute. Sessions of this database and
--   walsenders (a standby's hot_standby_feedback); autovacuum workers are left out (a lazy
--   vacuum's snapshot holds nothing back). Sessions of other roles are seen only with
--   pg_read_all_stats (the embedded server's user is a superuser). Never a query's text.
--   pg_stat_activity is an in-memory view: the same cost on ten rows or ten million.
SELECT a.pid,
       coalesce(nullif(a.application_name, ''), a.backend_type) AS application_name,
       a.state,
       coalesce(a.xact_start, a.backend_start) AS since
FROM pg_stat_activity AS a
WHERE a.pid <> pg_backend_pid()
  AND (a.datname = current_database() OR a.backend_type = 'walsender')
  AND a.backend_type <> 'autovacuum worker'
  AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
ORDER BY greatest(age(a.backend_xmin), age(a.backend_xid)) DESC, since
LIMIT 1;

-- name: figures_oldest_due_by_destination
-- description: each destination's oldest pending delivery that is due now, whatever its
-- destination's condition (a paused or disabled one's included): which publisher is behind. One
-- descent of webhook_delivery_due_by_destination per destination (a small table), so it costs
-- the same on ten rows or ten million; parked deliveries (due in 9999) are not due.
SELECT w.destination_id,
       least(due.next_attempt_at, previous_due.next_attempt_at) AS oldest_due_at
FROM webhook_destination AS w
LEFT JOIN LATERAL (
    SELECT t.fire_at AS next_attempt_at
    FROM delivery_timer AS t
    WHERE t.destination_id = w.destination_id
      AND t.kind = 'due'
      AND t.fire_at <= COALESCE(%(now)s::timestamptz, now())
    ORDER BY t.fire_at
    LIMIT 1
) AS due ON true
LEFT JOIN LATERAL (
    SELECT d.next_attempt_at
    FROM webhook_delivery_v1 AS d
    WHERE d.destination_id = w.destination_id
      AND d.state = 'pending'
      AND d.next_attempt_at <= COALESCE(%(now)s::timestamptz, now())
    ORDER BY d.next_attempt_at
    LIMIT 1
) AS previous_due ON true
WHERE due.next_attempt_at IS NOT NULL OR previous_due.next_attempt_at IS NOT NULL
ORDER BY w.destination_id;

-- name: figures_attempts_by_outcome
-- description: finished attempts per outcome over the last hour and day, read from the attempts
--   started since an hour before the day (no index names finished_at, migration 0023), one range
--   of delivery_attempt_destination per destination (an attempt's destination is its
--   delivery's, which exists). An attempt ends within its lease, seconds to minutes after its
--   start; one that a sweep ended more than an hour after its start (a lost worker, no run
--   since) is not counted.
WITH clock AS (
    SELECT COALESCE(%(now)s::timestamptz, now()) AS now
)
SELECT a.outcome,
       count(*) FILTER (WHERE a.finished_at > clock.now - interval '1 hour') AS last_hour,
       count(*) AS last_day
FROM delivery_attempt_all a, clock
WHERE a.destination_id = ANY (ARRAY(SELECT destination_id FROM webhook_destination))
  AND a.started_at > clock.now - interval '25 hours'
  AND a.finished_at > clock.now - interval '1 day'
  AND a.finished_at <= clock.now
GROUP BY a.outcome
ORDER BY a.outcome;

-- name: figures_cohort_due
-- description: whether any delivery of a cohort is due and sendable now (what a run would
-- claim; on an ordered destination, not held behind an earlier delivery of its asset, as in
-- figures_scalars): per sendable destination of the cohort, a range of
-- webhook_delivery_due_by_destination up to now, until the first such row.
SELECT EXISTS (
    SELECT 1
    FROM webhook_destination AS w
    WHERE w.enabled
      AND (w.paused_until IS NULL OR w.paused_until <= now())
      AND (cardinality(%(destination_ids)s::text[]) = 0
           OR w.destination_id = ANY (%(destination_ids)s))
      AND (EXISTS (
              SELECT 1
              FROM delivery_timer AS t
              JOIN delivery_state AS d ON d.delivery_id = t.delivery_id
              WHERE t.destination_id = w.destination_id
                AND t.kind = 'due'
                AND t.fire_at <= now()
                AND media_hooks_in_cohort_v2(d.destination_id, d.event_type, d.asset_id,
                                             d.created_at, %(destination_ids)s,
                                             %(event_types)s, %(asset_ids)s,
                                             %(created_after)s, %(created_before)s)
                AND NOT EXISTS (SELECT FROM media_hooks_held_by_v2(w.ordering, 'none',
                                                                   d.destination_id, d.asset_id,
                                                                   d.event_type, d.created_at,
                                                                   d.emit_seq, d.delivery_id)))
           OR EXISTS (
              SELECT 1
              FROM webhook_delivery_v1 AS d
              WHERE d.destination_id = w.destination_id
                AND d.state = 'pending'
                AND d.next_attempt_at <= now()
                AND media_hooks_in_cohort(d, %(destination_ids)s, %(event_types)s,
                                          %(asset_ids)s, %(created_after)s, %(created_before)s)
                AND NOT EXISTS (SELECT FROM media_hooks_held_by_v2(w.ordering, 'none',
                                                                   d.destination_id, d.asset_id,
                                                                   d.event_type, d.created_at,
                                                                   d.emit_seq, d.delivery_id))))
) AS due;

