-- migrate: no-transaction
-- 0027: the outbox stops storing a second copy of each body.
--
-- Every dispatch_outbox row held its delivery's body, copied at the claim from
-- webhook_delivery.body: the same bytes (webhook_delivery's identity columns never change, a
-- trigger of 0004 refuses it; invariant 2), written again with every dispatch and read by no
-- statement (the lease reads the delivery's). Under sustained load it was about 370 bytes of
-- WAL to deliver a delivery, and the outbox's heap about 1 KB a row at fillfactor 50.
--
-- From here on dispatches are rows of dispatch_outbox_v2: the same columns but the body. The
-- table the contract names becomes a view with the same columns and meaning, over the rows
-- written before this migration (dispatch_outbox_v1, the former table, renamed, with every
-- constraint, index and privilege it had; retention empties it as their deliveries expire)
-- and the new rows, whose body is their delivery's. This release's statements write
-- dispatch_outbox_v2 and delete from both tables; everything that reads the outbox reads the
-- view, as before.
--
-- The previous release keeps running on this schema: it inserts each dispatch with its body,
-- publishes it and purges it, by the table's name. INSTEAD OF triggers on the view carry those
-- writes to the tables: an insert goes to dispatch_outbox_v2, refused if its body is not its
-- delivery's (nothing may be lost by not storing it); an update or a delete goes to whichever
-- table holds the message. None of its statements locks outbox rows FOR UPDATE or inserts ON
-- CONFLICT, which a view cannot take.
--
-- Applied one statement at a time outside a transaction, each idempotent. The new table is
-- empty: its constraints and indexes cost nothing to build (its foreign key takes a brief lock
-- on webhook_delivery that lets reads through). The swap is one statement, so no session ever
-- finds the name missing: the rename takes the table's lock for an instant, bounded by the
-- migration's lock timeout and retried, and statements planned against the table are planned
-- again against the view.
-- keeps: invariant 2 (a dispatch's body is its delivery's: read from it, never stored apart),
--   invariant 3 (every dispatch is still a committed outbox row naming its run).

CREATE TABLE IF NOT EXISTS dispatch_outbox_v2 (
    message_id     text NOT NULL,
    delivery_id    text NOT NULL,
    dispatch_no    integer NOT NULL,
    destination_id text NOT NULL,
    run_id         text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz,
    CONSTRAINT dispatch_outbox_v2_pkey PRIMARY KEY (message_id),
    CONSTRAINT dispatch_outbox_v2_one_row_per_dispatch UNIQUE (delivery_id, dispatch_no),
    CONSTRAINT dispatch_outbox_v2_delivery_id_fkey
        FOREIGN KEY (delivery_id) REFERENCES webhook_delivery (delivery_id),
    CONSTRAINT dispatch_outbox_v2_dispatch_no_check CHECK (dispatch_no >= 1)
) WITH (fillfactor = 50);

CREATE INDEX IF NOT EXISTS dispatch_outbox_v2_by_run ON dispatch_outbox_v2 (run_id);

-- The previous release's insert: the dispatch without its body, which must be its delivery's.
CREATE OR REPLACE FUNCTION media_hooks_outbox_insert_v1()
RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    delivery_body bytea;
BEGIN
    SELECT d.body INTO delivery_body
    FROM webhook_delivery AS d
    WHERE d.delivery_id = NEW.delivery_id;
    -- A missing delivery is left to the foreign key's own error.
    IF FOUND AND NEW.body IS DISTINCT FROM delivery_body THEN
        RAISE EXCEPTION 'dispatch % has a body that is not its delivery''s', NEW.message_id
            USING ERRCODE = 'check_violation',
                  HINT = 'dispatch_outbox shows each dispatch with its delivery''s body';
    END IF;
    INSERT INTO dispatch_outbox_v2
        (message_id, delivery_id, dispatch_no, destination_id, run_id, created_at, published_at)
    VALUES (NEW.message_id, NEW.delivery_id, NEW.dispatch_no, NEW.destination_id, NEW.run_id,
            coalesce(NEW.created_at, now()), NEW.published_at)
    RETURNING created_at INTO NEW.created_at;
    RETURN NEW;
END
$$;

-- The previous release's publication, in the table that holds the message. A dispatch is
-- published once: the first time is kept, also against one made meanwhile (as the publishing
-- statement keeps it on a table: publishing twice is harmless). Nothing else of a dispatch
-- changes once written.
CREATE OR REPLACE FUNCTION media_hooks_outbox_update_v1()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.message_id, NEW.delivery_id, NEW.dispatch_no, NEW.destination_id, NEW.run_id,
        NEW.body, NEW.created_at)
       IS DISTINCT FROM
       (OLD.message_id, OLD.delivery_id, OLD.dispatch_no, OLD.destination_id, OLD.run_id,
        OLD.body, OLD.created_at) THEN
        RAISE EXCEPTION 'dispatch %: only published_at changes in dispatch_outbox',
            OLD.message_id
            USING ERRCODE = 'check_violation';
    END IF;
    UPDATE dispatch_outbox_v2 AS o
    SET published_at = coalesce(o.published_at, NEW.published_at)
    WHERE o.message_id = OLD.message_id;
    IF NOT FOUND THEN
        UPDATE dispatch_outbox_v1 AS o
        SET published_at = coalesce(o.published_at, NEW.published_at)
        WHERE o.message_id = OLD.message_id;
    END IF;
    RETURN NEW;
