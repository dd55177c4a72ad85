-- `media-hooks db status` (media_hooks.store.database_status): facts about the server and the
-- database, read from the catalogs. Nothing is written and no state moves.

-- name: server_facts
-- description: the server's version, this database's size on disk, and how many sessions
--   other than this one are open on the whole server (a fast shutdown ends them).
SELECT current_setting('server_version') AS server_version,
       pg_database_size(current_database())::bigint AS database_bytes,
       (SELECT count(*)
          FROM pg_stat_activity
         WHERE backend_type = 'client backend'
           AND pid <> pg_backend_pid())::integer AS other_sessions;
