-- `media-hooks db status` (media_hooks.store.database_status): facts about the server and the
-- database, read from the catalogs. Nothing is written and no state moves.

-- name: server_facts
-- description: the server's version, this database's size on disk, how many sessions other
--   than this one are open on the whole server (a fast shutdown ends them), and the two
--   settings that decide how much of the WAL is full-page images.
SELECT current_setting('server_version') AS server_version,
       current_setting('wal_compression') AS wal_compression,
       current_setting('data_checksums') AS data_checksums,
       pg_database_size(current_database())::bigint AS database_bytes,
       (SELECT count(*)
          FROM pg_stat_activity
         WHERE backend_type = 'client backend'
           AND pid <> pg_backend_pid())::integer AS other_sessions;

-- name: table_health
-- description: the database's largest tables as autovacuum sees them: size on disk (table,
--   TOAST and indexes), live rows and dead versions (estimates from the statistics), when a
--   vacuum last visited, and since the statistics were reset, how many updates there were, how
--   many were heap-only and (PostgreSQL 16 on; NULL before) how many wrote their new version on
--   another page. What grows with weeks of load, read from pg_stat_user_tables: no table is
--   scanned.
SELECT s.relname AS name,
       pg_total_relation_size(s.relid)::bigint AS total_bytes,
       pg_indexes_size(s.relid)::bigint AS index_bytes,
       s.n_live_tup::bigint AS live_rows,
       s.n_dead_tup::bigint AS dead_rows,
       greatest(s.last_vacuum, s.last_autovacuum) AS vacuumed_at,
       extract(epoch FROM now() - greatest(s.last_vacuum, s.last_autovacuum))::float8
           AS vacuumed_seconds_ago,
       s.n_tup_upd::bigint AS updates,
       s.n_tup_hot_upd::bigint AS heap_only_updates,
       (to_jsonb(s) ->> 'n_tup_newpage_upd')::bigint AS new_page_updates
FROM pg_stat_user_tables AS s
ORDER BY pg_total_relation_size(s.relid) DESC, s.relname
LIMIT %(limit)s;
