-- Who is connected (media_hooks.store.sessions): read from pg_stat_activity, which is in memory
-- (no table is read). Nothing is written.

-- name: sessions_by_name
-- description: the other sessions of media_hooks connected to this database, by the name each
--   gives itself (media_hooks:<role>:g<generation>): which releases are connected, in which
--   roles. application_name is shown for every role's sessions, without pg_read_all_stats.
SELECT a.application_name, count(*)::integer AS n
FROM pg_stat_activity AS a
WHERE a.datname = current_database()
  AND a.pid <> pg_backend_pid()
  AND starts_with(a.application_name, 'media_hooks:')
GROUP BY a.application_name
ORDER BY a.application_name;
