-- 0017: every decision that moves a delivery after an attempt is made here (issue 33, part 1).
--
-- Until now the runtime decided part of the next state: the Python worker computed the retry
-- delay (exponential backoff with jitter, media_hooks/backoff.py), capped Retry-After, chose
-- the pause of a 429 without Retry-After (the destination's backoff base), paused the
-- destination, disabled it on a 410 or an address the SSRF guard refused, and handed the
-- delay to record_outcomes. A second runtime (the Node.js worker) would have had to copy
-- that policy and drift from it. media_hooks_record_outcomes_v1 takes only what the runtime
-- saw, each attempt's classified outcome (docs/contract.md, "Outcomes"):
--   outcome (the contract's class), http_status, retry_after (seconds as parsed from the
--   header, uncapped; null when absent or unparseable), error, excerpt, finished_ago (seconds
--   since the attempt ended, on the runtime's monotonic clock), attempted (false: the runtime
--   never started the request, it stopped between lease and send), configuration_fault (true:
--   the SSRF guard refused the address at connect time);
-- and decides the rest:
--   - the next state: success -> succeeded; rejected -> dead; an attempt not started or
--     refused by the guard -> pending, its unit of retry budget given back, whatever the
--     budget and age; past the maximum age -> dead; the retry budget spent (rate_limited
--     never spends it) -> dead; otherwise pending;
--   - when it is due: Retry-After capped at RETRY_AFTER_CAP (3600 s); a 429 without one, the
--     destination's backoff base; anything else, the jittered backoff of its failed attempts
--     (media_hooks_backoff_seconds_v1: the same rule and distribution as backoff.py);
--     nothing started, due now;
--   - the destination: a rate-limited answer pauses it for the longest of the batch's waits
--     (media_hooks_pause_destination_v1), a 410 disables it (Gone), and so does a refused
--     address (a configuration fault, saying which address and which setting allows it).
-- A destination's backoff base and cap are taken within what `destination add` accepts
-- (0.1 s to 2,592,000 s), so a destination stored with odd values (or changed under a running
-- worker) can neither overflow a due time nor underflow the jitter's arithmetic.
--
-- Order of locks: a pause takes the destination's limiter row before any delivery row is
-- locked, the order every worker's step takes (media_hooks_lease_with_permits_v4), so a
-- record and a step cannot wait on each other. The pause and the disable apply to every
-- answer of the batch, also to one whose lease no longer held: the receiver said it.
--
-- The previous release's record_outcomes statement (the runtime's delay) keeps working: no
-- table changes here, and nothing it uses is altered.
-- keeps: invariant 4 (only the lease holder moves a row: the token fences it), invariant 5 (a
--   retry changes next_attempt_at and counts, never identity), invariant 6 (the table owns the
--   retry clock, now entirely: the runtime hands over no time).

-- The jittered wait after failed attempt p_failed (1 = the first), for a draw in [0, 1) as
-- random() makes them (multiples of 2^-52), with 0 < p_base <= p_cap:
-- d = min(cap, base * 2^(n-1)), uniform over [0.8 d, min(1.2 d, cap)]. The jitter spreads a
-- receiver's outage so that its retries do not come back in lockstep, never waits above the
-- cap and never below 80 % of the nominal delay. The draw is a parameter so that the rule is
-- a pure function (a test gives it chosen draws); the record passes random().
CREATE FUNCTION media_hooks_backoff_seconds_v1(
    p_failed integer,
    p_base double precision,
    p_cap double precision,
    p_draw double precision
)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT low + p_draw * (high - low)
    FROM (SELECT 0.8 * nominal AS low, greatest(least(1.2 * nominal, p_cap), 0.8 * nominal) AS high
          -- The exponent is bounded so that a huge attempt number cannot overflow.
          FROM (SELECT least(p_cap, p_base * power(2.0::double precision,
                                                   least(greatest(p_failed, 1) - 1, 64)))
                       AS nominal) AS n) AS bounds
$$;

-- A Retry-After as the record honours it: never negative, at most an hour, so a receiver
-- cannot park a destination for a year. Null stays null (no usable Retry-After).
CREATE FUNCTION media_hooks_retry_after_seconds_v1(p_seconds double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT least(greatest(p_seconds, 0), 3600)
$$;

-- Seconds as an operator reads them in a reason: whole, no exponent.
CREATE FUNCTION media_hooks_whole_seconds_v1(p_seconds double precision)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT round(p_seconds)::bigint::text
$$;

CREATE FUNCTION media_hooks_record_outcomes_v1(p_outcomes jsonb)
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
