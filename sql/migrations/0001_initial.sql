-- 0001: the delivery protocol's tables.
--
-- Identity (invariant 1), immutable bodies (invariant 2), the five states and the lease that
-- fences terminal transitions (invariant 4) are constraints here, not conventions in code.

CREATE TABLE webhook_destination (
    destination_id        text PRIMARY KEY
                          CONSTRAINT destination_id_form CHECK (destination_id ~ '^[A-Za-z0-9_:-]+$' AND length(destination_id) <= 200),
    url                   text NOT NULL CONSTRAINT url_is_http CHECK (url ~* '^https?://[^/]+'),
    -- Standard Webhooks secrets (whsec_<base64>); several are active during a rotation and
    -- every one signs each request.
    secrets               text[] NOT NULL DEFAULT '{}',
    rate_per_second       double precision NOT NULL DEFAULT 10 CONSTRAINT rate_positive CHECK (rate_per_second > 0),
    burst                 integer NOT NULL DEFAULT 10 CONSTRAINT burst_at_least_one CHECK (burst >= 1),
    max_in_flight         integer NOT NULL DEFAULT 4 CONSTRAINT max_in_flight_at_least_one CHECK (max_in_flight >= 1),
    timeout_seconds       double precision NOT NULL DEFAULT 10 CONSTRAINT timeout_positive CHECK (timeout_seconds > 0),
    max_attempts          integer NOT NULL DEFAULT 20 CONSTRAINT max_attempts_at_least_one CHECK (max_attempts >= 1),
    backoff_base_seconds  double precision NOT NULL DEFAULT 5 CONSTRAINT backoff_base_positive CHECK (backoff_base_seconds > 0),
    backoff_cap_seconds   double precision NOT NULL DEFAULT 28800
                          CONSTRAINT backoff_cap_not_below_base CHECK (backoff_cap_seconds >= backoff_base_seconds),
    max_age_seconds       double precision NOT NULL DEFAULT 259200 CONSTRAINT max_age_positive CHECK (max_age_seconds > 0),
    enabled               boolean NOT NULL DEFAULT true,
    disabled_reason       text,
    disabled_at           timestamptz,
    -- A 429 / 503 with Retry-After pauses the whole destination, for every process.
    paused_until          timestamptz,
    paused_reason         text,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE webhook_delivery (
    delivery_id        text PRIMARY KEY
                       -- (A bounded repeat like {1,200} makes PostgreSQL's regex engine ~70x slower per row.)
                       CONSTRAINT delivery_id_form CHECK (delivery_id ~ '^[A-Za-z0-9_:-]+$' AND length(delivery_id) <= 200),
    destination_id     text NOT NULL REFERENCES webhook_destination (destination_id),
    asset_id           text NOT NULL,
    event_type         text NOT NULL,
    payload            jsonb NOT NULL CONSTRAINT payload_is_object CHECK (jsonb_typeof(payload) = 'object'),
    -- The exact request body, serialized once when the delivery is recorded (invariant 2).
    body               bytea NOT NULL,
    state              text NOT NULL DEFAULT 'pending'
                       CONSTRAINT delivery_state CHECK (state IN ('pending', 'enqueued', 'leased', 'succeeded', 'dead')),
    -- HTTP attempts started, ever; also the attempt_no of the newest attempt.
    attempt_count      integer NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    -- Attempts that count against max_attempts since the budget was last reset (a requeue
    -- resets it; a rate-limited attempt gives its unit back).
    budget_used        integer NOT NULL DEFAULT 0 CHECK (budget_used >= 0),
    -- When the current retry budget began: max_age_seconds is measured from here.
    budget_started_at  timestamptz NOT NULL DEFAULT now(),
    -- Dispatches into the outbox, ever; dispatch_outbox.message_id is delivery_id:dispatch_no.
    dispatch_count     integer NOT NULL DEFAULT 0 CHECK (dispatch_count >= 0),
    next_attempt_at    timestamptz NOT NULL DEFAULT now(),
    -- The lease: while state = 'leased', only the holder of lease_token may move the row.
    lease_until        timestamptz,
    lease_token        uuid,
    -- The outbox message of the current dispatch; an older message is stale and is skipped.
    current_message_id text,
    last_outcome       text CONSTRAINT last_outcome_class
                       CHECK (last_outcome IN ('success', 'rate_limited', 'retryable', 'ambiguous', 'rejected')),
    last_error         text,
    -- Why the delivery waits, in words an operator reads: backoff, Retry-After, lease expiry...
    wait_reason        text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT leased_has_lease CHECK (state <> 'leased' OR (lease_until IS NOT NULL AND lease_token IS NOT NULL))
);

-- Invariant 2 held by the database, whatever code runs against it.
CREATE FUNCTION media_hooks_delivery_is_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.delivery_id IS DISTINCT FROM OLD.delivery_id
       OR NEW.destination_id IS DISTINCT FROM OLD.destination_id
       OR NEW.asset_id IS DISTINCT FROM OLD.asset_id
       OR NEW.event_type IS DISTINCT FROM OLD.event_type
       OR NEW.payload IS DISTINCT FROM OLD.payload
       OR NEW.body IS DISTINCT FROM OLD.body
       OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'delivery % is immutable: a payload revision is a new delivery_id', OLD.delivery_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER webhook_delivery_immutable
    BEFORE UPDATE ON webhook_delivery
    FOR EACH ROW EXECUTE FUNCTION media_hooks_delivery_is_immutable();

-- The reconciler's claim: due pending rows, oldest first.
CREATE INDEX webhook_delivery_due ON webhook_delivery (next_attempt_at, delivery_id)
    WHERE state = 'pending';
-- The lease sweep: leases that may have expired.
CREATE INDEX webhook_delivery_lease ON webhook_delivery (lease_until) WHERE state = 'leased';
-- The enqueue sweep: enqueued rows by age.
CREATE INDEX webhook_delivery_enqueued ON webhook_delivery (updated_at) WHERE state = 'enqueued';
-- Dead letters, newest first, per destination.
CREATE INDEX webhook_delivery_dead ON webhook_delivery (destination_id, updated_at) WHERE state = 'dead';
CREATE INDEX webhook_delivery_destination_state ON webhook_delivery (destination_id, state);

CREATE TABLE dispatch_outbox (
    -- One row per dispatch: delivery_id || ':' || dispatch_no. Per dispatch, not per delivery:
    -- a delivery that is retried is dispatched again and needs a new row (DESIGN.md).
    message_id      text PRIMARY KEY,
    delivery_id     text NOT NULL REFERENCES webhook_delivery (delivery_id),
    dispatch_no     integer NOT NULL CHECK (dispatch_no >= 1),
    destination_id  text NOT NULL,
    run_id          text NOT NULL,
    body            bytea NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    CONSTRAINT one_row_per_dispatch UNIQUE (delivery_id, dispatch_no)
);

-- A run's rows, per destination (the relay, the run-failure release, "rows of this run").
CREATE INDEX dispatch_outbox_run ON dispatch_outbox (run_id, destination_id, message_id);
-- Relay lag: the oldest unpublished row.
CREATE INDEX dispatch_outbox_unpublished ON dispatch_outbox (created_at) WHERE published_at IS NULL;

CREATE TABLE delivery_attempt (
    delivery_id       text NOT NULL REFERENCES webhook_delivery (delivery_id),
    attempt_no        integer NOT NULL CHECK (attempt_no >= 1),
    -- Denormalized so per-destination figures (circuit breaker, dispatch rate) need no join.
    destination_id    text NOT NULL,
    message_id        text,
    run_id            text,
    lease_token       uuid NOT NULL,
    -- Written before the request is sent, so a worker that dies mid-attempt leaves a row
    -- with a start and no finish: the audit trail shows the ambiguity.
    started_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    outcome           text CONSTRAINT attempt_outcome_class
                      CHECK (outcome IN ('success', 'rate_limited', 'retryable', 'ambiguous', 'rejected')),
    http_status       integer,
    error             text,
    response_excerpt  text,
    -- What the attempt decided: the next attempt time and why (backoff, Retry-After, ...).
    next_attempt_at   timestamptz,
    retry_reason      text,
    PRIMARY KEY (delivery_id, attempt_no)
);

CREATE INDEX delivery_attempt_finished ON delivery_attempt (finished_at, outcome);
CREATE INDEX delivery_attempt_destination ON delivery_attempt (destination_id, started_at);
CREATE INDEX delivery_attempt_run ON delivery_attempt (run_id);

-- Every operator requeue, with who, why, what and how many.
CREATE TABLE delivery_requeue (
    requeue_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    requested_by  text NOT NULL,
    reason        text NOT NULL CHECK (length(reason) > 0),
    cohort        jsonb NOT NULL,
    moved         integer NOT NULL,
    requested_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE delivery_requeue_item (
    requeue_id      bigint NOT NULL REFERENCES delivery_requeue (requeue_id),
    delivery_id     text NOT NULL,
    previous_state  text NOT NULL,
    PRIMARY KEY (requeue_id, delivery_id)
);
CREATE INDEX delivery_requeue_item_delivery ON delivery_requeue_item (delivery_id);

-- A cohort: the deliveries an operator selects (empty filters match everything). One
-- definition serves the claim, the requeue and its preview; as a single-expression SQL function
-- it is inlined into each statement's plan.
CREATE FUNCTION media_hooks_in_cohort(
    delivery webhook_delivery,
    destination_ids text[],
    event_types text[],
    asset_ids text[],
    created_after timestamptz,
    created_before timestamptz
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (cardinality(destination_ids) = 0 OR delivery.destination_id = ANY (destination_ids))
       AND (cardinality(event_types) = 0 OR delivery.event_type = ANY (event_types))
       AND (cardinality(asset_ids) = 0 OR delivery.asset_id = ANY (asset_ids))
       AND (created_after IS NULL OR delivery.created_at >= created_after)
       AND (created_before IS NULL OR delivery.created_at < created_before)
$$;

-- The lease transition, as a function so that the worker can take its permits and lease in
-- one statement (sql/queries/leases.sql: lease_deliveries, lease_with_permits). Leases the
-- offered messages whose delivery they still are the current dispatch of, opening each one's
-- attempt row before any request is sent.
-- keeps: invariant 4 (a fresh lease_token fences every later update; succeeded and dead rows
--   are never leased), invariant 3 (the attempt row records the start, so a worker that dies
--   leaves evidence), invariant 5 (only scheduling metadata changes).
CREATE FUNCTION media_hooks_lease_v1(
    p_run_id text,
    p_delivery_ids text[],
    p_message_ids text[],
    p_lease_seconds double precision
)
RETURNS TABLE (delivery_id text, message_id text, lease_token uuid, attempt_no integer,
               budget_used integer, body bytea)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH wanted AS (
        SELECT *
        FROM unnest(p_delivery_ids, p_message_ids) AS w(delivery_id, message_id)
    ),
    leased AS (
        UPDATE webhook_delivery AS d
        SET state = 'leased',
            lease_token = gen_random_uuid(),
            lease_until = now() + make_interval(secs => p_lease_seconds),
            attempt_count = d.attempt_count + 1,
            budget_used = d.budget_used + 1,
            updated_at = now()
        FROM wanted
        WHERE d.delivery_id = wanted.delivery_id
          AND d.current_message_id = wanted.message_id
          AND (d.state = 'enqueued'
               OR (d.state = 'pending' AND d.next_attempt_at <= now())
               OR (d.state = 'leased' AND d.lease_until < now()))
        RETURNING d.delivery_id, d.destination_id, d.current_message_id AS message_id,
                  d.lease_token, d.attempt_count AS attempt_no, d.budget_used, d.body
    ),
    opened AS (
        INSERT INTO delivery_attempt
            (delivery_id, attempt_no, destination_id, message_id, run_id, lease_token)
        SELECT l.delivery_id, l.attempt_no, l.destination_id, l.message_id, p_run_id, l.lease_token
        FROM leased AS l
    )
    SELECT l.delivery_id, l.message_id, l.lease_token, l.attempt_no, l.budget_used, l.body
    FROM leased AS l;
END;
$$;
