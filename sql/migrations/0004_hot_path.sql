-- 0004: the delivery hot path writes less per state change.
--
-- The immutability trigger (0001, invariant 2) fired on every update of a delivery, and every
-- transition of the state machine is one: three runs of a PL/pgSQL function per delivery sent,
-- each comparing the body and the payload. A column trigger fires only when an UPDATE names one
-- of the identity columns as a target, which is the only way to change one; the state machine
-- never names them, so it no longer pays, while any statement that does is checked as before.

DROP TRIGGER webhook_delivery_immutable ON webhook_delivery;
CREATE TRIGGER webhook_delivery_immutable
    BEFORE UPDATE OF delivery_id, destination_id, asset_id, event_type, payload, body, created_at
    ON webhook_delivery
    FOR EACH ROW EXECUTE FUNCTION media_hooks_delivery_is_immutable();

-- A lease token exists only while the delivery is leased (0001's leased_has_lease is the other
-- half), so the token alone fences an outcome: record_outcomes looks deliveries up by key and
-- token, never by state, and no stale estimate of how many rows are leased can change its plan.
ALTER TABLE webhook_delivery
    ADD CONSTRAINT lease_only_while_leased
    CHECK (state = 'leased' OR (lease_token IS NULL AND lease_until IS NULL));

-- The lease (0001) re-planned its statement on every call (0.17 ms of a 0.6 ms step), and its
-- state test, three ORed state comparisons, left the planner free to reach for the partial
-- state indexes when its statistics say few rows are enqueued or leased (right after a claim,
-- they all are: what made record_outcomes slow). As one CASE, the test can only filter rows
-- found by key, so the one plan is a primary-key lookup per offered message, made once per
-- session, and with sequential scans ruled out it stays that whatever size the table was
-- when the plan was made.
-- keeps: invariant 4 (a fresh lease_token fences every later update; succeeded and dead rows
--   are never leased), invariant 3 (the attempt row records the start before any request),
--   invariant 5 (only scheduling metadata changes); as in 0001.
CREATE OR REPLACE FUNCTION media_hooks_lease_v1(
    p_run_id text,
    p_delivery_ids text[],
    p_message_ids text[],
    p_lease_seconds double precision
)
RETURNS TABLE (delivery_id text, message_id text, lease_token uuid, attempt_no integer,
               budget_used integer, body bytea)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
-- The plan is made once per session, possibly while the table is still empty, when a scan
-- looks cheapest; it must stay a key lookup as the table grows to millions of rows.
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH wanted AS (
        SELECT *
        FROM unnest(p_delivery_ids, p_message_ids) AS w(delivery_id, message_id)
    ),
    leased AS (
        UPDATE webhook_delivery AS d
        SET state = 'leased',
            lease_token = gen_random_uuid(),
            lease_until = now() + make_interval(secs => p_lease_seconds),
            attempt_count = d.attempt_count + 1,
            budget_used = d.budget_used + 1,
            updated_at = now()
        FROM wanted
        WHERE d.delivery_id = wanted.delivery_id
          AND d.current_message_id = wanted.message_id
          AND CASE d.state
                  WHEN 'enqueued' THEN true
                  WHEN 'pending' THEN d.next_attempt_at <= now()
                  WHEN 'leased' THEN d.lease_until < now()
                  ELSE false
              END
        RETURNING d.delivery_id, d.destination_id, d.current_message_id AS message_id,
                  d.lease_token, d.attempt_count AS attempt_no, d.budget_used, d.body
    ),
    opened AS (
        INSERT INTO delivery_attempt
            (delivery_id, attempt_no, destination_id, message_id, run_id, lease_token)
        SELECT l.delivery_id, l.attempt_no, l.destination_id, l.message_id, p_run_id, l.lease_token
        FROM leased AS l
    )
    SELECT l.delivery_id, l.message_id, l.lease_token, l.attempt_no, l.budget_used, l.body
    FROM leased AS l;
END;
$$;

-- Slots of one holder freed in a limiter row's arrays (in memory; the caller writes the row).
-- Shared by the release and by the grant, which takes a worker's finished slots back first.
CREATE FUNCTION media_hooks_free_slots_v1(
    INOUT untils timestamptz[],
    INOUT holders bigint[],
    p_slots integer[],
    p_holder_key bigint,
    OUT released integer
)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    slot integer;
BEGIN
    released := 0;
    FOREACH slot IN ARRAY p_slots LOOP
        IF holders[slot] = p_holder_key AND untils[slot] IS NOT NULL THEN
            untils[slot] := NULL;
            holders[slot] := NULL;
            released := released + 1;
        END IF;
    END LOOP;
END;
$$;

-- The release (0002), unchanged in what it does, through the shared slot freeing.
CREATE OR REPLACE FUNCTION media_hooks_release_permits_v1(
    p_destination_id text,
    p_slots integer[],
    p_holder text
)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    lim destination_limiter;
    freed record;
