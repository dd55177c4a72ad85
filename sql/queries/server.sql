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
