-- migrate: no-transaction
-- 0022: an outbox row's one update (its publication) is a heap-only (HOT) update.
--
-- Every dispatch writes its outbox row twice: inserted by the claim, then published by the
-- relay (sql/queries/leases.sql: publish_messages sets published_at). PostgreSQL makes an
-- update heap-only, writing no index entry, when no index names a column it changes and the
-- row's page has room for the new version. dispatch_outbox_unpublished named published_at in
-- its predicate, so every publication wrote a whole new row version and an entry in each of
-- the table's four indexes, and a claim's page of rows filled its heap pages with no room to
-- spare: measured with bench/hot_path_prototype.py on 10,000 deliveries, 1,937 bytes of WAL
-- per delivery for the outbox, none of its updates HOT. With no index on published_at and
-- half of each page left free for the publication, every update was HOT and the outbox wrote
-- 990 bytes (docs/design/hot-path.md).
--
-- The index had no reader left: the relay-lag figure walks webhook_delivery_enqueued to each
-- delivery's current message by primary key (sql/queries/figures.sql). The space left free
-- is what today's dead versions took anyway; here a page prunes them without waiting for
-- VACUUM.
--
-- The attempt row's one update (its ending) stays a plain update: delivery_attempt_finished
-- names finished_at, and the checks find open attempts by its NULLs. A BRIN index instead
-- (PostgreSQL 16 and later let a summarizing index's column change in a HOT update) was
-- measured and set aside: a range of pages summarized while an attempt in it was still open
-- keeps "has NULLs" for good, so the open-attempt checks would read a growing share of the
-- history. The design's write-once attempt rows are the way there (docs/design/hot-path.md).
--
-- Applied one statement at a time outside a transaction: the storage parameter takes a lock
-- that lets reads and writes through and applies to pages filled from now on; the index goes
-- CONCURRENTLY. Both are idempotent. Workers of the previous release run unchanged: no
-- statement of theirs reads the index.

ALTER TABLE dispatch_outbox SET (fillfactor = 50);

DROP INDEX CONCURRENTLY IF EXISTS dispatch_outbox_unpublished;
