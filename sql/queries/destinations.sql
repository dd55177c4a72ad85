-- Destinations (media_hooks.outbox.destinations): where deliveries go, with their limits and retry
-- policy. None of these statements moves a delivery; enabling and disabling only decide whether
-- a destination's pending deliveries may go out.

-- name: destination_create_with_defaults
-- description: a new destination with the schema's default limits; nothing if it exists.
INSERT INTO webhook_destination (destination_id, url)
VALUES (%(destination_id)s, %(url)s)
ON CONFLICT (destination_id) DO NOTHING
RETURNING destination_id;

-- name: destination_fence_leases
-- description: before ordering is turned on, in the same transaction: the destination's limiter
-- row locked until the change commits. Every lease with permits locks it first
-- (media_hooks_lease_with_permits_v4), so a lease either ends before ordered_since is taken,
-- its attempt started before it, or reads the destination after the change and applies the
-- order (migration 0021); none leases under the old rule after ordered_since.
-- keeps: invariant 10, and check_sent_out_of_order exact for what the lease sends.
SELECT FROM media_hooks_lock_limiter_v1(%(destination_id)s);

-- name: destination_update_given
-- description: sets the URL and every option given (non-null); the others keep their values.
-- Secrets given replace the whole list (a rotation passes old and new together). Ordering
-- turned on records when (ordered_since, migration 0021), on the clock as the row is written,
-- not the transaction's start.
-- keeps: invariant 10 as check_sent_out_of_order reads it: a request sent before ordering began
--   cannot be recalled, so it is not counted; every dispatch or attempt after it is.
UPDATE webhook_destination
SET url                  = %(url)s,
    secrets              = COALESCE(%(secrets)s::text[], secrets),
    rate_per_second      = COALESCE(%(rate_per_second)s::double precision, rate_per_second),
    burst                = COALESCE(%(burst)s::integer, burst),
    max_in_flight        = COALESCE(%(max_in_flight)s::integer, max_in_flight),
    timeout_seconds      = COALESCE(%(timeout_seconds)s::double precision, timeout_seconds),
    max_attempts         = COALESCE(%(max_attempts)s::integer, max_attempts),
    backoff_base_seconds = COALESCE(%(backoff_base_seconds)s::double precision, backoff_base_seconds),
    backoff_cap_seconds  = COALESCE(%(backoff_cap_seconds)s::double precision, backoff_cap_seconds),
    ordering             = COALESCE(%(ordering)s::text, ordering),
    ordered_since        = CASE WHEN %(ordering)s::text = 'asset' AND ordering <> 'asset'
                                THEN clock_timestamp() ELSE ordered_since END,
    coalescing           = COALESCE(%(coalescing)s::text, coalescing),
    allow_private_url    = COALESCE(%(allow_private_url)s::boolean, allow_private_url),
    updated_at           = now()
WHERE destination_id = %(destination_id)s
RETURNING *;

-- name: destination_allows_private_url
-- description: whether a destination was added allowed to reach private addresses (none: it
-- does not exist yet).
SELECT allow_private_url
FROM webhook_destination
WHERE destination_id = %(destination_id)s;

-- name: destination_get
-- description: one destination with its secrets, for the sender.
SELECT *
FROM webhook_destination
WHERE destination_id = %(destination_id)s;

-- name: destination_list
-- description: every destination with its limits and state, and how many secrets it has
-- (never the secrets themselves).
SELECT destination_id,
       url,
       cardinality(secrets) AS secret_count,
       rate_per_second,
       burst,
       max_in_flight,
       timeout_seconds,
       max_attempts,
       backoff_base_seconds,
       backoff_cap_seconds,
       max_age_seconds,
       enabled,
       disabled_reason,
       disabled_at,
       paused_until,
       paused_reason,
       ARRAY(SELECT s.pattern FROM destination_subscription AS s
             WHERE s.destination_id = w.destination_id ORDER BY s.pattern) AS event_types,
       ordering,
       coalescing,
       allow_private_url,
       CASE
           WHEN NOT enabled THEN 'disabled'
           WHEN paused_until > now() THEN 'paused'
           ELSE 'enabled'
       END AS state
FROM webhook_destination AS w
ORDER BY destination_id;

-- name: destination_subscribe
-- description: replaces a destination's subscriptions with the patterns given (none: every
-- event type). An event already emitted keeps the deliveries it fanned out to.
WITH dropped AS (
    DELETE FROM destination_subscription
    WHERE destination_id = %(destination_id)s AND NOT (pattern = ANY (%(patterns)s::text[]))
)
INSERT INTO destination_subscription (destination_id, pattern)
SELECT %(destination_id)s, p FROM unnest(%(patterns)s::text[]) AS p
ON CONFLICT (destination_id, pattern) DO NOTHING;