BEGIN
    SELECT * INTO lim FROM destination_limiter l
     WHERE l.destination_id = p_destination_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    SELECT * INTO freed FROM media_hooks_free_slots_v1(
        lim.slot_until, lim.slot_holder, p_slots, media_hooks_holder_key_v1(p_holder));
    IF freed.released > 0 THEN
        UPDATE destination_limiter l SET slot_until = freed.untils, slot_holder = freed.holders
         WHERE l.destination_id = p_destination_id;
    END IF;
    RETURN freed.released;
END;
$$;

-- A worker's step hands back finished slots and asks for new ones in one call; the release is
-- now part of the grant, under the same lock and in the same row version (it was a call of
-- media_hooks_release_permits_v1: a second lock and a second row version per step).
-- keeps: the start-rate and in-flight ceilings and any pause (0002), with the release written
--   even when the grant is refused (paused, disabled).
CREATE OR REPLACE FUNCTION media_hooks_acquire_permits_v1(
    p_destination_id text,
    p_want integer,
    p_holder text,
    p_hold_seconds double precision,
    p_slot_poll_seconds double precision,
    p_disabled_poll_seconds double precision,
    p_release integer[] DEFAULT '{}'
)
RETURNS TABLE (slots integer[], granted_at timestamptz, retry_in double precision, reason text)
LANGUAGE plpgsql AS $$
DECLARE
    lim destination_limiter;
    dest webhook_destination;
    freed record;
    now_ts timestamptz;
    untils timestamptz[];
    holders bigint[];
    bucket double precision;
    tokens integer;
    in_flight integer := 0;
    next_expiry timestamptz;
    free_slots integer;
    n integer := 0;
    got integer[] := '{}';
    holder_key bigint := media_hooks_holder_key_v1(p_holder);
    rate_bound boolean;
    rate_wait double precision := 0;
    slot_wait double precision := 0;
BEGIN
    lim := media_hooks_lock_limiter_v1(p_destination_id);
    -- The holder's finished requests give their slots back first.
    SELECT * INTO freed
      FROM media_hooks_free_slots_v1(lim.slot_until, lim.slot_holder, p_release, holder_key);
    untils := freed.untils;
    holders := freed.holders;
    -- Read after the lock, with a fresh snapshot: a grant sees every earlier grant, release and
    -- pause, and its clock is later than theirs.
    SELECT * INTO dest FROM webhook_destination d WHERE d.destination_id = p_destination_id;
    now_ts := clock_timestamp();

    IF (NOT dest.enabled OR dest.paused_until > now_ts) AND freed.released > 0 THEN
        UPDATE destination_limiter l SET slot_until = untils, slot_holder = holders
         WHERE l.destination_id = p_destination_id;
    END IF;
    IF NOT dest.enabled THEN
        RETURN QUERY SELECT '{}'::integer[], now_ts, p_disabled_poll_seconds, 'disabled'::text;
        RETURN;
    END IF;
    IF dest.paused_until > now_ts THEN
        RETURN QUERY SELECT '{}'::integer[], now_ts,
            extract(epoch FROM dest.paused_until - now_ts)::double precision,
            format('paused until %s (%s)',
                   to_char(dest.paused_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                   coalesce(dest.paused_reason, 'no reason given'));
        RETURN;
    END IF;

    -- The bucket drained since it was last filled; room for whole starts only (the tiny slack
    -- absorbs floating-point error in the drained amount).
    bucket := greatest(lim.level - dest.rate_per_second
                  * greatest(extract(epoch FROM now_ts - lim.level_at)::double precision, 0), 0);
    tokens := greatest(floor(dest.burst - bucket + 1e-9)::integer, 0);

    -- Every unexpired hold counts, including slots above a lowered max_in_flight.
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
        bucket := bucket + n;
    END IF;
    IF n > 0 OR freed.released > 0 THEN
        -- The release and the grant in one row version. (Without a grant, the level drained
        -- as of now is the same bucket.)
        UPDATE destination_limiter l
           SET level = bucket, level_at = now_ts, slot_until = untils, slot_holder = holders
         WHERE l.destination_id = p_destination_id;
    END IF;
    IF n > 0 AND n = p_want THEN
        RETURN QUERY SELECT got, now_ts, 0::double precision, NULL::text;
        RETURN;
    END IF;

    rate_bound := tokens <= n;
    IF rate_bound THEN
        -- The next start is allowed once the bucket has drained to one start under the burst.
        rate_wait := greatest((bucket - (dest.burst - 1)) / dest.rate_per_second, 0);
    END IF;
    IF free_slots <= n THEN
        -- Releases are not announced: ask again after a short poll, or when a hold expires.
        slot_wait := least(p_slot_poll_seconds,
            greatest(coalesce(extract(epoch FROM next_expiry - now_ts)::double precision,
                              p_slot_poll_seconds), 0));
    END IF;
    RETURN QUERY SELECT got, now_ts, greatest(rate_wait, slot_wait),
        CASE WHEN rate_bound AND rate_wait >= slot_wait THEN 'rate' ELSE 'in flight' END;
END;
$$;
