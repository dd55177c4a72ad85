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
         created_at, updated_at, next_attempt_at, budget_started_at)
    SELECT identity.delivery_id, destination.destination_id, %(asset_id)s, %(event_type)s,
           %(payload)s::jsonb,
           %(body_head)s::bytea || convert_to(media_hooks_rfc3339_v1(now()), 'UTF8')
               || %(body_tail)s::bytea,
           now(), now(), now(), now()
    FROM identity CROSS JOIN destination
    -- A row recorded by code older than 0005 has no identity row yet: it is kept as it is.
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING delivery_id
)
SELECT EXISTS (SELECT 1 FROM destination) AS destination_known,
       EXISTS (SELECT 1 FROM inserted) AS inserted;

-- name: emit_staging_create
-- description: the session's staging table for a bulk emit (temporary: never logged, never
-- seen by another session).
CREATE TEMPORARY TABLE IF NOT EXISTS media_hooks_emit_staging_v2 (
    ordinal         bigint NOT NULL,
    delivery_id     text NOT NULL,
    destination_id  text NOT NULL,
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
TRUNCATE media_hooks_emit_staging_v2;

-- name: emit_staging_copy
-- description: streams the validated events of a bulk emit into staging (binary: the bodies
-- go as raw bytes, not hex).
COPY media_hooks_emit_staging_v2
    (ordinal, delivery_id, destination_id, asset_id, event_type, payload, body_head, body_tail)
FROM STDIN (FORMAT binary);

-- name: emit_staging_unknown_destination
-- description: the first staged event (by ordinal) whose destination does not exist, if any.
SELECT staged.destination_id, staged.first_ordinal AS ordinal
FROM (
    SELECT destination_id, min(ordinal) AS first_ordinal
    FROM media_hooks_emit_staging_v2
    GROUP BY destination_id
) AS staged
WHERE NOT EXISTS (
    SELECT 1 FROM webhook_destination d WHERE d.destination_id = staged.destination_id
)
ORDER BY staged.first_ordinal
LIMIT 1;

-- name: emit_staging_insert
-- description: records every staged delivery whose delivery_id was never recorded, in one
-- statement; a delivery_id staged twice counts once (its first event wins). Returns the counts.
-- Rows go in delivery_id order: the primary keys and the due index then fill leaf by leaf (a
-- quarter less server time than file order). Every delivery is stamped with the database clock
-- of the producer's transaction, like emit_one.
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
inserted AS (
    INSERT INTO webhook_delivery
        (delivery_id, destination_id, asset_id, event_type, payload, body,
         created_at, updated_at, next_attempt_at, budget_started_at)
    SELECT DISTINCT ON (e.delivery_id)
           e.delivery_id, e.destination_id, e.asset_id, e.event_type, e.payload::jsonb,
           e.body_head || clock.stamp || e.body_tail,
           clock.now, clock.now, clock.now, clock.now
    FROM media_hooks_emit_staging_v2 AS e
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
       (SELECT count(DISTINCT delivery_id) FROM media_hooks_emit_staging_v2) - inserted_count.n
           AS already_present
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
    FROM media_hooks_emit_staging_v2 AS s
    WHERE s.delivery_id IN (
        SELECT delivery_id FROM media_hooks_emit_staging_v2 GROUP BY delivery_id HAVING count(*) > 1
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
WHERE (later.destination_id, later.asset_id, later.event_type, later.payload)
      IS DISTINCT FROM (earliest.destination_id, earliest.asset_id, earliest.event_type,
                        earliest.payload)
ORDER BY later.ordinal
LIMIT 1;
