-- migrate: no-transaction
-- 0008: signing secrets get a checked form, and the circuit breaker's window an index.
--
-- Applied one statement at a time outside a transaction (media_hooks.migrations), so that no
-- statement holds a lock longer than it must: the constraint is added NOT VALID (a moment's
-- ACCESS EXCLUSIVE lock, no scan) and validated by the next statement (a scan under a lock that
-- lets reads and writes through), and the index is built CONCURRENTLY. Each statement is
-- idempotent: an interrupted run starts the file again.

-- A stored signing secret is a Standard Webhooks secret as given (whsec_<base64>) or one
-- encrypted at rest under MEDIA_HOOKS_SECRET_KEY (fernet:<token>, media_hooks.secret_store).
-- Nothing else is ever stored: code that reads the list knows both forms and no third.
CREATE OR REPLACE FUNCTION media_hooks_secrets_well_formed_v1(p_secrets text[])
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(bool_and(s ~ '^(whsec_[A-Za-z0-9+/]+={0,2}|fernet:[A-Za-z0-9_-]+={0,2})$'), true)
    FROM unnest(p_secrets) AS s
$$;

DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conrelid = 'webhook_destination'::regclass AND conname = 'secrets_well_formed'
    ) THEN
        ALTER TABLE webhook_destination
            ADD CONSTRAINT secrets_well_formed CHECK (media_hooks_secrets_well_formed_v1(secrets))
            NOT VALID;
    END IF;
END
$$;

ALTER TABLE webhook_destination VALIDATE CONSTRAINT secrets_well_formed;

-- The circuit breaker (sql/queries/sweeps.sql, trip_circuit_breakers) counts each
-- destination's attempts of the last stretch (a day by default). With no index on started_at
-- alone it read the whole of delivery_attempt_destination, every run: 13 ms at two million
-- attempts and growing with the history (0.1 ms with this index).
CREATE INDEX CONCURRENTLY IF NOT EXISTS delivery_attempt_started
    ON delivery_attempt (started_at);
