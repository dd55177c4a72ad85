-- 0015: the worker's step writes its destination's limiter row once, not three times (issue 13).
--
-- media_hooks_lease_with_permits_v3 (0014) composes the functions of earlier releases: it
-- hands back finished slots (media_hooks_release_permits_v1: a lock and a write of the
-- limiter row), takes permits (media_hooks_acquire_permits_v2: the lock again, a read of the
-- destination, a write), leases, then reads the limiter and the destination again and writes
-- the leased starts' schedule (a third write). Every write of the row is a new row version, a
-- WAL record and a page to prune: with tens of destinations each asking several times a
-- second, the step is the database's largest cost per delivery. One write instead of three
-- takes about an eighth off it (bench/statements.py, a step of four, the two versions run in
-- turn four times on one machine: 0.53-0.60 ms of server CPU against 0.62-0.79 ms).
--
-- media_hooks_lease_with_permits_v4 does the same in one pass over the locked row: the
-- destination read once, the releases, the grant, the lease, the stale offers' slots handed
-- back and the leased starts scheduled, all applied to the row's values in the function and
-- written in one UPDATE (none when nothing changed). Its arguments, rows and every answer are
-- v3's: the grant is acquire_permits_v2's rule and the schedule v3's, with the functions of 0014
-- (horizon, start offsets, level after, rate wait); media_hooks_tests/test_lease_step_versions.py
-- runs both from the same states and compares what they answer and write. One difference: v3
-- read the destination's rate and burst again after the lease, so a change committed during
-- the step could schedule its starts under a rate their grant was not made under; v4 grants
-- and schedules under the one reading.
--
-- v3 and the functions it calls stay for workers of the previous release; both serialize on
-- the same row lock and keep the same state, so they may run side by side.
-- keeps: the rate limits (no lease without a permit; no permit kept without a lease; every
--   leased start at or after its moment on the bucket's timeline) and invariants 3, 4, 5 and 9
--   (media_hooks_lease_v2).

CREATE FUNCTION media_hooks_lease_with_permits_v4(
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
    lim destination_limiter;
    dest webhook_destination;
    holder_key bigint := media_hooks_holder_key_v1(p_holder);
    untils timestamptz[];
    holders bigint[];
    changed boolean := false;
    released integer;
    empty_in double precision;
    tokens integer;
    in_flight integer := 0;
    next_expiry timestamptz;
    free_slots integer;
    granted integer;
    got integer[] := '{}';
    rate_bound boolean;
    rate_wait double precision := 0;
    slot_wait double precision := 0;
    -- The leases, column by column: rows are returned once their starts are scheduled.
    leased_ids text[];
    leased_messages text[];
    tokens_out uuid[];
    attempts integer[];
    budgets integer[];
    bodies bytea[];
    used integer;
    leased_at timestamptz;
    offsets double precision[];
BEGIN
    IF p_ahead_seconds IS NULL OR p_ahead_seconds < 0 THEN
        RAISE EXCEPTION 'p_ahead_seconds must be 0 or more, got %', p_ahead_seconds;
    END IF;
    lim := media_hooks_lock_limiter_v1(p_destination_id);
    -- Read after the lock, with a fresh snapshot: a grant sees every earlier grant, release and
    -- pause, and its clock is later than theirs.
    SELECT * INTO dest FROM webhook_destination d WHERE d.destination_id = p_destination_id;
    granted_at := clock_timestamp();
    untils := lim.slot_until;
    holders := lim.slot_holder;

    -- Finished requests' slots first (media_hooks_release_permits_v1's rule: only this
    -- holder's holds).
    FOREACH released IN ARRAY coalesce(p_release, '{}') LOOP
        IF holders[released] = holder_key AND untils[released] IS NOT NULL THEN
            untils[released] := NULL;
            holders[released] := NULL;
            changed := true;
        END IF;
    END LOOP;

    -- The grant: media_hooks_acquire_permits_v2's rule. Nothing while disabled or paused.
    IF NOT dest.enabled THEN
        granted := 0;
        retry_in := p_disabled_poll_seconds;
        reason := 'disabled';
    ELSIF dest.paused_until > granted_at THEN
        granted := 0;
        retry_in := extract(epoch FROM dest.paused_until - granted_at)::double precision;
        reason := format('paused until %s (%s)',
                         to_char(dest.paused_until AT TIME ZONE 'UTC',
                                 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                         coalesce(dest.paused_reason, 'no reason given'));
    ELSE
        empty_in := media_hooks_empty_in_v1(
            lim.level, lim.level_at, dest.rate_per_second, granted_at);
        tokens := media_hooks_starts_allowed_v1(
            empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds);
        -- Every unexpired hold counts, including slots above a lowered max_in_flight.
        FOR i IN 1 .. coalesce(array_length(untils, 1), 0) LOOP
            IF untils[i] > granted_at THEN
                in_flight := in_flight + 1;
                next_expiry := least(next_expiry, untils[i]);
            END IF;
        END LOOP;
        free_slots := greatest(dest.max_in_flight - in_flight, 0);
        granted := least(cardinality(p_delivery_ids), tokens, free_slots);
        -- Lowest free slots first; an index past the end of the arrays extends them.
        FOR i IN 1 .. dest.max_in_flight LOOP
            EXIT WHEN cardinality(got) >= granted;
            IF untils[i] IS NULL OR untils[i] <= granted_at THEN
                untils[i] := granted_at + make_interval(secs => p_hold_seconds);
                holders[i] := holder_key;
                got := got || i;
            END IF;
        END LOOP;
        IF granted > 0 THEN
            -- The grant's starts, as acquire_permits_v2 counts them (withdrawn below: only
            -- the leased ones are scheduled).
            lim.level := media_hooks_level_after_v1(
                empty_in, dest.rate_per_second, p_ahead_seconds, granted);
            lim.level_at := granted_at;
        END IF;
        retry_in := 0;
        IF granted = 0 OR granted < cardinality(p_delivery_ids) THEN
            rate_bound := tokens <= granted;
            IF rate_bound THEN
                -- The next start is worth asking for once it is within the horizon.
                rate_wait := media_hooks_rate_wait_v1(
                    empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds, granted);
            END IF;
            IF free_slots <= granted THEN
                -- Releases are not announced: ask again after a short poll, or when a hold
                -- expires.
                slot_wait := least(p_slot_poll_seconds,
                    greatest(coalesce(extract(epoch FROM next_expiry - granted_at)::double precision,
                                      p_slot_poll_seconds), 0));
            END IF;
            retry_in := greatest(rate_wait, slot_wait);
            reason := CASE WHEN rate_bound AND rate_wait >= slot_wait THEN 'rate'
                           ELSE 'in flight' END;
        END IF;
    END IF;
    examined := granted;

    IF granted > 0 THEN
        SELECT coalesce(array_agg(l.delivery_id ORDER BY l.n), '{}'),
               coalesce(array_agg(l.message_id ORDER BY l.n), '{}'),
               coalesce(array_agg(l.lease_token ORDER BY l.n), '{}'),
               coalesce(array_agg(l.attempt_no ORDER BY l.n), '{}'),
               coalesce(array_agg(l.budget_used ORDER BY l.n), '{}'),
               coalesce(array_agg(l.body ORDER BY l.n), '{}')
          INTO leased_ids, leased_messages, tokens_out, attempts, budgets, bodies
          FROM media_hooks_lease_v2(
              p_run_id, p_delivery_ids[1:granted], p_message_ids[1:granted], p_hold_seconds)
               WITH ORDINALITY
               AS l (delivery_id, message_id, lease_token, attempt_no, budget_used, body, n);
        used := cardinality(leased_ids);
        -- Offers no longer theirs to send give their slots back at once.
        FOR i IN used + 1 .. granted LOOP
            untils[got[i]] := NULL;
            holders[got[i]] := NULL;
        END LOOP;
        -- v3's schedule: the grant's starts withdrawn, the rest of the bucket drained until
        -- now, and the leased starts scheduled from the moment the lease is made (0009): a
        -- lease that waited on a lock neither spends the starts of the time it waited nor
        -- sends them on top of the next grant. A start promised ahead keeps the level above
        -- burst until its moment.
        leased_at := clock_timestamp();
        empty_in := media_hooks_empty_in_v1(lim.level - granted, lim.level_at,
                                            dest.rate_per_second, leased_at);
        offsets := media_hooks_start_offsets_v1(
            empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds, used);
        lim.level := media_hooks_level_after_v1(
            empty_in, dest.rate_per_second, p_ahead_seconds, used);
        lim.level_at := leased_at;
        changed := true;
    END IF;

    IF changed THEN
        UPDATE destination_limiter l
           SET level = lim.level, level_at = lim.level_at,
               slot_until = untils, slot_holder = holders
         WHERE l.destination_id = p_destination_id;
    END IF;
    answered_at := clock_timestamp();
    IF reason = 'rate' AND granted > 0 THEN
        retry_in := greatest(
            media_hooks_rate_wait_v1(empty_in, dest.rate_per_second, dest.burst,
                                     p_ahead_seconds, used)
            - extract(epoch FROM answered_at - leased_at)::double precision,
            0);
    END IF;

    IF coalesce(used, 0) = 0 THEN
        RETURN NEXT;
        RETURN;
    END IF;
    FOR i IN 1 .. used LOOP
        slot := got[i];
        start_at := leased_at + make_interval(secs => offsets[i]);
        delivery_id := leased_ids[i];
        message_id := leased_messages[i];
        lease_token := tokens_out[i];
        attempt_no := attempts[i];
        budget_used := budgets[i];
        body := bodies[i];
        RETURN NEXT;
    END LOOP;
END;
$$;
