-- 0002: global per-destination rate limits (DESIGN.md, "Shape": rate limits hold across
-- concurrent runs and processes, kept in PostgreSQL).
--
-- Two ceilings per destination, both read from webhook_destination:
--   start rate:  request starts in any window of length t <= burst + rate_per_second * t
--                (a leaky bucket of starts, drained at rate_per_second, never above burst);
--   in flight:   requests in flight <= max_in_flight (slots, each held until released or until
--                its hold expires, so a process that dies cannot leak a slot for ever).
-- The database clock (clock_timestamp(), read while holding the destination's limiter row)
-- is the one clock every process shares.
--
-- One row per destination holds both ceilings, so a grant of any number of permits, or a
-- release, writes one row version. (Slot rows, one per slot, wrote two versions per permit;
-- whenever anything in the cluster kept a transaction open for a few seconds those versions
-- could not be pruned, and a busy destination's grants slowed tenfold within seconds.)
--
-- The table is UNLOGGED: a grant or a release writes no WAL, so its commit waits for no disk
-- flush (a durable commit cost more than the whole grant). The price, paid only when the
-- database server crashes or fails over: the table comes back empty, i.e. every bucket full and
-- every slot free, so for at most one hold time the requests still in flight from before the
-- crash are not counted. Pauses live in webhook_destination and are durable.

CREATE UNLOGGED TABLE destination_limiter (
    destination_id  text PRIMARY KEY REFERENCES webhook_destination (destination_id) ON DELETE CASCADE,
    -- The bucket of starts: level (in starts) as of level_at; it drains at rate_per_second
    -- and a grant of n starts adds n. Kept in starts rather than as a theoretical arrival time
    -- so that a changed rate applies from now on, in both directions.
    level           double precision NOT NULL DEFAULT 0 CHECK (level >= 0),
    level_at        timestamptz NOT NULL DEFAULT now(),
    -- Slot i is held until slot_until[i] (NULL or past: free) by the holder whose key is
    -- slot_holder[i]. Keys (a 64-bit hash of the holder's name) keep the row small enough
    -- to stay inline and uncompressed for a few hundred slots. The arrays grow with
    -- max_in_flight; slots above a lowered max_in_flight are never granted again and
    -- still count while held.
    slot_until      timestamptz[] NOT NULL DEFAULT '{}',
    slot_holder     bigint[] NOT NULL DEFAULT '{}'
-- Rewritten on every grant and release: room on the page for new versions keeps updates HOT.
) WITH (fillfactor = 50);

-- The name under which a holder's slots are kept.
CREATE FUNCTION media_hooks_holder_key_v1(p_holder text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT hashtextextended(p_holder, 0) $$;

-- The destination's limiter row, created on first use and locked: every grant, release and
-- pause for one destination serializes here, so each reads the clock after the previous one
-- wrote.
CREATE FUNCTION media_hooks_lock_limiter_v1(p_destination_id text)
RETURNS destination_limiter
LANGUAGE plpgsql AS $$
DECLARE
    lim destination_limiter;
BEGIN
    SELECT * INTO lim FROM destination_limiter l
     WHERE l.destination_id = p_destination_id FOR UPDATE;
    IF FOUND THEN
        RETURN lim;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM webhook_destination d WHERE d.destination_id = p_destination_id) THEN
        RAISE EXCEPTION 'unknown destination %', p_destination_id USING ERRCODE = 'no_data_found';
    END IF;
    INSERT INTO destination_limiter (destination_id) VALUES (p_destination_id)
    ON CONFLICT (destination_id) DO NOTHING;
    SELECT * INTO lim FROM destination_limiter l
     WHERE l.destination_id = p_destination_id FOR UPDATE;
    RETURN lim;
END;
$$;

-- Grant up to p_want permits (a slot and a start each) in one call. Starts are spent only
-- together with slots. Returns the granted slot numbers (possibly none), the database time of
-- the grant, how long until asking again is worth it, and why fewer than wanted were granted
-- ('disabled', 'paused until ... (why)', 'rate', 'in flight'). p_release lists slots this
-- holder gives back first, in the same round trip (a worker's finished requests).
CREATE FUNCTION media_hooks_acquire_permits_v1(
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
    now_ts timestamptz;
    untils timestamptz[];
    holders bigint[];
    bucket double precision;
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
    IF cardinality(p_release) > 0 THEN
        PERFORM media_hooks_release_permits_v1(p_destination_id, p_release, p_holder);
    END IF;
    lim := media_hooks_lock_limiter_v1(p_destination_id);
    -- Read after the lock, with a fresh snapshot: a grant sees every earlier grant, release and
    -- pause, and its clock is later than theirs.
    SELECT * INTO dest FROM webhook_destination d WHERE d.destination_id = p_destination_id;
    now_ts := clock_timestamp();

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
        bucket := bucket + n;
        UPDATE destination_limiter l
           SET level = bucket, level_at = now_ts, slot_until = untils, slot_holder = holders
         WHERE l.destination_id = p_destination_id;
        IF n = p_want THEN
            RETURN QUERY SELECT got, now_ts, 0::double precision, NULL::text;
            RETURN;
        END IF;
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

-- Free the listed slots that this holder still holds; returns how many. A slot whose hold
-- expired and went to another holder is left alone.
CREATE FUNCTION media_hooks_release_permits_v1(
    p_destination_id text,
    p_slots integer[],
    p_holder text
)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    lim destination_limiter;
    untils timestamptz[];
    holders bigint[];
    holder_key bigint := media_hooks_holder_key_v1(p_holder);
    slot integer;
    released integer := 0;
BEGIN
    SELECT * INTO lim FROM destination_limiter l
     WHERE l.destination_id = p_destination_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    untils := lim.slot_until;
    holders := lim.slot_holder;
    FOREACH slot IN ARRAY p_slots LOOP
        IF holders[slot] = holder_key AND untils[slot] IS NOT NULL THEN
            untils[slot] := NULL;
            holders[slot] := NULL;
            released := released + 1;
        END IF;
    END LOOP;
    IF released > 0 THEN
        UPDATE destination_limiter l SET slot_until = untils, slot_holder = holders
         WHERE l.destination_id = p_destination_id;
    END IF;
    RETURN released;
END;
$$;

-- Free every slot one holder holds, on every destination: the holder is known to be dead (its
-- run failed), so its destinations need not wait for the holds to expire. Returns how many.
CREATE FUNCTION media_hooks_release_holder_v1(p_holder text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    holder_key bigint := media_hooks_holder_key_v1(p_holder);
    lim destination_limiter;
    slot integer;
    released integer := 0;
BEGIN
    FOR lim IN
        SELECT * FROM destination_limiter l
         WHERE holder_key = ANY (l.slot_holder)
         ORDER BY l.destination_id
           FOR UPDATE
    LOOP
        FOR slot IN 1 .. coalesce(array_length(lim.slot_holder, 1), 0) LOOP
            IF lim.slot_holder[slot] = holder_key AND lim.slot_until[slot] IS NOT NULL THEN
                lim.slot_until[slot] := NULL;
                lim.slot_holder[slot] := NULL;
                released := released + 1;
            END IF;
        END LOOP;
        UPDATE destination_limiter l SET slot_until = lim.slot_until, slot_holder = lim.slot_holder
         WHERE l.destination_id = lim.destination_id;
    END LOOP;
    RETURN released;
END;
$$;

-- A 429 or a 503 with Retry-After pauses the whole destination. Taken under the limiter lock,
-- so every grant either happened before the pause began or sees it. An existing longer pause
-- is kept, with its reason.
CREATE FUNCTION media_hooks_pause_destination_v1(
    p_destination_id text,
    p_seconds double precision,
    p_reason text
)
RETURNS TABLE (paused_from timestamptz, paused_until timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    now_ts timestamptz;
    until_ts timestamptz;
BEGIN
    PERFORM media_hooks_lock_limiter_v1(p_destination_id);
    now_ts := clock_timestamp();
    until_ts := now_ts + make_interval(secs => p_seconds);
    UPDATE webhook_destination d
       SET paused_reason = CASE WHEN d.paused_until >= until_ts THEN d.paused_reason ELSE p_reason END,
           paused_until = greatest(d.paused_until, until_ts),
           updated_at = now_ts
     WHERE d.destination_id = p_destination_id
    RETURNING d.paused_until INTO until_ts;
    RETURN QUERY SELECT now_ts, until_ts;
END;
$$;
