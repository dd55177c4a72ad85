-- Global per-destination rate limits: a start-rate ceiling (a leaky bucket of starts) and an
-- in-flight ceiling (slots with an expiring hold), shared by every process through one limiter
-- row per destination. The transitions are the functions of migration 0002; these statements
-- call them.

-- name: acquire_permits
-- description: give back release_slots, then grant up to want permits (one slot plus one
-- start each) to one holder, in one round trip; a start may be granted up to ahead_seconds (at
-- most one interval of the rate) before its moment. Returns the slots granted, when each may
-- start (seconds after granted_at), the database time of the grant, and when and why to ask
-- again. Keeps the start-rate and in-flight ceilings and any pause (docs/architecture.md: rate
-- limits hold across concurrent runs and processes; media_hooks_acquire_permits_v2, 0014).
SELECT slots, starts, granted_at, retry_in, reason
  FROM media_hooks_acquire_permits_v2(
      %(destination_id)s, %(want)s, %(holder)s, %(hold_seconds)s,
      %(slot_poll_seconds)s, %(disabled_poll_seconds)s, %(ahead_seconds)s, %(release_slots)s)

-- name: release_permits
-- description: free the listed slots of one destination that this holder still holds (a slot
-- whose hold expired and went to another holder is left alone); returns how many.
SELECT media_hooks_release_permits_v1(%(destination_id)s, %(slots)s, %(holder)s)

-- name: release_holder
-- description: free every slot one holder holds on any destination, for a worker known to be
-- dead (its run failed); returns how many.
SELECT media_hooks_release_holder_v1(%(holder)s) AS released

-- name: pause_destination
-- description: pause the whole destination (a 429, or a 503 with Retry-After) until the later
-- of its current pause and now plus seconds; no permit is granted to anyone before then.
SELECT paused_from, paused_until
  FROM media_hooks_pause_destination_v1(%(destination_id)s, %(seconds)s, %(reason)s)

-- name: destination_in_flight
-- description: the slots of one destination held now, with their expiry and whether the given
-- holder holds them; for figures and tests.
SELECT held.slot_no::integer AS slot_no,
       held.held_until,
       held.holder_key = media_hooks_holder_key_v1(%(holder)s) AS mine
  FROM destination_limiter l,
       unnest(l.slot_until, l.slot_holder) WITH ORDINALITY AS held (held_until, holder_key, slot_no)
 WHERE l.destination_id = %(destination_id)s AND held.held_until > clock_timestamp()
 ORDER BY held.slot_no

-- name: database_clock
-- description: the database's clock now, for a worker that sends starts at moments on it
-- (media_hooks.outbox.rate_limits.DatabaseClock); reads nothing else.
SELECT clock_timestamp() AS now
