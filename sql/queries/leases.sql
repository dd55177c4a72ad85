-- The delivery worker: relay, lease, record. No statement here is held open across HTTP.

-- name: publish_messages
-- description: The relay: messages a worker claimed (claim_destination_page), marked published
--   as they are handed to the sender, by primary key. Publishing twice is harmless: the first
--   publication time is kept and the lease decides who may send.
UPDATE dispatch_outbox AS o
SET published_at = coalesce(o.published_at, now())
WHERE o.message_id = ANY (%(message_ids)s::text[]);

-- name: lease_deliveries
-- description: Lease published messages for one attempt each, only while the message is the
--   delivery's current dispatch, and open their attempt rows before any request is sent; an
--   offered delivery whose lease expired is ended first, as the sweep ends it.
-- keeps: invariants 3, 4, 5 and 9 (media_hooks_lease_v2, migration 0005).
SELECT *
FROM media_hooks_lease_v2(%(run_id)s, %(delivery_ids)s, %(message_ids)s, %(lease_seconds)s);

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

-- name: record_outcomes
-- description: Record the outcomes of leased attempts and move each delivery to its next state
--   (docs/contract.md "Outcomes"), closing the attempt rows in the same statement. The previous
--   release's recording, where the runtime chose the delay: this release's workers use
--   record_classified_outcomes; kept while tests and figures set states with it.
-- keeps: invariant 4 (only the current lease holder moves the row: a late worker whose lease
--   expired and was re-claimed matches nothing), invariant 5 (a retry changes next_attempt_at
--   and counts, never identity), invariant 6 (the table owns the retry clock).
-- The fence is the token alone: a delivery holds one only while leased (constraint
-- lease_only_while_leased). Matching on the state as well would let the planner, whose
-- statistics lag a backlog that just turned leased, scan every leased row of the destination
-- for each outcome instead of looking each one up by its key.
-- An outcome marked spare (a configuration fault: nothing was sent, the destination is being
-- disabled) is recorded but does not count: it gives its unit of retry budget back and the
-- budget and age rules do not apply to it; the delivery waits, pending, for its destination.
-- Every stored time is the database's: the due time is now() plus the delay, and the attempt's
-- finish is now() less how long ago the worker saw it finish (finished_ago, measured on the
-- worker's monotonic clock), so an application host's wall clock is never stored.
WITH result AS (
    SELECT *
    FROM jsonb_to_recordset(%(outcomes)s::jsonb)
         AS r(delivery_id text, lease_token uuid, outcome text, http_status integer, error text,
              excerpt text, delay double precision, delay_reason text,
              finished_ago double precision, spare boolean)
),
decided AS (
    SELECT r.*,
           d.attempt_count AS attempt_no,
           CASE
               WHEN r.outcome = 'success' THEN 'succeeded'
               WHEN r.outcome = 'rejected' THEN 'dead'
               WHEN r.spare THEN 'pending'
               WHEN extract(epoch FROM now() - d.budget_started_at) >= w.max_age_seconds THEN 'dead'
               WHEN r.outcome <> 'rate_limited' AND d.budget_used >= w.max_attempts THEN 'dead'
               ELSE 'pending'
           END AS next_state,
           CASE
               WHEN r.outcome IN ('success', 'rejected') THEN NULL
               WHEN r.spare THEN r.delay_reason
               WHEN extract(epoch FROM now() - d.budget_started_at) >= w.max_age_seconds
                   THEN 'dead: older than the maximum delivery age (' || w.max_age_seconds || ' s)'
               WHEN r.outcome <> 'rate_limited' AND d.budget_used >= w.max_attempts
                   THEN 'dead: retry budget spent (' || w.max_attempts || ' attempts)'
               ELSE r.delay_reason
           END AS reason
    FROM result AS r
    JOIN webhook_delivery AS d
      ON d.delivery_id = r.delivery_id AND d.lease_token = r.lease_token
    JOIN webhook_destination AS w ON w.destination_id = d.destination_id
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
    RETURNING d.delivery_id, d.state, d.next_attempt_at, decided.attempt_no, decided.outcome,
              decided.http_status, decided.error, decided.excerpt, decided.reason,
              decided.finished_ago
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
)
SELECT delivery_id, state
FROM moved;

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
SELECT delivery_id, state, stopped
FROM media_hooks_record_outcomes_v1(%(outcomes)s::jsonb);

-- name: defer_deliveries
-- description: Hand dispatched deliveries that cannot be sent in this run back to pending,
--   without using retry budget (their destination is paused or disabled, or its rate limit
--   leaves no room before the run must stop). Due after the given delay on the database clock,
--   and never before the destination's pause ends (as stored: a pause is due at its end exactly).
-- keeps: invariant 3 (nothing waits invisibly in enqueued), invariant 5.
UPDATE webhook_delivery AS d
SET state = 'pending',
    next_attempt_at = greatest(now() + make_interval(secs => %(delay_seconds)s), w.paused_until),
    wait_reason = %(reason)s,
    updated_at = now()
FROM unnest(%(delivery_ids)s::text[], %(message_ids)s::text[]) AS offered(delivery_id, message_id),
     webhook_destination AS w
WHERE d.delivery_id = offered.delivery_id
  AND d.current_message_id = offered.message_id
  AND d.state = 'enqueued'
  AND w.destination_id = d.destination_id
RETURNING d.delivery_id;
