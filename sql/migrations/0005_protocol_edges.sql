-- 0005: the edges of the state machine (issue 9).
--
-- 1. One identity per delivery_id, outliving its payload (invariants 1 and 8).
-- 2. The request body's timestamp stamped from the database clock (the stored times the protocol
--    compares all come from one clock).
-- 3. One function owns "a lease ends without an outcome": the sweep, a lease takeover, a failed
--    run's release and a requeue all end leases through it (invariants 3, 4 and 9).
-- 4. The worker's lease-with-permits step takes start tokens and slots only for what it leases.
--
-- Every released function keeps its name and body: a worker of the previous release may still
-- call media_hooks_lease_v1 during a rolling upgrade. New behaviour lives in new versions.


-- 1. Identity --------------------------------------------------------------------------------
--
-- A delivery_id was protected by two things that no statement took together: the primary key of
-- webhook_delivery and the tombstone's primary key. A purge that deleted the row and wrote its
-- tombstone in one transaction let an emit of the same id, waiting on the deleted row, insert a
-- live delivery as soon as the purge committed (its NOT EXISTS looked at an older snapshot; its
-- ON CONFLICT rechecked only the deleted row). Now one row per delivery_id, in one table, holds
-- the identity from the first emit until the tombstone expires; every emit path inserts it
-- first (ON CONFLICT DO NOTHING) and records a delivery only when that insert wrote the row, and
-- the purge turns the same row into the tombstone. Whatever the interleaving, the unique index
-- on delivery_identity decides: an id is recorded once.
--
-- While its delivery lives the row is the id alone (the emit hot path writes one small tuple);
-- the purge fills in what the tombstone needs.
CREATE TABLE delivery_identity (
    delivery_id     text PRIMARY KEY,
    destination_id  text,
    -- The delivery's creation time: the duplicate window is measured from the event.
    created_at      timestamptz,
    final_state     text CONSTRAINT identity_final_state CHECK (final_state IN ('succeeded', 'dead')),
    -- NULL also for a tombstone written through the delivery_tombstone view by older code.
    purged_at       timestamptz,
    CONSTRAINT tombstone_is_complete CHECK (
        final_state IS NULL OR (destination_id IS NOT NULL AND created_at IS NOT NULL))
);

-- Every id recorded so far, and every tombstone (a tombstone that shares its id with a live
-- row, which the race above could leave, keeps the live row's identity: it is still protected,
-- and becomes a tombstone again when that row is purged).
INSERT INTO delivery_identity (delivery_id)
SELECT delivery_id FROM webhook_delivery;
INSERT INTO delivery_identity (delivery_id, destination_id, created_at, final_state, purged_at)
SELECT delivery_id, destination_id, created_at, final_state, purged_at FROM delivery_tombstone
ON CONFLICT (delivery_id) DO NOTHING;

-- Tombstone expiry, oldest events first, and the bulk emit's look-up of purged ids (only
-- tombstones are indexed: emit does not pay for either).
CREATE INDEX delivery_identity_tombstone_created ON delivery_identity (created_at)
    WHERE final_state IS NOT NULL;
CREATE INDEX delivery_identity_tombstone ON delivery_identity (delivery_id)
    WHERE final_state IS NOT NULL;

-- The tombstones under the name they had, for operators' queries and for code of the previous
-- release during a rolling upgrade: an auto-updatable view, whose INSERT ... ON CONFLICT
-- (delivery_id) DO NOTHING, as the previous purge wrote it, writes a tombstone identity (or
-- leaves the live identity, which protects the id all the same). The table keeps its rows under
-- another name: nothing committed is dropped (a code rollback keeps the audit trail).
ALTER TABLE delivery_tombstone RENAME TO delivery_tombstone_0003;
CREATE VIEW delivery_tombstone AS
SELECT delivery_id, destination_id, final_state, created_at, purged_at
FROM delivery_identity
WHERE final_state IS NOT NULL;


