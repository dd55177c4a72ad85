-- migrate: no-transaction
-- 0012: the checks and the index of 0011's columns, without stopping producers.
--
-- Applied one statement at a time outside a transaction (as 0008): each constraint is added NOT
-- VALID (a moment's lock, no scan) and validated by the next statement (a scan under a lock
-- that lets reads and writes through); the index is built CONCURRENTLY. Every statement is
-- idempotent: an interrupted run starts the file again.

-- The two per-destination scopes: 'none' (the default) or 'asset'.
CREATE OR REPLACE FUNCTION media_hooks_scope_ok_v1(p_scope text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_scope IN ('none', 'asset')
$$;

DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conrelid = 'webhook_destination'::regclass AND conname = 'destination_scopes'
    ) THEN
        ALTER TABLE webhook_destination
            ADD CONSTRAINT destination_scopes
            CHECK (media_hooks_scope_ok_v1(ordering) AND media_hooks_scope_ok_v1(coalescing))
            NOT VALID;
    END IF;
END
$$;

ALTER TABLE webhook_destination VALIDATE CONSTRAINT destination_scopes;

-- Only a dead delivery is closed, for one of two reasons; a superseded one names its successor.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conrelid = 'webhook_delivery'::regclass AND conname = 'closed_only_when_dead'
    ) THEN
        ALTER TABLE webhook_delivery
            ADD CONSTRAINT closed_only_when_dead
            CHECK ((closed_reason IS NULL AND closed_by IS NULL)
                   OR (state = 'dead' AND closed_reason = 'discarded' AND closed_by IS NULL)
                   OR (state = 'dead' AND closed_reason = 'superseded' AND closed_by IS NOT NULL))
            NOT VALID;
    END IF;
END
$$;

ALTER TABLE webhook_delivery VALIDATE CONSTRAINT closed_only_when_dead;

-- Each (destination, asset) queue of open deliveries, in emission order: what
-- media_hooks_may_claim_v1 reads to find a queue's head (ordering) or a newer delivery of the
-- same type (coalescing). Open: not succeeded and not closed; a dead delivery that was not
-- closed stays in its queue, holding its successors on an ordered destination.
CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_delivery_asset_queue
    ON webhook_delivery (destination_id, asset_id, created_at, emit_seq)
    INCLUDE (event_type)
    WHERE state <> 'succeeded' AND closed_reason IS NULL;