END
$$;

-- The previous release's purge, from the table that holds the message.
CREATE OR REPLACE FUNCTION media_hooks_outbox_delete_v1()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM dispatch_outbox_v2 AS o WHERE o.message_id = OLD.message_id;
    IF NOT FOUND THEN
        DELETE FROM dispatch_outbox_v1 AS o WHERE o.message_id = OLD.message_id;
    END IF;
    RETURN OLD;
END
$$;

DO $$
DECLARE
    granted record;
    table_owner name;
BEGIN
    IF to_regclass('dispatch_outbox_v1') IS NULL THEN
        ALTER TABLE dispatch_outbox RENAME TO dispatch_outbox_v1;
        -- Each arm reads one table, the body by a subquery rather than a join: PostgreSQL then
        -- plans the view as its two tables side by side, and a join to it (by message_id, by
        -- delivery_id) probes each table's index in turn; a reader that does not ask for the
        -- body never runs the subquery.
        CREATE VIEW dispatch_outbox AS
        SELECT message_id, delivery_id, dispatch_no, destination_id, run_id, body, created_at,
               published_at
        FROM dispatch_outbox_v1
        UNION ALL
        SELECT o.message_id, o.delivery_id, o.dispatch_no, o.destination_id, o.run_id,
               (SELECT d.body FROM webhook_delivery AS d WHERE d.delivery_id = o.delivery_id),
               o.created_at, o.published_at
        FROM dispatch_outbox_v2 AS o;
        CREATE TRIGGER dispatch_outbox_insert INSTEAD OF INSERT ON dispatch_outbox
            FOR EACH ROW EXECUTE FUNCTION media_hooks_outbox_insert_v1();
        CREATE TRIGGER dispatch_outbox_update INSTEAD OF UPDATE ON dispatch_outbox
            FOR EACH ROW EXECUTE FUNCTION media_hooks_outbox_update_v1();
        CREATE TRIGGER dispatch_outbox_delete INSTEAD OF DELETE ON dispatch_outbox
            FOR EACH ROW EXECUTE FUNCTION media_hooks_outbox_delete_v1();
        -- The view and the new table belong to whoever owned the table (the migration may run
        -- as a superuser on a database that another role owns and delivers as), and whoever
        -- could read or write the table can read or write the view, and the new table
        -- its triggers write (a trigger runs with the privileges of the statement's role).
        FOR granted IN
            SELECT a.privilege_type,
                   CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                        ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS grantee
            FROM pg_class AS c, aclexplode(c.relacl) AS a
            WHERE c.oid = 'dispatch_outbox_v1'::regclass AND a.grantee <> c.relowner
        LOOP
            EXECUTE format('GRANT %s ON dispatch_outbox, dispatch_outbox_v2 TO %s',
                           granted.privilege_type, granted.grantee);
        END LOOP;
        SELECT pg_get_userbyid(c.relowner) INTO table_owner
        FROM pg_class AS c WHERE c.oid = 'dispatch_outbox_v1'::regclass;
        IF table_owner <> current_user THEN
            EXECUTE format('ALTER TABLE dispatch_outbox_v2 OWNER TO %I', table_owner);
            EXECUTE format('ALTER VIEW dispatch_outbox OWNER TO %I', table_owner);
        END IF;
    END IF;
END
$$;
