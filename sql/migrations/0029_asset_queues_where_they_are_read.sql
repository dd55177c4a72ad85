-- migrate: no-transaction
-- 0029: an asset's queue is kept only where a destination orders or coalesces by asset.
--
-- webhook_delivery_asset_queue (0012) took an entry for every open delivery at its emit and at
-- every move while it stayed open (about 490 bytes of WAL a delivery: the largest index cost
-- left), and every statement that reads it asks about destinations with --ordering asset or
-- --coalesce asset only, which are not the default. A delivery now says whether it is
-- queued: the emit writes queued from its destination's row, read FOR KEY SHARE; the previous
-- release's emits leave it NULL, and NULL counts as queued, so every row written before this
-- migration, and by the previous release after it, stays in its asset's queue.
-- webhook_delivery_queue is webhook_delivery_asset_queue restricted to queued rows; 0030 drops
-- the old index once the previous release has gone.
--
-- When a destination starts ordering or coalescing, its open deliveries that were not queued
-- are queued by the trigger below, in the same transaction, whichever release changes the
-- destination: before the change the trigger takes the destination's row FOR UPDATE, which
-- waits for every transaction holding its key-share lock (an emit to it, which took the lock
-- where it read the destination, or its foreign key check) and makes every later emit wait for
-- this one and then read the destination as changed. So no delivery of a queued destination is
-- left out of the queue (invariant 10: the claim's rule reads the queue).
--
-- The functions that read an asset's queue are replaced with the condition queued IS NOT FALSE
-- added, so that they read the new index; on every row either release writes they return what
-- they returned (a queued destination's open deliveries are all queued or NULL).
--
-- Applied one statement at a time outside a transaction (as 0013): the column has no default
-- (no rewrite: an exclusive lock for an instant, bounded by the lock timeout and retried), the
-- index is built CONCURRENTLY. Every statement is idempotent.

ALTER TABLE webhook_delivery ADD COLUMN IF NOT EXISTS queued boolean;

CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_delivery_queue
    ON webhook_delivery (destination_id, asset_id, created_at, emit_seq) INCLUDE (event_type)
    WHERE queued IS NOT FALSE AND state <> 'succeeded' AND closed_reason IS NULL;

-- The rule of 0013, on the queued deliveries.
CREATE OR REPLACE FUNCTION media_hooks_held_by_v2(
    p_ordering text,
    p_coalescing text,
    p_destination_id text,
    p_asset_id text,
    p_event_type text,
    p_created_at timestamptz,
    p_emit_seq bigint,
    p_delivery_id text
)
RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT e.delivery_id
    FROM webhook_delivery AS e
    WHERE p_ordering = 'asset'
      AND e.destination_id = p_destination_id AND e.asset_id = p_asset_id
      AND e.queued IS NOT FALSE
      AND e.state <> 'succeeded' AND e.closed_reason IS NULL
      AND (e.created_at, e.emit_seq) < (p_created_at, p_emit_seq)
    UNION ALL
    SELECT e.delivery_id
    FROM webhook_delivery AS e
    WHERE p_ordering = 'asset'
      AND e.destination_id = p_destination_id AND e.asset_id = p_asset_id
      AND e.queued IS NOT FALSE
      AND e.state <> 'succeeded' AND e.closed_reason IS NULL
      AND e.created_at = p_created_at AND e.emit_seq IS NULL
      AND (p_emit_seq IS NOT NULL OR e.delivery_id < p_delivery_id)
    UNION ALL
    SELECT n.delivery_id
    FROM webhook_delivery AS n
    WHERE p_coalescing = 'asset'
      AND n.destination_id = p_destination_id AND n.asset_id = p_asset_id
      AND n.queued IS NOT FALSE
      AND n.state <> 'succeeded' AND n.closed_reason IS NULL
      AND n.event_type = p_event_type
      AND n.delivery_id <> p_delivery_id
      AND ((n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
               > (p_created_at, coalesce(p_emit_seq, 0), p_delivery_id)
           OR n.state IN ('enqueued', 'leased'))
$$;

-- The trigger function of 0011, on the queued deliveries.
CREATE OR REPLACE FUNCTION media_hooks_release_queue_head_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM webhook_destination AS w
               WHERE w.destination_id = OLD.destination_id AND w.ordering = 'asset') THEN
        UPDATE webhook_delivery AS d
        SET next_attempt_at = CASE WHEN d.next_attempt_at >= timestamptz '9999-01-01 00:00:00+00'
                                   THEN now() ELSE d.next_attempt_at END,
            wait_reason = CASE WHEN d.next_attempt_at >= timestamptz '9999-01-01 00:00:00+00'
                               THEN 'released: the earlier deliveries of its asset are done'
                               ELSE d.wait_reason END
        WHERE d.delivery_id = (
                SELECT e.delivery_id
                FROM webhook_delivery AS e
                WHERE e.destination_id = OLD.destination_id AND e.asset_id = OLD.asset_id
                  AND e.queued IS NOT FALSE
                  AND e.state <> 'succeeded' AND e.closed_reason IS NULL
                  AND e.delivery_id <> OLD.delivery_id
                ORDER BY e.created_at, coalesce(e.emit_seq, 0), e.delivery_id
                LIMIT 1)
          AND d.state = 'pending';
    END IF;
    RETURN NULL;
END;
$$;

-- The recording function of 0020, its latest-wins step on the queued deliveries.
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
        FOR UPDATE OF d
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

-- A destination that starts ordering or coalescing by asset: its open deliveries join their
-- queues (the top of this file). Before the row is changed, it is locked FOR UPDATE: that waits
-- for the emits to it in flight, which hold its key-share lock, and the open deliveries are
-- queued after they committed (a statement of a function takes its own snapshot); an emit
-- that reads the destination from then on waits for this transaction and reads it changed.
-- keeps: invariant 10 (every open delivery of a queued destination is in its asset's queue).
CREATE OR REPLACE FUNCTION media_hooks_queue_backlog_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM webhook_destination AS w
    WHERE w.destination_id = NEW.destination_id
    FOR UPDATE;
    -- One arm per partial index of the open states, read as a BitmapOr.
    UPDATE webhook_delivery AS d
    SET queued = true
    WHERE d.destination_id = NEW.destination_id
      AND d.queued = false
      AND (d.state = 'pending' OR d.state = 'enqueued' OR d.state = 'leased'
           OR d.state = 'dead')
      AND d.closed_reason IS NULL;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER webhook_destination_queue_backlog
    BEFORE UPDATE OF ordering, coalescing ON webhook_destination
    FOR EACH ROW
    WHEN ((NEW.ordering = 'asset' AND OLD.ordering <> 'asset')
          OR (NEW.coalescing = 'asset' AND OLD.coalescing <> 'asset'))
    EXECUTE FUNCTION media_hooks_queue_backlog_v1();
