-- migrate: no-transaction
-- migrate: contract
-- 0030: three indexes that only the releases before this one read go (about 650 bytes of WAL
-- a delivery on a destination that neither orders nor coalesces, 160 on one that does).
--
-- webhook_delivery_asset_queue: every open delivery's asset queue. This release reads the
-- queues of the destinations that order or coalesce through webhook_delivery_queue (0029).
--
-- webhook_delivery_due (next_attempt_at, delivery_id) WHERE state = 'pending': every due
-- delivery of every destination in one order, read by status's oldest-due figures and by the
-- "is anything of this cohort due?" probe. This release reads them per destination through
-- webhook_delivery_due_by_destination (migration 0010), as its claims always have: one descent
-- per destination, a small table.
--
-- delivery_attempt_started (started_at): the attempts of every destination by start, read by
-- the checks' windows and status's attempts by outcome. This release reads them through
-- delivery_attempt_destination (destination_id, started_at), one range per destination.
--
-- A contract migration: `media-hooks db migrate` applies it once no session of a release
-- before it is connected (each session names its release in application_name), and this
-- release runs with it pending meanwhile. Dropped CONCURRENTLY: no lock a producer or a
-- worker waits on.
DROP INDEX CONCURRENTLY IF EXISTS webhook_delivery_asset_queue;

DROP INDEX CONCURRENTLY IF EXISTS webhook_delivery_due;

DROP INDEX CONCURRENTLY IF EXISTS delivery_attempt_started;
