-- migrate: no-transaction
-- 0034: the lean hot path (docs/design/hot-path.md, sections 2 to 5).
--
-- A delivery's life moves out of webhook_delivery, whose every index but its key named a column
-- that each move changes (so no move was heap-only, and every move wrote a new 640-byte version
-- of a row that also carried a month of history), into tables each written the way it is used:
--
--   delivery_state   the open delivery, narrow (no payload, no body), half of each page free;
--                    no index names a column a move changes, so its moves are heap-only.
--   delivery_timer   one narrow row per open delivery saying when somebody must look at it
--                    next: due (the claim), parked (behind an earlier delivery of its asset),
--                    in flight (the sweeps), dead (an operator: a dead letter holding its
--                    asset's queue); the claim's, the sweeps' and status's indexes are on it.
--   delivery_body    what never changes (payload, body), written once at emit.
--   delivery_history the ended delivery, written once when it ends.
--   dispatch_outbox_v3, delivery_attempt_v2
--                    dispatches and ended attempts, written once (an attempt in flight is
--                    its delivery's lease).
--
-- Body, history, dispatches and attempts are partitioned by the delivery's creation time (a
-- partition every media_hooks_partitioning.width_seconds, a day unless set), so that
-- retention drops a whole partition of each once nothing of it is open or recent, where it
-- deleted row by row. The identity stays one unpartitioned table, written complete at emit:
-- its primary key refuses a repeated delivery_id for the whole duplicate window, whatever the
-- layout of the delivery it names.
--
-- Expand only: the previous layout's tables stay, renamed webhook_delivery_v1 and
-- delivery_attempt_v1, with everything the previous release reads and writes under the
-- contract's names (single-table views, written through). Its producers still write them and
-- its workers deliver what they hold. This release's producers write the new tables; its sweeps
-- move the previous release's pending deliveries into them (convert_previous_pending); its
-- readers read both (webhook_delivery_all, delivery_attempt_all, dispatch_outbox).
-- media_hooks_held_by_v2, which the previous release's claims read, now reads both layouts'
-- queues: an ordered asset's queue may hold deliveries of both while the releases overlap, and
-- the order is the queue's, not the layout's.
--
-- Applied one idempotent statement at a time outside a transaction: the new tables are empty
-- (no lock on anything a producer writes), the identity's new index is built concurrently.

-- The previous layout's two tables take names of their own, and the contract's names become
-- views over them: one table each, every column, so PostgreSQL updates them as the tables
-- (inserts, updates, deletes, ON CONFLICT and FOR UPDATE go to the table, its triggers fire),
-- and the previous release reads and writes them as it did. This release names the tables
-- themselves; the contract migration after it (0035) turns the views into the contract's view
-- over both layouts. One statement a table: the rename's lock is as short as a rename.
DO $$
BEGIN
    IF to_regclass('webhook_delivery_v1') IS NULL THEN
        ALTER TABLE webhook_delivery RENAME TO webhook_delivery_v1;
        CREATE VIEW webhook_delivery AS SELECT * FROM webhook_delivery_v1;
        -- The previous release's claims, figures and requeue select a cohort by the whole row
        -- (media_hooks_in_cohort(d, ...)), whose type is now the view's: the table's rule for
        -- it, in this statement, so that no claim finds it missing. 0035 drops it with the view.
        CREATE FUNCTION media_hooks_in_cohort(
            delivery webhook_delivery, destination_ids text[], event_types text[],
            asset_ids text[], created_after timestamptz, created_before timestamptz)
        RETURNS boolean
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        AS $fn$
            SELECT media_hooks_in_cohort(ROW(delivery.*)::webhook_delivery_v1, destination_ids,
                                         event_types, asset_ids, created_after, created_before)
        $fn$;
    END IF;
END
$$;

DO $$
BEGIN
    IF to_regclass('delivery_attempt_v1') IS NULL THEN
        ALTER TABLE delivery_attempt RENAME TO delivery_attempt_v1;
        CREATE VIEW delivery_attempt AS SELECT * FROM delivery_attempt_v1;
    END IF;
END
$$;

-- This release's emits refuse a repeated delivery_id by its identity row alone, never by the
-- previous layout's table, so every delivery there has one first: a row that code older than
-- 0005 wrote without one (the purge wrote it late, as its tombstone) gets it here. Releases
-- since 0005, the previous one included, write it before the delivery.
-- keeps: invariants 1 and 8.
INSERT INTO delivery_identity (delivery_id)
SELECT d.delivery_id
FROM webhook_delivery_v1 AS d
WHERE NOT EXISTS (SELECT 1 FROM delivery_identity AS i WHERE i.delivery_id = d.delivery_id)
ON CONFLICT (delivery_id) DO NOTHING;

CREATE TABLE IF NOT EXISTS media_hooks_partitioning (
    only_row       boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    -- The width of every partition of the history tables, in seconds; changing it applies to
    -- partitions made from then on (each starts where the last one ended).
    width_seconds  integer NOT NULL DEFAULT 86400 CHECK (width_seconds >= 1)
);

INSERT INTO media_hooks_partitioning (only_row) VALUES (true) ON CONFLICT DO NOTHING;

-- Every partition made, with its range: what retention drops, and where the next one starts.
CREATE TABLE IF NOT EXISTS media_hooks_partition (
    parent     text NOT NULL,
    child      text NOT NULL,
    lower_at   timestamptz NOT NULL,
    upper_at   timestamptz NOT NULL,
    CONSTRAINT media_hooks_partition_pkey PRIMARY KEY (parent, lower_at),
    CONSTRAINT media_hooks_partition_child UNIQUE (child),
    CONSTRAINT media_hooks_partition_range CHECK (lower_at < upper_at)
);

CREATE TABLE IF NOT EXISTS delivery_body (
    delivery_id  text NOT NULL,
    created_at   timestamptz NOT NULL,
    payload      jsonb NOT NULL,
    body         bytea NOT NULL,
    CONSTRAINT delivery_body_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_body_payload_is_object CHECK (jsonb_typeof(payload) = 'object')
) PARTITION BY RANGE (created_at);

CREATE TABLE IF NOT EXISTS delivery_state (
    delivery_id        text NOT NULL,
    destination_id     text NOT NULL,
    asset_id           text NOT NULL,
    event_type         text NOT NULL,
    created_at         timestamptz NOT NULL,
    emit_seq           bigint,
    queued             boolean NOT NULL,
    state              text NOT NULL DEFAULT 'pending',
    attempt_count      integer NOT NULL DEFAULT 0,
    budget_used        integer NOT NULL DEFAULT 0,
    budget_started_at  timestamptz NOT NULL,
    dispatch_count     integer NOT NULL DEFAULT 0,
    next_attempt_at    timestamptz NOT NULL,
    lease_until        timestamptz,
    lease_token        uuid,
    lease_started_at   timestamptz,
    lease_run_id       text,
    current_message_id text,
    last_outcome       text,
    last_error         text,
    wait_reason        text,
    updated_at         timestamptz NOT NULL,
    CONSTRAINT delivery_state_pkey PRIMARY KEY (delivery_id),
    CONSTRAINT delivery_state_destination_id_fkey
        FOREIGN KEY (destination_id) REFERENCES webhook_destination (destination_id),
    CONSTRAINT delivery_state_id_form
        CHECK (delivery_id ~ '^[A-Za-z0-9_:-]+$' AND length(delivery_id) <= 200),
    -- Dead only while it holds its asset's queue (unclosed, on a destination that orders or
    -- coalesces by asset); every other ended delivery is history.
    CONSTRAINT delivery_state_state
        CHECK (state IN ('pending', 'enqueued', 'leased') OR (state = 'dead' AND queued)),
    CONSTRAINT delivery_state_last_outcome
        CHECK (last_outcome IN ('success', 'rate_limited', 'retryable', 'ambiguous', 'rejected')),
    CONSTRAINT delivery_state_lease_only_while_leased
        CHECK (state = 'leased' OR (lease_token IS NULL AND lease_until IS NULL
                                    AND lease_started_at IS NULL)),
    CONSTRAINT delivery_state_leased_has_lease
        CHECK (state <> 'leased' OR (lease_until IS NOT NULL AND lease_token IS NOT NULL
                                     AND lease_started_at IS NOT NULL)),
    CONSTRAINT delivery_state_counts
        CHECK (attempt_count >= 0 AND budget_used >= 0 AND dispatch_count >= 0)
) WITH (fillfactor = 50);

-- Per-asset order and latest-wins (media_hooks_held_by_v2): immutable columns only, and a
-- predicate on a column no move changes, so every move stays heap-only.
CREATE INDEX IF NOT EXISTS delivery_state_queue
    ON delivery_state (destination_id, asset_id, created_at, emit_seq) INCLUDE (event_type)
    WHERE queued;

-- The oldest open delivery: which history partitions nothing open holds any more.
CREATE INDEX IF NOT EXISTS delivery_state_created ON delivery_state (created_at);

CREATE TABLE IF NOT EXISTS delivery_timer (
    delivery_id     text NOT NULL,
    destination_id  text NOT NULL,
    kind            text NOT NULL,
    fire_at         timestamptz NOT NULL,
    CONSTRAINT delivery_timer_pkey PRIMARY KEY (delivery_id),
    CONSTRAINT delivery_timer_kind CHECK (kind IN ('due', 'parked', 'inflight', 'dead'))
);

CREATE INDEX IF NOT EXISTS delivery_timer_due
    ON delivery_timer (destination_id, fire_at, delivery_id) WHERE kind = 'due';

CREATE INDEX IF NOT EXISTS delivery_timer_inflight
    ON delivery_timer (fire_at) WHERE kind = 'inflight';

