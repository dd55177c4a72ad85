-- 0018: one destination may be allowed to reach addresses that are not globally reachable
-- (issue 35: a first webhook to a receiver on this machine).
--
-- The SSRF guard refuses loopback, private and link-local addresses for every destination
-- unless the deployment sets MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1 in every process that adds or
-- sends: a trial receiver on 127.0.0.1 then depends on each process's environment (the CLI,
-- the daemon's runs, a launched run), and a run whose environment lacks the setting disables
-- the destination. allow_private_url records the choice on the destination it concerns, made
-- explicitly by `media-hooks destination add ID ... --allow-private-url`: every process reads
-- it with the destination, and every other destination stays guarded.
--
-- A constant default: the column is added without rewriting the table, and code of the
-- previous release, which never reads it, sends as before.

ALTER TABLE webhook_destination
    ADD COLUMN IF NOT EXISTS allow_private_url boolean NOT NULL DEFAULT false;
