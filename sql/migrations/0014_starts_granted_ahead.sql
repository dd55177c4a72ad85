-- 0014: a start may be granted a little ahead, for an exact moment (issue 13, part 3 item 5).
--
-- Until now a start was granted only once the bucket had room for it at the grant. With a
-- burst of 1 the bucket stores no credit, so every moment between the start becoming allowed
-- and the worker's next ask reaching the limiter (its wake-up, the round trip, a second
-- process asking first) was capacity lost for good: at 10/s two runs at once reached 0.95 of
-- the limit.
--
-- Now a grant may take a start that the bucket allows within the next p_ahead_seconds (at most
-- one interval of the rate ahead, so at most one start is ever promised ahead), and says when
-- it may start: the worker sends it at exactly that moment. The bucket is the same one (0002:
-- its level in starts as of level_at; a start allowed once the level has drained to burst - 1),
-- read as the theoretical arrival time of GCRA: the bucket is empty at level_at + level / rate,
-- and the k-th start of a grant may start (k - burst) / rate after that (at once if earlier).
-- A start promised ahead leaves the level above burst until it starts, so every version of
-- the grant (v1 of a worker of the previous release too) sees it and keeps its distance.
-- Starts granted at once from a drained bucket are counted as made up to half the horizon
-- later than they may go out (media_hooks_restart_in_v1): the first requests after a quiet
-- spell reach the receiver a little late, and the exact timeline would otherwise put the
-- starts after them right on their heels.
--
-- Nothing else changes: the in-flight ceiling (a slot per permit, held from the grant), pauses
-- and disabled destinations (nothing is granted during them), holders and releases, the
-- refund of stale offers, and 0009's rule that starts are counted from their lease: the
-- worker's step (media_hooks_lease_with_permits_v3) dates the starts it leased from the moment
-- the lease is made, as v2 did. The functions of 0002, 0005 and 0009 stay for workers of the
-- previous release.
-- keeps: the start-rate ceiling (0002: starts in any window of length t <= burst + rate * t,
--   counted at the moment each may start, or later) and the in-flight ceiling.

-- Seconds from p_at until the bucket is empty (0 if it already is): GCRA's theoretical arrival
-- time, less p_at.
CREATE FUNCTION media_hooks_empty_in_v1(
    p_level double precision,
    p_level_at timestamptz,
    p_rate double precision,
    p_at timestamptz
)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(p_level / p_rate - extract(epoch FROM p_at - p_level_at)::double precision, 0)
$$;

