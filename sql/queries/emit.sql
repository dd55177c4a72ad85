-- Emit (media_hooks.emit): the producer records deliveries, one or a file at a time. A delivery
-- is born pending and due now, with its request body serialized once. A delivery_id that is
-- already recorded is left exactly as it is.

-- name: emit_one
-- description: records one pending delivery unless its delivery_id exists; says whether the
-- destination is known and whether a row was written (an unknown destination writes nothing,
-- so a producer's transaction is never aborted by a foreign key error).
-- invariant 1: the delivery_id is its identity; a second emit of it records nothing, even
-- after retention purged the first (its tombstone remains).
-- invariant 2: payload and body are written once here and never updated.
WITH destination AS (
    SELECT destination_id
    FROM webhook_destination
    WHERE destination_id = %(destination_id)s
),
inserted AS (
    INSERT INTO webhook_delivery
        (delivery_id, destination_id, asset_id, event_type, payload, body,
         created_at, updated_at, next_attempt_at, budget_started_at)
    SELECT %(delivery_id)s, destination.destination_id, %(asset_id)s, %(event_type)s,
           %(payload)s::jsonb, %(body)s::bytea,
           %(created_at)s, %(created_at)s, %(created_at)s, %(created_at)s
    FROM destination
    -- A purged delivery's tombstone still holds its identity (retention, 0003).
    WHERE NOT EXISTS (SELECT 1 FROM delivery_tombstone AS t WHERE t.delivery_id = %(delivery_id)s)
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING delivery_id
)
SELECT EXISTS (SELECT 1 FROM destination) AS destination_known,
       EXISTS (SELECT 1 FROM inserted) AS inserted;

-- name: emit_staging_create
-- description: the session's staging table for a bulk emit (temporary: never logged, never
-- seen by another session).
CREATE TEMPORARY TABLE IF NOT EXISTS media_hooks_emit_staging (
    ordinal         bigint NOT NULL,
    delivery_id     text NOT NULL,
    destination_id  text NOT NULL,
    asset_id        text NOT NULL,
    event_type      text NOT NULL,
    -- Text, parsed into jsonb by the INSERT: binary COPY of jsonb would serialize it again.
    payload         text NOT NULL,
    body            bytea NOT NULL
);

-- name: emit_staging_clear
-- description: empties the staging table before and after a bulk emit.
TRUNCATE media_hooks_emit_staging;

-- name: emit_staging_copy
-- description: streams the validated events of a bulk emit into staging (binary: the bodies
-- go as raw bytes, not hex).
COPY media_hooks_emit_staging
    (ordinal, delivery_id, destination_id, asset_id, event_type, payload, body)
FROM STDIN (FORMAT binary);

-- name: emit_staging_unknown_destination
-- description: the first staged event (by ordinal) whose destination does not exist, if any.
SELECT staged.destination_id, staged.first_ordinal AS ordinal
FROM (
    SELECT destination_id, min(ordinal) AS first_ordinal
    FROM media_hooks_emit_staging
    GROUP BY destination_id
) AS staged
WHERE NOT EXISTS (
    SELECT 1 FROM webhook_destination d WHERE d.destination_id = staged.destination_id
)
ORDER BY staged.first_ordinal
LIMIT 1;

-- name: emit_staging_insert
-- description: records every staged delivery whose delivery_id is new, in one statement; a
-- delivery_id staged twice counts once (its first event wins). Returns the counts. Rows go in
-- delivery_id order: the primary key and the due index then fill leaf by leaf (a quarter less
-- server time than file order).
-- invariant 1: a delivery_id already recorded (or tombstoned) is left as it is and counted as
-- already present.
-- invariant 2: payload and body are written once here and never updated.
WITH inserted AS (
    INSERT INTO webhook_delivery
        (delivery_id, destination_id, asset_id, event_type, payload, body,
         created_at, updated_at, next_attempt_at, budget_started_at)
    SELECT DISTINCT ON (delivery_id)
           delivery_id, destination_id, asset_id, event_type, payload::jsonb, body,
           %(created_at)s, %(created_at)s, %(created_at)s, %(created_at)s
    FROM media_hooks_emit_staging AS staged
    -- A purged delivery's tombstone still holds its identity (retention, 0003).
    WHERE NOT EXISTS (SELECT 1 FROM delivery_tombstone AS t WHERE t.delivery_id = staged.delivery_id)
    ORDER BY delivery_id, ordinal
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING 1
),
inserted_count AS (
    SELECT count(*) AS n FROM inserted
)
SELECT inserted_count.n AS inserted,
       (SELECT count(DISTINCT delivery_id) FROM media_hooks_emit_staging) - inserted_count.n
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
    FROM media_hooks_emit_staging AS s
    WHERE s.delivery_id IN (
        SELECT delivery_id FROM media_hooks_emit_staging GROUP BY delivery_id HAVING count(*) > 1
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
