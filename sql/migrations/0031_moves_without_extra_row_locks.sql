-- 0031: a delivery's moves write no row lock that its update does not write anyway.
--
-- Read in the WAL by kind of record (bench.wal: pg_walinspect), each lease and each record of a
-- delivery logged a row lock (a Heap/LOCK record, about 54 bytes) on the delivery's row before
-- the update that moved it: about 120 of the 2,375 bytes of WAL it took to deliver a delivery
-- (bench/results/hot-path-0031/). An update locks its row itself and logs nothing more for it;
-- these locks came from three places:
--
-- * webhook_delivery_immutable was a BEFORE UPDATE row trigger. PostgreSQL locks a row, and
--   logs the lock, before it looks at a table's BEFORE UPDATE row triggers, on every update of
--   the table: the trigger's column list (0004) decides only whether its function runs. The
--   same trigger AFTER the update, with the same columns and function, refuses the same
--   updates (the statement fails and nothing it changed stays), and locks nothing.
-- * delivery_attempt's foreign key to webhook_delivery: the lease inserts the attempt in the
--   statement that moves its delivery, and the key's check locked the delivery's row again
--   (either of the two was enough for a lock record). Attempts are written only with their
--   delivery's lease and deleted only with their delivery, by the purge, in one statement each;
--   check's attempt_without_delivery (in the history it reads) says none is left without it.
-- * media_hooks_record_outcomes_v1 read the leased rows FOR UPDATE before it moved them. Its
--   update matches the lease token on the row it updates (on the newest version, when another
--   session moved the row in between: PostgreSQL rechecks the condition there), and a row keeps
--   its token only while it stays leased, when nothing else changes what the decision reads
--   (attempt count, budget, age): the lease still held means the decision is the one the lock
--   would have read. Replaced in place without the lock; for either release's calls it moves
--   and returns what it did.
--
-- keeps: invariant 2 (the identity columns still never change), invariant 4 (only the lease
--   holder's token moves a leased row).
--
-- The trigger's swap and the key's drop each take an exclusive lock for an instant
-- (webhook_delivery, delivery_attempt), in this one transaction: bounded by the lock timeout and
-- retried, as 0027's rename.

DROP TRIGGER webhook_delivery_immutable ON webhook_delivery;
CREATE TRIGGER webhook_delivery_immutable
    AFTER UPDATE OF delivery_id, destination_id, asset_id, event_type, payload, body, created_at
    ON webhook_delivery
    FOR EACH ROW EXECUTE FUNCTION media_hooks_delivery_is_immutable();

ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_delivery_id_fkey;

-- The recording function of 0029, without the lock of its decision.
CREATE OR REPLACE FUNCTION media_hooks_record_outcomes_v1(p_outcomes jsonb)
RETURNS TABLE (delivery_id text, state text, stopped text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    shortest_base CONSTANT double precision := 0.1;
    longest_delay CONSTANT double precision := 2592000;
    private_setting CONSTANT text := 'MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1';
    bad text;
    pause record;
BEGIN
    SELECT coalesce(g.outcome, 'null') INTO bad
    FROM jsonb_to_recordset(p_outcomes) AS g(outcome text)
    WHERE g.outcome IS NULL
       OR g.outcome NOT IN ('success', 'rate_limited', 'retryable', 'ambiguous', 'rejected')
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'unknown outcome class %: expected success, rate_limited, retryable, '
                        'ambiguous or rejected', quote_literal(bad)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Pauses first: the limiter's lock before any delivery row's (the top of this file).
    IF p_outcomes @> '[{"outcome": "rate_limited"}]' THEN
        FOR pause IN
            SELECT DISTINCT ON (w.destination_id)
                   w.destination_id, waits.seconds,
                   'HTTP ' || coalesce(g.http_status::text, '?')
                   || CASE WHEN g.retry_after IS NULL
                           THEN ' without Retry-After: ' ELSE ' with Retry-After ' END
                   || media_hooks_whole_seconds_v1(waits.seconds) || ' s' AS why
            FROM jsonb_to_recordset(p_outcomes)
                 AS g(delivery_id text, outcome text, http_status integer,
                      retry_after double precision)
            JOIN webhook_delivery AS d ON d.delivery_id = g.delivery_id
            JOIN webhook_destination AS w ON w.destination_id = d.destination_id
            CROSS JOIN LATERAL (
                SELECT coalesce(media_hooks_retry_after_seconds_v1(g.retry_after),
                                least(greatest(w.backoff_base_seconds, shortest_base),
                                      longest_delay)) AS seconds
            ) AS waits
            WHERE g.outcome = 'rate_limited'
            ORDER BY w.destination_id, waits.seconds DESC
        LOOP
            IF pause.seconds > 0 THEN
                PERFORM media_hooks_pause_destination_v1(pause.destination_id, pause.seconds,
                                                         pause.why);
            END IF;
        END LOOP;
    END IF;

    RETURN QUERY
    WITH given AS (
        SELECT g.*, NOT coalesce(g.attempted, true) OR coalesce(g.configuration_fault, false)
                    AS spare
        FROM jsonb_to_recordset(p_outcomes)
             AS g(delivery_id text, lease_token uuid, outcome text, http_status integer,
                  retry_after double precision, error text, excerpt text,
                  finished_ago double precision, attempted boolean,
                  configuration_fault boolean)
    ),
    decided AS (
        SELECT g.delivery_id, g.lease_token, g.outcome, g.error, g.finished_ago,
               CASE WHEN g.spare THEN NULL ELSE g.http_status END AS http_status,
               CASE WHEN g.spare THEN NULL ELSE g.excerpt END AS excerpt,
               g.spare,
               d.attempt_count AS attempt_no,
               fate.next_state,
               wait.delay,
               CASE
                   WHEN fate.next_state <> 'pending' OR g.outcome = 'success' THEN fate.death
                   WHEN coalesce(g.configuration_fault, false)
                       THEN 'waiting: destination ' || d.destination_id || ' is disabled '
                            || '(configuration fault, see `media-hooks destination list`)'
                   WHEN g.spare THEN 'due again: its worker stopped before sending it'
                   WHEN g.outcome = 'rate_limited' AND g.retry_after IS NOT NULL
                       THEN 'Retry-After ' || media_hooks_whole_seconds_v1(wait.delay)
                            || ' s (HTTP ' || coalesce(g.http_status::text, '?') || ')'
                   WHEN g.outcome = 'rate_limited'
                       THEN 'rate limited (HTTP ' || coalesce(g.http_status::text, '?')
                            || ', no Retry-After): ' || media_hooks_whole_seconds_v1(wait.delay)
                            || ' s'
                   ELSE 'backoff ' || media_hooks_whole_seconds_v1(wait.delay)
                        || ' s after attempt ' || d.attempt_count || ' (' || g.outcome || ')'
               END AS reason
        FROM given AS g
        -- The fence is the token alone, looked up by key (the previous statement's reason:
        -- record_outcomes in sql/queries/leases.sql).
        JOIN webhook_delivery AS d
          ON d.delivery_id = g.delivery_id AND d.lease_token = g.lease_token
        JOIN webhook_destination AS w ON w.destination_id = d.destination_id
        CROSS JOIN LATERAL (
            SELECT CASE
                       WHEN g.outcome = 'success' THEN 'succeeded'
                       WHEN g.outcome = 'rejected' THEN 'dead'
                       WHEN g.spare THEN 'pending'
                       -- In seconds, not as an interval: no stored value can overflow the test.
                       WHEN extract(epoch FROM now() - d.budget_started_at) >= w.max_age_seconds
                           THEN 'dead'
                       WHEN g.outcome <> 'rate_limited' AND d.budget_used >= w.max_attempts
                           THEN 'dead'
                       ELSE 'pending'
                   END AS next_state,
                   CASE
                       WHEN g.outcome IN ('success', 'rejected') OR g.spare THEN NULL
                       WHEN extract(epoch FROM now() - d.budget_started_at) >= w.max_age_seconds
                           THEN 'dead: older than the maximum delivery age ('
                                || w.max_age_seconds || ' s)'
                       WHEN g.outcome <> 'rate_limited' AND d.budget_used >= w.max_attempts
                           THEN 'dead: retry budget spent (' || w.max_attempts || ' attempts)'
                   END AS death
        ) AS fate
        CROSS JOIN LATERAL (
            SELECT CASE
                       WHEN g.spare OR g.outcome IN ('success', 'rejected') THEN 0
                       WHEN g.outcome = 'rate_limited'
                           THEN coalesce(media_hooks_retry_after_seconds_v1(g.retry_after),
                                         least(greatest(w.backoff_base_seconds, shortest_base),
                                               longest_delay))
                       ELSE media_hooks_backoff_seconds_v1(
                                d.budget_used,
                                least(greatest(w.backoff_base_seconds, shortest_base), longest_delay),
                                least(greatest(w.backoff_cap_seconds, shortest_base), longest_delay),
                                random())
                   END AS delay
        ) AS wait
    ),
    moved AS (
        UPDATE webhook_delivery AS d
        SET state = decided.next_state,
            next_attempt_at = CASE WHEN decided.next_state = 'pending'
                                   THEN now() + make_interval(secs => decided.delay)
                                   ELSE d.next_attempt_at END,
            -- A rate-limited or spared attempt gives its unit of retry budget back.
            budget_used = CASE WHEN decided.outcome = 'rate_limited' OR decided.spare
                               THEN greatest(d.budget_used - 1, 0) ELSE d.budget_used END,
            lease_until = NULL,
            lease_token = NULL,
            last_outcome = decided.outcome,
            last_error = decided.error,
            wait_reason = decided.reason,
            updated_at = now()
        FROM decided
        WHERE d.delivery_id = decided.delivery_id
          AND d.lease_token = decided.lease_token
        RETURNING d.delivery_id, d.destination_id, d.state, d.next_attempt_at, decided.attempt_no,
                  decided.outcome, decided.http_status, decided.error, decided.excerpt,
                  decided.reason, decided.finished_ago
    ),
    closed AS (
        UPDATE delivery_attempt AS a
        SET finished_at = greatest(a.started_at,
                                   now() - make_interval(secs => greatest(moved.finished_ago, 0))),
            outcome = moved.outcome,
            http_status = moved.http_status,
            error = moved.error,
            response_excerpt = moved.excerpt,
            next_attempt_at = CASE WHEN moved.state = 'pending' THEN moved.next_attempt_at END,
            retry_reason = moved.reason
        FROM moved
        WHERE a.delivery_id = moved.delivery_id AND a.attempt_no = moved.attempt_no
    ),
    -- Latest wins (0020): on a destination that coalesces by asset, a success closes the older
    -- deliveries of its asset and type still waiting, as sweep_superseded would. Sent after it,
    -- one would leave the receiver on stale content, and nothing else closes it: the sweep and
    -- the claim's rule (media_hooks_held_by_v2) read only open rows, never a newer success.
    -- One asset's open queue is read (webhook_delivery_queue); a row another session
    -- holds is skipped.
    superseded AS (
        UPDATE webhook_delivery AS o
        SET state = 'dead',
            closed_reason = 'superseded',
            closed_by = stale.newer_id,
            wait_reason = 'superseded by ' || stale.newer_id,
            updated_at = now()
        FROM (
            SELECT older.delivery_id, n.delivery_id AS newer_id
            FROM moved AS m
            JOIN webhook_delivery AS n ON n.delivery_id = m.delivery_id
            JOIN webhook_destination AS w
              ON w.destination_id = n.destination_id AND w.coalescing = 'asset'
            CROSS JOIN LATERAL (
                SELECT e.delivery_id
                FROM webhook_delivery AS e
                WHERE e.destination_id = n.destination_id AND e.asset_id = n.asset_id
                  AND e.queued IS NOT FALSE
                  AND e.state = 'pending' AND e.closed_reason IS NULL
                  AND e.event_type = n.event_type
                  AND (e.created_at, coalesce(e.emit_seq, 0), e.delivery_id)
                      < (n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
                FOR UPDATE SKIP LOCKED
            ) AS older
            WHERE m.state = 'succeeded'
        ) AS stale
        WHERE o.delivery_id = stale.delivery_id AND o.state = 'pending'
    ),
    -- A 410 (Gone) or an address the guard refused disables the destination until an operator
    -- enables it; one already disabled keeps its reason. The refused address wins over a 410
    -- in one batch: it is what the operator must fix first.
    signal AS (
        SELECT DISTINCT ON (d.destination_id)
               d.destination_id,
               CASE
                   WHEN coalesce(g.configuration_fault, false)
                       THEN 'configuration: ' || coalesce(g.error, 'address refused')
                            || ' (at connect time'
                            || CASE WHEN strpos(coalesce(g.error, ''), private_setting) > 0
                                    THEN ''
                                    ELSE '; ' || private_setting || ' in the workers'' '
                                         || 'environment allows private addresses' END
                            || '); enable it once the URL or the setting is fixed'
                   ELSE 'receiver answered HTTP 410 (Gone) at '
                        || to_char((now() - make_interval(secs => greatest(g.finished_ago, 0)))
                                   AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')
                        || ' UTC'
               END AS why
        FROM given AS g
        JOIN webhook_delivery AS d ON d.delivery_id = g.delivery_id
        WHERE coalesce(g.configuration_fault, false)
           OR (g.outcome = 'rejected' AND g.http_status = 410)
        ORDER BY d.destination_id, coalesce(g.configuration_fault, false) DESC
    ),
    disabled AS (
        UPDATE webhook_destination AS w
        SET enabled = false,
            disabled_reason = signal.why,
            disabled_at = now(),
            updated_at = now()
        FROM signal
        WHERE w.destination_id = signal.destination_id AND w.enabled
        RETURNING w.destination_id, w.disabled_reason
    ),
    stops AS (
        SELECT signal.destination_id,
               coalesce(disabled.disabled_reason, w.disabled_reason, signal.why) AS stopped
        FROM signal
        JOIN webhook_destination AS w ON w.destination_id = signal.destination_id
        LEFT JOIN disabled ON disabled.destination_id = signal.destination_id
    )
    -- A stop is looked up only when the batch disabled something (the common batch reads no
    -- destination here), and a delivery's destination only when its lease no longer held.
    SELECT g.delivery_id, moved.state,
           CASE WHEN EXISTS (SELECT 1 FROM stops) THEN (
               SELECT stops.stopped FROM stops
               WHERE stops.destination_id = coalesce(
                   moved.destination_id,
                   (SELECT x.destination_id FROM webhook_delivery AS x
                    WHERE x.delivery_id = g.delivery_id))
           ) END
    FROM given AS g
    LEFT JOIN moved ON moved.delivery_id = g.delivery_id;
END;
$$;
