-- migrate: no-transaction
-- 0028: tombstones found by the identity's primary key; one index fewer on the table that
-- keeps every id for the whole duplicate window.
--
-- delivery_identity_tombstone (delivery_id) WHERE final_state IS NOT NULL repeated the primary
-- key's entry for every tombstone. Every statement that reads it, of this release and the
-- previous one, looks a tombstone up by its delivery_id (the bulk emit's "already delivered
-- and purged", tombstone_exists, the check of a tombstone beside a live delivery), which the
-- primary key answers with the same one probe, the final_state test on the row it finds. The
-- identity table is the one whose rows live for the duplicate window (400 days by default), so
-- this index was about a quarter of its disk (74 of 310 MB a million tombstones), and every
-- purge wrote an entry in it (76 bytes of WAL a delivery).
--
-- Dropped CONCURRENTLY, outside a transaction: no lock that a producer or the purge waits on.

DROP INDEX CONCURRENTLY IF EXISTS delivery_identity_tombstone;