CREATE INDEX IF NOT EXISTS delivery_timer_parked
    ON delivery_timer (destination_id, delivery_id) WHERE kind = 'parked';

-- The dead letters that hold their asset's queue, by destination and since when (status, the
-- dead heads): delivery_state has no index on its state, which each move changes.
CREATE INDEX IF NOT EXISTS delivery_timer_dead
    ON delivery_timer (destination_id, fire_at) WHERE kind = 'dead';

CREATE TABLE IF NOT EXISTS delivery_history (
    delivery_id        text NOT NULL,
    destination_id     text NOT NULL,
    asset_id           text NOT NULL,
    event_type         text NOT NULL,
    created_at         timestamptz NOT NULL,
    emit_seq           bigint,
    queued             boolean NOT NULL,
    state              text NOT NULL,
    attempt_count      integer NOT NULL,
    budget_used        integer NOT NULL,
    budget_started_at  timestamptz NOT NULL,
    dispatch_count     integer NOT NULL,
    next_attempt_at    timestamptz NOT NULL,
    current_message_id text,
    last_outcome       text,
    last_error         text,
    wait_reason        text,
    closed_reason      text,
    closed_by          text,
    finished_at        timestamptz NOT NULL,
    CONSTRAINT delivery_history_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_history_state CHECK (state IN ('succeeded', 'dead')),
    CONSTRAINT delivery_history_closed_only_when_dead CHECK (
        (closed_reason IS NULL AND closed_by IS NULL)
        OR (state = 'dead' AND closed_reason = 'discarded' AND closed_by IS NULL)
        OR (state = 'dead' AND closed_reason = 'superseded' AND closed_by IS NOT NULL))
) PARTITION BY RANGE (created_at);

-- Dead letters by destination (requeue, discard, status).
CREATE INDEX IF NOT EXISTS delivery_history_dead
    ON delivery_history (destination_id, finished_at) WHERE state = 'dead';

-- Successes by destination (status): its one key deduplicates, so that counting a partition's
-- successes reads a few pages, not its rows.
CREATE INDEX IF NOT EXISTS delivery_history_succeeded
    ON delivery_history (destination_id) WHERE state = 'succeeded';

-- What ended in a window (check's default pass, a run's own reading): a history row is written
-- when its delivery ends and never updated, so each partition's pages are in the order its rows
-- ended, and a block-range index finds a window's rows in the partitions' last pages for a few
-- bytes a page (a B-tree entry a delivery would cost each ending about 60 bytes of WAL).
CREATE INDEX IF NOT EXISTS delivery_history_finished
    ON delivery_history USING brin (finished_at);

CREATE TABLE IF NOT EXISTS dispatch_outbox_v3 (
    message_id           text NOT NULL,
    delivery_id          text NOT NULL,
    dispatch_no          integer NOT NULL,
    destination_id       text NOT NULL,
    run_id               text NOT NULL,
    delivery_created_at  timestamptz NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    published_at         timestamptz,
    CONSTRAINT dispatch_outbox_v3_pkey PRIMARY KEY (message_id, delivery_created_at),
    CONSTRAINT dispatch_outbox_v3_dispatch_no CHECK (dispatch_no >= 1),
    CONSTRAINT dispatch_outbox_v3_message_id_names_dispatch
        CHECK (message_id = delivery_id || ':' || dispatch_no)
) PARTITION BY RANGE (delivery_created_at);

CREATE INDEX IF NOT EXISTS dispatch_outbox_v3_by_run ON dispatch_outbox_v3 (run_id);

CREATE TABLE IF NOT EXISTS delivery_attempt_v2 (
    delivery_id          text NOT NULL,
    attempt_no           integer NOT NULL,
    destination_id       text NOT NULL,
    message_id           text,
    run_id               text,
    lease_token          uuid NOT NULL,
    delivery_created_at  timestamptz NOT NULL,
    started_at           timestamptz NOT NULL,
    finished_at          timestamptz NOT NULL,
    outcome              text NOT NULL,
    http_status          integer,
    error                text,
    response_excerpt     text,
    next_attempt_at      timestamptz,
    retry_reason         text,
    CONSTRAINT delivery_attempt_v2_pkey PRIMARY KEY (delivery_id, attempt_no, delivery_created_at),
    CONSTRAINT delivery_attempt_v2_attempt_no CHECK (attempt_no >= 1),
    CONSTRAINT delivery_attempt_v2_outcome
        CHECK (outcome IN ('success', 'rate_limited', 'retryable', 'ambiguous', 'rejected'))
) PARTITION BY RANGE (delivery_created_at);

CREATE INDEX IF NOT EXISTS delivery_attempt_v2_destination
    ON delivery_attempt_v2 (destination_id, started_at);

-- The identity of a delivery of this release is complete from its emit (destination, creation
-- time); once the duplicate window has passed its creation and nothing of it is open, retention
-- forgets it by this index.
CREATE INDEX CONCURRENTLY IF NOT EXISTS delivery_identity_created
    ON delivery_identity (created_at);

-- Partitions: [lower, lower + width) named <parent>_p<lower as epoch seconds>, made ahead by
-- this migration (a week), every delivery run and the retention job, each starting where the
-- last one of its table ended. Made as the tables' owner (a worker's role may not own them): an empty table
-- like its parent, attached (a lock that lets reads and writes of the parent through).
CREATE OR REPLACE FUNCTION media_hooks_make_partitions_v1(p_until timestamptz)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    width integer := (SELECT width_seconds FROM media_hooks_partitioning);
    parents CONSTANT text[] := ARRAY['delivery_body', 'delivery_history', 'dispatch_outbox_v3',
                                     'delivery_attempt_v2'];
    rel text;
    next_at timestamptz;
    child text;
    made integer := 0;
BEGIN
    -- One maker at a time (retention and every delivery run make ahead): two would both start
    -- where the last range ended and make the same partition.
    LOCK TABLE media_hooks_partition IN SHARE ROW EXCLUSIVE MODE;
    FOREACH rel IN ARRAY parents LOOP
        -- The first partition starts a width before now, aligned to the width.
        SELECT coalesce(max(p.upper_at),
                        to_timestamp(floor(extract(epoch FROM now()) / width) * width - width))
          INTO next_at
          FROM media_hooks_partition AS p
         WHERE p.parent = rel;
        WHILE next_at < p_until LOOP
            child := rel || '_p' || extract(epoch FROM next_at)::bigint;
            EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                           child, rel);
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                           rel, child, next_at, next_at + make_interval(secs => width));
            INSERT INTO media_hooks_partition (parent, child, lower_at, upper_at)
            VALUES (rel, child, next_at, next_at + make_interval(secs => width));
            next_at := next_at + make_interval(secs => width);
            made := made + 1;
        END LOOP;
    END LOOP;
    RETURN made;
END
$$;

SELECT media_hooks_make_partitions_v1(now() + interval '7 days');

-- Before the first range, one partition of each table for whatever was created earlier: the
-- previous release's deliveries as they move into this layout (convert_previous_pending) keep
-- their creation time.
DO $$
DECLARE
    rel text;
    first_at timestamptz;
BEGIN
    FOREACH rel IN ARRAY ARRAY['delivery_body', 'delivery_history', 'dispatch_outbox_v3',
                               'delivery_attempt_v2'] LOOP
        IF to_regclass(rel || '_before') IS NULL THEN
            SELECT min(p.lower_at) INTO first_at FROM media_hooks_partition AS p
            WHERE p.parent = rel;
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (MINVALUE) TO (%L)',
                           rel || '_before', rel, first_at);
            INSERT INTO media_hooks_partition (parent, child, lower_at, upper_at)
            -- Its lower bound is MINVALUE; the ledger says the epoch (nothing is older).
            VALUES (rel, rel || '_before', to_timestamp(0), first_at);
        END IF;
    END LOOP;
END
$$;

-- A delivery's request body, read by the lease: its payload and body rows are found by the key
-- they were written under (one partition, pruned at run time).
CREATE OR REPLACE FUNCTION media_hooks_body_v1(p_delivery_id text, p_created_at timestamptz)
RETURNS bytea
LANGUAGE sql
STABLE
AS $$
    SELECT b.body FROM delivery_body AS b
    WHERE b.delivery_id = p_delivery_id AND b.created_at = p_created_at
$$;

CREATE OR REPLACE FUNCTION media_hooks_payload_v1(p_delivery_id text, p_created_at timestamptz)
RETURNS jsonb
LANGUAGE sql
STABLE
AS $$
    SELECT b.payload FROM delivery_body AS b
    WHERE b.delivery_id = p_delivery_id AND b.created_at = p_created_at
$$;

