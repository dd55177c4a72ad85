-- migrate: no-transaction
-- 0010: each destination's due deliveries, oldest first, by an index of their own.
--
-- A delivery run claims a bounded page per destination, round-robin (sql/queries/claims.sql:
-- claim_destination_page): no destination waits behind another's backlog. This index gives
-- that claim, and the probe for destinations with due work (due_destinations), a plan with no
-- sort and no scan of other destinations' rows, whatever the planner's statistics say (a
-- freshly loaded table that ANALYZE has not seen yet is the case that matters).
--
-- Built CONCURRENTLY, one statement outside a transaction (media_hooks.migrations): producers
-- keep writing while it builds. Idempotent: an interrupted run starts the file again.

CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_delivery_due_by_destination
    ON webhook_delivery (destination_id, next_attempt_at, delivery_id)
    WHERE state = 'pending';
