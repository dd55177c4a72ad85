-- migrate: no-transaction
-- 0023: an attempt row's one update (its ending) is a heap-only (HOT) update.
--
-- Every attempt writes its row twice: inserted open by the lease, then ended by the record or
-- by a sweep (finished_at, outcome, http_status, error, ...). delivery_attempt_finished named
-- finished_at and outcome, so every ending wrote a whole new row version and an entry in each
-- of the table's five indexes. With no index on a column the ending changes and half of each
-- page left free for the new version, every ending is heap-only: measured with
-- bench/hot_path_prototype.py on 10,000 deliveries (PostgreSQL 15.20), the WAL to deliver a
-- delivery went from 4,989 to 4,449 bytes (docs/design/hot-path.md, 6.2).
--
-- The index's readers now read by start time, which no ending changes (sql/queries/checks.sql,
-- figures.sql): the open-attempt checks start from the leased deliveries or from the attempts
-- started in the check's window, the outcome figures from the attempts started since an hour
-- before their day.
-- (A BRIN index on finished_at was measured first and set aside: it is HOT-compatible on
-- PostgreSQL 16 and later only, and a range summarized while one of its attempts was open
-- keeps "has NULLs" for good.)
--
-- Applied one statement at a time outside a transaction: the storage parameter takes a lock
-- that lets reads and writes through and applies to pages filled from now on; the index goes
-- CONCURRENTLY. Both are idempotent. Workers of the previous release run unchanged: none of
-- their hot-path statements reads the index (their `check` and `status`, where they still
-- run, read the attempts' history whole instead, correctly and more slowly).

ALTER TABLE delivery_attempt SET (fillfactor = 50);

DROP INDEX CONCURRENTLY IF EXISTS delivery_attempt_finished;