-- A cohort (media_hooks_in_cohort's rule) over a delivery's columns, whichever table holds it.
CREATE OR REPLACE FUNCTION media_hooks_in_cohort_v2(
    p_destination_id text, p_event_type text, p_asset_id text, p_created_at timestamptz,
    destination_ids text[], event_types text[], asset_ids text[],
    created_after timestamptz, created_before timestamptz)
RETURNS boolean
LANGUAGE sql
IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (cardinality(destination_ids) = 0 OR p_destination_id = ANY (destination_ids))
       AND (cardinality(event_types) = 0 OR p_event_type = ANY (event_types))
       AND (cardinality(asset_ids) = 0 OR p_asset_id = ANY (asset_ids))
       AND (created_after IS NULL OR p_created_at >= created_after)
       AND (created_before IS NULL OR p_created_at < created_before)
$$;

-- The claim's rule for per-asset order and latest-wins, over both layouts' queues: an asset's
-- queue holds the previous release's deliveries and this one's while they overlap. Every row of
-- delivery_state is open and unclosed (a delivery that succeeds or is closed leaves it), so its
-- arms need only its queue. The previous release's claims call this function too: its body
-- reads this release's deliveries as well, so that neither release sends a delivery ahead of
-- an earlier one the other recorded (its arms over the previous layout are as they were).
CREATE OR REPLACE FUNCTION media_hooks_held_by_v2(
    p_ordering text, p_coalescing text, p_destination_id text, p_asset_id text,
    p_event_type text, p_created_at timestamptz, p_emit_seq bigint, p_delivery_id text)
RETURNS SETOF text
LANGUAGE sql
STABLE
AS $$
    SELECT e.delivery_id
    FROM webhook_delivery_v1 AS e
    WHERE p_ordering = 'asset'
      AND e.destination_id = p_destination_id AND e.asset_id = p_asset_id
      AND e.queued IS NOT FALSE
      AND e.state <> 'succeeded' AND e.closed_reason IS NULL
      AND (e.created_at, e.emit_seq) < (p_created_at, p_emit_seq)
    UNION ALL
    SELECT e.delivery_id
    FROM webhook_delivery_v1 AS e
    WHERE p_ordering = 'asset'
      AND e.destination_id = p_destination_id AND e.asset_id = p_asset_id
      AND e.queued IS NOT FALSE
      AND e.state <> 'succeeded' AND e.closed_reason IS NULL
      AND e.created_at = p_created_at AND e.emit_seq IS NULL
      AND (p_emit_seq IS NOT NULL OR e.delivery_id < p_delivery_id)
    UNION ALL
    SELECT n.delivery_id
    FROM webhook_delivery_v1 AS n
    WHERE p_coalescing = 'asset'
      AND n.destination_id = p_destination_id AND n.asset_id = p_asset_id
      AND n.queued IS NOT FALSE
      AND n.state <> 'succeeded' AND n.closed_reason IS NULL
      AND n.event_type = p_event_type
      AND n.delivery_id <> p_delivery_id
      AND ((n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
               > (p_created_at, coalesce(p_emit_seq, 0), p_delivery_id)
           OR n.state IN ('enqueued', 'leased'))
    UNION ALL
    SELECT e.delivery_id
    FROM delivery_state AS e
    WHERE p_ordering = 'asset'
      AND e.destination_id = p_destination_id AND e.asset_id = p_asset_id AND e.queued
      AND (e.created_at, e.emit_seq) < (p_created_at, p_emit_seq)
    UNION ALL
    SELECT e.delivery_id
    FROM delivery_state AS e
    WHERE p_ordering = 'asset'
      AND e.destination_id = p_destination_id AND e.asset_id = p_asset_id AND e.queued
      AND e.created_at = p_created_at AND e.emit_seq IS NULL
      AND (p_emit_seq IS NOT NULL OR e.delivery_id < p_delivery_id)
    UNION ALL
    SELECT n.delivery_id
    FROM delivery_state AS n
    WHERE p_coalescing = 'asset'
      AND n.destination_id = p_destination_id AND n.asset_id = p_asset_id AND n.queued
      AND n.event_type = p_event_type
      AND n.delivery_id <> p_delivery_id
      AND ((n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
               > (p_created_at, coalesce(p_emit_seq, 0), p_delivery_id)
           OR n.state IN ('enqueued', 'leased'))
$$;

-- An asset's queue lost its head (a delivery succeeded, was closed, or left the table): the
-- next one, in either layout, is made due if it was parked. Its claim still applies the rule
-- (media_hooks_held_by_v2): waking one that is not the head costs a pass of the claim, never
-- the order.
CREATE OR REPLACE FUNCTION media_hooks_wake_queue_head_v1(
    p_destination_id text, p_asset_id text, p_leaving text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    head record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_destination AS w
                   WHERE w.destination_id = p_destination_id AND w.ordering = 'asset') THEN
        RETURN;
    END IF;
    SELECT q.delivery_id, q.lean INTO head
    FROM (
        (SELECT e.delivery_id, e.created_at, coalesce(e.emit_seq, 0) AS seq, false AS lean
         FROM webhook_delivery_v1 AS e
         WHERE e.destination_id = p_destination_id AND e.asset_id = p_asset_id
           AND e.queued IS NOT FALSE
           AND e.state <> 'succeeded' AND e.closed_reason IS NULL
           AND e.delivery_id <> p_leaving
         ORDER BY e.created_at, coalesce(e.emit_seq, 0), e.delivery_id
         LIMIT 1)
        UNION ALL
        (SELECT s.delivery_id, s.created_at, coalesce(s.emit_seq, 0), true
         FROM delivery_state AS s
         WHERE s.destination_id = p_destination_id AND s.asset_id = p_asset_id AND s.queued
           AND s.delivery_id <> p_leaving
         ORDER BY s.created_at, coalesce(s.emit_seq, 0), s.delivery_id
         LIMIT 1)
    ) AS q
    ORDER BY q.created_at, q.seq, q.delivery_id
    LIMIT 1;
    IF head.delivery_id IS NULL THEN
        RETURN;
    ELSIF head.lean THEN
        UPDATE delivery_timer AS t
        SET kind = 'due', fire_at = now()
        WHERE t.delivery_id = head.delivery_id AND t.kind = 'parked';
        IF FOUND THEN
            UPDATE delivery_state AS s
            SET next_attempt_at = now(),
                wait_reason = 'released: the earlier deliveries of its asset are done',
                updated_at = now()
            WHERE s.delivery_id = head.delivery_id AND s.state = 'pending';
        END IF;
    ELSE
        UPDATE webhook_delivery_v1 AS d
        SET next_attempt_at = now(),
            wait_reason = 'released: the earlier deliveries of its asset are done'
        WHERE d.delivery_id = head.delivery_id
          AND d.state = 'pending'
          AND d.next_attempt_at >= timestamptz '9999-01-01 00:00:00+00';
    END IF;
END
$$;

-- The previous release's trigger on webhook_delivery_v1 wakes the next head in either layout.
CREATE OR REPLACE FUNCTION media_hooks_release_queue_head_v1()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM media_hooks_wake_queue_head_v1(OLD.destination_id, OLD.asset_id, OLD.delivery_id);
    RETURN NULL;
END
$$;

-- A delivery leaves delivery_state when it succeeds, ends unqueued, is closed or is purged:
-- if it was in its asset's queue, the next one may go.
CREATE OR REPLACE FUNCTION media_hooks_state_left_queue_v1()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM media_hooks_wake_queue_head_v1(OLD.destination_id, OLD.asset_id, OLD.delivery_id);
    RETURN NULL;
END
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'delivery_state_left_queue') THEN
        CREATE TRIGGER delivery_state_left_queue AFTER DELETE ON delivery_state
            FOR EACH ROW WHEN (OLD.queued)
            EXECUTE FUNCTION media_hooks_state_left_queue_v1();
    END IF;
END
$$;

-- A destination that starts to order or coalesce by asset queues its open deliveries, in
-- both layouts (0029's rule).
CREATE OR REPLACE FUNCTION media_hooks_queue_backlog_v1()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM webhook_destination AS w
    WHERE w.destination_id = NEW.destination_id
    FOR UPDATE;
    UPDATE webhook_delivery_v1 AS d
    SET queued = true
    WHERE d.destination_id = NEW.destination_id
      AND d.queued = false
      AND (d.state = 'pending' OR d.state = 'enqueued' OR d.state = 'leased'
           OR d.state = 'dead')
      AND d.closed_reason IS NULL;
    UPDATE delivery_state AS s
    SET queued = true
    WHERE s.destination_id = NEW.destination_id AND NOT s.queued;
    -- Its dead letters (not closed) hold their asset's queue from now on, as open rows do: they
    -- come back from history to delivery_state, dead and queued, with a dead letter's timer.
    WITH revived AS (
        DELETE FROM delivery_history AS h
        WHERE h.destination_id = NEW.destination_id
          AND h.state = 'dead' AND h.closed_reason IS NULL
        RETURNING h.*
    ),
    revived_state AS (
        INSERT INTO delivery_state
            (delivery_id, destination_id, asset_id, event_type, created_at, emit_seq, queued,
             state, attempt_count, budget_used, budget_started_at, dispatch_count,
             next_attempt_at, current_message_id, last_outcome, last_error, wait_reason,
             updated_at)
        SELECT r.delivery_id, r.destination_id, r.asset_id, r.event_type, r.created_at,
               r.emit_seq, true, 'dead', r.attempt_count, r.budget_used, r.budget_started_at,
               r.dispatch_count, r.next_attempt_at, r.current_message_id, r.last_outcome,
               r.last_error, r.wait_reason, r.finished_at
        FROM revived AS r
    )
    INSERT INTO delivery_timer (delivery_id, destination_id, kind, fire_at)
    SELECT r.delivery_id, r.destination_id, 'dead', r.finished_at FROM revived AS r;
    RETURN NEW;
END
$$;

-- Lease offered deliveries of delivery_state (the lease of 0005 and 0009, on this layout): the
-- move is heap-only (no index of delivery_state names a column it changes); the attempt it
-- starts is the lease itself (its start and run on the row) until it ends, when its row is
-- written whole (media_hooks_record_outcomes_v2, media_hooks_end_leases_v2). A pending offer
-- (its expired lease ended by the takeover below) was due: its timer goes in flight.
CREATE OR REPLACE FUNCTION media_hooks_lease_state_v1(
    p_run_id text, p_delivery_ids text[], p_message_ids text[], p_lease_seconds double precision)
RETURNS TABLE(delivery_id text, message_id text, lease_token uuid, attempt_no integer,
              budget_used integer, body bytea)
LANGUAGE plpgsql
SET plan_cache_mode TO 'force_generic_plan'
SET enable_seqscan TO 'off'
AS $$
#variable_conflict use_column
DECLARE
    leased_now integer;
    leased_total integer := 0;
BEGIN
    FOR pass IN 1 .. 2 LOOP
        RETURN QUERY
        WITH wanted AS (
            SELECT *
            FROM unnest(p_delivery_ids, p_message_ids) AS w(delivery_id, message_id)
        ),
        leased AS (
            UPDATE delivery_state AS d
            SET state = 'leased',
                lease_token = gen_random_uuid(),
                lease_until = now() + make_interval(secs => p_lease_seconds),
                lease_started_at = now(),
                lease_run_id = p_run_id,
                attempt_count = d.attempt_count + 1,
                budget_used = d.budget_used + 1,
                updated_at = now()
            FROM wanted, webhook_destination AS w
            WHERE d.delivery_id = wanted.delivery_id
              AND d.current_message_id = wanted.message_id
              AND CASE d.state
                      WHEN 'enqueued' THEN true
                      WHEN 'pending' THEN d.next_attempt_at <= now()
                      ELSE false
                  END
              AND w.destination_id = d.destination_id
              AND NOT EXISTS (
                  SELECT FROM media_hooks_held_by_v2(w.ordering, 'none', d.destination_id,
                                                     d.asset_id, d.event_type, d.created_at,
                                                     d.emit_seq, d.delivery_id))
            RETURNING d.delivery_id, d.current_message_id AS message_id, d.lease_token,
                      d.attempt_count AS attempt_no, d.budget_used, d.created_at
        ),
        timed AS (
            UPDATE delivery_timer AS t
            SET kind = 'inflight', fire_at = now()
            FROM leased AS l
            WHERE t.delivery_id = l.delivery_id AND t.kind <> 'inflight'
        )
        SELECT l.delivery_id, l.message_id, l.lease_token, l.attempt_no, l.budget_used,
               media_hooks_body_v1(l.delivery_id, l.created_at)
        FROM leased AS l;
        GET DIAGNOSTICS leased_now = ROW_COUNT;
        leased_total := leased_total + leased_now;
        EXIT WHEN leased_total = cardinality(p_delivery_ids);
        -- Held offers are handed back parked (after each pass: the second leases deliveries
        -- whose expired lease just ended, which may be held as well).
        WITH held AS (
            UPDATE delivery_state AS d
            SET state = 'pending',
                next_attempt_at = parked.next_attempt_at,
                wait_reason = parked.wait_reason,
                updated_at = now()
            FROM unnest(p_delivery_ids, p_message_ids) AS wanted(delivery_id, message_id),
                 webhook_destination AS w,
                 media_hooks_parking_v2(true, now()) AS parked
            WHERE d.delivery_id = wanted.delivery_id
              AND d.current_message_id = wanted.message_id
              AND CASE d.state
                      WHEN 'enqueued' THEN true
                      WHEN 'pending' THEN d.next_attempt_at <= now()
                      ELSE false
                  END
              AND w.destination_id = d.destination_id
              AND w.ordering = 'asset'
              AND EXISTS (
                  SELECT FROM media_hooks_held_by_v2(w.ordering, 'none', d.destination_id,
                                                     d.asset_id, d.event_type, d.created_at,
                                                     d.emit_seq, d.delivery_id))
            RETURNING d.delivery_id, d.next_attempt_at
        )
        UPDATE delivery_timer AS t
        SET kind = 'parked', fire_at = held.next_attempt_at
        FROM held
        WHERE t.delivery_id = held.delivery_id;
        EXIT WHEN pass = 2;
        -- Some were not leased: those whose lease expired end now; the second pass leases the
        -- ones that came out pending (the rest were leased already, or are stale or ended).
        PERFORM 1 FROM media_hooks_end_leases_v2(
            p_delivery_ids, true,
            'lease expiry (taken over by run ' || p_run_id || ')',
            'lease expired before an outcome was recorded (worker lost or too slow)') AS ended
        WHERE ended.state = 'pending';
        EXIT WHEN NOT FOUND;
    END LOOP;
END
$$;

-- An ended delivery's history row, made of its last state row: the one way every statement that
-- ends a delivery of this layout writes it (the record, a lease that ended without an outcome,
-- a supersession, a discard). It ended now.
CREATE OR REPLACE FUNCTION media_hooks_history_row_v1(
    s delivery_state, p_state text, p_budget_used integer, p_next_attempt_at timestamptz,
    p_last_outcome text, p_last_error text, p_wait_reason text,
    p_closed_reason text DEFAULT NULL, p_closed_by text DEFAULT NULL)
RETURNS delivery_history
LANGUAGE sql
STABLE
AS $$
    SELECT s.delivery_id, s.destination_id, s.asset_id, s.event_type, s.created_at, s.emit_seq,
           s.queued, p_state, s.attempt_count, p_budget_used, s.budget_started_at,
           s.dispatch_count, p_next_attempt_at, s.current_message_id, p_last_outcome,
           p_last_error, p_wait_reason, p_closed_reason, p_closed_by, now()
$$;

-- A delivery closed unsent (superseded, discarded): dead, as it last was.
CREATE OR REPLACE FUNCTION media_hooks_closed_row_v1(
    s delivery_state, p_closed_reason text, p_closed_by text, p_wait_reason text)
RETURNS delivery_history
LANGUAGE sql
STABLE
AS $$
    SELECT * FROM media_hooks_history_row_v1(
        s, 'dead', s.budget_used, s.next_attempt_at, s.last_outcome, s.last_error,
        p_wait_reason, p_closed_reason, p_closed_by)
$$;

-- The one rule for a lease of delivery_state that ends without an outcome (0005's, on this
-- layout): the attempt it started is written ended as ambiguous (the request may or may not have
-- reached the receiver), and the delivery is due again now, or dead once its retry budget or
-- maximum age is spent. A dead delivery that holds its asset's queue stays (dead) until an
-- operator requeues or discards it; any other is written to history. Rows another transaction
-- holds (a takeover in progress) are left to it.
-- keeps: invariants 3, 4 (the token goes: the lost worker can record nothing) and 9 (the
--   ambiguous attempt is written before the delivery can be sent again).
CREATE OR REPLACE FUNCTION media_hooks_end_leases_v2(
    p_delivery_ids text[], p_expired_only boolean, p_cause text, p_error text)
RETURNS TABLE(delivery_id text, state text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH ending AS (
        SELECT d.delivery_id, d.lease_token, d.attempt_count, d.lease_started_at,
               d.lease_run_id, d.current_message_id, d.destination_id, d.created_at, d.queued,
               CASE
                   WHEN extract(epoch FROM now() - d.budget_started_at) >= w.max_age_seconds
                       THEN 'dead: older than the maximum delivery age (' || w.max_age_seconds
                            || ' s); the last lease ended without an outcome (' || p_cause || ')'
                   WHEN d.budget_used >= w.max_attempts
                       THEN 'dead: retry budget spent (' || w.max_attempts
                            || ' attempts); the last lease ended without an outcome ('
                            || p_cause || ')'
               END AS death
        FROM delivery_state AS d
        JOIN webhook_destination AS w ON w.destination_id = d.destination_id
        WHERE d.delivery_id = ANY (p_delivery_ids)
          AND d.state = 'leased'
          AND (NOT p_expired_only OR d.lease_until < now())
        FOR UPDATE OF d SKIP LOCKED
    ),
    -- Due again, or dead holding its asset's queue: the row stays.
    kept AS (
        UPDATE delivery_state AS d
        SET state = CASE WHEN ending.death IS NULL THEN 'pending' ELSE 'dead' END,
            next_attempt_at = now(),
            lease_until = NULL,
            lease_token = NULL,
            lease_started_at = NULL,
            lease_run_id = NULL,
            last_outcome = 'ambiguous',
            last_error = p_error,
            wait_reason = coalesce(ending.death, p_cause || ': due again now'),
            updated_at = now()
        FROM ending
        WHERE d.delivery_id = ending.delivery_id
          AND (ending.death IS NULL OR ending.queued)
        RETURNING d.delivery_id, d.state
    ),
    -- Due now, or a dead letter from now (it waits for an operator).
    retimed AS (
        UPDATE delivery_timer AS t
        SET kind = CASE WHEN kept.state = 'pending' THEN 'due' ELSE 'dead' END, fire_at = now()
        FROM kept
        WHERE t.delivery_id = kept.delivery_id
    ),
    -- Dead, and in no queue: written to history.
    ended AS (
        DELETE FROM delivery_state AS d
        USING ending
        WHERE d.delivery_id = ending.delivery_id
          AND ending.death IS NOT NULL AND NOT ending.queued
        RETURNING d.*,
                  media_hooks_history_row_v1(d, 'dead', d.budget_used, now(), 'ambiguous',
                                             p_error, ending.death) AS ended_row
    ),
    history AS (
        INSERT INTO delivery_history SELECT (e.ended_row).* FROM ended AS e
    ),
    untimed AS (
        DELETE FROM delivery_timer AS t USING ended WHERE t.delivery_id = ended.delivery_id
    ),
    attempts AS (
        INSERT INTO delivery_attempt_v2
            (delivery_id, attempt_no, destination_id, message_id, run_id, lease_token,
             delivery_created_at, started_at, finished_at, outcome, error, retry_reason)
        SELECT e.delivery_id, e.attempt_count, e.destination_id, e.current_message_id,
               e.lease_run_id, e.lease_token, e.created_at, e.lease_started_at,
               greatest(now(), e.lease_started_at), 'ambiguous', p_error, p_cause
        FROM ending AS e
    )
    SELECT kept.delivery_id, kept.state FROM kept
    UNION ALL
    SELECT ended.delivery_id, 'dead' FROM ended;
END
$$;

-- The previous layout's leases end by its rule (media_hooks_end_leases_v1, 0005), whose body
-- reads them under the contract's name, webhook_delivery. Once the contract migration (0035) has
-- ended every one of them and put both layouts under that name, a lease of the previous layout
-- can no longer start, and this release's sweeps and requeue call that rule only for one there is.
CREATE OR REPLACE FUNCTION media_hooks_end_previous_leases_v1(
    p_delivery_ids text[], p_expired_only boolean, p_cause text, p_error text)
RETURNS TABLE(delivery_id text, state text)
LANGUAGE plpgsql
AS $$
BEGIN
    IF cardinality(p_delivery_ids) > 0 THEN
        RETURN QUERY
        SELECT * FROM media_hooks_end_leases_v1(p_delivery_ids, p_expired_only, p_cause, p_error);
    END IF;
END
$$;

-- The lease of either layout's deliveries, under the name both releases' worker step
-- (media_hooks_lease_with_permits_v4, 0015) calls: each offered message is leased where its
-- delivery is (an offer is the previous release's or this one's, never both), with that
-- layout's rule for a lease that ended without an outcome and for an offer held behind its
-- asset. The previous layout's lease (0021's body) keeps its rule under a name of its own; one
-- statement renames it and puts the dispatch in its place, so no call finds the name missing.
-- keeps: invariants 3, 4, 5, 9 and 10 as each layout's lease keeps them.
DO $do$
BEGIN
    IF to_regprocedure('media_hooks_lease_previous_layout_v1(text, text[], text[], double precision)')
       IS NOT NULL THEN
        RETURN;
    END IF;
    ALTER FUNCTION media_hooks_lease_v2(text, text[], text[], double precision)
        RENAME TO media_hooks_lease_previous_layout_v1;
    CREATE FUNCTION media_hooks_lease_v2(
        p_run_id text, p_delivery_ids text[], p_message_ids text[],
        p_lease_seconds double precision)
    RETURNS TABLE(delivery_id text, message_id text, lease_token uuid, attempt_no integer,
                  budget_used integer, body bytea)
    LANGUAGE plpgsql
    AS $fn$
    BEGIN
        RETURN QUERY
        SELECT * FROM media_hooks_lease_state_v1(p_run_id, p_delivery_ids, p_message_ids,
                                                 p_lease_seconds);
        IF EXISTS (SELECT 1 FROM webhook_delivery_v1 AS d
                   WHERE d.delivery_id = ANY (p_delivery_ids)) THEN
            RETURN QUERY
            SELECT * FROM media_hooks_lease_previous_layout_v1(
                p_run_id, p_delivery_ids, p_message_ids, p_lease_seconds);
        END IF;
    END
    $fn$;
END
$do$;

-- The record of 0017 on this layout: outcomes of leases of delivery_state, classified by the
-- runtime; the database decides the rest as media_hooks_record_outcomes_v1 does (the same
-- rules, the same reasons). A retry, or a dead delivery that holds its asset's queue, stays in
-- delivery_state (a heap-only move) and its timer is set; an ended delivery is written to
-- history and leaves delivery_state and its timer. The attempt is written once, ended.
-- keeps: invariant 4 (only the current lease holder moves the row: the token), 5, 6 (the
--   table owns the retry clock), 9 (every started request has its attempt row).
CREATE OR REPLACE FUNCTION media_hooks_record_outcomes_v2(p_outcomes jsonb)
 RETURNS TABLE(delivery_id text, state text, stopped text)
 LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    shortest_base CONSTANT double precision := 0.1;
    longest_delay CONSTANT double precision := 2592000;
    private_setting CONSTANT text := 'MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1';
    bad text;
    pause record;
BEGIN
    SELECT coalesce(g.outcome, 'null') INTO bad
    FROM jsonb_to_recordset(p_outcomes) AS g(outcome text)
    WHERE g.outcome IS NULL
       OR g.outcome NOT IN ('success', 'rate_limited', 'retryable', 'ambiguous', 'rejected')
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'unknown outcome class %: expected success, rate_limited, retryable, '
                        'ambiguous or rejected', quote_literal(bad)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Pauses first: the limiter's lock before any delivery row's (the top of this file).
    IF p_outcomes @> '[{"outcome": "rate_limited"}]' THEN
        FOR pause IN
            SELECT DISTINCT ON (w.destination_id)
                   w.destination_id, waits.seconds,
                   'HTTP ' || coalesce(g.http_status::text, '?')
                   || CASE WHEN g.retry_after IS NULL
                           THEN ' without Retry-After: ' ELSE ' with Retry-After ' END
                   || media_hooks_whole_seconds_v1(waits.seconds) || ' s' AS why
            FROM jsonb_to_recordset(p_outcomes)
                 AS g(delivery_id text, outcome text, http_status integer,
                      retry_after double precision)
            JOIN delivery_state AS d ON d.delivery_id = g.delivery_id
            JOIN webhook_destination AS w ON w.destination_id = d.destination_id
            CROSS JOIN LATERAL (
                SELECT coalesce(media_hooks_retry_after_seconds_v1(g.retry_after),
                                least(greatest(w.backoff_base_seconds, shortest_base),
                                      longest_delay)) AS seconds
            ) AS waits
            WHERE g.outcome = 'rate_limited'
            ORDER BY w.destination_id, waits.seconds DESC
        LOOP
            IF pause.seconds > 0 THEN
                PERFORM media_hooks_pause_destination_v1(pause.destination_id, pause.seconds,
                                                         pause.why);
            END IF;
        END LOOP;
    END IF;

    RETURN QUERY
    WITH given AS (
        SELECT g.*, NOT coalesce(g.attempted, true) OR coalesce(g.configuration_fault, false)
                    AS spare
        FROM jsonb_to_recordset(p_outcomes)
             AS g(delivery_id text, lease_token uuid, outcome text, http_status integer,
                  retry_after double precision, error text, excerpt text,
                  finished_ago double precision, attempted boolean,
                  configuration_fault boolean)
    ),
    decided AS (
        SELECT g.delivery_id, g.lease_token, g.outcome, g.error, g.finished_ago,
               CASE WHEN g.spare THEN NULL ELSE g.http_status END AS http_status,
               CASE WHEN g.spare THEN NULL ELSE g.excerpt END AS excerpt,
               g.spare,
               d.attempt_count AS attempt_no, d.queued, d.lease_started_at, d.lease_run_id,
               d.current_message_id, d.created_at,
               fate.next_state,
               wait.delay,
               CASE
                   WHEN fate.next_state <> 'pending' OR g.outcome = 'success' THEN fate.death
                   WHEN coalesce(g.configuration_fault, false)
                       THEN 'waiting: destination ' || d.destination_id || ' is disabled '
                            || '(configuration fault, see `media-hooks destination list`)'
                   WHEN g.spare THEN 'due again: its worker stopped before sending it'
                   WHEN g.outcome = 'rate_limited' AND g.retry_after IS NOT NULL
                       THEN 'Retry-After ' || media_hooks_whole_seconds_v1(wait.delay)
                            || ' s (HTTP ' || coalesce(g.http_status::text, '?') || ')'
                   WHEN g.outcome = 'rate_limited'
                       THEN 'rate limited (HTTP ' || coalesce(g.http_status::text, '?')
                            || ', no Retry-After): ' || media_hooks_whole_seconds_v1(wait.delay)
                            || ' s'
                   ELSE 'backoff ' || media_hooks_whole_seconds_v1(wait.delay)
                        || ' s after attempt ' || d.attempt_count || ' (' || g.outcome || ')'
               END AS reason
        FROM given AS g
        -- The fence is the token alone, looked up by key (the previous statement's reason:
        -- record_outcomes in sql/queries/leases.sql).
        JOIN delivery_state AS d
          ON d.delivery_id = g.delivery_id AND d.lease_token = g.lease_token
        JOIN webhook_destination AS w ON w.destination_id = d.destination_id
        CROSS JOIN LATERAL (
            SELECT CASE
                       WHEN g.outcome = 'success' THEN 'succeeded'
                       WHEN g.outcome = 'rejected' THEN 'dead'
                       WHEN g.spare THEN 'pending'
                       -- In seconds, not as an interval: no stored value can overflow the test.
                       WHEN extract(epoch FROM now() - d.budget_started_at) >= w.max_age_seconds
                           THEN 'dead'
                       WHEN g.outcome <> 'rate_limited' AND d.budget_used >= w.max_attempts
                           THEN 'dead'
                       ELSE 'pending'
                   END AS next_state,
                   CASE
                       WHEN g.outcome IN ('success', 'rejected') OR g.spare THEN NULL
                       WHEN extract(epoch FROM now() - d.budget_started_at) >= w.max_age_seconds
                           THEN 'dead: older than the maximum delivery age ('
                                || w.max_age_seconds || ' s)'
                       WHEN g.outcome <> 'rate_limited' AND d.budget_used >= w.max_attempts
                           THEN 'dead: retry budget spent (' || w.max_attempts || ' attempts)'
                   END AS death
        ) AS fate
        CROSS JOIN LATERAL (
            SELECT CASE
                       WHEN g.spare OR g.outcome IN ('success', 'rejected') THEN 0
                       WHEN g.outcome = 'rate_limited'
                           THEN coalesce(media_hooks_retry_after_seconds_v1(g.retry_after),
                                         least(greatest(w.backoff_base_seconds, shortest_base),
                                               longest_delay))
                       ELSE media_hooks_backoff_seconds_v1(
                                d.budget_used,
                                least(greatest(w.backoff_base_seconds, shortest_base), longest_delay),
                                least(greatest(w.backoff_cap_seconds, shortest_base), longest_delay),
                                random())
                   END AS delay
        ) AS wait
    ),
    -- The row a move keeps: due again (a retry), or dead holding its asset's queue. Heap-only:
    -- no index of delivery_state names a column this changes.
    kept AS (
        UPDATE delivery_state AS d
        SET state = decided.next_state,
            next_attempt_at = CASE WHEN decided.next_state = 'pending'
                                   THEN now() + make_interval(secs => decided.delay)
                                   ELSE d.next_attempt_at END,
            -- A rate-limited or spared attempt gives its unit of retry budget back.
            budget_used = CASE WHEN decided.outcome = 'rate_limited' OR decided.spare
                               THEN greatest(d.budget_used - 1, 0) ELSE d.budget_used END,
            lease_until = NULL,
            lease_token = NULL,
            lease_started_at = NULL,
            lease_run_id = NULL,
            last_outcome = decided.outcome,
            last_error = decided.error,
            wait_reason = decided.reason,
            updated_at = now()
        FROM decided
        WHERE d.delivery_id = decided.delivery_id
          AND d.lease_token = decided.lease_token
          AND (decided.next_state = 'pending' OR (decided.next_state = 'dead' AND d.queued))
        RETURNING d.delivery_id, d.destination_id, d.state, d.next_attempt_at,
                  d.budget_used, d.created_at
    ),
    -- Due at its retry, or a dead letter from now (it waits for an operator).
    retimed AS (
        UPDATE delivery_timer AS t
        SET kind = CASE WHEN kept.state = 'pending' THEN 'due' ELSE 'dead' END,
            fire_at = CASE WHEN kept.state = 'pending' THEN kept.next_attempt_at ELSE now() END
        FROM kept
        WHERE t.delivery_id = kept.delivery_id
    ),
    -- The delivery ended (succeeded, or dead in no queue): it leaves delivery_state for history,
    -- written once.
    ended AS (
        DELETE FROM delivery_state AS d
        USING decided
        WHERE d.delivery_id = decided.delivery_id
          AND d.lease_token = decided.lease_token
          AND (decided.next_state = 'succeeded' OR (decided.next_state = 'dead' AND NOT d.queued))
        RETURNING d.*, decided.next_state,
                  media_hooks_history_row_v1(
                      d, decided.next_state,
                      CASE WHEN decided.outcome = 'rate_limited' OR decided.spare
                           THEN greatest(d.budget_used - 1, 0) ELSE d.budget_used END,
                      d.next_attempt_at, decided.outcome, decided.error, decided.reason)
                      AS ended_row
    ),
    history AS (
        INSERT INTO delivery_history SELECT (e.ended_row).* FROM ended AS e
        RETURNING delivery_id, destination_id, state, next_attempt_at, created_at
    ),
    untimed AS (
        DELETE FROM delivery_timer AS t USING ended WHERE t.delivery_id = ended.delivery_id
    ),
    moved AS (
        SELECT k.delivery_id, k.destination_id, k.state, k.next_attempt_at FROM kept AS k
        UNION ALL
        SELECT h.delivery_id, h.destination_id, h.state, h.next_attempt_at FROM history AS h
    ),
    -- The attempt, written once as it ended.
    closed AS (
        INSERT INTO delivery_attempt_v2
            (delivery_id, attempt_no, destination_id, message_id, run_id, lease_token,
             delivery_created_at, started_at, finished_at, outcome, http_status, error,
             response_excerpt, next_attempt_at, retry_reason)
        SELECT decided.delivery_id, decided.attempt_no, moved.destination_id,
               decided.current_message_id, decided.lease_run_id, decided.lease_token,
               decided.created_at, decided.lease_started_at,
               greatest(decided.lease_started_at,
                        now() - make_interval(secs => greatest(decided.finished_ago, 0))),
               decided.outcome, decided.http_status, decided.error, decided.excerpt,
               CASE WHEN moved.state = 'pending' THEN moved.next_attempt_at END, decided.reason
        FROM moved
        JOIN decided ON decided.delivery_id = moved.delivery_id
    ),
    -- Latest wins (0020): on a destination that coalesces by asset, a success closes the older
    -- deliveries of its asset and type still waiting, as sweep_superseded would, in either
    -- layout. Sent after it, one would leave the receiver on stale content, and nothing else
    -- closes it: the sweep and the claim's rule (media_hooks_held_by_v2) read only open rows,
    -- never a newer success. One asset's open queue is read (delivery_state_queue,
    -- webhook_delivery_queue); a row another session holds is skipped.
    newer AS (
        SELECT s.delivery_id, s.destination_id, s.asset_id, s.event_type, s.created_at,
               s.emit_seq
        FROM ended AS s
        JOIN webhook_destination AS w
          ON w.destination_id = s.destination_id AND w.coalescing = 'asset'
        WHERE s.next_state = 'succeeded'
    ),
    stale AS (
        SELECT older.delivery_id, n.delivery_id AS newer_id
        FROM newer AS n
        CROSS JOIN LATERAL (
            SELECT e.delivery_id
            FROM delivery_state AS e
            WHERE e.destination_id = n.destination_id AND e.asset_id = n.asset_id
              AND e.queued AND e.state = 'pending'
              AND e.event_type = n.event_type
              AND (e.created_at, coalesce(e.emit_seq, 0), e.delivery_id)
                  < (n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
            FOR UPDATE SKIP LOCKED
        ) AS older
    ),
    superseded AS (
        DELETE FROM delivery_state AS o
        USING stale
        WHERE o.delivery_id = stale.delivery_id AND o.state = 'pending'
        RETURNING o.delivery_id,
                  media_hooks_closed_row_v1(o, 'superseded', stale.newer_id,
                                            'superseded by ' || stale.newer_id) AS ended_row
    ),
    superseded_history AS (
        INSERT INTO delivery_history SELECT (o.ended_row).* FROM superseded AS o
    ),
    superseded_untimed AS (
        DELETE FROM delivery_timer AS t
        USING superseded AS o
        WHERE t.delivery_id = o.delivery_id
    ),
    superseded_previous AS (
        UPDATE webhook_delivery_v1 AS o
        SET state = 'dead',
            closed_reason = 'superseded',
            closed_by = stale.newer_id,
            wait_reason = 'superseded by ' || stale.newer_id,
            updated_at = now()
        FROM (
            SELECT older.delivery_id, n.delivery_id AS newer_id
            FROM newer AS n
            CROSS JOIN LATERAL (
                SELECT e.delivery_id
                FROM webhook_delivery_v1 AS e
                WHERE e.destination_id = n.destination_id AND e.asset_id = n.asset_id
                  AND e.queued IS NOT FALSE
                  AND e.state = 'pending' AND e.closed_reason IS NULL
                  AND e.event_type = n.event_type
                  AND (e.created_at, coalesce(e.emit_seq, 0), e.delivery_id)
                      < (n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
                FOR UPDATE SKIP LOCKED
            ) AS older
        ) AS stale
        WHERE o.delivery_id = stale.delivery_id AND o.state = 'pending'
    ),
    -- A 410 (Gone) or an address the guard refused disables the destination until an operator
    -- enables it; one already disabled keeps its reason. The refused address wins over a 410
    -- in one batch: it is what the operator must fix first.
    signal AS (
        SELECT DISTINCT ON (d.destination_id)
               d.destination_id,
               CASE
                   WHEN coalesce(g.configuration_fault, false)
                       THEN 'configuration: ' || coalesce(g.error, 'address refused')
                            || ' (at connect time'
                            || CASE WHEN strpos(coalesce(g.error, ''), private_setting) > 0
                                    THEN ''
                                    ELSE '; ' || private_setting || ' in the workers'' '
                                         || 'environment allows private addresses' END
                            || '); enable it once the URL or the setting is fixed'
                   ELSE 'receiver answered HTTP 410 (Gone) at '
                        || to_char((now() - make_interval(secs => greatest(g.finished_ago, 0)))
                                   AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')
                        || ' UTC'
               END AS why
        FROM given AS g
        JOIN delivery_state AS d ON d.delivery_id = g.delivery_id
        WHERE coalesce(g.configuration_fault, false)
           OR (g.outcome = 'rejected' AND g.http_status = 410)
        ORDER BY d.destination_id, coalesce(g.configuration_fault, false) DESC
    ),
    disabled AS (
        UPDATE webhook_destination AS w
        SET enabled = false,
            disabled_reason = signal.why,
            disabled_at = now(),
            updated_at = now()
        FROM signal
        WHERE w.destination_id = signal.destination_id AND w.enabled
        RETURNING w.destination_id, w.disabled_reason
    ),
    stops AS (
        SELECT signal.destination_id,
               coalesce(disabled.disabled_reason, w.disabled_reason, signal.why) AS stopped
        FROM signal
        JOIN webhook_destination AS w ON w.destination_id = signal.destination_id
        LEFT JOIN disabled ON disabled.destination_id = signal.destination_id
    )
    -- A stop is looked up only when the batch disabled something (the common batch reads no
    -- destination here), and a delivery's destination only when its lease no longer held.
    SELECT g.delivery_id, moved.state,
           CASE WHEN EXISTS (SELECT 1 FROM stops) THEN (
               SELECT stops.stopped FROM stops
               WHERE stops.destination_id = coalesce(
                   moved.destination_id,
                   (SELECT x.destination_id FROM delivery_state AS x
                    WHERE x.delivery_id = g.delivery_id))
           ) END
    FROM given AS g
    LEFT JOIN moved ON moved.delivery_id = g.delivery_id;
END;
$$;

-- What this release reads for "every delivery", whichever layout holds it: the contract's
-- columns and meaning (docs/contract.md, webhook_delivery). Payload and body are read by key
-- only for a reader that asks for them.
CREATE OR REPLACE VIEW webhook_delivery_all AS
SELECT d.delivery_id, d.destination_id, d.asset_id, d.event_type, d.payload, d.body, d.state,
       d.attempt_count, d.budget_used, d.budget_started_at, d.dispatch_count,
       d.next_attempt_at, d.lease_until, d.lease_token, d.current_message_id, d.last_outcome,
       d.last_error, d.wait_reason, d.created_at, d.updated_at, d.emit_seq, d.closed_reason,
       d.closed_by, d.queued
FROM webhook_delivery_v1 AS d
UNION ALL
SELECT s.delivery_id, s.destination_id, s.asset_id, s.event_type,
       media_hooks_payload_v1(s.delivery_id, s.created_at),
       media_hooks_body_v1(s.delivery_id, s.created_at), s.state, s.attempt_count,
       s.budget_used, s.budget_started_at, s.dispatch_count, s.next_attempt_at, s.lease_until,
       s.lease_token, s.current_message_id, s.last_outcome, s.last_error, s.wait_reason,
       s.created_at, s.updated_at, s.emit_seq, NULL::text, NULL::text, s.queued
FROM delivery_state AS s
UNION ALL
SELECT h.delivery_id, h.destination_id, h.asset_id, h.event_type,
       media_hooks_payload_v1(h.delivery_id, h.created_at),
       media_hooks_body_v1(h.delivery_id, h.created_at), h.state, h.attempt_count,
       h.budget_used, h.budget_started_at, h.dispatch_count, h.next_attempt_at, NULL::timestamptz,
       NULL::uuid, h.current_message_id, h.last_outcome, h.last_error, h.wait_reason,
       h.created_at, h.finished_at, h.emit_seq, h.closed_reason, h.closed_by, h.queued
FROM delivery_history AS h;

-- Every attempt, whichever layout holds it: the contract's columns and meaning
-- (delivery_attempt). An attempt in flight on this layout is its delivery's lease.
CREATE OR REPLACE VIEW delivery_attempt_all AS
SELECT a.delivery_id, a.attempt_no, a.destination_id, a.message_id, a.run_id, a.lease_token,
       a.started_at, a.finished_at, a.outcome, a.http_status, a.error, a.response_excerpt,
       a.next_attempt_at, a.retry_reason
FROM delivery_attempt_v1 AS a
UNION ALL
SELECT a.delivery_id, a.attempt_no, a.destination_id, a.message_id, a.run_id, a.lease_token,
       a.started_at, a.finished_at, a.outcome, a.http_status, a.error, a.response_excerpt,
       a.next_attempt_at, a.retry_reason
FROM delivery_attempt_v2 AS a
UNION ALL
SELECT s.delivery_id, s.attempt_count, s.destination_id, s.current_message_id, s.lease_run_id,
       s.lease_token, s.lease_started_at, NULL::timestamptz, NULL::text, NULL::integer,
       NULL::text, NULL::text, NULL::timestamptz, NULL::text
FROM delivery_timer AS t
JOIN delivery_state AS s ON s.delivery_id = t.delivery_id
WHERE t.kind = 'inflight' AND s.state = 'leased';

-- The outbox's view (0027) shows this release's dispatches too, with their deliveries' bodies.
CREATE OR REPLACE VIEW dispatch_outbox AS
SELECT message_id, delivery_id, dispatch_no, destination_id, run_id, body, created_at,
       published_at
FROM dispatch_outbox_v1
UNION ALL
SELECT o.message_id, o.delivery_id, o.dispatch_no, o.destination_id, o.run_id,
       (SELECT d.body FROM webhook_delivery_v1 AS d WHERE d.delivery_id = o.delivery_id),
       o.created_at, o.published_at
FROM dispatch_outbox_v2 AS o
UNION ALL
SELECT o.message_id, o.delivery_id, o.dispatch_no, o.destination_id, o.run_id,
       media_hooks_body_v1(o.delivery_id, o.delivery_created_at), o.created_at, o.published_at
FROM dispatch_outbox_v3 AS o;

-- A relation this release creates belongs to whoever owns the model it stands beside (the
-- migration may run as a superuser on a database another role owns and delivers as), and
-- whoever could read or write the model can read or write it (0027's rule). The contract
-- migration (0035) shares its views by the same rule.
CREATE OR REPLACE FUNCTION media_hooks_share_like_v1(p_model regclass, p_relations text[])
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    granted record;
    model_owner name;
    rel text;
BEGIN
    SELECT pg_get_userbyid(c.relowner) INTO model_owner FROM pg_class AS c WHERE c.oid = p_model;
    FOREACH rel IN ARRAY p_relations LOOP
        FOR granted IN
            SELECT a.privilege_type,
                   CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                        ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS grantee
            FROM pg_class AS c, aclexplode(c.relacl) AS a
            WHERE c.oid = p_model AND a.grantee <> c.relowner
        LOOP
            EXECUTE format('GRANT %s ON %I TO %s', granted.privilege_type, rel, granted.grantee);
        END LOOP;
        IF model_owner <> current_user THEN
            EXECUTE format('ALTER TABLE %I OWNER TO %I', rel, model_owner);
        END IF;
    END LOOP;
END
$$;

-- The new tables, views and partitions stand beside webhook_delivery_v1; so do the contract's
-- names, now views; so does the function that makes partitions (SECURITY DEFINER: as the
-- tables' owner).
DO $$
DECLARE
    model_owner name;
BEGIN
    PERFORM media_hooks_share_like_v1(
        'webhook_delivery_v1',
        ARRAY['media_hooks_partitioning', 'media_hooks_partition', 'delivery_body',
              'delivery_state', 'delivery_timer', 'delivery_history', 'dispatch_outbox_v3',
              'delivery_attempt_v2', 'webhook_delivery_all', 'delivery_attempt_all',
              'webhook_delivery', 'delivery_attempt']
        || ARRAY(SELECT p.child FROM media_hooks_partition AS p));
    SELECT pg_get_userbyid(c.relowner) INTO model_owner
    FROM pg_class AS c WHERE c.oid = 'webhook_delivery_v1'::regclass;
    IF model_owner <> current_user THEN
        EXECUTE format('ALTER FUNCTION media_hooks_make_partitions_v1(timestamptz) OWNER TO %I',
                       model_owner);
    END IF;
END
$$;

-- webhook_delivery_all is written as the contract's table was: an update, insert or delete by
-- hand (an operator's fix in psql, a test's setup) goes to whichever layout holds the delivery,
-- and one of this layout is written where its state says it belongs (open or dead in its
-- asset's queue: delivery_state and a timer that agrees; ended: history), so the layout's own
-- rules hold afterwards. What never changes (identity, payload, body) is refused as the
-- previous table refused it (0004).
-- A view has no row for its statement to lock and read again when another session moved the
-- delivery after the statement read it, as a table's update does: written as read, a claim's
-- dispatch, a lease or an ending committed meanwhile would be undone (the same message claimed
-- twice, a leased delivery made due). So the delivery's row is locked where it is and compared
-- with the row the statement read; if it moved, nothing is written and the statement fails as
-- a serialization conflict, to be run again.
CREATE OR REPLACE FUNCTION media_hooks_delivery_all_write_v1()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    was text;  -- where the delivery is: previous, state, history (null: nowhere yet)
    goes text;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM 1 FROM webhook_delivery_v1 AS d WHERE d.delivery_id = OLD.delivery_id FOR UPDATE;
        IF FOUND THEN
            was := 'previous';
        ELSE
            PERFORM 1 FROM delivery_state AS s WHERE s.delivery_id = OLD.delivery_id FOR UPDATE;
            IF FOUND THEN
                was := 'state';
            ELSE
                PERFORM 1 FROM delivery_history AS h
                WHERE h.delivery_id = OLD.delivery_id AND h.created_at = OLD.created_at
                FOR UPDATE;
                was := CASE WHEN FOUND THEN 'history' END;
            END IF;
        END IF;
        IF was IS NULL OR NOT EXISTS (
            SELECT 1 FROM webhook_delivery_all AS v
            WHERE v.delivery_id = OLD.delivery_id AND v.created_at = OLD.created_at
              AND (v.state, v.attempt_count, v.budget_used, v.budget_started_at,
                   v.dispatch_count, v.next_attempt_at, v.lease_until, v.lease_token,
                   v.current_message_id, v.last_outcome, v.last_error, v.wait_reason,
                   v.updated_at, v.emit_seq, v.closed_reason, v.closed_by, v.queued)
                  IS NOT DISTINCT FROM
                  (OLD.state, OLD.attempt_count, OLD.budget_used, OLD.budget_started_at,
                   OLD.dispatch_count, OLD.next_attempt_at, OLD.lease_until, OLD.lease_token,
                   OLD.current_message_id, OLD.last_outcome, OLD.last_error, OLD.wait_reason,
                   OLD.updated_at, OLD.emit_seq, OLD.closed_reason, OLD.closed_by, OLD.queued))
        THEN
            RAISE EXCEPTION 'delivery % changed after this statement read it (another session '
                            'moved it): nothing was written; run the statement again',
                            OLD.delivery_id
                USING ERRCODE = 'serialization_failure';
        END IF;
    END IF;
    IF TG_OP = 'DELETE' THEN
        IF was = 'previous' THEN
            DELETE FROM webhook_delivery_v1 AS d WHERE d.delivery_id = OLD.delivery_id;
        ELSE
            DELETE FROM delivery_timer AS t WHERE t.delivery_id = OLD.delivery_id;
            DELETE FROM delivery_state AS s WHERE s.delivery_id = OLD.delivery_id;
            DELETE FROM delivery_history AS h
            WHERE h.delivery_id = OLD.delivery_id AND h.created_at = OLD.created_at;
            DELETE FROM delivery_body AS b
            WHERE b.delivery_id = OLD.delivery_id AND b.created_at = OLD.created_at;
        END IF;
        RETURN OLD;
    END IF;
    IF was = 'previous' THEN
        UPDATE webhook_delivery_v1 AS d
        SET destination_id = NEW.destination_id, asset_id = NEW.asset_id,
            event_type = NEW.event_type, payload = NEW.payload, body = NEW.body,
            state = NEW.state, attempt_count = NEW.attempt_count,
            budget_used = NEW.budget_used, budget_started_at = NEW.budget_started_at,
            dispatch_count = NEW.dispatch_count, next_attempt_at = NEW.next_attempt_at,
            lease_until = NEW.lease_until, lease_token = NEW.lease_token,
            current_message_id = NEW.current_message_id, last_outcome = NEW.last_outcome,
            last_error = NEW.last_error, wait_reason = NEW.wait_reason,
            created_at = NEW.created_at, updated_at = NEW.updated_at, emit_seq = NEW.emit_seq,
            closed_reason = NEW.closed_reason, closed_by = NEW.closed_by, queued = NEW.queued
        WHERE d.delivery_id = OLD.delivery_id;
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND (
           NEW.delivery_id IS DISTINCT FROM OLD.delivery_id
        OR NEW.destination_id IS DISTINCT FROM OLD.destination_id
        OR NEW.asset_id IS DISTINCT FROM OLD.asset_id
        OR NEW.event_type IS DISTINCT FROM OLD.event_type
        OR NEW.payload IS DISTINCT FROM OLD.payload
        OR NEW.body IS DISTINCT FROM OLD.body
        OR NEW.created_at IS DISTINCT FROM OLD.created_at) THEN
        RAISE EXCEPTION 'delivery % is immutable: a payload revision is a new delivery_id',
            OLD.delivery_id
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'INSERT' THEN
        NEW.created_at := coalesce(NEW.created_at, now());
        NEW.updated_at := coalesce(NEW.updated_at, now());
        NEW.next_attempt_at := coalesce(NEW.next_attempt_at, now());
        NEW.budget_started_at := coalesce(NEW.budget_started_at, NEW.created_at);
        NEW.state := coalesce(NEW.state, 'pending');
        NEW.attempt_count := coalesce(NEW.attempt_count, 0);
        NEW.budget_used := coalesce(NEW.budget_used, 0);
        NEW.dispatch_count := coalesce(NEW.dispatch_count, 0);
        -- In its asset's queue as emit would put it (0029's rule): only where the destination
        -- orders or coalesces by asset.
        NEW.queued := coalesce(NEW.queued, EXISTS (
            SELECT 1 FROM webhook_destination AS w
            WHERE w.destination_id = NEW.destination_id
              AND (w.ordering = 'asset' OR w.coalescing = 'asset')));
        INSERT INTO delivery_body (delivery_id, created_at, payload, body)
        VALUES (NEW.delivery_id, NEW.created_at, NEW.payload, NEW.body);
    END IF;
    goes := CASE WHEN NEW.state IN ('pending', 'enqueued', 'leased')
                      OR (NEW.state = 'dead' AND coalesce(NEW.queued, true)
                          AND NEW.closed_reason IS NULL) THEN 'state'
                 ELSE 'history' END;
    IF was = 'state' AND goes = 'state' THEN
        UPDATE delivery_state AS s
        SET queued = coalesce(NEW.queued, true), state = NEW.state,
            attempt_count = NEW.attempt_count, budget_used = NEW.budget_used,
            budget_started_at = NEW.budget_started_at, dispatch_count = NEW.dispatch_count,
            next_attempt_at = NEW.next_attempt_at, lease_until = NEW.lease_until,
            lease_token = NEW.lease_token,
            lease_started_at = CASE WHEN NEW.state = 'leased'
                                    THEN coalesce(s.lease_started_at, NEW.updated_at) END,
            lease_run_id = CASE WHEN NEW.state = 'leased' THEN s.lease_run_id END,
            current_message_id = NEW.current_message_id, last_outcome = NEW.last_outcome,
            last_error = NEW.last_error, wait_reason = NEW.wait_reason,
            updated_at = NEW.updated_at, emit_seq = NEW.emit_seq
        WHERE s.delivery_id = OLD.delivery_id;
    ELSE
        IF was = 'state' THEN
            DELETE FROM delivery_state AS s WHERE s.delivery_id = OLD.delivery_id;
        ELSIF was = 'history' THEN
            DELETE FROM delivery_history AS h
            WHERE h.delivery_id = OLD.delivery_id AND h.created_at = OLD.created_at;
        END IF;
        IF goes = 'state' THEN
            INSERT INTO delivery_state
                (delivery_id, destination_id, asset_id, event_type, created_at, emit_seq,
                 queued, state, attempt_count, budget_used, budget_started_at, dispatch_count,
                 next_attempt_at, lease_until, lease_token, lease_started_at,
                 current_message_id, last_outcome, last_error, wait_reason, updated_at)
            VALUES (NEW.delivery_id, NEW.destination_id, NEW.asset_id, NEW.event_type,
                    NEW.created_at, NEW.emit_seq, coalesce(NEW.queued, true), NEW.state,
                    NEW.attempt_count, NEW.budget_used, NEW.budget_started_at,
                    NEW.dispatch_count, NEW.next_attempt_at, NEW.lease_until, NEW.lease_token,
                    CASE WHEN NEW.state = 'leased' THEN NEW.updated_at END,
                    NEW.current_message_id, NEW.last_outcome, NEW.last_error, NEW.wait_reason,
                    NEW.updated_at);
        ELSE
            INSERT INTO delivery_history
                (delivery_id, destination_id, asset_id, event_type, created_at, emit_seq,
                 queued, state, attempt_count, budget_used, budget_started_at, dispatch_count,
                 next_attempt_at, current_message_id, last_outcome, last_error, wait_reason,
                 closed_reason, closed_by, finished_at)
            VALUES (NEW.delivery_id, NEW.destination_id, NEW.asset_id, NEW.event_type,
                    NEW.created_at, NEW.emit_seq, coalesce(NEW.queued, false), NEW.state,
                    NEW.attempt_count, NEW.budget_used, NEW.budget_started_at,
                    NEW.dispatch_count, NEW.next_attempt_at, NEW.current_message_id,
                    NEW.last_outcome, NEW.last_error, NEW.wait_reason, NEW.closed_reason,
                    NEW.closed_by, NEW.updated_at);
        END IF;
    END IF;
    -- The timer says what the state means.
    IF goes = 'state' THEN
        INSERT INTO delivery_timer AS t (delivery_id, destination_id, kind, fire_at)
        VALUES (NEW.delivery_id, NEW.destination_id,
                CASE WHEN NEW.state IN ('enqueued', 'leased') THEN 'inflight'
                     WHEN NEW.state = 'dead' THEN 'dead'
                     WHEN NEW.next_attempt_at >= timestamptz '9999-01-01 00:00:00+00'
                         THEN 'parked'
                     ELSE 'due' END,
                CASE WHEN NEW.state IN ('enqueued', 'leased', 'dead') THEN NEW.updated_at
                     ELSE NEW.next_attempt_at END)
        ON CONFLICT (delivery_id) DO UPDATE
        SET kind = EXCLUDED.kind,
            fire_at = CASE WHEN t.kind = EXCLUDED.kind AND t.kind IN ('inflight', 'dead')
                           THEN least(t.fire_at, EXCLUDED.fire_at) ELSE EXCLUDED.fire_at END;
    ELSE
        DELETE FROM delivery_timer AS t WHERE t.delivery_id = NEW.delivery_id;
    END IF;
    RETURN NEW;
END
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'webhook_delivery_all_write') THEN
        CREATE TRIGGER webhook_delivery_all_write
            INSTEAD OF INSERT OR UPDATE OR DELETE ON webhook_delivery_all
            FOR EACH ROW EXECUTE FUNCTION media_hooks_delivery_all_write_v1();
    END IF;
END
$$;

-- An update (a publication) or a delete through dispatch_outbox goes to whichever table holds
-- the message, this release's included.
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
    UPDATE dispatch_outbox_v3 AS o
    SET published_at = coalesce(o.published_at, NEW.published_at)
    WHERE o.message_id = OLD.message_id;
    IF NOT FOUND THEN
        UPDATE dispatch_outbox_v2 AS o
        SET published_at = coalesce(o.published_at, NEW.published_at)
        WHERE o.message_id = OLD.message_id;
    END IF;
    IF NOT FOUND THEN
        UPDATE dispatch_outbox_v1 AS o
        SET published_at = coalesce(o.published_at, NEW.published_at)
        WHERE o.message_id = OLD.message_id;
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION media_hooks_outbox_delete_v1()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM dispatch_outbox_v3 AS o WHERE o.message_id = OLD.message_id;
    IF NOT FOUND THEN
        DELETE FROM dispatch_outbox_v2 AS o WHERE o.message_id = OLD.message_id;
    END IF;
    IF NOT FOUND THEN
        DELETE FROM dispatch_outbox_v1 AS o WHERE o.message_id = OLD.message_id;
    END IF;
    RETURN OLD;
END
$$;
