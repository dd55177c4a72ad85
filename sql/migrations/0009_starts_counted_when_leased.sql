-- 0009: a start is counted when its lease is made, not when its permit was granted (issue 12).
--
-- media_hooks_lease_with_permits_v1 (0005) takes the permits first (the limiter row is locked
-- and the bucket filled as of the grant's clock), then leases. A lease that waits on a row lock
-- (an operator's session, a requeue, a sweep holding the delivery) keeps the limiter row locked
-- meanwhile, and its requests go out only after it commits; but the bucket says they started at
-- the grant. The next grant, right after the commit, finds the bucket drained by everything
-- the rate allowed during the wait, and grants a full burst on top of the starts that just went
-- out: 2 x burst starts at once, above the start-rate ceiling (the soak's and
-- media_hooks_tests/test_rate_limits.py's interleaving show it).
--
-- v2 calls v1, then, still holding the limiter row, moves the starts it leased to the moment
-- the lease is made: the rest of the bucket drains for the time the lease waited, the
-- leased starts do not. v1 is kept unchanged for workers of the previous release during a
-- rolling upgrade.
-- keeps: the start-rate ceiling (0002: starts in any window of length t <= burst + rate * t,
--   counted when the requests can go out) and the in-flight ceiling; invariants 3, 4, 5 and 9
--   (media_hooks_lease_v2).
CREATE FUNCTION media_hooks_lease_with_permits_v2(
    p_destination_id text,
    p_holder text,
    p_hold_seconds double precision,
    p_slot_poll_seconds double precision,
    p_disabled_poll_seconds double precision,
    p_release integer[],
    p_run_id text,
    p_delivery_ids text[],
    p_message_ids text[]
)
RETURNS TABLE (examined integer, granted_at timestamptz, retry_in double precision, reason text,
               slot integer, delivery_id text, message_id text, lease_token uuid,
               attempt_no integer, budget_used integer, body bytea)
LANGUAGE plpgsql AS $$
DECLARE
    used integer := 0;
    leased_at timestamptz;
BEGIN
    FOR examined, granted_at, retry_in, reason, slot, delivery_id, message_id, lease_token,
        attempt_no, budget_used, body IN
        SELECT * FROM media_hooks_lease_with_permits_v1(
            p_destination_id, p_holder, p_hold_seconds, p_slot_poll_seconds,
            p_disabled_poll_seconds, p_release, p_run_id, p_delivery_ids, p_message_ids)
    LOOP
        IF delivery_id IS NOT NULL THEN
            used := used + 1;
        END IF;
        RETURN NEXT;
    END LOOP;
    IF used > 0 THEN
        -- v1 left the limiter row locked. Its level holds the leased starts (added at the
        -- grant) and what earlier starts had left as of the grant: that rest drains for as long
        -- as the lease took; the leased starts are counted from now.
        leased_at := clock_timestamp();
        UPDATE destination_limiter AS l
           SET level = greatest(l.level - used - w.rate_per_second
                                * greatest(extract(epoch FROM leased_at - l.level_at)::double precision, 0),
                                0) + used,
               level_at = leased_at
          FROM webhook_destination AS w
         WHERE l.destination_id = p_destination_id
           AND w.destination_id = p_destination_id;
    END IF;
END;
$$;
