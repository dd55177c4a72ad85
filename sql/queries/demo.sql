-- `media-hooks demo` (media_hooks.devtools.demo): its own data only. Every statement is limited to the
-- destinations whose id starts with the demo's prefix; nothing else is read or touched.

-- name: demo_reset
-- description: delete the demo's previous data, children first in one statement (foreign keys
--   are checked at its end): attempts, outbox rows, requeue items, identities and tombstones of
--   demo deliveries, the deliveries, then the demo destinations (their limiter rows cascade).
--   Forgetting the identities lets a demo run record the same delivery ids again.
--   Operator requeue headers stay: they may name other deliveries too.
WITH doomed AS (
    SELECT d.delivery_id, d.dispatch_count
    FROM webhook_delivery_v1 AS d
    WHERE starts_with(d.destination_id, %(prefix)s)
),
attempts AS (
    DELETE FROM delivery_attempt_v1 AS a
    WHERE a.delivery_id IN (SELECT delivery_id FROM doomed)
),
-- A delivery's dispatches by their message ids, the outbox's primary key (migration 0032).
outbox AS (
    DELETE FROM dispatch_outbox_v2 AS o
    WHERE o.message_id = ANY (ARRAY(
        SELECT d.delivery_id || ':' || n
        FROM doomed AS d, generate_series(1, d.dispatch_count) AS n))
),
outbox_v1 AS (
    DELETE FROM dispatch_outbox_v1 AS o
    WHERE o.delivery_id IN (SELECT delivery_id FROM doomed)
),
-- This release's layout: the demo's deliveries are its destinations'.
lean_attempts AS (
    DELETE FROM delivery_attempt_v2 AS a
    WHERE starts_with(a.destination_id, %(prefix)s)
),
lean_outbox AS (
    DELETE FROM dispatch_outbox_v3 AS o
    WHERE starts_with(o.destination_id, %(prefix)s)
),
lean_timers AS (
    DELETE FROM delivery_timer AS t
    WHERE starts_with(t.destination_id, %(prefix)s)
),
lean_state AS (
    DELETE FROM delivery_state AS s
    WHERE starts_with(s.destination_id, %(prefix)s)
    RETURNING s.delivery_id, s.created_at
),
lean_history AS (
    DELETE FROM delivery_history AS h
    WHERE starts_with(h.destination_id, %(prefix)s)
    RETURNING h.delivery_id, h.created_at
),
lean_bodies AS (
    DELETE FROM delivery_body AS b
    WHERE (b.delivery_id, b.created_at) IN (SELECT delivery_id, created_at FROM lean_state
                                            UNION ALL
                                            SELECT delivery_id, created_at FROM lean_history)
),
requeue_items AS (
    DELETE FROM delivery_requeue_item AS i
    WHERE i.delivery_id IN (SELECT delivery_id FROM doomed
                            UNION ALL SELECT delivery_id FROM lean_state
                            UNION ALL SELECT delivery_id FROM lean_history)
),
identities AS (
    DELETE FROM delivery_identity AS t
    WHERE t.delivery_id IN (SELECT delivery_id FROM doomed)
       OR starts_with(t.destination_id, %(prefix)s)
),
deliveries_previous AS (
    DELETE FROM webhook_delivery_v1 AS d
    WHERE d.delivery_id IN (SELECT delivery_id FROM doomed)
    RETURNING d.delivery_id
),
deliveries AS (
    SELECT delivery_id FROM deliveries_previous
    UNION ALL
    SELECT delivery_id FROM lean_state
    UNION ALL
    SELECT delivery_id FROM lean_history
),
destinations AS (
    DELETE FROM webhook_destination AS w
    WHERE starts_with(w.destination_id, %(prefix)s)
    RETURNING w.destination_id
)
SELECT (SELECT count(*) FROM deliveries)::integer AS deliveries,
       (SELECT count(*) FROM destinations)::integer AS destinations;

