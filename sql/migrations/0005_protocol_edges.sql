-- 0005: the edges of the state machine (issue 9).
--
-- 1. One identity per delivery_id, outliving its payload (invariants 1 and 8).
-- 2. The request body's timestamp stamped from the database clock (the stored times the protocol
--    compares all come from one clock).
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

-- Tombstone expiry, oldest events first (only tombstones are indexed: emit does not pay).
CREATE INDEX delivery_identity_tombstone_created ON delivery_identity (created_at)
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