-- name: destination_release_parked
-- description: a destination that no longer orders by asset: its deliveries parked behind an
-- earlier one of their asset (born parked, or parked by an earlier release) are due again now.
-- invariant 3: nothing stays parked once no rule holds it.
WITH released AS (
    UPDATE delivery_timer AS t
    SET kind = 'due', fire_at = now()
    WHERE t.destination_id = %(destination_id)s AND t.kind = 'parked'
    RETURNING t.delivery_id
),
released_state AS (
    UPDATE delivery_state AS s
    SET next_attempt_at = now(),
        wait_reason = 'released: the destination no longer orders by asset',
        updated_at = now()
    FROM released
    WHERE s.delivery_id = released.delivery_id
)
UPDATE webhook_delivery_v1
SET next_attempt_at = now(),
    wait_reason = 'released: the destination no longer orders by asset',
    updated_at = now()
WHERE destination_id = %(destination_id)s
  AND state = 'pending'
  AND next_attempt_at >= timestamptz '9999-01-01 00:00:00+00';

-- name: destination_park_held
-- description: a destination that orders by asset: its due pending deliveries held behind an
-- earlier open one of their asset are parked, as the emit statements record a held delivery
-- now (sql/queries/emit.sql): those recorded before it ordered, or recorded due by an older
-- release's emit. Otherwise each claim of the destination would read them again until they
-- head their queues. Rows a worker or a trigger holds are left to it (SKIP LOCKED).
-- keeps: invariant 3 (a parked delivery is made due when it heads its queue: by the trigger
--   media_hooks_release_queue_head_v1, which waits for this statement's lock and then sees
--   the parking, or by sweep_wake_parked_heads when its head left while this ran),
--   invariant 10 (the claim's rule holds them, parked or not).
WITH held AS (
    SELECT t.delivery_id
    FROM delivery_timer AS t
    JOIN delivery_state AS d ON d.delivery_id = t.delivery_id
    WHERE t.destination_id = %(destination_id)s
      AND t.kind = 'due'
      AND EXISTS (SELECT FROM media_hooks_held_by_v2('asset', 'none', d.destination_id,
                                                     d.asset_id, d.event_type, d.created_at,
                                                     d.emit_seq, d.delivery_id))
    FOR UPDATE OF t SKIP LOCKED
),
parked_timers AS (
    UPDATE delivery_timer AS t
    SET kind = 'parked', fire_at = parking.next_attempt_at
    FROM media_hooks_parking_v2(true, now()) AS parking
    WHERE t.delivery_id = ANY (ARRAY(SELECT delivery_id FROM held))
    RETURNING t.delivery_id
),
parked_state AS (
    UPDATE delivery_state AS d
    SET next_attempt_at = parking.next_attempt_at,
        wait_reason = parking.wait_reason,
        updated_at = now()
    FROM media_hooks_parking_v2(true, now()) AS parking, parked_timers
    WHERE d.delivery_id = parked_timers.delivery_id
),
-- The previous release's deliveries, by its rule.
previous_held AS (
    SELECT d.delivery_id
    FROM webhook_delivery_v1 AS d
    WHERE d.destination_id = %(destination_id)s
      AND d.state = 'pending'
      AND d.next_attempt_at < timestamptz '9999-01-01 00:00:00+00'
      AND EXISTS (SELECT FROM media_hooks_held_by_v2('asset', 'none', d.destination_id,
                                                     d.asset_id, d.event_type, d.created_at,
                                                     d.emit_seq, d.delivery_id))
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_delivery_v1 AS d
SET next_attempt_at = parking.next_attempt_at,
    wait_reason = parking.wait_reason,
    updated_at = now()
FROM media_hooks_parking_v2(true, now()) AS parking
WHERE d.delivery_id = ANY (ARRAY(SELECT delivery_id FROM previous_held));

-- name: destination_close_superseded
-- description: a destination that coalesces by asset: its pending deliveries for which a newer
-- one of the same asset and event type exists (open, or already succeeded) close unsent at once,
-- as sweep_superseded closes them: dead, with the reason 'superseded' and the newest one's id.
-- Those recorded before it coalesced would otherwise be sent after a newer one that had already
-- succeeded, which neither the claim's rule nor the sweep sees (they read open rows only).
-- Rows a worker holds are left to the sweep (SKIP LOCKED).
-- keeps: invariant 3 (the delivery ends terminal, with its reason), invariant 1 (nothing is sent
--   under another id). Each newer look-up reads one asset's rows of the destination.
WITH stale AS (
    SELECT o.delivery_id, newest.delivery_id AS superseded_by
    FROM delivery_state AS o
    CROSS JOIN LATERAL (
        SELECT n.delivery_id
        FROM webhook_delivery_all AS n
        WHERE n.destination_id = o.destination_id AND n.asset_id = o.asset_id
          AND n.event_type = o.event_type AND n.closed_reason IS NULL
          AND (n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
              > (o.created_at, coalesce(o.emit_seq, 0), o.delivery_id)
        ORDER BY n.created_at DESC, coalesce(n.emit_seq, 0) DESC, n.delivery_id DESC
        LIMIT 1
    ) AS newest
    WHERE o.destination_id = %(destination_id)s AND o.queued AND o.state = 'pending'
    FOR UPDATE OF o SKIP LOCKED
),
closed AS (
    DELETE FROM delivery_state AS o
    USING stale
    WHERE o.delivery_id = stale.delivery_id AND o.state = 'pending'
    RETURNING o.delivery_id,
              media_hooks_closed_row_v1(o, 'superseded', stale.superseded_by,
                                        'superseded by ' || stale.superseded_by) AS ended_row
),
history AS (
    INSERT INTO delivery_history SELECT (c.ended_row).* FROM closed AS c
),
untimed AS (
    DELETE FROM delivery_timer AS t USING closed WHERE t.delivery_id = closed.delivery_id
),
-- The previous release's deliveries, by its rule.
previous_stale AS (
    SELECT o.delivery_id, newest.delivery_id AS superseded_by
    FROM webhook_delivery_v1 AS o
    CROSS JOIN LATERAL (
        SELECT n.delivery_id
        FROM webhook_delivery_all AS n
        WHERE n.destination_id = o.destination_id AND n.asset_id = o.asset_id
          AND n.event_type = o.event_type AND n.closed_reason IS NULL
          AND (n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
              > (o.created_at, coalesce(o.emit_seq, 0), o.delivery_id)
        ORDER BY n.created_at DESC, coalesce(n.emit_seq, 0) DESC, n.delivery_id DESC
        LIMIT 1
    ) AS newest
    WHERE o.destination_id = %(destination_id)s AND o.state = 'pending'
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE webhook_delivery_v1 AS d
SET state = 'dead',
    closed_reason = 'superseded',
    closed_by = previous_stale.superseded_by,
    wait_reason = 'superseded by ' || previous_stale.superseded_by,
    updated_at = now()
FROM previous_stale
WHERE d.delivery_id = previous_stale.delivery_id AND d.state = 'pending';

-- name: destination_enable
-- description: turns a destination on and forgets why it was off.
-- invariant 3: its pending deliveries were kept while it was off and are due again now.
UPDATE webhook_destination
SET enabled = true,
    disabled_reason = NULL,
    disabled_at = NULL,
    updated_at = now()
WHERE destination_id = %(destination_id)s
RETURNING destination_id;

-- name: destination_disable
-- description: turns a destination off with the operator's reason (the first disable time is kept).
-- invariant 3: its deliveries stay pending and discoverable while it is off; nothing is dropped.
UPDATE webhook_destination
SET enabled = false,
    disabled_reason = %(reason)s,
    disabled_at = CASE WHEN enabled THEN now() ELSE disabled_at END,
    updated_at = now()
WHERE destination_id = %(destination_id)s
RETURNING destination_id;

-- name: destination_has_sealed_secrets
-- description: whether any destination's secrets are stored encrypted (fernet:…): adding a
-- secret without the key would then store it in the clear beside them.
SELECT EXISTS (
    SELECT 1 FROM webhook_destination AS w, unnest(w.secrets) AS s WHERE s LIKE 'fernet:%%'
) AS sealed;

-- name: destination_secrets_for_rekey
-- description: every destination that has secrets, locked against a concurrent add while its
-- secrets are re-encrypted (NO KEY UPDATE: emits' foreign-key checks are not blocked).
SELECT destination_id, secrets
FROM webhook_destination
WHERE cardinality(secrets) > 0
ORDER BY destination_id
FOR NO KEY UPDATE;

-- name: destination_store_secrets
-- description: one destination's secrets, as stored after re-encryption.
UPDATE webhook_destination
SET secrets = %(secrets)s::text[],
    updated_at = now()
WHERE destination_id = %(destination_id)s;
