-- Retention (media_hooks.outbox.maintenance.retention): bounded batches, each its own short transaction.

-- name: purge_terminal_batch
-- description: tombstones then deletes one batch of terminal deliveries older than the cutoff,
-- with their attempt and outbox rows (index webhook_delivery_terminal).
-- invariant: 3 (only succeeded or dead rows, never one still to be delivered), 1 and 8 (the
-- delivery_id's identity row becomes its tombstone and outlives the delivery for the duplicate
-- window; an emit of the same id, running at the same time, conflicts on that row's key
-- whichever commits first, migration 0005). A row written before 0005 by older code has no
-- identity row yet: the purge writes it.
-- The identity row every emit wrote becomes the tombstone by an update: an upsert locks the
-- row it updates first, a row lock logged for nothing (about 54 bytes a delivery). Only the ids
-- the update did not find are upserted: a row older code never wrote, and one written since
-- this statement's snapshot, which the upsert's conflict finds.
WITH victims AS (
    SELECT delivery_id, destination_id, state, created_at, dispatch_count
    FROM webhook_delivery
    WHERE state IN ('succeeded', 'dead')
      AND updated_at < %(cutoff)s
    ORDER BY updated_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
),
tombstones AS (
    UPDATE delivery_identity AS i
    SET destination_id = v.destination_id,
        created_at = v.created_at,
        final_state = v.state,
        purged_at = now()
    FROM victims AS v
    WHERE i.delivery_id = v.delivery_id
    RETURNING i.delivery_id
),
first_tombstones AS (
    INSERT INTO delivery_identity (delivery_id, destination_id, created_at, final_state, purged_at)
    SELECT v.delivery_id, v.destination_id, v.created_at, v.state, now()
    FROM victims AS v
    WHERE NOT EXISTS (SELECT 1 FROM tombstones AS t WHERE t.delivery_id = v.delivery_id)
    ON CONFLICT (delivery_id) DO UPDATE
    SET destination_id = EXCLUDED.destination_id,
        created_at = EXCLUDED.created_at,
        final_state = EXCLUDED.final_state,
        purged_at = EXCLUDED.purged_at
    RETURNING 1
),
attempts AS (
    DELETE FROM delivery_attempt a USING victims v
    WHERE a.delivery_id = v.delivery_id
    RETURNING 1
),
-- The outbox's two tables (migration 0027). In dispatch_outbox_v2 a delivery's dispatches are
-- its message ids delivery_id:1 to delivery_id:dispatch_count (the claim numbers each one in the
-- statement that counts it, and a constraint holds every id to its dispatch: migration 0032),
-- looked up by its primary key. dispatch_outbox_v1 holds the dispatches written before 0027,
-- until their deliveries expire, by its (delivery_id, dispatch_no) key, which its foreign key
-- still checks.
outbox AS (
    DELETE FROM dispatch_outbox_v2 AS o
    WHERE o.message_id = ANY (ARRAY(
        SELECT v.delivery_id || ':' || n
        FROM victims AS v, generate_series(1, v.dispatch_count) AS n))
    RETURNING 1
),
outbox_v1 AS (
    DELETE FROM dispatch_outbox_v1 o USING victims v
    WHERE o.delivery_id = v.delivery_id
    RETURNING 1
),
deliveries AS (
    DELETE FROM webhook_delivery d USING victims v
    WHERE d.delivery_id = v.delivery_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM deliveries) AS deliveries,
       (SELECT count(*) FROM outbox) + (SELECT count(*) FROM outbox_v1) AS outbox_rows,
       (SELECT count(*) FROM attempts) AS attempts,
       (SELECT count(*) FROM tombstones) + (SELECT count(*) FROM first_tombstones) AS tombstones;

-- name: expire_tombstones_batch
-- description: deletes one batch of tombstones whose event is older than the duplicate window
-- (index delivery_identity_tombstone_created): the id may be recorded again after this.
-- invariant 8, within the duplicate window: only tombstones are forgotten (final_state set),
-- never the identity of a delivery that still has its row.
WITH expired AS (
    SELECT delivery_id
    FROM delivery_identity
    WHERE final_state IS NOT NULL
      AND created_at < %(cutoff)s
    ORDER BY created_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM delivery_identity t USING expired e
WHERE t.delivery_id = e.delivery_id;

-- name: expire_events_batch
-- description: deletes one batch of events (emitted without a destination) recorded before the
-- duplicate window, as their deliveries' tombstones expire (index webhook_event_created): the
-- event id may be recorded again after this.
WITH expired AS (
    SELECT event_id
    FROM webhook_event
    WHERE created_at < %(cutoff)s
    ORDER BY created_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM webhook_event e USING expired x
WHERE e.event_id = x.event_id;

-- name: tombstone_exists
-- description: whether a delivery_id was delivered and purged within the duplicate window (by
-- delivery_identity's key: its row, then its final state).
SELECT EXISTS (
    SELECT 1 FROM delivery_identity
    WHERE delivery_id = %(delivery_id)s AND final_state IS NOT NULL
) AS present;

-- name: retention_cutoffs
-- description: the retention and duplicate-window cutoffs on the server clock.
SELECT COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(retain_seconds)s) AS purge_cutoff,
       COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(tombstone_seconds)s) AS tombstone_cutoff;
