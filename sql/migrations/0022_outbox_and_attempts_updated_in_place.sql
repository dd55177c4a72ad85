-- migrate: no-transaction
-- 0022: the one update of an outbox row (its publication) and of an attempt row (its ending)
-- are heap-only (HOT) updates.
--
-- Every dispatch writes its outbox row twice (inserted by the claim, published by the relay:
-- sql/queries/leases.sql, publish_messages) and every attempt its attempt row twice (opened by
-- the lease, ended by the record). PostgreSQL makes an update heap-only, writing no new index
-- entry, when no index names a column the update changes and the row's page has room for the
-- new version. dispatch_outbox_unpublished named published_at in its predicate, and
-- delivery_attempt_finished (a B-tree) named finished_at and outcome, so each of those updates
-- wrote a whole new row version and an entry in every index of its table. Measured with
-- bench/hot_path_prototype.py (10,000 deliveries, PostgreSQL 18): the outbox wrote 1,937 bytes
-- of WAL per delivery and the attempts 1,140, none of their updates HOT; with this migration
-- 989 and 624, all of them HOT (docs/design/hot-path.md).
--
-- - dispatch_outbox_unpublished had no reader left: the relay-lag figure walks
--   webhook_delivery_enqueued to each delivery's current message by primary key.
-- - delivery_attempt_finished's readers (the figures' attempts by outcome, the checks of open
--   attempts and of successes in a window) read delivery_attempt_finished_brin instead: a BRIN
--   index, which keeps a summary per range of pages (the attempts' finish times follow the
--   order they were written in). PostgreSQL 16 and later count it as a summarizing index,
--   which does not stop an update being HOT; on PostgreSQL 15 the ending stays a plain update,
--   as before this migration.
-- - Half of each outbox and attempt page is left free for the update's new version
--   (fillfactor, for pages filled from now on): every row of a page is updated once, soon
--   after it is written, often before the page can prune the versions that other sessions'
--   updates left (at 70%, under the sustained benchmark's concurrency, half of the attempts'
--   endings found no room and were not HOT). That room is what the dead versions took before;
--   now a page prunes them without waiting for VACUUM.
--
-- Applied one statement at a time outside a transaction: the storage parameters take a lock
-- that lets reads and writes through, the new index is built and the old ones dropped
-- CONCURRENTLY; each statement is idempotent. Workers of the previous release run unchanged
-- (media_hooks_tests/store/test_online_upgrade.py): none of their statements names an index.

ALTER TABLE dispatch_outbox SET (fillfactor = 50);

ALTER TABLE delivery_attempt SET (fillfactor = 50);

CREATE INDEX CONCURRENTLY IF NOT EXISTS delivery_attempt_finished_brin
    ON delivery_attempt USING brin (finished_at) WITH (pages_per_range = 32, autosummarize = on);

DROP INDEX CONCURRENTLY IF EXISTS delivery_attempt_finished;

DROP INDEX CONCURRENTLY IF EXISTS dispatch_outbox_unpublished;
