-- migrate: no-transaction
-- 0026: a run's rows found by the run alone; one index less on every attempt.
--
-- dispatch_outbox_run (run_id, destination_id, message_id) took an entry per dispatch unique
-- in all three columns, so PostgreSQL could not deduplicate it: under sustained load it was
-- twice the size of the outbox's primary key (50 MiB at 500,000 deliveries) and about 140
-- bytes of WAL per delivery. Every statement that reads it, of this release and the previous
-- one, asks by run_id alone (run_dispatched, release_run, the operator's query in a run's
-- metadata), so dispatch_outbox_by_run keeps only run_id: a run's thousands of entries share
-- one key, which a B-tree stores once with the list of their rows.
--
-- delivery_attempt_run (run_id) was read by no statement of any release: the operator's query
-- for a run's attempts now goes from the run's dispatches (dispatch_outbox_by_run) to their
-- attempts by delivery_attempt's primary key.
--
-- Applied one statement at a time outside a transaction, the new index first: built and
-- dropped CONCURRENTLY, idempotent, and the previous release's statements find the same
-- leading column in the new index.

CREATE INDEX CONCURRENTLY IF NOT EXISTS dispatch_outbox_by_run ON dispatch_outbox (run_id);

DROP INDEX CONCURRENTLY IF EXISTS dispatch_outbox_run;

DROP INDEX CONCURRENTLY IF EXISTS delivery_attempt_run;