-- 2. The body's timestamp from the database clock --------------------------------------------
--
-- RFC 3339 in UTC with microseconds and Z: what timestamptz stores, so a body's timestamp equals
-- its row's created_at exactly. (to_char is STABLE for its locale-dependent patterns; this one
-- uses none.)
CREATE FUNCTION media_hooks_rfc3339_v1(moment timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT to_char(moment AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;


-- 3. A lease ends ----------------------------------------------------------------------------
--
-- The one rule for a lease that ends without a recorded outcome (its worker was lost, too slow,
-- or its run failed): the attempt it opened is closed as ambiguous (the request may have
-- reached the receiver), and the delivery is dead if its retry budget or its maximum age is
-- spent, else pending and due now. Rows another transaction holds are skipped: that one is
-- deciding them. Returns each delivery ended and the state it was left in.
--   p_expired_only: end only leases past lease_until (the sweep, a takeover, a requeue); false
--     for a run known to have failed.
--   p_cause: why, in a few words (the attempt's retry_reason, the start of wait_reason);
--   p_error: the attempt's error text.
-- keeps: invariant 3 (the delivery is due again, or terminal by the budget and age rules, so a
--   payload that kills its worker cannot loop for ever), invariant 4 (the token is cleared: the
--   lost worker can record nothing), invariant 9 (the send that may follow has this recorded
--   reason: an ambiguous attempt).
CREATE FUNCTION media_hooks_end_leases_v1(
    p_delivery_ids text[],
    p_expired_only boolean,
    p_cause text,
    p_error text
)
RETURNS TABLE (delivery_id text, state text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH ending AS (
        SELECT d.delivery_id, d.lease_token, d.attempt_count,
               CASE
                   -- In seconds, not as an interval: no stored value can overflow the test.
                   WHEN extract(epoch FROM now() - d.budget_started_at) >= w.max_age_seconds
                       THEN 'dead: older than the maximum delivery age (' || w.max_age_seconds
                            || ' s); the last lease ended without an outcome (' || p_cause || ')'
                   WHEN d.budget_used >= w.max_attempts
                       THEN 'dead: retry budget spent (' || w.max_attempts
                            || ' attempts); the last lease ended without an outcome ('
                            || p_cause || ')'
               END AS death
        FROM webhook_delivery AS d
        JOIN webhook_destination AS w ON w.destination_id = d.destination_id
        WHERE d.delivery_id = ANY (p_delivery_ids)
          -- As one CASE (0004's reason): the state can only filter rows found by key, never
          -- send the planner to the partial index of leased rows.
          AND CASE WHEN d.state = 'leased' THEN NOT p_expired_only OR d.lease_until < now()
                   ELSE false END
        FOR UPDATE OF d SKIP LOCKED
    ),
    moved AS (
        UPDATE webhook_delivery AS d
        SET state = CASE WHEN ending.death IS NULL THEN 'pending' ELSE 'dead' END,
            next_attempt_at = now(),
            lease_until = NULL,
            lease_token = NULL,
            last_outcome = 'ambiguous',
            last_error = p_error,
            wait_reason = coalesce(ending.death, p_cause || ': due again now'),
            updated_at = now()
        FROM ending
        WHERE d.delivery_id = ending.delivery_id
        RETURNING d.delivery_id, d.state, ending.lease_token, ending.attempt_count
    ),
    closed AS (
        UPDATE delivery_attempt AS a
        SET finished_at = now(),
            outcome = 'ambiguous',
            error = p_error,
            retry_reason = p_cause
        FROM moved
        WHERE a.delivery_id = moved.delivery_id
          AND a.attempt_no = moved.attempt_count
          AND a.lease_token = moved.lease_token
          AND a.finished_at IS NULL
    )
    SELECT moved.delivery_id, moved.state FROM moved;
END;
$$;

-- The lease (0004's media_hooks_lease_v1), except that an expired lease is no longer taken over
-- directly: an offered delivery whose lease expired is first ended by media_hooks_end_leases_v1
-- (its attempt closed as ambiguous, the budget and age rules applied), exactly as the sweep
-- would end it, and then leased like any due pending delivery, in the same call. (v1 left the
-- abandoned attempt open for ever and never applied the budget rule to a re-offered message:
-- a Dagster step retry or re-execution.) The ending runs only when the lease found offered
-- deliveries it could not lease, so the common step costs what v1 cost.
-- keeps: invariant 4 (a fresh lease_token fences every later update; succeeded and dead rows are
--   never leased), invariant 3 (the attempt row records the start before any request),
--   invariant 5 (only scheduling metadata changes), invariant 9 (a second send follows a
--   recorded ambiguous attempt).
CREATE FUNCTION media_hooks_lease_v2(
    p_run_id text,
    p_delivery_ids text[],
    p_message_ids text[],
    p_lease_seconds double precision
)
RETURNS TABLE (delivery_id text, message_id text, lease_token uuid, attempt_no integer,
               budget_used integer, body bytea)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
-- As in 0004: the plans are made once per session, and must stay key lookups.
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    leased_now integer;
    leased_total integer := 0;
BEGIN
    FOR pass IN 1 .. 2 LOOP
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
                      ELSE false
                  END
            RETURNING d.delivery_id, d.destination_id, d.current_message_id AS message_id,
                      d.lease_token, d.attempt_count AS attempt_no, d.budget_used, d.body
        ),
        opened AS (
            INSERT INTO delivery_attempt
                (delivery_id, attempt_no, destination_id, message_id, run_id, lease_token)
            SELECT l.delivery_id, l.attempt_no, l.destination_id, l.message_id, p_run_id,
                   l.lease_token
            FROM leased AS l
        )
        SELECT l.delivery_id, l.message_id, l.lease_token, l.attempt_no, l.budget_used, l.body
        FROM leased AS l;
        GET DIAGNOSTICS leased_now = ROW_COUNT;
        leased_total := leased_total + leased_now;
        EXIT WHEN pass = 2 OR leased_total = cardinality(p_delivery_ids);
        -- Some were not leased: those whose lease expired end now; the second pass leases the
        -- ones that came out pending (the rest were leased already, or are stale or terminal).
        PERFORM 1 FROM media_hooks_end_leases_v1(
            p_delivery_ids, true,
            'lease expiry (taken over by run ' || p_run_id || ')',
            'lease expired before an outcome was recorded (worker lost or too slow)') AS ended
        WHERE ended.state = 'pending';
        EXIT WHEN NOT FOUND;
    END LOOP;
END;
$$;


-- 4. Permits only for what is leased ----------------------------------------------------------
--
-- Give back permits granted in this transaction and not used: the listed slots this holder
-- holds are freed and one start per freed slot leaves the bucket. Only meaningful inside the
-- transaction that granted them (the limiter row is still locked, so nothing drained or was
-- granted in between). Returns how many were refunded.
-- keeps: the start-rate and in-flight ceilings (0002): a start is counted only for a request
--   that is made.
CREATE FUNCTION media_hooks_refund_permits_v1(
    p_destination_id text,
    p_slots integer[],
    p_holder text
)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    refunded integer := media_hooks_release_permits_v1(p_destination_id, p_slots, p_holder);
BEGIN
    IF refunded > 0 THEN
        UPDATE destination_limiter l
           SET level = greatest(l.level - refunded, 0)
         WHERE l.destination_id = p_destination_id;
    END IF;
    RETURN refunded;
END;
$$;

-- The worker's step in one call: hand back finished slots, take up to one permit per offered
-- message, lease that many of the offered messages (the first ones), and refund at once the
-- permits of offered messages that were no longer theirs to send (a stale dispatch, a delivery
-- another worker took). The earlier step (sql/queries: media_hooks_acquire_permits_v1 joined to
-- media_hooks_lease_v1) kept the start token of a stale message, so the live message behind it
-- waited a whole interval of the start rate.
-- Returns one row per lease, each with its slot; or one row with empty lease columns when
-- nothing was leased. Every row carries the grant: how many offered messages were used up
-- (leased or found stale), the database time of the grant, and when and why to ask again.
-- keeps: the rate limits (no lease without a permit; no permit kept without a lease) and
--   invariants 3, 4, 5 and 9 (media_hooks_lease_v2).
CREATE FUNCTION media_hooks_lease_with_permits_v1(
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
    permit record;
    taken record;
    granted integer;
    used integer := 0;
BEGIN
    SELECT * INTO permit
      FROM media_hooks_acquire_permits_v1(
          p_destination_id, cardinality(p_delivery_ids), p_holder, p_hold_seconds,
          p_slot_poll_seconds, p_disabled_poll_seconds, p_release);
    granted := coalesce(cardinality(permit.slots), 0);
    examined := granted;
    granted_at := permit.granted_at;
    retry_in := permit.retry_in;
    reason := permit.reason;
    IF granted > 0 THEN
        FOR taken IN
            SELECT * FROM media_hooks_lease_v2(
                p_run_id, p_delivery_ids[1:granted], p_message_ids[1:granted], p_hold_seconds)
        LOOP
            used := used + 1;
            slot := permit.slots[used];
            delivery_id := taken.delivery_id;
            message_id := taken.message_id;
            lease_token := taken.lease_token;
            attempt_no := taken.attempt_no;
            budget_used := taken.budget_used;
            body := taken.body;
            RETURN NEXT;
        END LOOP;
        IF used < granted THEN
            PERFORM media_hooks_refund_permits_v1(
                p_destination_id, permit.slots[used + 1:granted], p_holder);
        END IF;
    END IF;
    IF used = 0 THEN
        RETURN NEXT;
    END IF;
END;
$$;
