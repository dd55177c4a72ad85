-- The delivery worker: lease, record. No statement here is held open across HTTP.

-- name: lease_with_permits
-- description: The worker's step, in one round trip: hand back finished permits, take up to one
--   new one per offered message from the destination's global limits (a start may be granted
--   up to ahead_seconds, at most one interval of the rate, before its moment), lease as many of
--   the offered messages as permits were granted (the first ones), and give back the permits of
--   offered messages that were no longer theirs to send. One row per lease with its slot and
--   start_at (the moment its request may start, on the database's clock); a single row with
--   empty lease columns when nothing was leased. Every row carries answered_at (the database's
--   clock as the statement ends), how many offered messages were used up (leased or found
--   stale) and when and why to ask again.
-- keeps: the rate limits (no lease without a permit, no permit kept without a lease: a stale
--   message spends no start token; a start counts from the moment it may start, and never
--   before its lease is made, however long the lease waited on a lock) and invariants 3, 4, 5
--   and 9 (media_hooks_lease_with_permits_v4, migration 0015: the limiter row written once).
SELECT *
FROM media_hooks_lease_with_permits_v4(
    %(destination_id)s, %(holder)s, %(hold_seconds)s, %(slot_poll_seconds)s,
    %(disabled_poll_seconds)s, %(ahead_seconds)s, %(release_slots)s, %(run_id)s,
    %(delivery_ids)s, %(message_ids)s);

-- name: record_classified_outcomes
-- description: Record leased attempts as the runtime classified them (docs/contract.md "Outcomes":
--   the class, the HTTP status, Retry-After as parsed, the error, whether the request was
--   started, whether the SSRF guard refused the address) and let the database decide all the
--   rest: the next state, when it is due (backoff with jitter, Retry-After capped, a bare 429's
--   pause), the retry budget and maximum age, and the destination's pause or disabling. One row
--   per outcome given: its state when its lease still held (null otherwise), and why its
--   destination was disabled when this batch disabled it (its worker then stops sending).
-- keeps: invariant 4 (only the current lease holder moves the row), invariant 5 (a retry
--   changes next_attempt_at and counts, never identity), invariant 6 (the table owns the retry
--   clock: the runtime hands over no delay) (media_hooks_record_outcomes_v1, migration 0017).
-- The fence is the token alone: a delivery holds one only while leased (constraint
-- lease_only_while_leased). Matching on the state as well would let the planner, whose
-- statistics lag a backlog that just turned leased, scan every leased row of the destination
-- for each outcome instead of looking each one up by its key. (Migration 0017 points for this
-- reason to record_outcomes, the previous release's statement, removed since.)
SELECT delivery_id, state, stopped
FROM media_hooks_record_outcomes_v2(%(outcomes)s::jsonb);

-- name: defer_deliveries
-- description: Hand dispatched deliveries that cannot be sent in this run back to pending,
--   without using retry budget (their destination is paused or disabled, or its rate limit
--   leaves no room before the run must stop). Due after the given delay on the database clock,
--   and never before the destination's pause ends (as stored: a pause is due at its end exactly).
-- keeps: invariant 3 (nothing waits invisibly in enqueued), invariant 5.
WITH deferred AS (
    UPDATE delivery_state AS d
    SET state = 'pending',
        next_attempt_at = greatest(now() + make_interval(secs => %(delay_seconds)s),
                                   w.paused_until),
        wait_reason = %(reason)s,
        updated_at = now()
    FROM unnest(%(delivery_ids)s::text[], %(message_ids)s::text[])
             AS offered(delivery_id, message_id),
         webhook_destination AS w
    WHERE d.delivery_id = offered.delivery_id
      AND d.current_message_id = offered.message_id
      AND d.state = 'enqueued'
      AND w.destination_id = d.destination_id
    RETURNING d.delivery_id, d.next_attempt_at
),
retimed AS (
    UPDATE delivery_timer AS t
    SET kind = 'due', fire_at = deferred.next_attempt_at
    FROM deferred
    WHERE t.delivery_id = deferred.delivery_id
)
SELECT delivery_id FROM deferred;
