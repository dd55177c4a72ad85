-- migrate: no-transaction
-- migrate: contract
-- 0032: a dispatch is found by its message id alone; the outbox's second key and its foreign
-- key go (about 110 bytes of WAL a delivery, and an index as large as the outbox's primary key).
--
-- dispatch_outbox_v2_one_row_per_dispatch (delivery_id, dispatch_no) took an entry at every
-- claim. Its readers: the foreign key's check when a delivery is purged (a look-up of the
-- delivery's dispatches by delivery_id), the previous release's purge and its inspection. A
-- delivery's dispatches are exactly its message ids delivery_id:1 to delivery_id:dispatch_count
-- (the claim numbers each one and writes it in the statement that counts it), so this
-- release's purge and inspection read them by the primary key, and with them the foreign key
-- goes, whose check needed the second key: dispatches are written only by the claim, from the
-- delivery's own row in the same statement, and deleted only with their delivery.
--
-- What the second key also said, one row per (delivery_id, dispatch_no), the primary key says
-- once the message id is the delivery's id and the dispatch's number: the constraint below
-- (delivery ids may hold ':', but the number after the last one is the dispatch's, so two
-- dispatches cannot share an id). Every release writes message ids that way.
--
-- keeps: invariant 3 (one outbox row per dispatch, which the lease finds by its message id).
--
-- A contract migration: `media-hooks db migrate` applies it once no session of a release before
-- it is connected (the previous release's purge reads the second key). Applied one statement at a
-- time outside a transaction, each idempotent: the constraint is added NOT VALID (an instant's
-- lock), validated without blocking writers, and only then do the keys go, each an instant's
-- exclusive lock on the outbox (and, for the foreign key, on webhook_delivery), bounded by the
-- lock timeout and retried.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conrelid = 'dispatch_outbox_v2'::regclass
          AND conname = 'dispatch_outbox_v2_message_id_names_dispatch'
    ) THEN
        ALTER TABLE dispatch_outbox_v2
            ADD CONSTRAINT dispatch_outbox_v2_message_id_names_dispatch
            CHECK (message_id = delivery_id || ':' || dispatch_no::text) NOT VALID;
    END IF;
END
$$;

ALTER TABLE dispatch_outbox_v2 VALIDATE CONSTRAINT dispatch_outbox_v2_message_id_names_dispatch;

ALTER TABLE dispatch_outbox_v2 DROP CONSTRAINT IF EXISTS dispatch_outbox_v2_delivery_id_fkey;

ALTER TABLE dispatch_outbox_v2 DROP CONSTRAINT IF EXISTS dispatch_outbox_v2_one_row_per_dispatch;
