-- The recovery of dead delivery runs (media_hooks/orchestration/recovery.py) runs one at a time:
-- a session advisory lock, reentrant on one connection, released with the session.

-- name: recovery_lock
-- description: Wait for the recovery lock (a release of one run).
SELECT pg_advisory_lock(hashtext('media_hooks.recovery'));

-- name: recovery_try_lock
-- description: Take the recovery lock if it is free (a recovery pass; one under way elsewhere
--   makes this one a no-op).
SELECT pg_try_advisory_lock(hashtext('media_hooks.recovery')) AS got;

-- name: recovery_unlock
-- description: Give the recovery lock back.
SELECT pg_advisory_unlock(hashtext('media_hooks.recovery'));
