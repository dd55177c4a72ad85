-- Emit (media_hooks.emit): the producer records deliveries, one or a file at a time. A delivery
-- is born pending and due now, with its request body serialized once. A delivery_id that is
-- already recorded is left exactly as it is.

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
WITH destination AS (
    SELECT destination_id
    FROM webhook_destination
    WHERE destination_id = %(destination_id)s
),
identity AS (
    INSERT INTO delivery_identity (delivery_id)
    SELECT %(delivery_id)s FROM destination
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING delivery_id
),
inserted AS (
    INSERT INTO webhook_delivery
        (delivery_id, destination_id, asset_id, event_type, payload, body,
         created_at, updated_at, next_attempt_at, budget_started_at, emit_seq)
    SELECT identity.delivery_id, destination.destination_id, %(asset_id)s, %(event_type)s,
           %(payload)s::jsonb,
           %(body_head)s::bytea || convert_to(media_hooks_rfc3339_v1(now()), 'UTF8')
               || %(body_tail)s::bytea,
           now(), now(), now(), now(), nextval('media_hooks_emit_seq')
    FROM identity CROSS JOIN destination
    -- A row recorded by code older than 0005 has no identity row yet: it is kept as it is.
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING delivery_id
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
WITH targets AS (
    SELECT w.destination_id,
           media_hooks_event_delivery_id_v1(%(event_id)s, w.destination_id) AS delivery_id
    FROM webhook_destination AS w
    WHERE media_hooks_subscribed_v1(w.destination_id, %(event_type)s)
),
event AS (
    INSERT INTO webhook_event (event_id, event_type, asset_id, destination_ids, created_at)
    VALUES (%(event_id)s, %(event_type)s, %(asset_id)s,
            ARRAY(SELECT destination_id FROM targets ORDER BY destination_id), now())
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id, destination_ids
),
identity AS (
    INSERT INTO delivery_identity (delivery_id)
    SELECT targets.delivery_id FROM targets WHERE EXISTS (SELECT 1 FROM event)
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING delivery_id
),
inserted AS (
    INSERT INTO webhook_delivery
        (delivery_id, destination_id, asset_id, event_type, payload, body,
         created_at, updated_at, next_attempt_at, budget_started_at, emit_seq)
    SELECT identity.delivery_id, targets.destination_id, %(asset_id)s, %(event_type)s,
           %(payload)s::jsonb,
           %(body_head)s::bytea || convert_to(media_hooks_rfc3339_v1(now()), 'UTF8')
               || %(body_tail)s::bytea,
           now(), now(), now(), now(), nextval('media_hooks_emit_seq')
    FROM identity JOIN targets ON targets.delivery_id = identity.delivery_id
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING delivery_id
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
-- a purged one (its tombstone is looked up, index delivery_identity_tombstone); each delivery
-- written writes its identity row in the same statement, plainly. Every recorded id has an
-- identity row, so an interleaving that slips past the look-up (a purge committing a tombstone
-- this statement's snapshot predates, the delivery's row deleted under the insert's wait) ends
-- in a unique violation on delivery_identity_pkey, never in a second delivery:
-- media_hooks.emit then runs the statement again, and its new snapshot sees the tombstone.
-- (Unlike emit_one, which inserts the identity first, this keeps the bulk path's cost per row
-- close to what it was before identities: one look-up into the tombstones, one insert.)
-- invariant 2: payload and body are written once here and never updated.
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
inserted AS (
    INSERT INTO webhook_delivery
        (delivery_id, destination_id, asset_id, event_type, payload, body,
         created_at, updated_at, next_attempt_at, budget_started_at, emit_seq)
    SELECT DISTINCT ON (e.delivery_id)
           e.delivery_id, e.destination_id, e.asset_id, e.event_type, e.payload::jsonb,
           e.body_head || clock.stamp || e.body_tail,
           clock.now, clock.now, clock.now, clock.now, e.emit_seq
    FROM numbered AS e
    CROSS JOIN clock
    WHERE NOT EXISTS (SELECT 1 FROM delivery_identity AS i
                      WHERE i.delivery_id = e.delivery_id AND i.final_state IS NOT NULL)
    ORDER BY e.delivery_id, e.ordinal
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING delivery_id
),
identity AS (
    INSERT INTO delivery_identity (delivery_id)
    SELECT delivery_id FROM inserted
    RETURNING 1
),
inserted_count AS (
    SELECT count(*) AS n FROM identity
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
