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
    FROM webhook_delivery_v1
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
    DELETE FROM delivery_attempt_v1 a USING victims v
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
    DELETE FROM webhook_delivery_v1 d USING victims v
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
    SELECT 1 FROM delivery_identity AS i
    WHERE i.delivery_id = %(delivery_id)s
      AND (i.final_state IS NOT NULL
           OR NOT EXISTS (SELECT 1 FROM webhook_delivery_all AS d
                          WHERE d.delivery_id = i.delivery_id))
) AS present;

-- name: retention_cutoffs
-- description: the retention and duplicate-window cutoffs on the server clock.
SELECT COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(retain_seconds)s) AS purge_cutoff,
       COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(tombstone_seconds)s) AS tombstone_cutoff;

-- name: partitions_make
-- description: the partitions of the history tables up to the horizon, each starting where the
--   last one ended (media_hooks_make_partitions_v1, as the tables' owner): emits need their
--   creation time's partition of delivery_body. The horizon is ahead_seconds, or ahead_ranges
--   partitions where that is nearer: a week of partitions seconds wide would be hundreds of
--   thousands of tables.
SELECT media_hooks_make_partitions_v1(
           now() + least(make_interval(secs => %(ahead_seconds)s),
                         make_interval(secs => %(ahead_ranges)s * p.width_seconds)))
    AS made
FROM media_hooks_partitioning AS p;

-- name: partitions_ahead
-- description: how far ahead of now partitions are made (the least of the four tables'), in
--   seconds: an emit after that would find no partition for its body.
SELECT extract(epoch FROM min(upper_at) - now())::double precision AS ahead_seconds
FROM (
    SELECT parent, max(upper_at) AS upper_at
    FROM media_hooks_partition
    GROUP BY parent
) AS last;

-- name: partitions_expired
-- description: the ranges retention is done with in time, oldest first: ended before now on the
--   server's clock (nothing can be recorded in them any more) and before the retention cutoff;
--   each with whether one of its deliveries ended after the cutoff (a requeued one that ended
--   late keeps its range). What is open in it is partitions_open_in_range's to say.
SELECT r.lower_at, r.upper_at, r.parents, r.children,
       EXISTS (SELECT 1 FROM delivery_history AS h
               WHERE h.created_at >= r.lower_at AND h.created_at < r.upper_at
                 AND h.finished_at >= %(cutoff)s) AS ended_late
FROM (
    SELECT lower_at, upper_at,
           array_agg(parent ORDER BY parent) AS parents,
           array_agg(child ORDER BY parent) AS children
    FROM media_hooks_partition
    WHERE upper_at <= now() AND upper_at <= %(cutoff)s
    GROUP BY lower_at, upper_at
    ORDER BY lower_at
    LIMIT %(limit)s
) AS r
ORDER BY r.lower_at;

-- name: partitions_open_in_range
-- description: the deliveries created in the range that are open (delivery_state_created), or
--   that the previous layout holds and may still bring into it: the sweeps move a pending one
--   in under its creation time, and a requeue makes a dead one pending (one arm per partial
--   index of webhook_delivery_v1, read as a BitmapOr). Any of them holds the range; the
--   destination of the oldest says where to look.
-- invariant 3: a range with an open delivery, or one that may become open in it, is not dropped.
SELECT count(*)::integer AS open,
       (array_agg(o.destination_id ORDER BY o.created_at))[1] AS oldest_destination_id
FROM (
    SELECT s.destination_id, s.created_at
    FROM delivery_state AS s
    WHERE s.created_at >= %(lower_at)s AND s.created_at < %(upper_at)s
    UNION ALL
    SELECT d.destination_id, d.created_at
    FROM webhook_delivery_v1 AS d
    WHERE (d.state = 'pending' OR d.state = 'enqueued' OR d.state = 'leased'
           OR d.state = 'dead')
      AND d.closed_reason IS NULL
      AND d.created_at >= %(lower_at)s AND d.created_at < %(upper_at)s
) AS o;

-- name: partitions_attachment
-- description: whether a partition is attached to its table, detached, or left half detached
--   (a DETACH ... CONCURRENTLY interrupted while it waited: FINALIZE completes it).
SELECT CASE WHEN i.inhrelid IS NULL THEN 'detached'
            WHEN i.inhdetachpending THEN 'pending'
            ELSE 'attached' END AS attachment
FROM (SELECT to_regclass(%(child)s) AS rel) AS c
LEFT JOIN pg_inherits AS i ON i.inhrelid = c.rel;

-- name: partitions_forget
-- description: the range's partitions are dropped: they leave the ledger.
-- keeps: invariant 3 (only in the transaction that drops the partitions of a range that
--   partitions_open_in_range found nothing open in, detached) and 8 (the identity rows of its
--   deliveries stay: the duplicate window outlives the range).
DELETE FROM media_hooks_partition
WHERE lower_at = %(lower_at)s AND upper_at = %(upper_at)s;

-- name: expire_identities_batch
-- description: forgets one batch of this layout's delivery ids recorded before the duplicate
--   window (delivery_identity_created) whose delivery is gone: neither open nor in history in
--   either layout. The id may be recorded again after this. An id whose delivery is still kept
--   (a range an open delivery holds) is passed over, not counted in the batch: it would
--   otherwise end every pass at the oldest held range and keep every later id for good.
-- keeps: invariant 8, within the duplicate window: only an id whose creation is older than the
--   window and whose delivery no table holds any more is forgotten.
WITH expired AS (
    SELECT i.delivery_id
    FROM delivery_identity AS i
    WHERE i.created_at < %(cutoff)s
      AND i.final_state IS NULL
      AND NOT EXISTS (SELECT 1 FROM delivery_state AS s WHERE s.delivery_id = i.delivery_id)
      AND NOT EXISTS (SELECT 1 FROM delivery_history AS h
                      WHERE h.delivery_id = i.delivery_id AND h.created_at = i.created_at)
      AND NOT EXISTS (SELECT 1 FROM webhook_delivery_v1 AS d WHERE d.delivery_id = i.delivery_id)
    ORDER BY i.created_at
    LIMIT %(batch_size)s
    FOR UPDATE OF i SKIP LOCKED
)
DELETE FROM delivery_identity AS i
USING expired AS e
WHERE i.delivery_id = e.delivery_id;