-- name: demo_unfinished
-- description: the demo's deliveries not yet terminal: how many are due now and how many wait
--   (on their own retry time or their destination's pause, whichever is later), how long until
--   the earliest pending one is due (negative: already due), how many a run still holds, why
--   the pending ones last failed, and the earliest pending one, to inspect.
WITH open AS (
    SELECT d.delivery_id, d.state, coalesce(d.last_outcome, 'none') AS last_outcome,
           greatest(d.next_attempt_at, coalesce(w.paused_until, d.next_attempt_at)) AS due_at
    FROM webhook_delivery_all AS d
    JOIN webhook_destination AS w ON w.destination_id = d.destination_id
    WHERE d.destination_id = ANY (%(destination_ids)s)
      AND d.state NOT IN ('succeeded', 'dead')
),
outcomes AS (
    SELECT last_outcome, count(*)::integer AS n
    FROM open
    WHERE state = 'pending'
    GROUP BY last_outcome
)
SELECT count(*)::integer AS unfinished,
       count(*) FILTER (WHERE state = 'pending' AND due_at <= now())::integer AS due_now,
       count(*) FILTER (WHERE state = 'pending' AND due_at > now())::integer AS waiting,
       count(*) FILTER (WHERE state <> 'pending')::integer AS held_by_a_run,
       extract(epoch FROM min(due_at) FILTER (WHERE state = 'pending') - now())::double precision
           AS due_in_seconds,
       (array_agg(delivery_id ORDER BY due_at, delivery_id) FILTER (WHERE state = 'pending'))[1]
           AS earliest,
       (SELECT coalesce(jsonb_object_agg(last_outcome, n), '{}'::jsonb) FROM outcomes)
           AS last_outcomes
FROM open;

-- name: demo_summary
-- description: per demo destination: deliveries by outcome (from webhook_delivery), attempts
--   by outcome (from delivery_attempt), the mean start rate of first attempts, and the most
--   starts in any one clock second, beside the destination's limit.
WITH deliveries AS (
    SELECT d.destination_id,
           count(*)::integer AS deliveries,
           count(*) FILTER (WHERE d.state = 'succeeded')::integer AS delivered,
           count(*) FILTER (WHERE d.state = 'dead')::integer AS dead,
           count(*) FILTER (WHERE d.state NOT IN ('succeeded', 'dead'))::integer AS unfinished,
           count(*) FILTER (WHERE d.attempt_count > 1)::integer AS needed_retries
    FROM webhook_delivery_all AS d
    WHERE d.destination_id = ANY (%(destination_ids)s)
    GROUP BY d.destination_id
),
attempts AS (
    SELECT a.destination_id,
           count(*)::integer AS attempts,
           count(*) FILTER (WHERE a.outcome IN ('retryable', 'ambiguous'))::integer AS retried,
           count(*) FILTER (WHERE a.outcome = 'rate_limited')::integer AS rate_limited,
           count(*) FILTER (WHERE a.outcome = 'ambiguous')::integer AS ambiguous,
           count(*) FILTER (WHERE a.attempt_no = 1)::integer AS first_attempts,
           extract(epoch FROM max(a.started_at) FILTER (WHERE a.attempt_no = 1)
                              - min(a.started_at) FILTER (WHERE a.attempt_no = 1))::double precision
               AS first_attempts_span_seconds
    FROM delivery_attempt_all AS a
    WHERE a.destination_id = ANY (%(destination_ids)s)
    GROUP BY a.destination_id
),
per_second AS (
    SELECT a.destination_id, count(*)::integer AS starts
    FROM delivery_attempt_all AS a
    WHERE a.destination_id = ANY (%(destination_ids)s)
    GROUP BY a.destination_id, date_trunc('second', a.started_at)
),
peaks AS (
    SELECT destination_id, max(starts)::integer AS peak_starts_per_second
    FROM per_second
    GROUP BY destination_id
)
SELECT w.destination_id, w.rate_per_second, w.burst,
       coalesce(d.deliveries, 0) AS deliveries,
       coalesce(d.delivered, 0) AS delivered,
       coalesce(d.dead, 0) AS dead,
       coalesce(d.unfinished, 0) AS unfinished,
       coalesce(d.needed_retries, 0) AS needed_retries,
       coalesce(a.attempts, 0) AS attempts,
       coalesce(a.retried, 0) AS retried,
       coalesce(a.rate_limited, 0) AS rate_limited,
       coalesce(a.ambiguous, 0) AS ambiguous,
       CASE WHEN a.first_attempts_span_seconds > 0
            THEN (a.first_attempts - 1) / a.first_attempts_span_seconds END AS achieved_rate,
       coalesce(p.peak_starts_per_second, 0) AS peak_starts_per_second
FROM webhook_destination AS w
LEFT JOIN deliveries AS d ON d.destination_id = w.destination_id
LEFT JOIN attempts AS a ON a.destination_id = w.destination_id
LEFT JOIN peaks AS p ON p.destination_id = w.destination_id
WHERE w.destination_id = ANY (%(destination_ids)s)
ORDER BY w.rate_per_second DESC, w.destination_id;

-- name: demo_request_starts
-- description: request starts per destination per whole second since the demo's first start:
--   the chart's series.
WITH origin AS (
    SELECT min(a.started_at) AS t0
    FROM delivery_attempt_all AS a
    WHERE a.destination_id = ANY (%(destination_ids)s)
)
SELECT a.destination_id,
       floor(extract(epoch FROM a.started_at - origin.t0))::integer AS second,
       count(*)::integer AS starts
FROM delivery_attempt_all AS a CROSS JOIN origin
WHERE a.destination_id = ANY (%(destination_ids)s)
GROUP BY a.destination_id, 2
ORDER BY a.destination_id, 2;

-- name: demo_pauses
-- description: each rate-limited answer (a 429, or a 503 with Retry-After) of a demo destination:
--   when it came and until when its delivery waited (the attempt's next_attempt_at, no sooner
--   than the Retry-After, which paused the whole destination), in seconds since the demo's
--   first start: the chart's pauses.
WITH origin AS (
    SELECT min(a.started_at) AS t0
    FROM delivery_attempt_all AS a
    WHERE a.destination_id = ANY (%(destination_ids)s)
)
SELECT a.destination_id,
       extract(epoch FROM a.finished_at - origin.t0)::double precision AS paused_at,
       extract(epoch FROM a.next_attempt_at - origin.t0)::double precision AS resumed_at
FROM delivery_attempt_all AS a CROSS JOIN origin
WHERE a.destination_id = ANY (%(destination_ids)s)
  AND a.outcome = 'rate_limited'
  AND a.finished_at IS NOT NULL
  AND a.next_attempt_at IS NOT NULL
ORDER BY a.destination_id, 2;
