-- Emit (media_hooks.outbox.emit): the producer records deliveries, one or a file at a time. A delivery
-- is born pending and due now, with its request body serialized once. A delivery_id that is
-- already recorded is left exactly as it is.
--
-- On a destination that orders by asset, a delivery held behind an earlier open one of its
-- asset (recorded before it, in the producer's snapshot or earlier in the same statement) is
-- born parked instead: next_attempt_at 9999-01-01, out of the claim's due scan, so that its
-- first write is its last until it heads its queue (migration 0013). The producer only reads
-- to decide this (no row lock, no wait on a worker). Parking is an optimisation: the claim's
-- rule (media_hooks_held_by_v2) is what keeps the order. What wakes a parked delivery: the
-- trigger media_hooks_release_queue_head_v1 when the delivery before it leaves the queue, and,
-- for one whose predecessor left while the producer's transaction was still open (the trigger
-- cannot see an uncommitted row), the sweep sweep_wake_parked_heads (each delivery run's
-- sweeps, and each tick of the lag sensor).
--
-- A delivery to a destination that orders or coalesces by asset is born queued: it joins its
-- asset's queue (webhook_delivery_queue, migration 0029), which the claim's rule reads; one to
-- another destination is not, and costs no entry there. The destination is read under the
-- key-share lock its foreign key check takes anyway, taken where it is read: a destination that
-- starts ordering or coalescing waits for the emits to it in flight, and then queues their
-- deliveries, and a later emit waits for it and reads it changed (0029's trigger).

-- name: emit_one
-- description: records one pending delivery unless its delivery_id was ever recorded; says
-- whether the destination is known and whether a row was written (an unknown destination
-- writes nothing, so a producer's transaction is never aborted by a foreign key error). The
-- delivery is stamped with the database clock of the producer's transaction: created_at, the
-- due time and the body's timestamp are one instant, now().
-- invariants 1 and 8: the identity row is inserted first and the delivery only if that insert
-- wrote it; a recorded, or purged and tombstoned, id conflicts on delivery_identity's key, which
-- also makes a concurrent purge or emit of the same id wait and then decide (migration 0005).
-- invariant 2: payload and body are written once here and never updated.
-- keeps: invariants 3 and 10: on an ordered destination, born parked when an earlier open
--   delivery of its asset holds it (the top of this file: the trigger or the sweep wakes it).
WITH destination AS (
    SELECT destination_id, ordering, ordering = 'asset' OR coalescing = 'asset' AS queued
    FROM webhook_destination
    WHERE destination_id = %(destination_id)s
    FOR KEY SHARE
),
identity AS (
    INSERT INTO delivery_identity (delivery_id, destination_id, created_at)
    SELECT %(delivery_id)s, destination.destination_id, now() FROM destination
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING delivery_id
),
-- Its place in emission order, and whether an earlier open delivery of its asset holds it.
born AS MATERIALIZED (
    SELECT identity.delivery_id, destination.destination_id, destination.queued,
           numbered.emit_seq,
           destination.ordering = 'asset' AND EXISTS (
               SELECT FROM media_hooks_held_by_v2('asset', 'none', destination.destination_id,
                                                  %(asset_id)s, %(event_type)s, now(),
                                                  numbered.emit_seq, identity.delivery_id)
           ) AS held
    FROM identity
    CROSS JOIN destination
    CROSS JOIN (SELECT nextval('media_hooks_emit_seq') AS emit_seq) AS numbered
),
body AS (
    INSERT INTO delivery_body (delivery_id, created_at, payload, body)
    SELECT born.delivery_id, now(), %(payload)s::jsonb,
           %(body_head)s::bytea || convert_to(media_hooks_rfc3339_v1(now()), 'UTF8')
               || %(body_tail)s::bytea
    FROM born
),
inserted AS (
    INSERT INTO delivery_state
        (delivery_id, destination_id, asset_id, event_type, created_at, updated_at,
         next_attempt_at, budget_started_at, emit_seq, wait_reason, queued)
    SELECT born.delivery_id, born.destination_id, %(asset_id)s, %(event_type)s,
           now(), now(), parking.next_attempt_at, now(), born.emit_seq, parking.wait_reason,
           born.queued
    FROM born
    CROSS JOIN LATERAL media_hooks_parking_v2(born.held, now()) AS parking
    RETURNING delivery_id, destination_id, next_attempt_at
),
timer AS (
    INSERT INTO delivery_timer (delivery_id, destination_id, kind, fire_at)
    SELECT delivery_id, destination_id,
           CASE WHEN next_attempt_at >= timestamptz '9999-01-01 00:00:00+00'
                THEN 'parked' ELSE 'due' END,
           next_attempt_at
    FROM inserted
)
SELECT EXISTS (SELECT 1 FROM destination) AS destination_known,
       EXISTS (SELECT 1 FROM inserted) AS inserted;

-- name: emit_event_one
-- description: records one event emitted without a destination and, in the same statement, one
-- pending delivery for each destination, enabled or disabled, subscribed to its type
-- (media_hooks_subscribed_v1), each with the id media_hooks_event_delivery_id_v1 derives from the
-- event id and the destination. An event id already recorded records nothing (its fan-out was
-- decided when it was first recorded); an event that matches no destination is recorded with
-- none, so the producer can be told. Returns whether the event was recorded now, the
-- destinations it went to, and the stored event's type and asset (to refuse a reused id).
-- invariants 1 and 8: as emit_one, identity rows first, deliveries only for ids they wrote.
-- invariant 2: payload and body are written once here and never updated.
-- keeps: invariants 3 and 10: a delivery to an ordered destination is born parked when an
--   earlier open delivery of its asset holds it, as in emit_one.
WITH targets AS (
    SELECT w.destination_id, w.ordering, w.ordering = 'asset' OR w.coalescing = 'asset' AS queued,
           media_hooks_event_delivery_id_v1(%(event_id)s, w.destination_id) AS delivery_id
    FROM webhook_destination AS w
    WHERE media_hooks_subscribed_v1(w.destination_id, %(event_type)s)
    FOR KEY SHARE OF w
),
event AS (
    INSERT INTO webhook_event (event_id, event_type, asset_id, destination_ids, created_at)
    VALUES (%(event_id)s, %(event_type)s, %(asset_id)s,
            ARRAY(SELECT destination_id FROM targets ORDER BY destination_id), now())
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id, destination_ids
),
identity AS (
    INSERT INTO delivery_identity (delivery_id, destination_id, created_at)
    SELECT targets.delivery_id, targets.destination_id, now()
    FROM targets WHERE EXISTS (SELECT 1 FROM event)
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING delivery_id
),
-- Each delivery's place in emission order (destinations in name order), and whether an
-- earlier open delivery of the asset holds it there.
numbered AS (
    SELECT targets.*, nextval('media_hooks_emit_seq') AS emit_seq
    FROM identity JOIN targets ON targets.delivery_id = identity.delivery_id
    ORDER BY targets.destination_id
),
-- MATERIALIZED: held is computed once a row, not once for each column it decides.
born AS MATERIALIZED (
    SELECT numbered.*,
           numbered.ordering = 'asset' AND EXISTS (
               SELECT FROM media_hooks_held_by_v2('asset', 'none', numbered.destination_id,
                                                  %(asset_id)s, %(event_type)s, now(),
                                                  numbered.emit_seq, numbered.delivery_id)
           ) AS held
    FROM numbered
),
body AS (
    INSERT INTO delivery_body (delivery_id, created_at, payload, body)
    SELECT born.delivery_id, now(), %(payload)s::jsonb,
           %(body_head)s::bytea || convert_to(media_hooks_rfc3339_v1(now()), 'UTF8')
               || %(body_tail)s::bytea
    FROM born
),
inserted AS (
    INSERT INTO delivery_state
        (delivery_id, destination_id, asset_id, event_type, created_at, updated_at,
         next_attempt_at, budget_started_at, emit_seq, wait_reason, queued)
    SELECT born.delivery_id, born.destination_id, %(asset_id)s, %(event_type)s,
           now(), now(), parking.next_attempt_at, now(), born.emit_seq, parking.wait_reason,
           born.queued
    FROM born
    CROSS JOIN LATERAL media_hooks_parking_v2(born.held, now()) AS parking
    RETURNING delivery_id, destination_id, next_attempt_at
),
timer AS (
    INSERT INTO delivery_timer (delivery_id, destination_id, kind, fire_at)
    SELECT delivery_id, destination_id,
           CASE WHEN next_attempt_at >= timestamptz '9999-01-01 00:00:00+00'
                THEN 'parked' ELSE 'due' END,
           next_attempt_at
    FROM inserted
)
SELECT EXISTS (SELECT 1 FROM event) AS recorded,
       coalesce((SELECT destination_ids FROM event), stored.destination_ids) AS destination_ids,
       (SELECT count(*) FROM inserted)::integer AS inserted,
       stored.event_type AS stored_event_type,
       stored.asset_id AS stored_asset_id
FROM (SELECT 1) AS one
LEFT JOIN webhook_event AS stored ON stored.event_id = %(event_id)s;

-- name: emit_staging_create
-- description: the session's staging table for a bulk emit (temporary: never logged, never
-- seen by another session).
CREATE TEMPORARY TABLE IF NOT EXISTS media_hooks_emit_staging_v3 (
    ordinal         bigint NOT NULL,
    -- An event's line (fan-out) has no delivery_id and no destination: it carries '/' and its
    -- event id here ('/' is in no identifier's alphabet), so the checks by delivery_id below
    -- also compare repeats of one event.
    delivery_id     text NOT NULL,
    destination_id  text,
    event_id        text,
    asset_id        text NOT NULL,
    event_type      text NOT NULL,
    -- Text, parsed into jsonb by the INSERT: binary COPY of jsonb would serialize it again.
    payload         text NOT NULL,
    -- The request body before and after its timestamp, which the INSERT stamps.
    body_head       bytea NOT NULL,
    body_tail       bytea NOT NULL
);

-- name: emit_staging_clear
-- description: empties the staging table before and after a bulk emit.
TRUNCATE media_hooks_emit_staging_v3;

-- name: emit_staging_copy
-- description: streams the validated events of a bulk emit into staging (binary: the bodies
-- go as raw bytes, not hex).
COPY media_hooks_emit_staging_v3
    (ordinal, delivery_id, destination_id, event_id, asset_id, event_type, payload, body_head,
     body_tail)
FROM STDIN (FORMAT binary);

-- name: emit_staging_rows
-- description: puts a chunk of a bulk emit's validated events into staging, one array per
-- column (for a runtime whose driver has no COPY: the Node.js producer); the same rows
-- emit_staging_copy streams.
INSERT INTO media_hooks_emit_staging_v3
    (ordinal, delivery_id, destination_id, event_id, asset_id, event_type, payload, body_head,
     body_tail)
SELECT *
FROM unnest(%(ordinals)s::bigint[], %(delivery_ids)s::text[], %(destination_ids)s::text[],
            %(event_ids)s::text[], %(asset_ids)s::text[], %(event_types)s::text[],
            %(payloads)s::text[], %(body_heads)s::bytea[], %(body_tails)s::bytea[]);

-- name: emit_staging_unknown_destination
-- description: the first staged event (by ordinal) whose destination does not exist, if any.
SELECT staged.destination_id, staged.first_ordinal AS ordinal
FROM (
    SELECT destination_id, min(ordinal) AS first_ordinal
    FROM media_hooks_emit_staging_v3
    WHERE destination_id IS NOT NULL
    GROUP BY destination_id
) AS staged
WHERE NOT EXISTS (
    SELECT 1 FROM webhook_destination d WHERE d.destination_id = staged.destination_id
)
ORDER BY staged.first_ordinal
LIMIT 1;

-- name: emit_staging_insert
-- description: records every staged delivery whose delivery_id was never recorded, and every
-- staged event whose event_id was never recorded with one delivery per destination subscribed to
-- its type (as emit_event_one), in one statement; an id staged twice counts once (its first line
-- wins). Returns the counts, and the first few events recorded that matched no destination.
-- Rows go in delivery_id order: the primary keys and the due index then fill leaf by leaf (a
-- quarter less server time than file order). Every delivery is stamped with the database clock
-- of the producer's transaction, like emit_one, and numbered (emit_seq) in file order.
-- invariants 1 and 8: an id already recorded is left alone (its live row conflicts), and so is
-- a purged one (its tombstone is looked up by delivery_identity's key, migration 0028); each
-- delivery written writes its identity row in the same statement, plainly. Every recorded id
-- has an identity row, so an interleaving that slips past the look-up (a purge committing a
-- tombstone this statement's snapshot predates, the delivery's row deleted under the insert's
-- wait) ends in a unique violation on delivery_identity_pkey, never in a second delivery:
-- media_hooks.outbox.emit then runs the statement again, and its new snapshot sees the tombstone.
-- (Unlike emit_one, which inserts the identity first, this keeps the bulk path's cost per row
-- close to what it was before identities: one look-up of the identity, one insert.)
-- invariant 2: payload and body are written once here and never updated.
-- keeps: invariants 3 and 10: a delivery to an ordered destination is born parked when an
--   earlier line of its asset in the file, or an earlier open delivery of its asset, holds it
--   (as in emit_one).
WITH clock AS (
    SELECT now() AS now, convert_to(media_hooks_rfc3339_v1(now()), 'UTF8') AS stamp
),
-- Each staged event type's subscribers: a handful of types times a handful of destinations.
subscribers AS (
    SELECT t.event_type,
           array_agg(w.destination_id ORDER BY w.destination_id) AS destination_ids
    FROM (SELECT DISTINCT event_type FROM media_hooks_emit_staging_v3
          WHERE event_id IS NOT NULL) AS t
    JOIN webhook_destination AS w ON media_hooks_subscribed_v1(w.destination_id, t.event_type)
    GROUP BY t.event_type
),
events AS (
    INSERT INTO webhook_event (event_id, event_type, asset_id, destination_ids, created_at)
    SELECT DISTINCT ON (e.event_id)
           e.event_id, e.event_type, e.asset_id, coalesce(s.destination_ids, '{}'), clock.now
    FROM media_hooks_emit_staging_v3 AS e
    CROSS JOIN clock
    LEFT JOIN subscribers AS s ON s.event_type = e.event_type
    WHERE e.event_id IS NOT NULL
    ORDER BY e.event_id, e.ordinal
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id, destination_ids
),
wanted AS (
    SELECT e.ordinal, e.delivery_id, e.destination_id, e.asset_id, e.event_type, e.payload,
           e.body_head, e.body_tail
    FROM media_hooks_emit_staging_v3 AS e
    WHERE e.event_id IS NULL
    UNION ALL
    SELECT e.ordinal, media_hooks_event_delivery_id_v1(e.event_id, t.destination_id),
           t.destination_id, e.asset_id, e.event_type, e.payload, e.body_head, e.body_tail
    FROM (SELECT DISTINCT ON (event_id) * FROM media_hooks_emit_staging_v3
          WHERE event_id IS NOT NULL ORDER BY event_id, ordinal) AS e
    JOIN events AS ev ON ev.event_id = e.event_id
    CROSS JOIN LATERAL unnest(ev.destination_ids) AS t (destination_id)
),
-- Emission order: numbers taken in file order (nextval runs after the sort).
numbered AS (
    SELECT w.*, nextval('media_hooks_emit_seq') AS emit_seq
    FROM wanted AS w
    ORDER BY w.ordinal, w.destination_id
),
-- The lines for destinations that order by asset, those whose delivery_id is new (an id
-- recorded before is not inserted again, so it holds nothing here), with each queue's first.
ordered_new AS (
    SELECT e.destination_id, e.asset_id, e.event_type, e.delivery_id, e.emit_seq,
           min(e.emit_seq) OVER (PARTITION BY e.destination_id, e.asset_id) AS first_seq
    FROM numbered AS e
    JOIN webhook_destination AS w ON w.destination_id = e.destination_id AND w.ordering = 'asset'
    WHERE NOT EXISTS (SELECT 1 FROM delivery_identity AS i WHERE i.delivery_id = e.delivery_id)
),
-- Whether each destination's deliveries are born queued, read under the key-share lock (the
-- top of this file).
queues AS (
    SELECT w.destination_id, w.ordering = 'asset' OR w.coalescing = 'asset' AS queued
    FROM webhook_destination AS w
    WHERE w.destination_id IN (SELECT destination_id FROM numbered)
    FOR KEY SHARE
),
-- Held: behind an earlier line of its asset in this file, or behind an earlier open delivery
-- of its asset in the producer's snapshot (only a queue's first line in the file can be not
-- held, so only it is looked up).
held AS (
    SELECT o.emit_seq
    FROM ordered_new AS o
    CROSS JOIN clock
    WHERE o.emit_seq > o.first_seq
       OR EXISTS (SELECT FROM media_hooks_held_by_v2('asset', 'none', o.destination_id,
                                                     o.asset_id, o.event_type, clock.now,
                                                     o.emit_seq, o.delivery_id))
),
-- The identity first, for every id (its first line's): an id recorded before, in either
-- layout and however long ago within the duplicate window, conflicts here and writes nothing
-- else; one a concurrent emit is recording waits for it and then conflicts.
identity AS (
    INSERT INTO delivery_identity (delivery_id, destination_id, created_at)
    SELECT DISTINCT ON (e.delivery_id) e.delivery_id, e.destination_id, clock.now
    FROM numbered AS e
    CROSS JOIN clock
    ORDER BY e.delivery_id, e.ordinal
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING delivery_id
),
fresh AS MATERIALIZED (
    SELECT DISTINCT ON (e.delivery_id)
           e.delivery_id, e.destination_id, e.asset_id, e.event_type, e.payload, e.body_head,
           e.body_tail, e.emit_seq, q.queued, held.emit_seq IS NOT NULL AS held
    FROM numbered AS e
    JOIN identity AS i ON i.delivery_id = e.delivery_id
    JOIN queues AS q ON q.destination_id = e.destination_id
    LEFT JOIN held ON held.emit_seq = e.emit_seq
    ORDER BY e.delivery_id, e.ordinal
),
body AS (
    INSERT INTO delivery_body (delivery_id, created_at, payload, body)
    SELECT f.delivery_id, clock.now, f.payload::jsonb, f.body_head || clock.stamp || f.body_tail
    FROM fresh AS f
    CROSS JOIN clock
    ORDER BY f.delivery_id
),
inserted AS (
    INSERT INTO delivery_state
        (delivery_id, destination_id, asset_id, event_type, created_at, updated_at,
         next_attempt_at, budget_started_at, emit_seq, wait_reason, queued)
    SELECT f.delivery_id, f.destination_id, f.asset_id, f.event_type, clock.now, clock.now,
           parking.next_attempt_at, clock.now, f.emit_seq, parking.wait_reason, f.queued
    FROM fresh AS f
    CROSS JOIN clock
    CROSS JOIN LATERAL media_hooks_parking_v2(f.held, clock.now) AS parking
    ORDER BY f.delivery_id
    RETURNING delivery_id, destination_id, next_attempt_at
),
timer AS (
    INSERT INTO delivery_timer (delivery_id, destination_id, kind, fire_at)
    SELECT delivery_id, destination_id,
           CASE WHEN next_attempt_at >= timestamptz '9999-01-01 00:00:00+00'
                THEN 'parked' ELSE 'due' END,
           next_attempt_at
    FROM inserted
),
inserted_count AS (
    SELECT count(*) AS n FROM inserted
)
SELECT inserted_count.n AS inserted,
       (SELECT count(DISTINCT delivery_id) FROM wanted) - inserted_count.n AS already_present,
       (SELECT count(*) FROM events) AS events_recorded,
       (SELECT count(DISTINCT event_id) FROM media_hooks_emit_staging_v3
        WHERE event_id IS NOT NULL) - (SELECT count(*) FROM events) AS events_already_present,
       (SELECT count(*) FROM events WHERE destination_ids = '{}') AS events_unmatched,
       ARRAY(SELECT event_id FROM events WHERE destination_ids = '{}'
             ORDER BY event_id LIMIT 5) AS unmatched_sample
FROM inserted_count;

-- name: emit_staging_conflicting_duplicate
-- description: the first staged event (by ordinal) whose delivery_id an earlier staged event
-- has with a different destination, asset, event type or payload, with that earlier ordinal.
-- Only ids staged more than once are compared (one narrow aggregate over the ids: ~4% of a
-- bulk emit), not every row.
-- invariant 2: one delivery_id, one payload; two different events under one id in one batch
-- are a producer's mistake, refused rather than silently collapsed to the first.
WITH repeated AS (
    SELECT s.*
    FROM media_hooks_emit_staging_v3 AS s
    WHERE s.delivery_id IN (
        SELECT delivery_id FROM media_hooks_emit_staging_v3 GROUP BY delivery_id HAVING count(*) > 1
    )
),
earliest AS (
    SELECT DISTINCT ON (delivery_id) *
    FROM repeated
    ORDER BY delivery_id, ordinal
)
SELECT later.delivery_id, earliest.ordinal AS first_ordinal, later.ordinal
FROM repeated AS later
JOIN earliest ON earliest.delivery_id = later.delivery_id AND earliest.ordinal < later.ordinal
WHERE (later.destination_id, later.event_id, later.asset_id, later.event_type, later.payload)
      IS DISTINCT FROM (earliest.destination_id, earliest.event_id, earliest.asset_id,
                        earliest.event_type, earliest.payload)
ORDER BY later.ordinal
LIMIT 1;