-- How far ahead of its moment a start may be granted: p_ahead, but at most one interval of the
-- rate, so that at most one start per destination is ever promised ahead.
CREATE FUNCTION media_hooks_horizon_v1(p_ahead double precision, p_rate double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT least(p_ahead, 1 / p_rate) $$;

-- Seconds from a grant to where its bucket's timeline goes on from: the moment the bucket
-- empties (p_empty_in after the grant), but never sooner than half the horizon. The first
-- requests after a quiet spell leave a worker that is only starting to send (its threads, its
-- connections, every destination of a run at once) and reach the receiver some milliseconds
-- late; starts scheduled right behind them would bunch up with them. So starts granted at once
-- from a drained bucket go out at once but are counted as made up to half the horizon later:
-- the bucket only ever counts them later than they are allowed, so the ceiling holds, and the
-- rate loses that much once per quiet spell, never in a steady stream of starts.
CREATE FUNCTION media_hooks_restart_in_v1(
    p_empty_in double precision,
    p_rate double precision,
    p_ahead double precision
)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(p_empty_in, media_hooks_horizon_v1(p_ahead, p_rate) / 2)
$$;

-- How many starts a grant p_empty_in before the bucket empties may take: those allowed at once
-- (the level drained to burst - 1 before each), and those whose moment on the timeline (the
-- k-th (k - burst) / rate after it goes on, media_hooks_restart_in_v1) is within the horizon.
-- The tiny slack absorbs floating-point error.
CREATE FUNCTION media_hooks_starts_allowed_v1(
    p_empty_in double precision,
    p_rate double precision,
    p_burst integer,
    p_ahead double precision
)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(
        floor(p_burst
              + p_rate * (media_hooks_horizon_v1(p_ahead, p_rate)
                          - media_hooks_restart_in_v1(p_empty_in, p_rate, p_ahead))
              + 1e-9)::integer,
        0)
$$;

-- When each of p_count starts of a grant may go out, in seconds after it: 0 for those allowed
-- at once, the moment on the timeline for the rest.
CREATE FUNCTION media_hooks_start_offsets_v1(
    p_empty_in double precision,
    p_rate double precision,
    p_burst integer,
    p_ahead double precision,
    p_count integer
)
RETURNS double precision[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(
               CASE WHEN p_empty_in + (k - p_burst) / p_rate <= 1e-9 THEN 0
                    ELSE media_hooks_restart_in_v1(p_empty_in, p_rate, p_ahead)
                         + (k - p_burst) / p_rate
               END ORDER BY k),
           '{}')
      FROM generate_series(1, p_count) AS k
$$;

-- The bucket's level just after a grant of p_count starts: its timeline then ends p_count
-- intervals after where it goes on from.
CREATE FUNCTION media_hooks_level_after_v1(
    p_empty_in double precision,
    p_rate double precision,
    p_ahead double precision,
    p_count integer
)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_rate * media_hooks_restart_in_v1(p_empty_in, p_rate, p_ahead) + p_count
$$;

-- How long after a grant of p_count starts the next one is worth asking for: once its moment
-- on the timeline is within the horizon.
CREATE FUNCTION media_hooks_rate_wait_v1(
    p_empty_in double precision,
    p_rate double precision,
    p_burst integer,
    p_ahead double precision,
    p_count integer
)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(media_hooks_restart_in_v1(p_empty_in, p_rate, p_ahead)
                    + (p_count + 1 - p_burst) / p_rate
                    - media_hooks_horizon_v1(p_ahead, p_rate), 0)
$$;

-- media_hooks_acquire_permits_v1 with starts granted ahead: up to p_want permits (a slot and a
-- start each), each start allowed within the horizon (media_hooks_horizon_v1) of the grant.
-- ``starts`` says, per granted slot, how many seconds after granted_at its request may start
-- (0: at once); retry_in, for the rate, is when the next start comes within the horizon.
-- With p_ahead_seconds = 0 this grants exactly what v1 grants, every start at once.
-- keeps: the start-rate ceiling (a start is counted from the moment it may start or later, and
--   none is allowed before the level has drained to burst - 1) and the in-flight ceiling (a
--   slot per permit from the grant on); no permit while the destination is paused or disabled.
CREATE FUNCTION media_hooks_acquire_permits_v2(
    p_destination_id text,
    p_want integer,
    p_holder text,
    p_hold_seconds double precision,
    p_slot_poll_seconds double precision,
    p_disabled_poll_seconds double precision,
    p_ahead_seconds double precision,
    p_release integer[] DEFAULT '{}'
)
RETURNS TABLE (slots integer[], starts double precision[], granted_at timestamptz,
               retry_in double precision, reason text)
LANGUAGE plpgsql AS $$
DECLARE
    lim destination_limiter;
    dest webhook_destination;
    now_ts timestamptz;
    untils timestamptz[];
    holders bigint[];
    empty_in double precision;
    tokens integer;
    in_flight integer := 0;
    next_expiry timestamptz;
    free_slots integer;
    n integer;
    got integer[] := '{}';
    holder_key bigint := media_hooks_holder_key_v1(p_holder);
    rate_bound boolean;
    rate_wait double precision := 0;
    slot_wait double precision := 0;
BEGIN
    IF p_ahead_seconds IS NULL OR p_ahead_seconds < 0 THEN
        RAISE EXCEPTION 'p_ahead_seconds must be 0 or more, got %', p_ahead_seconds;
    END IF;
    IF cardinality(p_release) > 0 THEN
        PERFORM media_hooks_release_permits_v1(p_destination_id, p_release, p_holder);
    END IF;
    lim := media_hooks_lock_limiter_v1(p_destination_id);
    -- Read after the lock, with a fresh snapshot: a grant sees every earlier grant, release and
    -- pause, and its clock is later than theirs.
    SELECT * INTO dest FROM webhook_destination d WHERE d.destination_id = p_destination_id;
    now_ts := clock_timestamp();

    IF NOT dest.enabled THEN
        RETURN QUERY SELECT '{}'::integer[], '{}'::double precision[], now_ts,
            p_disabled_poll_seconds, 'disabled'::text;
        RETURN;
    END IF;
    IF dest.paused_until > now_ts THEN
        RETURN QUERY SELECT '{}'::integer[], '{}'::double precision[], now_ts,
            extract(epoch FROM dest.paused_until - now_ts)::double precision,
            format('paused until %s (%s)',
                   to_char(dest.paused_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                   coalesce(dest.paused_reason, 'no reason given'));
        RETURN;
    END IF;

    empty_in := media_hooks_empty_in_v1(lim.level, lim.level_at, dest.rate_per_second, now_ts);
    tokens := media_hooks_starts_allowed_v1(
        empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds);

    -- Every unexpired hold counts, including slots above a lowered max_in_flight.
    untils := lim.slot_until;
    holders := lim.slot_holder;
    FOR i IN 1 .. coalesce(array_length(untils, 1), 0) LOOP
        IF untils[i] > now_ts THEN
            in_flight := in_flight + 1;
            next_expiry := least(next_expiry, untils[i]);
        END IF;
    END LOOP;
    free_slots := greatest(dest.max_in_flight - in_flight, 0);

    n := least(p_want, tokens, free_slots);
    IF n > 0 THEN
        -- Lowest free slots first; an index past the end of the arrays extends them.
        FOR i IN 1 .. dest.max_in_flight LOOP
            EXIT WHEN cardinality(got) = n;
            IF untils[i] IS NULL OR untils[i] <= now_ts THEN
                untils[i] := now_ts + make_interval(secs => p_hold_seconds);
                holders[i] := holder_key;
                got := got || i;
            END IF;
        END LOOP;
        -- A start promised ahead keeps the level above burst until its moment.
        UPDATE destination_limiter l
           SET level = media_hooks_level_after_v1(
                   empty_in, dest.rate_per_second, p_ahead_seconds, n),
               level_at = now_ts,
               slot_until = untils, slot_holder = holders
         WHERE l.destination_id = p_destination_id;
        IF n = p_want THEN
            RETURN QUERY SELECT got,
                media_hooks_start_offsets_v1(
                    empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds, n),
                now_ts, 0::double precision, NULL::text;
            RETURN;
        END IF;
    END IF;

    rate_bound := tokens <= n;
    IF rate_bound THEN
        -- The next start, the (n + 1)-th, is worth asking for once it is within the horizon.
        rate_wait := media_hooks_rate_wait_v1(
            empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds, n);
    END IF;
    IF free_slots <= n THEN
        -- Releases are not announced: ask again after a short poll, or when a hold expires.
        slot_wait := least(p_slot_poll_seconds,
            greatest(coalesce(extract(epoch FROM next_expiry - now_ts)::double precision,
                              p_slot_poll_seconds), 0));
    END IF;
    RETURN QUERY SELECT got,
        media_hooks_start_offsets_v1(
            empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds, greatest(n, 0)),
        now_ts, greatest(rate_wait, slot_wait),
        CASE WHEN rate_bound AND rate_wait >= slot_wait THEN 'rate' ELSE 'in flight' END;
END;
$$;

-- The worker's step (media_hooks_lease_with_permits_v2) with starts granted ahead: hand back
-- finished slots, take up to one permit per offered message (media_hooks_acquire_permits_v2),
-- lease that many of the offered messages (the first ones), give back the slots of offered
-- messages no longer theirs to send, and count the leased starts from the moment the lease is
-- made (0009): the grant's starts are withdrawn and the leased ones scheduled again from then,
-- so a lease that waited on a lock neither spends the starts of the time it waited nor sends
-- them on top of the next grant. Each row's start_at is the moment its request may start, on
-- the database's clock; answered_at is that clock as the statement ends (the worker maps the
-- one clock onto its own with it: media_hooks.rate_limits.DatabaseClock), and retry_in counts
-- from then.
-- keeps: the rate limits (no lease without a permit; no permit kept without a lease; every
--   leased start at or after its moment on the bucket's timeline) and invariants 3, 4, 5 and 9
--   (media_hooks_lease_v2).
CREATE FUNCTION media_hooks_lease_with_permits_v3(
    p_destination_id text,
    p_holder text,
    p_hold_seconds double precision,
    p_slot_poll_seconds double precision,
    p_disabled_poll_seconds double precision,
    p_ahead_seconds double precision,
    p_release integer[],
    p_run_id text,
    p_delivery_ids text[],
    p_message_ids text[]
)
RETURNS TABLE (examined integer, granted_at timestamptz, retry_in double precision, reason text,
               slot integer, start_at timestamptz, answered_at timestamptz,
               delivery_id text, message_id text,
               lease_token uuid, attempt_no integer, budget_used integer, body bytea)
LANGUAGE plpgsql AS $$
DECLARE
    permit record;
    granted integer;
    used integer;
    -- The leases, column by column: rows are returned once their starts are scheduled.
    leased_ids text[];
    leased_messages text[];
    tokens uuid[];
    attempts integer[];
    budgets integer[];
    bodies bytea[];
    lim destination_limiter;
    rate double precision;
    burst integer;
    leased_at timestamptz;
    empty_in double precision;
    offsets double precision[];
BEGIN
    SELECT * INTO permit
      FROM media_hooks_acquire_permits_v2(
          p_destination_id, cardinality(p_delivery_ids), p_holder, p_hold_seconds,
          p_slot_poll_seconds, p_disabled_poll_seconds, p_ahead_seconds, p_release);
    granted := coalesce(cardinality(permit.slots), 0);
    examined := granted;
    granted_at := permit.granted_at;
    retry_in := permit.retry_in;
    reason := permit.reason;
    IF granted = 0 THEN
        answered_at := clock_timestamp();
        RETURN NEXT;
        RETURN;
    END IF;

    SELECT coalesce(array_agg(l.delivery_id ORDER BY l.n), '{}'),
           coalesce(array_agg(l.message_id ORDER BY l.n), '{}'),
           coalesce(array_agg(l.lease_token ORDER BY l.n), '{}'),
           coalesce(array_agg(l.attempt_no ORDER BY l.n), '{}'),
           coalesce(array_agg(l.budget_used ORDER BY l.n), '{}'),
           coalesce(array_agg(l.body ORDER BY l.n), '{}')
      INTO leased_ids, leased_messages, tokens, attempts, budgets, bodies
      FROM media_hooks_lease_v2(
          p_run_id, p_delivery_ids[1:granted], p_message_ids[1:granted], p_hold_seconds)
           WITH ORDINALITY
           AS l (delivery_id, message_id, lease_token, attempt_no, budget_used, body, n);
    used := cardinality(leased_ids);
    IF used < granted THEN
        PERFORM media_hooks_release_permits_v1(
            p_destination_id, permit.slots[used + 1:granted], p_holder);
    END IF;

    -- The limiter row is still ours: withdraw the grant's starts, let the rest of the bucket
    -- drain until now, and schedule the leased starts from now.
    leased_at := clock_timestamp();
    SELECT * INTO lim FROM destination_limiter l WHERE l.destination_id = p_destination_id;
    SELECT d.rate_per_second, d.burst INTO rate, burst
      FROM webhook_destination d WHERE d.destination_id = p_destination_id;
    empty_in := media_hooks_empty_in_v1(lim.level - granted, lim.level_at, rate, leased_at);
    offsets := media_hooks_start_offsets_v1(empty_in, rate, burst, p_ahead_seconds, used);
    UPDATE destination_limiter l
       SET level = media_hooks_level_after_v1(empty_in, rate, p_ahead_seconds, used),
           level_at = leased_at
     WHERE l.destination_id = p_destination_id;
    answered_at := clock_timestamp();
    IF reason = 'rate' THEN
        retry_in := greatest(
            media_hooks_rate_wait_v1(empty_in, rate, burst, p_ahead_seconds, used)
            - extract(epoch FROM answered_at - leased_at)::double precision,
            0);
    END IF;

    IF used = 0 THEN
        RETURN NEXT;
        RETURN;
    END IF;
    FOR i IN 1 .. used LOOP
        slot := permit.slots[i];
        start_at := leased_at + make_interval(secs => offsets[i]);
        delivery_id := leased_ids[i];
        message_id := leased_messages[i];
        lease_token := tokens[i];
        attempt_no := attempts[i];
        budget_used := budgets[i];
        body := bodies[i];
        RETURN NEXT;
    END LOOP;
END;
$$;
