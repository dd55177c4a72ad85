-- 0021: per-asset order holds when ordering is turned on while deliveries are in flight.
--
-- A worker claimed revisions 1 and 2 of an asset on a destination that did not order;
-- revision 1's attempt ended retryable (pending again); the operator turned ordering on; the
-- worker then leased revision 2, already claimed, and sent it before revision 1: the claim
-- applies the rule of an ordered destination (media_hooks_held_by_v2), the lease did not. Found
-- by the model-based test of the row protocol (docs/protocol-model.md); the sequence is kept as
-- media_hooks_tests/outbox/test_ordering.py::
-- test_ordering_turned_on_with_a_later_delivery_in_flight.
--
-- Two changes. The lease (media_hooks_lease_v2, which media_hooks_lease_with_permits_v4 calls)
-- applies the claim's ordering rule too: an offered delivery held behind an earlier open one of
-- its asset is not leased but handed back pending and parked, as the emit statements park a
-- held delivery (media_hooks_parking_v2); its permit is given back by the caller as for any
-- offer not leased. And a request already sent when ordering is turned on cannot be recalled:
-- webhook_destination.ordered_since records when ordering began (set by
-- destination_update_given when ordering changes to 'asset', after destination_fence_leases
-- took the limiter row every lease with permits locks first), so check_sent_out_of_order does
-- not count a dispatch made, or an attempt started, before it.
--
-- A nullable column with no default: added without rewriting the table; code of the previous
-- release never reads it. The function keeps its signature and its rows: workers of the
-- previous release call it unchanged.

ALTER TABLE webhook_destination ADD COLUMN IF NOT EXISTS ordered_since timestamptz;

-- 0005's lease, except that an offered delivery of a destination that orders by asset is leased
-- only if it heads its asset's queue (media_hooks_held_by_v2 returns no row for it, the
-- claim's rule, coalescing aside: a claimed delivery is closed by the sweep, not refused here).
-- A held one that was still the offer's to send (its current dispatch, enqueued, or pending and
-- due) is handed back: pending, parked until it heads its queue, its budget untouched, as
-- defer_deliveries hands back what a run cannot send. The trigger
-- webhook_delivery_release_queue_head (0011) or sweep_wake_parked_heads (0013) makes it due
-- again, as for a delivery born held. The hand-back runs only when some offer was not leased:
-- the common step adds only the rule's index look-up, and only on an ordered destination.
-- keeps: invariant 10 (no delivery of an ordered destination is sent while an earlier one of
--   its asset is not terminal, whenever ordering was turned on), invariant 3 (a refused offer
--   is pending, due again once it heads its queue: never left enqueued), invariant 4 (a fresh
--   lease_token fences every later update; succeeded and dead rows are never leased),
--   invariant 5 (only scheduling metadata changes), invariant 9 (a second send follows a
--   recorded ambiguous attempt).
CREATE OR REPLACE FUNCTION media_hooks_lease_v2(
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
            FROM wanted, webhook_destination AS w
            WHERE d.delivery_id = wanted.delivery_id
              AND d.current_message_id = wanted.message_id
              AND CASE d.state
                      WHEN 'enqueued' THEN true
                      WHEN 'pending' THEN d.next_attempt_at <= now()
                      ELSE false
                  END
              AND w.destination_id = d.destination_id
              AND NOT EXISTS (
                  SELECT FROM media_hooks_held_by_v2(w.ordering, 'none', d.destination_id,
                                                     d.asset_id, d.event_type, d.created_at,
                                                     d.emit_seq, d.delivery_id))
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
        EXIT WHEN leased_total = cardinality(p_delivery_ids);
        -- Held offers are handed back parked (after each pass: the second leases deliveries
        -- whose expired lease just ended, which may be held as well).
        UPDATE webhook_delivery AS d
        SET state = 'pending',
            next_attempt_at = parked.next_attempt_at,
            wait_reason = parked.wait_reason,
            updated_at = now()
        FROM unnest(p_delivery_ids, p_message_ids) AS wanted(delivery_id, message_id),
             webhook_destination AS w,
             media_hooks_parking_v2(true, now()) AS parked
        WHERE d.delivery_id = wanted.delivery_id
          AND d.current_message_id = wanted.message_id
          AND CASE d.state
                  WHEN 'enqueued' THEN true
                  WHEN 'pending' THEN d.next_attempt_at <= now()
                  ELSE false
              END
          AND w.destination_id = d.destination_id
          AND w.ordering = 'asset'
          AND EXISTS (
              SELECT FROM media_hooks_held_by_v2(w.ordering, 'none', d.destination_id,
                                                 d.asset_id, d.event_type, d.created_at,
                                                 d.emit_seq, d.delivery_id));
        EXIT WHEN pass = 2;
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
