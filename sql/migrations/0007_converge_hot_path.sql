-- 0007: a database that applied an earlier version of 0004 gets what its last version defines.
--
-- 0004 was edited after databases had applied it (sql/migrations/manifest.toml accepts the two
-- earlier checksums). Between its versions only comments changed, and one setting of the lease
-- function: its plan, made once per session, possibly while the table is still empty, must stay
-- a primary-key lookup as the table grows to millions of rows, so sequential scans are ruled out
-- inside it. Setting exactly that (rather than re-creating the function) cannot undo anything a
-- later migration changes; on a database that applied the last version of 0004 it changes
-- nothing.
-- keeps: invariants 3, 4 and 5 as 0001 and 0004 state them (the function's body is untouched).
ALTER FUNCTION media_hooks_lease_v1(text, text[], text[], double precision)
    SET enable_seqscan = off;
