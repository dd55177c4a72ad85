-- migrate: no-transaction
-- 0025: one index fewer written at every state move of a delivery.
--
-- webhook_delivery_destination_state (destination_id, state) named the state, which every
-- move changes, and had no predicate: each move of each delivery (claim, lease, record: three
-- or more) wrote an entry in it, for one reader, the operator's counts of deliveries by
-- destination and state (`status`, the asset page, the metrics). Those counts now read each
-- open state through the partial index its own statements use (figures_open_counts_by_state)
-- and the succeeded deliveries through webhook_delivery_succeeded_by_destination, which only
-- the success move writes, once per delivery.
--
-- Applied one statement at a time outside a transaction, the new index first: both are built
-- and dropped CONCURRENTLY, idempotent, and no statement of the previous release needs the old
-- index to be correct (its `status` counts by a sequential scan instead).

CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_delivery_succeeded_by_destination
    ON webhook_delivery (destination_id) WHERE state = 'succeeded';

DROP INDEX CONCURRENTLY IF EXISTS webhook_delivery_destination_state;
