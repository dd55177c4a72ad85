-- The schema as the migrations in sql/migrations leave it: generated, never edited by hand.
-- Regenerate with: python -m media_hooks.store.schema DATABASE_URL > sql/schema.sql
-- (DATABASE_URL: a database migrated with `media-hooks db migrate`). The state machine's
-- statements are in sql/queries; the invariants they keep are in docs/architecture.md.


-- Tables -----------------------------------------------------------------------------------------

CREATE TABLE dagster_step_output (
    run_id text NOT NULL,
    step_key text NOT NULL,
    output_name text NOT NULL,
    mapping_key text DEFAULT ''::text NOT NULL,
    value bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT dagster_step_output_pkey PRIMARY KEY (run_id, step_key, output_name, mapping_key)
);

CREATE TABLE delivery_attempt_v1 (
    delivery_id text NOT NULL,
    attempt_no integer NOT NULL,
    destination_id text NOT NULL,
    message_id text,
    run_id text,
    lease_token uuid NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    outcome text,
    http_status integer,
    error text,
    response_excerpt text,
    next_attempt_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT attempt_outcome_class CHECK ((outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text]))),
    CONSTRAINT delivery_attempt_attempt_no_check CHECK ((attempt_no >= 1)),
    CONSTRAINT delivery_attempt_pkey PRIMARY KEY (delivery_id, attempt_no)
) WITH (fillfactor=50);

CREATE TABLE delivery_attempt_v2 (
    delivery_id text NOT NULL,
    attempt_no integer NOT NULL,
    destination_id text NOT NULL,
    message_id text,
    run_id text,
    lease_token uuid NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    http_status integer,
    error text,
    response_excerpt text,
    next_attempt_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT delivery_attempt_v2_attempt_no CHECK ((attempt_no >= 1)),
    CONSTRAINT delivery_attempt_v2_outcome CHECK ((outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text]))),
    CONSTRAINT delivery_attempt_v2_pkey PRIMARY KEY (delivery_id, attempt_no, delivery_created_at)
);

CREATE TABLE delivery_attempt_v2_before (
    delivery_id text NOT NULL,
    attempt_no integer NOT NULL,
    destination_id text NOT NULL,
    message_id text,
    run_id text,
    lease_token uuid NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    http_status integer,
    error text,
    response_excerpt text,
    next_attempt_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT delivery_attempt_v2_attempt_no CHECK ((attempt_no >= 1)),
    CONSTRAINT delivery_attempt_v2_before_pkey PRIMARY KEY (delivery_id, attempt_no, delivery_created_at),
    CONSTRAINT delivery_attempt_v2_outcome CHECK ((outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text])))
);

CREATE TABLE delivery_attempt_v2_p1796515200 (
    delivery_id text NOT NULL,
    attempt_no integer NOT NULL,
    destination_id text NOT NULL,
    message_id text,
    run_id text,
    lease_token uuid NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    http_status integer,
    error text,
    response_excerpt text,
    next_attempt_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT delivery_attempt_v2_attempt_no CHECK ((attempt_no >= 1)),
    CONSTRAINT delivery_attempt_v2_outcome CHECK ((outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text]))),
    CONSTRAINT delivery_attempt_v2_p1796515200_pkey PRIMARY KEY (delivery_id, attempt_no, delivery_created_at)
);

CREATE TABLE delivery_attempt_v2_p1796601600 (
    delivery_id text NOT NULL,
    attempt_no integer NOT NULL,
    destination_id text NOT NULL,
    message_id text,
    run_id text,
    lease_token uuid NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    http_status integer,
    error text,
    response_excerpt text,
    next_attempt_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT delivery_attempt_v2_attempt_no CHECK ((attempt_no >= 1)),
    CONSTRAINT delivery_attempt_v2_outcome CHECK ((outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text]))),
    CONSTRAINT delivery_attempt_v2_p1796601600_pkey PRIMARY KEY (delivery_id, attempt_no, delivery_created_at)
);

CREATE TABLE delivery_attempt_v2_p1796688000 (
    delivery_id text NOT NULL,
    attempt_no integer NOT NULL,
    destination_id text NOT NULL,
    message_id text,
    run_id text,
    lease_token uuid NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    http_status integer,
    error text,
    response_excerpt text,
    next_attempt_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT delivery_attempt_v2_attempt_no CHECK ((attempt_no >= 1)),
    CONSTRAINT delivery_attempt_v2_outcome CHECK ((outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text]))),
    CONSTRAINT delivery_attempt_v2_p1796688000_pkey PRIMARY KEY (delivery_id, attempt_no, delivery_created_at)
);

CREATE TABLE delivery_attempt_v2_p1796774400 (
    delivery_id text NOT NULL,
    attempt_no integer NOT NULL,
    destination_id text NOT NULL,
    message_id text,
    run_id text,
    lease_token uuid NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    http_status integer,
    error text,
    response_excerpt text,
    next_attempt_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT delivery_attempt_v2_attempt_no CHECK ((attempt_no >= 1)),
    CONSTRAINT delivery_attempt_v2_outcome CHECK ((outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text]))),
    CONSTRAINT delivery_attempt_v2_p1796774400_pkey PRIMARY KEY (delivery_id, attempt_no, delivery_created_at)
);

CREATE TABLE delivery_attempt_v2_p1796860800 (
    delivery_id text NOT NULL,
    attempt_no integer NOT NULL,
    destination_id text NOT NULL,
    message_id text,
    run_id text,
    lease_token uuid NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    http_status integer,
    error text,
    response_excerpt text,
    next_attempt_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT delivery_attempt_v2_attempt_no CHECK ((attempt_no >= 1)),
    CONSTRAINT delivery_attempt_v2_outcome CHECK ((outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text]))),
    CONSTRAINT delivery_attempt_v2_p1796860800_pkey PRIMARY KEY (delivery_id, attempt_no, delivery_created_at)
);

CREATE TABLE delivery_attempt_v2_p1796947200 (
    delivery_id text NOT NULL,
    attempt_no integer NOT NULL,
    destination_id text NOT NULL,
    message_id text,
    run_id text,
    lease_token uuid NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    http_status integer,
    error text,
    response_excerpt text,
    next_attempt_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT delivery_attempt_v2_attempt_no CHECK ((attempt_no >= 1)),
    CONSTRAINT delivery_attempt_v2_outcome CHECK ((outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text]))),
    CONSTRAINT delivery_attempt_v2_p1796947200_pkey PRIMARY KEY (delivery_id, attempt_no, delivery_created_at)
);

CREATE TABLE delivery_attempt_v2_p1797033600 (
    delivery_id text NOT NULL,
    attempt_no integer NOT NULL,
    destination_id text NOT NULL,
    message_id text,
    run_id text,
    lease_token uuid NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    http_status integer,
    error text,
    response_excerpt text,
    next_attempt_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT delivery_attempt_v2_attempt_no CHECK ((attempt_no >= 1)),
    CONSTRAINT delivery_attempt_v2_outcome CHECK ((outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text]))),
    CONSTRAINT delivery_attempt_v2_p1797033600_pkey PRIMARY KEY (delivery_id, attempt_no, delivery_created_at)
);

CREATE TABLE delivery_attempt_v2_p1797120000 (
    delivery_id text NOT NULL,
    attempt_no integer NOT NULL,
    destination_id text NOT NULL,
    message_id text,
    run_id text,
    lease_token uuid NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    http_status integer,
    error text,
    response_excerpt text,
    next_attempt_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT delivery_attempt_v2_attempt_no CHECK ((attempt_no >= 1)),
    CONSTRAINT delivery_attempt_v2_outcome CHECK ((outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text]))),
    CONSTRAINT delivery_attempt_v2_p1797120000_pkey PRIMARY KEY (delivery_id, attempt_no, delivery_created_at)
);

CREATE TABLE delivery_attempt_v2_p1797206400 (
    delivery_id text NOT NULL,
    attempt_no integer NOT NULL,
    destination_id text NOT NULL,
    message_id text,
    run_id text,
    lease_token uuid NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    http_status integer,
    error text,
    response_excerpt text,
    next_attempt_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT delivery_attempt_v2_attempt_no CHECK ((attempt_no >= 1)),
    CONSTRAINT delivery_attempt_v2_outcome CHECK ((outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text]))),
    CONSTRAINT delivery_attempt_v2_p1797206400_pkey PRIMARY KEY (delivery_id, attempt_no, delivery_created_at)
);

CREATE TABLE delivery_body (
    delivery_id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    payload jsonb NOT NULL,
    body bytea NOT NULL,
    CONSTRAINT delivery_body_payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text)),
    CONSTRAINT delivery_body_pkey PRIMARY KEY (delivery_id, created_at)
);

CREATE TABLE delivery_body_before (
    delivery_id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    payload jsonb NOT NULL,
    body bytea NOT NULL,
    CONSTRAINT delivery_body_before_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_body_payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text))
);

CREATE TABLE delivery_body_p1796515200 (
    delivery_id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    payload jsonb NOT NULL,
    body bytea NOT NULL,
    CONSTRAINT delivery_body_p1796515200_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_body_payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text))
);

CREATE TABLE delivery_body_p1796601600 (
    delivery_id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    payload jsonb NOT NULL,
    body bytea NOT NULL,
    CONSTRAINT delivery_body_p1796601600_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_body_payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text))
);

CREATE TABLE delivery_body_p1796688000 (
    delivery_id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    payload jsonb NOT NULL,
    body bytea NOT NULL,
    CONSTRAINT delivery_body_p1796688000_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_body_payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text))
);

CREATE TABLE delivery_body_p1796774400 (
    delivery_id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    payload jsonb NOT NULL,
    body bytea NOT NULL,
    CONSTRAINT delivery_body_p1796774400_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_body_payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text))
);

CREATE TABLE delivery_body_p1796860800 (
    delivery_id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    payload jsonb NOT NULL,
    body bytea NOT NULL,
    CONSTRAINT delivery_body_p1796860800_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_body_payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text))
);

CREATE TABLE delivery_body_p1796947200 (
    delivery_id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    payload jsonb NOT NULL,
    body bytea NOT NULL,
    CONSTRAINT delivery_body_p1796947200_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_body_payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text))
);

CREATE TABLE delivery_body_p1797033600 (
    delivery_id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    payload jsonb NOT NULL,
    body bytea NOT NULL,
    CONSTRAINT delivery_body_p1797033600_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_body_payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text))
);

CREATE TABLE delivery_body_p1797120000 (
    delivery_id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    payload jsonb NOT NULL,
    body bytea NOT NULL,
    CONSTRAINT delivery_body_p1797120000_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_body_payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text))
);

CREATE TABLE delivery_body_p1797206400 (
    delivery_id text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    payload jsonb NOT NULL,
    body bytea NOT NULL,
    CONSTRAINT delivery_body_p1797206400_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_body_payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text))
);

CREATE TABLE delivery_history (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    asset_id text NOT NULL,
    event_type text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    emit_seq bigint,
    queued boolean NOT NULL,
    state text NOT NULL,
    attempt_count integer NOT NULL,
    budget_used integer NOT NULL,
    budget_started_at timestamp with time zone NOT NULL,
    dispatch_count integer NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    current_message_id text,
    last_outcome text,
    last_error text,
    wait_reason text,
    closed_reason text,
    closed_by text,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_history_closed_only_when_dead CHECK ((((closed_reason IS NULL) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'discarded'::text) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'superseded'::text) AND (closed_by IS NOT NULL)))),
    CONSTRAINT delivery_history_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_history_state CHECK ((state = ANY (ARRAY['succeeded'::text, 'dead'::text])))
);

CREATE TABLE delivery_history_before (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    asset_id text NOT NULL,
    event_type text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    emit_seq bigint,
    queued boolean NOT NULL,
    state text NOT NULL,
    attempt_count integer NOT NULL,
    budget_used integer NOT NULL,
    budget_started_at timestamp with time zone NOT NULL,
    dispatch_count integer NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    current_message_id text,
    last_outcome text,
    last_error text,
    wait_reason text,
    closed_reason text,
    closed_by text,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_history_before_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_history_closed_only_when_dead CHECK ((((closed_reason IS NULL) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'discarded'::text) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'superseded'::text) AND (closed_by IS NOT NULL)))),
    CONSTRAINT delivery_history_state CHECK ((state = ANY (ARRAY['succeeded'::text, 'dead'::text])))
);

CREATE TABLE delivery_history_p1796515200 (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    asset_id text NOT NULL,
    event_type text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    emit_seq bigint,
    queued boolean NOT NULL,
    state text NOT NULL,
    attempt_count integer NOT NULL,
    budget_used integer NOT NULL,
    budget_started_at timestamp with time zone NOT NULL,
    dispatch_count integer NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    current_message_id text,
    last_outcome text,
    last_error text,
    wait_reason text,
    closed_reason text,
    closed_by text,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_history_closed_only_when_dead CHECK ((((closed_reason IS NULL) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'discarded'::text) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'superseded'::text) AND (closed_by IS NOT NULL)))),
    CONSTRAINT delivery_history_p1796515200_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_history_state CHECK ((state = ANY (ARRAY['succeeded'::text, 'dead'::text])))
);

CREATE TABLE delivery_history_p1796601600 (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    asset_id text NOT NULL,
    event_type text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    emit_seq bigint,
    queued boolean NOT NULL,
    state text NOT NULL,
    attempt_count integer NOT NULL,
    budget_used integer NOT NULL,
    budget_started_at timestamp with time zone NOT NULL,
    dispatch_count integer NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    current_message_id text,
    last_outcome text,
    last_error text,
    wait_reason text,
    closed_reason text,
    closed_by text,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_history_closed_only_when_dead CHECK ((((closed_reason IS NULL) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'discarded'::text) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'superseded'::text) AND (closed_by IS NOT NULL)))),
    CONSTRAINT delivery_history_p1796601600_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_history_state CHECK ((state = ANY (ARRAY['succeeded'::text, 'dead'::text])))
);

CREATE TABLE delivery_history_p1796688000 (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    asset_id text NOT NULL,
    event_type text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    emit_seq bigint,
    queued boolean NOT NULL,
    state text NOT NULL,
    attempt_count integer NOT NULL,
    budget_used integer NOT NULL,
    budget_started_at timestamp with time zone NOT NULL,
    dispatch_count integer NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    current_message_id text,
    last_outcome text,
    last_error text,
    wait_reason text,
    closed_reason text,
    closed_by text,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_history_closed_only_when_dead CHECK ((((closed_reason IS NULL) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'discarded'::text) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'superseded'::text) AND (closed_by IS NOT NULL)))),
    CONSTRAINT delivery_history_p1796688000_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_history_state CHECK ((state = ANY (ARRAY['succeeded'::text, 'dead'::text])))
);

CREATE TABLE delivery_history_p1796774400 (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    asset_id text NOT NULL,
    event_type text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    emit_seq bigint,
    queued boolean NOT NULL,
    state text NOT NULL,
    attempt_count integer NOT NULL,
    budget_used integer NOT NULL,
    budget_started_at timestamp with time zone NOT NULL,
    dispatch_count integer NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    current_message_id text,
    last_outcome text,
    last_error text,
    wait_reason text,
    closed_reason text,
    closed_by text,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_history_closed_only_when_dead CHECK ((((closed_reason IS NULL) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'discarded'::text) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'superseded'::text) AND (closed_by IS NOT NULL)))),
    CONSTRAINT delivery_history_p1796774400_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_history_state CHECK ((state = ANY (ARRAY['succeeded'::text, 'dead'::text])))
);

CREATE TABLE delivery_history_p1796860800 (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    asset_id text NOT NULL,
    event_type text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    emit_seq bigint,
    queued boolean NOT NULL,
    state text NOT NULL,
    attempt_count integer NOT NULL,
    budget_used integer NOT NULL,
    budget_started_at timestamp with time zone NOT NULL,
    dispatch_count integer NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    current_message_id text,
    last_outcome text,
    last_error text,
    wait_reason text,
    closed_reason text,
    closed_by text,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_history_closed_only_when_dead CHECK ((((closed_reason IS NULL) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'discarded'::text) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'superseded'::text) AND (closed_by IS NOT NULL)))),
    CONSTRAINT delivery_history_p1796860800_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_history_state CHECK ((state = ANY (ARRAY['succeeded'::text, 'dead'::text])))
);

CREATE TABLE delivery_history_p1796947200 (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    asset_id text NOT NULL,
    event_type text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    emit_seq bigint,
    queued boolean NOT NULL,
    state text NOT NULL,
    attempt_count integer NOT NULL,
    budget_used integer NOT NULL,
    budget_started_at timestamp with time zone NOT NULL,
    dispatch_count integer NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    current_message_id text,
    last_outcome text,
    last_error text,
    wait_reason text,
    closed_reason text,
    closed_by text,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_history_closed_only_when_dead CHECK ((((closed_reason IS NULL) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'discarded'::text) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'superseded'::text) AND (closed_by IS NOT NULL)))),
    CONSTRAINT delivery_history_p1796947200_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_history_state CHECK ((state = ANY (ARRAY['succeeded'::text, 'dead'::text])))
);

CREATE TABLE delivery_history_p1797033600 (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    asset_id text NOT NULL,
    event_type text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    emit_seq bigint,
    queued boolean NOT NULL,
    state text NOT NULL,
    attempt_count integer NOT NULL,
    budget_used integer NOT NULL,
    budget_started_at timestamp with time zone NOT NULL,
    dispatch_count integer NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    current_message_id text,
    last_outcome text,
    last_error text,
    wait_reason text,
    closed_reason text,
    closed_by text,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_history_closed_only_when_dead CHECK ((((closed_reason IS NULL) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'discarded'::text) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'superseded'::text) AND (closed_by IS NOT NULL)))),
    CONSTRAINT delivery_history_p1797033600_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_history_state CHECK ((state = ANY (ARRAY['succeeded'::text, 'dead'::text])))
);

CREATE TABLE delivery_history_p1797120000 (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    asset_id text NOT NULL,
    event_type text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    emit_seq bigint,
    queued boolean NOT NULL,
    state text NOT NULL,
    attempt_count integer NOT NULL,
    budget_used integer NOT NULL,
    budget_started_at timestamp with time zone NOT NULL,
    dispatch_count integer NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    current_message_id text,
    last_outcome text,
    last_error text,
    wait_reason text,
    closed_reason text,
    closed_by text,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_history_closed_only_when_dead CHECK ((((closed_reason IS NULL) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'discarded'::text) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'superseded'::text) AND (closed_by IS NOT NULL)))),
    CONSTRAINT delivery_history_p1797120000_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_history_state CHECK ((state = ANY (ARRAY['succeeded'::text, 'dead'::text])))
);

CREATE TABLE delivery_history_p1797206400 (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    asset_id text NOT NULL,
    event_type text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    emit_seq bigint,
    queued boolean NOT NULL,
    state text NOT NULL,
    attempt_count integer NOT NULL,
    budget_used integer NOT NULL,
    budget_started_at timestamp with time zone NOT NULL,
    dispatch_count integer NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    current_message_id text,
    last_outcome text,
    last_error text,
    wait_reason text,
    closed_reason text,
    closed_by text,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_history_closed_only_when_dead CHECK ((((closed_reason IS NULL) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'discarded'::text) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'superseded'::text) AND (closed_by IS NOT NULL)))),
    CONSTRAINT delivery_history_p1797206400_pkey PRIMARY KEY (delivery_id, created_at),
    CONSTRAINT delivery_history_state CHECK ((state = ANY (ARRAY['succeeded'::text, 'dead'::text])))
);

CREATE TABLE delivery_identity (
    delivery_id text NOT NULL,
    destination_id text,
    created_at timestamp with time zone,
    final_state text,
    purged_at timestamp with time zone,
    CONSTRAINT delivery_identity_pkey PRIMARY KEY (delivery_id),
    CONSTRAINT identity_final_state CHECK ((final_state = ANY (ARRAY['succeeded'::text, 'dead'::text]))),
    CONSTRAINT tombstone_is_complete CHECK (((final_state IS NULL) OR ((destination_id IS NOT NULL) AND (created_at IS NOT NULL))))
);

CREATE TABLE delivery_requeue (
    requeue_id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    requested_by text NOT NULL,
    reason text NOT NULL,
    cohort jsonb NOT NULL,
    moved integer NOT NULL,
    requested_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT delivery_requeue_pkey PRIMARY KEY (requeue_id),
    CONSTRAINT delivery_requeue_reason_check CHECK ((length(reason) > 0))
);

CREATE TABLE delivery_requeue_item (
    requeue_id bigint NOT NULL,
    delivery_id text NOT NULL,
    previous_state text NOT NULL,
    CONSTRAINT delivery_requeue_item_pkey PRIMARY KEY (requeue_id, delivery_id),
    CONSTRAINT delivery_requeue_item_requeue_id_fkey FOREIGN KEY (requeue_id) REFERENCES delivery_requeue(requeue_id)
);

CREATE TABLE delivery_state (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    asset_id text NOT NULL,
    event_type text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    emit_seq bigint,
    queued boolean NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    attempt_count integer DEFAULT 0 NOT NULL,
    budget_used integer DEFAULT 0 NOT NULL,
    budget_started_at timestamp with time zone NOT NULL,
    dispatch_count integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    lease_until timestamp with time zone,
    lease_token uuid,
    lease_started_at timestamp with time zone,
    lease_run_id text,
    current_message_id text,
    last_outcome text,
    last_error text,
    wait_reason text,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_state_counts CHECK (((attempt_count >= 0) AND (budget_used >= 0) AND (dispatch_count >= 0))),
    CONSTRAINT delivery_state_destination_id_fkey FOREIGN KEY (destination_id) REFERENCES webhook_destination(destination_id),
    CONSTRAINT delivery_state_id_form CHECK (((delivery_id ~ '^[A-Za-z0-9_:-]+$'::text) AND (length(delivery_id) <= 200))),
    CONSTRAINT delivery_state_last_outcome CHECK ((last_outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text]))),
    CONSTRAINT delivery_state_lease_only_while_leased CHECK (((state = 'leased'::text) OR ((lease_token IS NULL) AND (lease_until IS NULL) AND (lease_started_at IS NULL)))),
    CONSTRAINT delivery_state_leased_has_lease CHECK (((state <> 'leased'::text) OR ((lease_until IS NOT NULL) AND (lease_token IS NOT NULL) AND (lease_started_at IS NOT NULL)))),
    CONSTRAINT delivery_state_pkey PRIMARY KEY (delivery_id),
    CONSTRAINT delivery_state_state CHECK (((state = ANY (ARRAY['pending'::text, 'enqueued'::text, 'leased'::text])) OR ((state = 'dead'::text) AND queued)))
) WITH (fillfactor=50);

CREATE TABLE delivery_timer (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    kind text NOT NULL,
    fire_at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_timer_kind CHECK ((kind = ANY (ARRAY['due'::text, 'parked'::text, 'inflight'::text, 'dead'::text]))),
    CONSTRAINT delivery_timer_pkey PRIMARY KEY (delivery_id)
);

CREATE TABLE delivery_tombstone_0003 (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    final_state text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    purged_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT delivery_tombstone_pkey PRIMARY KEY (delivery_id),
    CONSTRAINT tombstone_final_state CHECK ((final_state = ANY (ARRAY['succeeded'::text, 'dead'::text])))
);

CREATE TABLE destination_limiter (
    destination_id text NOT NULL,
    level double precision DEFAULT 0 NOT NULL,
    level_at timestamp with time zone DEFAULT now() NOT NULL,
    slot_until timestamp with time zone[] DEFAULT '{}'::timestamp with time zone[] NOT NULL,
    slot_holder bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    CONSTRAINT destination_limiter_destination_id_fkey FOREIGN KEY (destination_id) REFERENCES webhook_destination(destination_id) ON DELETE CASCADE,
    CONSTRAINT destination_limiter_level_check CHECK ((level >= (0)::double precision)),
    CONSTRAINT destination_limiter_pkey PRIMARY KEY (destination_id)
) WITH (fillfactor=50);

CREATE TABLE destination_subscription (
    destination_id text NOT NULL,
    pattern text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT destination_subscription_destination_id_fkey FOREIGN KEY (destination_id) REFERENCES webhook_destination(destination_id),
    CONSTRAINT destination_subscription_pkey PRIMARY KEY (destination_id, pattern),
    CONSTRAINT subscription_pattern_form CHECK ((((length(pattern) >= 1) AND (length(pattern) <= 256)) AND (pattern !~ '[[:space:][:cntrl:]]'::text) AND ((strpos(pattern, '*'::text) = 0) OR (pattern ~ '^[^*]+\.\*$'::text))))
);

CREATE TABLE dispatch_outbox_v1 (
    message_id text NOT NULL,
    delivery_id text NOT NULL,
    dispatch_no integer NOT NULL,
    destination_id text NOT NULL,
    run_id text NOT NULL,
    body bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    CONSTRAINT dispatch_outbox_delivery_id_fkey FOREIGN KEY (delivery_id) REFERENCES webhook_delivery_v1(delivery_id),
    CONSTRAINT dispatch_outbox_dispatch_no_check CHECK ((dispatch_no >= 1)),
    CONSTRAINT dispatch_outbox_pkey PRIMARY KEY (message_id),
    CONSTRAINT one_row_per_dispatch UNIQUE (delivery_id, dispatch_no)
) WITH (fillfactor=50);

CREATE TABLE dispatch_outbox_v2 (
    message_id text NOT NULL,
    delivery_id text NOT NULL,
    dispatch_no integer NOT NULL,
    destination_id text NOT NULL,
    run_id text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    CONSTRAINT dispatch_outbox_v2_dispatch_no_check CHECK ((dispatch_no >= 1)),
    CONSTRAINT dispatch_outbox_v2_message_id_names_dispatch CHECK ((message_id = ((delivery_id || ':'::text) || (dispatch_no)::text))),
    CONSTRAINT dispatch_outbox_v2_pkey PRIMARY KEY (message_id)
);

CREATE TABLE dispatch_outbox_v3 (
    message_id text NOT NULL,
    delivery_id text NOT NULL,
    dispatch_no integer NOT NULL,
    destination_id text NOT NULL,
    run_id text NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    CONSTRAINT dispatch_outbox_v3_dispatch_no CHECK ((dispatch_no >= 1)),
    CONSTRAINT dispatch_outbox_v3_message_id_names_dispatch CHECK ((message_id = ((delivery_id || ':'::text) || dispatch_no))),
    CONSTRAINT dispatch_outbox_v3_pkey PRIMARY KEY (message_id, delivery_created_at)
);

CREATE TABLE dispatch_outbox_v3_before (
    message_id text NOT NULL,
    delivery_id text NOT NULL,
    dispatch_no integer NOT NULL,
    destination_id text NOT NULL,
    run_id text NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    CONSTRAINT dispatch_outbox_v3_before_pkey PRIMARY KEY (message_id, delivery_created_at),
    CONSTRAINT dispatch_outbox_v3_dispatch_no CHECK ((dispatch_no >= 1)),
    CONSTRAINT dispatch_outbox_v3_message_id_names_dispatch CHECK ((message_id = ((delivery_id || ':'::text) || dispatch_no)))
);

CREATE TABLE dispatch_outbox_v3_p1796515200 (
    message_id text NOT NULL,
    delivery_id text NOT NULL,
    dispatch_no integer NOT NULL,
    destination_id text NOT NULL,
    run_id text NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    CONSTRAINT dispatch_outbox_v3_dispatch_no CHECK ((dispatch_no >= 1)),
    CONSTRAINT dispatch_outbox_v3_message_id_names_dispatch CHECK ((message_id = ((delivery_id || ':'::text) || dispatch_no))),
    CONSTRAINT dispatch_outbox_v3_p1796515200_pkey PRIMARY KEY (message_id, delivery_created_at)
);

CREATE TABLE dispatch_outbox_v3_p1796601600 (
    message_id text NOT NULL,
    delivery_id text NOT NULL,
    dispatch_no integer NOT NULL,
    destination_id text NOT NULL,
    run_id text NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    CONSTRAINT dispatch_outbox_v3_dispatch_no CHECK ((dispatch_no >= 1)),
    CONSTRAINT dispatch_outbox_v3_message_id_names_dispatch CHECK ((message_id = ((delivery_id || ':'::text) || dispatch_no))),
    CONSTRAINT dispatch_outbox_v3_p1796601600_pkey PRIMARY KEY (message_id, delivery_created_at)
);

CREATE TABLE dispatch_outbox_v3_p1796688000 (
    message_id text NOT NULL,
    delivery_id text NOT NULL,
    dispatch_no integer NOT NULL,
    destination_id text NOT NULL,
    run_id text NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    CONSTRAINT dispatch_outbox_v3_dispatch_no CHECK ((dispatch_no >= 1)),
    CONSTRAINT dispatch_outbox_v3_message_id_names_dispatch CHECK ((message_id = ((delivery_id || ':'::text) || dispatch_no))),
    CONSTRAINT dispatch_outbox_v3_p1796688000_pkey PRIMARY KEY (message_id, delivery_created_at)
);

CREATE TABLE dispatch_outbox_v3_p1796774400 (
    message_id text NOT NULL,
    delivery_id text NOT NULL,
    dispatch_no integer NOT NULL,
    destination_id text NOT NULL,
    run_id text NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    CONSTRAINT dispatch_outbox_v3_dispatch_no CHECK ((dispatch_no >= 1)),
    CONSTRAINT dispatch_outbox_v3_message_id_names_dispatch CHECK ((message_id = ((delivery_id || ':'::text) || dispatch_no))),
    CONSTRAINT dispatch_outbox_v3_p1796774400_pkey PRIMARY KEY (message_id, delivery_created_at)
);

CREATE TABLE dispatch_outbox_v3_p1796860800 (
    message_id text NOT NULL,
    delivery_id text NOT NULL,
    dispatch_no integer NOT NULL,
    destination_id text NOT NULL,
    run_id text NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    CONSTRAINT dispatch_outbox_v3_dispatch_no CHECK ((dispatch_no >= 1)),
    CONSTRAINT dispatch_outbox_v3_message_id_names_dispatch CHECK ((message_id = ((delivery_id || ':'::text) || dispatch_no))),
    CONSTRAINT dispatch_outbox_v3_p1796860800_pkey PRIMARY KEY (message_id, delivery_created_at)
);

CREATE TABLE dispatch_outbox_v3_p1796947200 (
    message_id text NOT NULL,
    delivery_id text NOT NULL,
    dispatch_no integer NOT NULL,
    destination_id text NOT NULL,
    run_id text NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    CONSTRAINT dispatch_outbox_v3_dispatch_no CHECK ((dispatch_no >= 1)),
    CONSTRAINT dispatch_outbox_v3_message_id_names_dispatch CHECK ((message_id = ((delivery_id || ':'::text) || dispatch_no))),
    CONSTRAINT dispatch_outbox_v3_p1796947200_pkey PRIMARY KEY (message_id, delivery_created_at)
);

CREATE TABLE dispatch_outbox_v3_p1797033600 (
    message_id text NOT NULL,
    delivery_id text NOT NULL,
    dispatch_no integer NOT NULL,
    destination_id text NOT NULL,
    run_id text NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    CONSTRAINT dispatch_outbox_v3_dispatch_no CHECK ((dispatch_no >= 1)),
    CONSTRAINT dispatch_outbox_v3_message_id_names_dispatch CHECK ((message_id = ((delivery_id || ':'::text) || dispatch_no))),
    CONSTRAINT dispatch_outbox_v3_p1797033600_pkey PRIMARY KEY (message_id, delivery_created_at)
);

CREATE TABLE dispatch_outbox_v3_p1797120000 (
    message_id text NOT NULL,
    delivery_id text NOT NULL,
    dispatch_no integer NOT NULL,
    destination_id text NOT NULL,
    run_id text NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    CONSTRAINT dispatch_outbox_v3_dispatch_no CHECK ((dispatch_no >= 1)),
    CONSTRAINT dispatch_outbox_v3_message_id_names_dispatch CHECK ((message_id = ((delivery_id || ':'::text) || dispatch_no))),
    CONSTRAINT dispatch_outbox_v3_p1797120000_pkey PRIMARY KEY (message_id, delivery_created_at)
);

CREATE TABLE dispatch_outbox_v3_p1797206400 (
    message_id text NOT NULL,
    delivery_id text NOT NULL,
    dispatch_no integer NOT NULL,
    destination_id text NOT NULL,
    run_id text NOT NULL,
    delivery_created_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    CONSTRAINT dispatch_outbox_v3_dispatch_no CHECK ((dispatch_no >= 1)),
    CONSTRAINT dispatch_outbox_v3_message_id_names_dispatch CHECK ((message_id = ((delivery_id || ':'::text) || dispatch_no))),
    CONSTRAINT dispatch_outbox_v3_p1797206400_pkey PRIMARY KEY (message_id, delivery_created_at)
);

CREATE TABLE media_hooks_partition (
    parent text NOT NULL,
    child text NOT NULL,
    lower_at timestamp with time zone NOT NULL,
    upper_at timestamp with time zone NOT NULL,
    CONSTRAINT media_hooks_partition_child UNIQUE (child),
    CONSTRAINT media_hooks_partition_pkey PRIMARY KEY (parent, lower_at),
    CONSTRAINT media_hooks_partition_range CHECK ((lower_at < upper_at))
);

CREATE TABLE media_hooks_partitioning (
    only_row boolean DEFAULT true NOT NULL,
    width_seconds integer DEFAULT 86400 NOT NULL,
    CONSTRAINT media_hooks_partitioning_only_row_check CHECK (only_row),
    CONSTRAINT media_hooks_partitioning_pkey PRIMARY KEY (only_row),
    CONSTRAINT media_hooks_partitioning_width_seconds_check CHECK ((width_seconds >= 1))
);

CREATE TABLE schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schema_migrations_pkey PRIMARY KEY (version)
);

CREATE TABLE webhook_delivery_v1 (
    delivery_id text NOT NULL,
    destination_id text NOT NULL,
    asset_id text NOT NULL,
    event_type text NOT NULL,
    payload jsonb NOT NULL,
    body bytea NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    attempt_count integer DEFAULT 0 NOT NULL,
    budget_used integer DEFAULT 0 NOT NULL,
    budget_started_at timestamp with time zone DEFAULT now() NOT NULL,
    dispatch_count integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_until timestamp with time zone,
    lease_token uuid,
    current_message_id text,
    last_outcome text,
    last_error text,
    wait_reason text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    emit_seq bigint,
    closed_reason text,
    closed_by text,
    queued boolean,
    CONSTRAINT closed_only_when_dead CHECK ((((closed_reason IS NULL) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'discarded'::text) AND (closed_by IS NULL)) OR ((state = 'dead'::text) AND (closed_reason = 'superseded'::text) AND (closed_by IS NOT NULL)))),
    CONSTRAINT delivery_id_form CHECK (((delivery_id ~ '^[A-Za-z0-9_:-]+$'::text) AND (length(delivery_id) <= 200))),
    CONSTRAINT delivery_state CHECK ((state = ANY (ARRAY['pending'::text, 'enqueued'::text, 'leased'::text, 'succeeded'::text, 'dead'::text]))),
    CONSTRAINT last_outcome_class CHECK ((last_outcome = ANY (ARRAY['success'::text, 'rate_limited'::text, 'retryable'::text, 'ambiguous'::text, 'rejected'::text]))),
    CONSTRAINT lease_only_while_leased CHECK (((state = 'leased'::text) OR ((lease_token IS NULL) AND (lease_until IS NULL)))),
    CONSTRAINT leased_has_lease CHECK (((state <> 'leased'::text) OR ((lease_until IS NOT NULL) AND (lease_token IS NOT NULL)))),
    CONSTRAINT payload_is_object CHECK ((jsonb_typeof(payload) = 'object'::text)),
    CONSTRAINT webhook_delivery_attempt_count_check CHECK ((attempt_count >= 0)),
    CONSTRAINT webhook_delivery_budget_used_check CHECK ((budget_used >= 0)),
    CONSTRAINT webhook_delivery_destination_id_fkey FOREIGN KEY (destination_id) REFERENCES webhook_destination(destination_id),
    CONSTRAINT webhook_delivery_dispatch_count_check CHECK ((dispatch_count >= 0)),
    CONSTRAINT webhook_delivery_pkey PRIMARY KEY (delivery_id)
) WITH (fillfactor=70);

CREATE TABLE webhook_destination (
    destination_id text NOT NULL,
    url text NOT NULL,
    secrets text[] DEFAULT '{}'::text[] NOT NULL,
    rate_per_second double precision DEFAULT 10 NOT NULL,
    burst integer DEFAULT 10 NOT NULL,
    max_in_flight integer DEFAULT 4 NOT NULL,
    timeout_seconds double precision DEFAULT 10 NOT NULL,
    max_attempts integer DEFAULT 20 NOT NULL,
    backoff_base_seconds double precision DEFAULT 5 NOT NULL,
    backoff_cap_seconds double precision DEFAULT 28800 NOT NULL,
    max_age_seconds double precision DEFAULT 259200 NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    disabled_reason text,
    disabled_at timestamp with time zone,
    paused_until timestamp with time zone,
    paused_reason text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    ordering text DEFAULT 'none'::text NOT NULL,
    coalescing text DEFAULT 'none'::text NOT NULL,
    allow_private_url boolean DEFAULT false NOT NULL,
    ordered_since timestamp with time zone,
    CONSTRAINT backoff_base_positive CHECK ((backoff_base_seconds > (0)::double precision)),
    CONSTRAINT backoff_cap_not_below_base CHECK ((backoff_cap_seconds >= backoff_base_seconds)),
    CONSTRAINT burst_at_least_one CHECK ((burst >= 1)),
    CONSTRAINT destination_id_form CHECK (((destination_id ~ '^[A-Za-z0-9_:-]+$'::text) AND (length(destination_id) <= 200))),
    CONSTRAINT destination_scopes CHECK ((media_hooks_scope_ok_v1(ordering) AND media_hooks_scope_ok_v1(coalescing))),
    CONSTRAINT max_age_positive CHECK ((max_age_seconds > (0)::double precision)),
    CONSTRAINT max_attempts_at_least_one CHECK ((max_attempts >= 1)),
    CONSTRAINT max_in_flight_at_least_one CHECK ((max_in_flight >= 1)),
    CONSTRAINT rate_positive CHECK ((rate_per_second > (0)::double precision)),
    CONSTRAINT secrets_well_formed CHECK (media_hooks_secrets_well_formed_v1(secrets)),
    CONSTRAINT timeout_positive CHECK ((timeout_seconds > (0)::double precision)),
    CONSTRAINT url_is_http CHECK ((url ~* '^https?://[^/]+'::text)),
    CONSTRAINT webhook_destination_pkey PRIMARY KEY (destination_id)
);

CREATE TABLE webhook_event (
    event_id text NOT NULL,
    event_type text NOT NULL,
    asset_id text NOT NULL,
    destination_ids text[] NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT event_id_form CHECK (((event_id ~ '^[A-Za-z0-9_:-]+$'::text) AND (length(event_id) <= 200))),
    CONSTRAINT webhook_event_pkey PRIMARY KEY (event_id)
);

-- Views ------------------------------------------------------------------------------------------

CREATE VIEW delivery_attempt AS
 SELECT delivery_id,
    attempt_no,
    destination_id,
    message_id,
    run_id,
    lease_token,
    started_at,
    finished_at,
    outcome,
    http_status,
    error,
    response_excerpt,
    next_attempt_at,
    retry_reason
   FROM delivery_attempt_all;

CREATE VIEW delivery_attempt_all AS
 SELECT a.delivery_id,
    a.attempt_no,
    a.destination_id,
    a.message_id,
    a.run_id,
    a.lease_token,
    a.started_at,
    a.finished_at,
    a.outcome,
    a.http_status,
    a.error,
    a.response_excerpt,
    a.next_attempt_at,
    a.retry_reason
   FROM delivery_attempt_v1 a
UNION ALL
 SELECT a.delivery_id,
    a.attempt_no,
    a.destination_id,
    a.message_id,
    a.run_id,
    a.lease_token,
    a.started_at,
    a.finished_at,
    a.outcome,
    a.http_status,
    a.error,
    a.response_excerpt,
    a.next_attempt_at,
    a.retry_reason
   FROM delivery_attempt_v2 a
UNION ALL
 SELECT s.delivery_id,
    s.attempt_count AS attempt_no,
    s.destination_id,
    s.current_message_id AS message_id,
    s.lease_run_id AS run_id,
    s.lease_token,
    s.lease_started_at AS started_at,
    NULL::timestamp with time zone AS finished_at,
    NULL::text AS outcome,
    NULL::integer AS http_status,
    NULL::text AS error,
    NULL::text AS response_excerpt,
    NULL::timestamp with time zone AS next_attempt_at,
    NULL::text AS retry_reason
   FROM delivery_timer t
     JOIN delivery_state s ON s.delivery_id = t.delivery_id
  WHERE t.kind = 'inflight'::text AND s.state = 'leased'::text;

CREATE VIEW delivery_tombstone AS
 SELECT delivery_id,
    destination_id,
    final_state,
    created_at,
    purged_at
   FROM delivery_identity
  WHERE final_state IS NOT NULL;

CREATE VIEW dispatch_outbox AS
 SELECT dispatch_outbox_v1.message_id,
    dispatch_outbox_v1.delivery_id,
    dispatch_outbox_v1.dispatch_no,
    dispatch_outbox_v1.destination_id,
    dispatch_outbox_v1.run_id,
    dispatch_outbox_v1.body,
    dispatch_outbox_v1.created_at,
    dispatch_outbox_v1.published_at
   FROM dispatch_outbox_v1
UNION ALL
 SELECT o.message_id,
    o.delivery_id,
    o.dispatch_no,
    o.destination_id,
    o.run_id,
    ( SELECT d.body
           FROM webhook_delivery_v1 d
          WHERE d.delivery_id = o.delivery_id) AS body,
    o.created_at,
    o.published_at
   FROM dispatch_outbox_v2 o
UNION ALL
 SELECT o.message_id,
    o.delivery_id,
    o.dispatch_no,
    o.destination_id,
    o.run_id,
    media_hooks_body_v1(o.delivery_id, o.delivery_created_at) AS body,
    o.created_at,
    o.published_at
   FROM dispatch_outbox_v3 o;

CREATE VIEW webhook_delivery AS
 SELECT delivery_id,
    destination_id,
    asset_id,
    event_type,
    payload,
    body,
    state,
    attempt_count,
    budget_used,
    budget_started_at,
    dispatch_count,
    next_attempt_at,
    lease_until,
    lease_token,
    current_message_id,
    last_outcome,
    last_error,
    wait_reason,
    created_at,
    updated_at,
    emit_seq,
    closed_reason,
    closed_by,
    queued
   FROM webhook_delivery_all;

CREATE VIEW webhook_delivery_all AS
 SELECT d.delivery_id,
    d.destination_id,
    d.asset_id,
    d.event_type,
    d.payload,
    d.body,
    d.state,
    d.attempt_count,
    d.budget_used,
    d.budget_started_at,
    d.dispatch_count,
    d.next_attempt_at,
    d.lease_until,
    d.lease_token,
    d.current_message_id,
    d.last_outcome,
    d.last_error,
    d.wait_reason,
    d.created_at,
    d.updated_at,
    d.emit_seq,
    d.closed_reason,
    d.closed_by,
    d.queued
   FROM webhook_delivery_v1 d
UNION ALL
 SELECT s.delivery_id,
    s.destination_id,
    s.asset_id,
    s.event_type,
    media_hooks_payload_v1(s.delivery_id, s.created_at) AS payload,
    media_hooks_body_v1(s.delivery_id, s.created_at) AS body,
    s.state,
    s.attempt_count,
    s.budget_used,
    s.budget_started_at,
    s.dispatch_count,
    s.next_attempt_at,
    s.lease_until,
    s.lease_token,
    s.current_message_id,
    s.last_outcome,
    s.last_error,
    s.wait_reason,
    s.created_at,
    s.updated_at,
    s.emit_seq,
    NULL::text AS closed_reason,
    NULL::text AS closed_by,
    s.queued
   FROM delivery_state s
UNION ALL
 SELECT h.delivery_id,
    h.destination_id,
    h.asset_id,
    h.event_type,
    media_hooks_payload_v1(h.delivery_id, h.created_at) AS payload,
    media_hooks_body_v1(h.delivery_id, h.created_at) AS body,
    h.state,
    h.attempt_count,
    h.budget_used,
    h.budget_started_at,
    h.dispatch_count,
    h.next_attempt_at,
    NULL::timestamp with time zone AS lease_until,
    NULL::uuid AS lease_token,
    h.current_message_id,
    h.last_outcome,
    h.last_error,
    h.wait_reason,
    h.created_at,
    h.finished_at AS updated_at,
    h.emit_seq,
    h.closed_reason,
    h.closed_by,
    h.queued
   FROM delivery_history h;

-- Indexes ----------------------------------------------------------------------------------------

CREATE INDEX dagster_step_output_created ON public.dagster_step_output USING btree (created_at);

CREATE UNIQUE INDEX dagster_step_output_pkey ON public.dagster_step_output USING btree (run_id, step_key, output_name, mapping_key);

CREATE INDEX delivery_attempt_destination ON public.delivery_attempt_v1 USING btree (destination_id, started_at);

CREATE UNIQUE INDEX delivery_attempt_pkey ON public.delivery_attempt_v1 USING btree (delivery_id, attempt_no);

CREATE INDEX delivery_attempt_v2_before_destination_id_started_at_idx ON public.delivery_attempt_v2_before USING btree (destination_id, started_at);

CREATE UNIQUE INDEX delivery_attempt_v2_before_pkey ON public.delivery_attempt_v2_before USING btree (delivery_id, attempt_no, delivery_created_at);

CREATE INDEX delivery_attempt_v2_p1796515200_destination_id_started_at_idx ON public.delivery_attempt_v2_p1796515200 USING btree (destination_id, started_at);

CREATE UNIQUE INDEX delivery_attempt_v2_p1796515200_pkey ON public.delivery_attempt_v2_p1796515200 USING btree (delivery_id, attempt_no, delivery_created_at);

CREATE INDEX delivery_attempt_v2_p1796601600_destination_id_started_at_idx ON public.delivery_attempt_v2_p1796601600 USING btree (destination_id, started_at);

CREATE UNIQUE INDEX delivery_attempt_v2_p1796601600_pkey ON public.delivery_attempt_v2_p1796601600 USING btree (delivery_id, attempt_no, delivery_created_at);

CREATE INDEX delivery_attempt_v2_p1796688000_destination_id_started_at_idx ON public.delivery_attempt_v2_p1796688000 USING btree (destination_id, started_at);

CREATE UNIQUE INDEX delivery_attempt_v2_p1796688000_pkey ON public.delivery_attempt_v2_p1796688000 USING btree (delivery_id, attempt_no, delivery_created_at);

CREATE INDEX delivery_attempt_v2_p1796774400_destination_id_started_at_idx ON public.delivery_attempt_v2_p1796774400 USING btree (destination_id, started_at);

CREATE UNIQUE INDEX delivery_attempt_v2_p1796774400_pkey ON public.delivery_attempt_v2_p1796774400 USING btree (delivery_id, attempt_no, delivery_created_at);

CREATE INDEX delivery_attempt_v2_p1796860800_destination_id_started_at_idx ON public.delivery_attempt_v2_p1796860800 USING btree (destination_id, started_at);

CREATE UNIQUE INDEX delivery_attempt_v2_p1796860800_pkey ON public.delivery_attempt_v2_p1796860800 USING btree (delivery_id, attempt_no, delivery_created_at);

CREATE INDEX delivery_attempt_v2_p1796947200_destination_id_started_at_idx ON public.delivery_attempt_v2_p1796947200 USING btree (destination_id, started_at);

CREATE UNIQUE INDEX delivery_attempt_v2_p1796947200_pkey ON public.delivery_attempt_v2_p1796947200 USING btree (delivery_id, attempt_no, delivery_created_at);

CREATE INDEX delivery_attempt_v2_p1797033600_destination_id_started_at_idx ON public.delivery_attempt_v2_p1797033600 USING btree (destination_id, started_at);

CREATE UNIQUE INDEX delivery_attempt_v2_p1797033600_pkey ON public.delivery_attempt_v2_p1797033600 USING btree (delivery_id, attempt_no, delivery_created_at);

CREATE INDEX delivery_attempt_v2_p1797120000_destination_id_started_at_idx ON public.delivery_attempt_v2_p1797120000 USING btree (destination_id, started_at);

CREATE UNIQUE INDEX delivery_attempt_v2_p1797120000_pkey ON public.delivery_attempt_v2_p1797120000 USING btree (delivery_id, attempt_no, delivery_created_at);

CREATE INDEX delivery_attempt_v2_p1797206400_destination_id_started_at_idx ON public.delivery_attempt_v2_p1797206400 USING btree (destination_id, started_at);

CREATE UNIQUE INDEX delivery_attempt_v2_p1797206400_pkey ON public.delivery_attempt_v2_p1797206400 USING btree (delivery_id, attempt_no, delivery_created_at);

CREATE UNIQUE INDEX delivery_body_before_pkey ON public.delivery_body_before USING btree (delivery_id, created_at);

CREATE UNIQUE INDEX delivery_body_p1796515200_pkey ON public.delivery_body_p1796515200 USING btree (delivery_id, created_at);

CREATE UNIQUE INDEX delivery_body_p1796601600_pkey ON public.delivery_body_p1796601600 USING btree (delivery_id, created_at);

CREATE UNIQUE INDEX delivery_body_p1796688000_pkey ON public.delivery_body_p1796688000 USING btree (delivery_id, created_at);

CREATE UNIQUE INDEX delivery_body_p1796774400_pkey ON public.delivery_body_p1796774400 USING btree (delivery_id, created_at);

CREATE UNIQUE INDEX delivery_body_p1796860800_pkey ON public.delivery_body_p1796860800 USING btree (delivery_id, created_at);

CREATE UNIQUE INDEX delivery_body_p1796947200_pkey ON public.delivery_body_p1796947200 USING btree (delivery_id, created_at);

CREATE UNIQUE INDEX delivery_body_p1797033600_pkey ON public.delivery_body_p1797033600 USING btree (delivery_id, created_at);

CREATE UNIQUE INDEX delivery_body_p1797120000_pkey ON public.delivery_body_p1797120000 USING btree (delivery_id, created_at);

CREATE UNIQUE INDEX delivery_body_p1797206400_pkey ON public.delivery_body_p1797206400 USING btree (delivery_id, created_at);

CREATE INDEX delivery_history_before_destination_id_finished_at_idx ON public.delivery_history_before USING btree (destination_id, finished_at) WHERE (state = 'dead'::text);

CREATE INDEX delivery_history_before_destination_id_idx ON public.delivery_history_before USING btree (destination_id) WHERE (state = 'succeeded'::text);

CREATE INDEX delivery_history_before_finished_at_idx ON public.delivery_history_before USING brin (finished_at);

CREATE UNIQUE INDEX delivery_history_before_pkey ON public.delivery_history_before USING btree (delivery_id, created_at);

CREATE INDEX delivery_history_p1796515200_destination_id_finished_at_idx ON public.delivery_history_p1796515200 USING btree (destination_id, finished_at) WHERE (state = 'dead'::text);

CREATE INDEX delivery_history_p1796515200_destination_id_idx ON public.delivery_history_p1796515200 USING btree (destination_id) WHERE (state = 'succeeded'::text);

CREATE INDEX delivery_history_p1796515200_finished_at_idx ON public.delivery_history_p1796515200 USING brin (finished_at);

CREATE UNIQUE INDEX delivery_history_p1796515200_pkey ON public.delivery_history_p1796515200 USING btree (delivery_id, created_at);

CREATE INDEX delivery_history_p1796601600_destination_id_finished_at_idx ON public.delivery_history_p1796601600 USING btree (destination_id, finished_at) WHERE (state = 'dead'::text);

CREATE INDEX delivery_history_p1796601600_destination_id_idx ON public.delivery_history_p1796601600 USING btree (destination_id) WHERE (state = 'succeeded'::text);

CREATE INDEX delivery_history_p1796601600_finished_at_idx ON public.delivery_history_p1796601600 USING brin (finished_at);

CREATE UNIQUE INDEX delivery_history_p1796601600_pkey ON public.delivery_history_p1796601600 USING btree (delivery_id, created_at);

CREATE INDEX delivery_history_p1796688000_destination_id_finished_at_idx ON public.delivery_history_p1796688000 USING btree (destination_id, finished_at) WHERE (state = 'dead'::text);

CREATE INDEX delivery_history_p1796688000_destination_id_idx ON public.delivery_history_p1796688000 USING btree (destination_id) WHERE (state = 'succeeded'::text);

CREATE INDEX delivery_history_p1796688000_finished_at_idx ON public.delivery_history_p1796688000 USING brin (finished_at);

CREATE UNIQUE INDEX delivery_history_p1796688000_pkey ON public.delivery_history_p1796688000 USING btree (delivery_id, created_at);

CREATE INDEX delivery_history_p1796774400_destination_id_finished_at_idx ON public.delivery_history_p1796774400 USING btree (destination_id, finished_at) WHERE (state = 'dead'::text);

CREATE INDEX delivery_history_p1796774400_destination_id_idx ON public.delivery_history_p1796774400 USING btree (destination_id) WHERE (state = 'succeeded'::text);

CREATE INDEX delivery_history_p1796774400_finished_at_idx ON public.delivery_history_p1796774400 USING brin (finished_at);

CREATE UNIQUE INDEX delivery_history_p1796774400_pkey ON public.delivery_history_p1796774400 USING btree (delivery_id, created_at);

CREATE INDEX delivery_history_p1796860800_destination_id_finished_at_idx ON public.delivery_history_p1796860800 USING btree (destination_id, finished_at) WHERE (state = 'dead'::text);

CREATE INDEX delivery_history_p1796860800_destination_id_idx ON public.delivery_history_p1796860800 USING btree (destination_id) WHERE (state = 'succeeded'::text);

CREATE INDEX delivery_history_p1796860800_finished_at_idx ON public.delivery_history_p1796860800 USING brin (finished_at);

CREATE UNIQUE INDEX delivery_history_p1796860800_pkey ON public.delivery_history_p1796860800 USING btree (delivery_id, created_at);

CREATE INDEX delivery_history_p1796947200_destination_id_finished_at_idx ON public.delivery_history_p1796947200 USING btree (destination_id, finished_at) WHERE (state = 'dead'::text);

CREATE INDEX delivery_history_p1796947200_destination_id_idx ON public.delivery_history_p1796947200 USING btree (destination_id) WHERE (state = 'succeeded'::text);

CREATE INDEX delivery_history_p1796947200_finished_at_idx ON public.delivery_history_p1796947200 USING brin (finished_at);

CREATE UNIQUE INDEX delivery_history_p1796947200_pkey ON public.delivery_history_p1796947200 USING btree (delivery_id, created_at);

CREATE INDEX delivery_history_p1797033600_destination_id_finished_at_idx ON public.delivery_history_p1797033600 USING btree (destination_id, finished_at) WHERE (state = 'dead'::text);

CREATE INDEX delivery_history_p1797033600_destination_id_idx ON public.delivery_history_p1797033600 USING btree (destination_id) WHERE (state = 'succeeded'::text);

CREATE INDEX delivery_history_p1797033600_finished_at_idx ON public.delivery_history_p1797033600 USING brin (finished_at);

CREATE UNIQUE INDEX delivery_history_p1797033600_pkey ON public.delivery_history_p1797033600 USING btree (delivery_id, created_at);

CREATE INDEX delivery_history_p1797120000_destination_id_finished_at_idx ON public.delivery_history_p1797120000 USING btree (destination_id, finished_at) WHERE (state = 'dead'::text);

CREATE INDEX delivery_history_p1797120000_destination_id_idx ON public.delivery_history_p1797120000 USING btree (destination_id) WHERE (state = 'succeeded'::text);

CREATE INDEX delivery_history_p1797120000_finished_at_idx ON public.delivery_history_p1797120000 USING brin (finished_at);

CREATE UNIQUE INDEX delivery_history_p1797120000_pkey ON public.delivery_history_p1797120000 USING btree (delivery_id, created_at);

CREATE INDEX delivery_history_p1797206400_destination_id_finished_at_idx ON public.delivery_history_p1797206400 USING btree (destination_id, finished_at) WHERE (state = 'dead'::text);

CREATE INDEX delivery_history_p1797206400_destination_id_idx ON public.delivery_history_p1797206400 USING btree (destination_id) WHERE (state = 'succeeded'::text);

CREATE INDEX delivery_history_p1797206400_finished_at_idx ON public.delivery_history_p1797206400 USING brin (finished_at);

CREATE UNIQUE INDEX delivery_history_p1797206400_pkey ON public.delivery_history_p1797206400 USING btree (delivery_id, created_at);

CREATE INDEX delivery_identity_created ON public.delivery_identity USING btree (created_at);

CREATE UNIQUE INDEX delivery_identity_pkey ON public.delivery_identity USING btree (delivery_id);

CREATE INDEX delivery_identity_tombstone_created ON public.delivery_identity USING btree (created_at) WHERE (final_state IS NOT NULL);

CREATE INDEX delivery_requeue_item_delivery ON public.delivery_requeue_item USING btree (delivery_id);

CREATE UNIQUE INDEX delivery_requeue_item_pkey ON public.delivery_requeue_item USING btree (requeue_id, delivery_id);

CREATE UNIQUE INDEX delivery_requeue_pkey ON public.delivery_requeue USING btree (requeue_id);

CREATE INDEX delivery_state_created ON public.delivery_state USING btree (created_at);

CREATE UNIQUE INDEX delivery_state_pkey ON public.delivery_state USING btree (delivery_id);

CREATE INDEX delivery_state_queue ON public.delivery_state USING btree (destination_id, asset_id, created_at, emit_seq) INCLUDE (event_type) WHERE queued;

CREATE INDEX delivery_timer_dead ON public.delivery_timer USING btree (destination_id, fire_at) WHERE (kind = 'dead'::text);

CREATE INDEX delivery_timer_due ON public.delivery_timer USING btree (destination_id, fire_at, delivery_id) WHERE (kind = 'due'::text);

CREATE INDEX delivery_timer_inflight ON public.delivery_timer USING btree (fire_at) WHERE (kind = 'inflight'::text);

CREATE INDEX delivery_timer_parked ON public.delivery_timer USING btree (destination_id, delivery_id) WHERE (kind = 'parked'::text);

CREATE UNIQUE INDEX delivery_timer_pkey ON public.delivery_timer USING btree (delivery_id);

CREATE INDEX delivery_tombstone_created ON public.delivery_tombstone_0003 USING btree (created_at);

CREATE UNIQUE INDEX delivery_tombstone_pkey ON public.delivery_tombstone_0003 USING btree (delivery_id);

CREATE UNIQUE INDEX destination_limiter_pkey ON public.destination_limiter USING btree (destination_id);

CREATE UNIQUE INDEX destination_subscription_pkey ON public.destination_subscription USING btree (destination_id, pattern);

CREATE INDEX dispatch_outbox_by_run ON public.dispatch_outbox_v1 USING btree (run_id);

CREATE UNIQUE INDEX dispatch_outbox_pkey ON public.dispatch_outbox_v1 USING btree (message_id);

CREATE INDEX dispatch_outbox_v2_by_run ON public.dispatch_outbox_v2 USING btree (run_id);

CREATE UNIQUE INDEX dispatch_outbox_v2_pkey ON public.dispatch_outbox_v2 USING btree (message_id);

CREATE UNIQUE INDEX dispatch_outbox_v3_before_pkey ON public.dispatch_outbox_v3_before USING btree (message_id, delivery_created_at);

CREATE INDEX dispatch_outbox_v3_before_run_id_idx ON public.dispatch_outbox_v3_before USING btree (run_id);

CREATE UNIQUE INDEX dispatch_outbox_v3_p1796515200_pkey ON public.dispatch_outbox_v3_p1796515200 USING btree (message_id, delivery_created_at);

CREATE INDEX dispatch_outbox_v3_p1796515200_run_id_idx ON public.dispatch_outbox_v3_p1796515200 USING btree (run_id);

CREATE UNIQUE INDEX dispatch_outbox_v3_p1796601600_pkey ON public.dispatch_outbox_v3_p1796601600 USING btree (message_id, delivery_created_at);

CREATE INDEX dispatch_outbox_v3_p1796601600_run_id_idx ON public.dispatch_outbox_v3_p1796601600 USING btree (run_id);

CREATE UNIQUE INDEX dispatch_outbox_v3_p1796688000_pkey ON public.dispatch_outbox_v3_p1796688000 USING btree (message_id, delivery_created_at);

CREATE INDEX dispatch_outbox_v3_p1796688000_run_id_idx ON public.dispatch_outbox_v3_p1796688000 USING btree (run_id);

CREATE UNIQUE INDEX dispatch_outbox_v3_p1796774400_pkey ON public.dispatch_outbox_v3_p1796774400 USING btree (message_id, delivery_created_at);

CREATE INDEX dispatch_outbox_v3_p1796774400_run_id_idx ON public.dispatch_outbox_v3_p1796774400 USING btree (run_id);

CREATE UNIQUE INDEX dispatch_outbox_v3_p1796860800_pkey ON public.dispatch_outbox_v3_p1796860800 USING btree (message_id, delivery_created_at);

CREATE INDEX dispatch_outbox_v3_p1796860800_run_id_idx ON public.dispatch_outbox_v3_p1796860800 USING btree (run_id);

CREATE UNIQUE INDEX dispatch_outbox_v3_p1796947200_pkey ON public.dispatch_outbox_v3_p1796947200 USING btree (message_id, delivery_created_at);

CREATE INDEX dispatch_outbox_v3_p1796947200_run_id_idx ON public.dispatch_outbox_v3_p1796947200 USING btree (run_id);

CREATE UNIQUE INDEX dispatch_outbox_v3_p1797033600_pkey ON public.dispatch_outbox_v3_p1797033600 USING btree (message_id, delivery_created_at);

CREATE INDEX dispatch_outbox_v3_p1797033600_run_id_idx ON public.dispatch_outbox_v3_p1797033600 USING btree (run_id);

CREATE UNIQUE INDEX dispatch_outbox_v3_p1797120000_pkey ON public.dispatch_outbox_v3_p1797120000 USING btree (message_id, delivery_created_at);

CREATE INDEX dispatch_outbox_v3_p1797120000_run_id_idx ON public.dispatch_outbox_v3_p1797120000 USING btree (run_id);

CREATE UNIQUE INDEX dispatch_outbox_v3_p1797206400_pkey ON public.dispatch_outbox_v3_p1797206400 USING btree (message_id, delivery_created_at);

CREATE INDEX dispatch_outbox_v3_p1797206400_run_id_idx ON public.dispatch_outbox_v3_p1797206400 USING btree (run_id);

CREATE UNIQUE INDEX media_hooks_partition_child ON public.media_hooks_partition USING btree (child);

CREATE UNIQUE INDEX media_hooks_partition_pkey ON public.media_hooks_partition USING btree (parent, lower_at);

CREATE UNIQUE INDEX media_hooks_partitioning_pkey ON public.media_hooks_partitioning USING btree (only_row);

CREATE UNIQUE INDEX one_row_per_dispatch ON public.dispatch_outbox_v1 USING btree (delivery_id, dispatch_no);

CREATE UNIQUE INDEX schema_migrations_pkey ON public.schema_migrations USING btree (version);

CREATE INDEX webhook_delivery_dead ON public.webhook_delivery_v1 USING btree (destination_id, updated_at) WHERE (state = 'dead'::text);

CREATE INDEX webhook_delivery_due_by_destination ON public.webhook_delivery_v1 USING btree (destination_id, next_attempt_at, delivery_id) WHERE (state = 'pending'::text);

CREATE INDEX webhook_delivery_enqueued ON public.webhook_delivery_v1 USING btree (updated_at) WHERE (state = 'enqueued'::text);

CREATE INDEX webhook_delivery_lease ON public.webhook_delivery_v1 USING btree (lease_until) WHERE (state = 'leased'::text);

CREATE INDEX webhook_delivery_parked ON public.webhook_delivery_v1 USING btree (destination_id, asset_id, created_at, emit_seq NULLS FIRST, delivery_id) WHERE ((state = 'pending'::text) AND (next_attempt_at >= '9999-01-01 00:00:00+00'::timestamp with time zone));

CREATE UNIQUE INDEX webhook_delivery_pkey ON public.webhook_delivery_v1 USING btree (delivery_id);

CREATE INDEX webhook_delivery_queue ON public.webhook_delivery_v1 USING btree (destination_id, asset_id, created_at, emit_seq) INCLUDE (event_type) WHERE ((queued IS NOT FALSE) AND (state <> 'succeeded'::text) AND (closed_reason IS NULL));

CREATE INDEX webhook_delivery_succeeded_by_destination ON public.webhook_delivery_v1 USING btree (destination_id) WHERE (state = 'succeeded'::text);

CREATE INDEX webhook_delivery_terminal ON public.webhook_delivery_v1 USING btree (updated_at) WHERE (state = ANY (ARRAY['succeeded'::text, 'dead'::text]));

CREATE UNIQUE INDEX webhook_destination_pkey ON public.webhook_destination USING btree (destination_id);

CREATE INDEX webhook_event_created ON public.webhook_event USING btree (created_at);

CREATE UNIQUE INDEX webhook_event_pkey ON public.webhook_event USING btree (event_id);

-- Triggers ---------------------------------------------------------------------------------------

CREATE TRIGGER delivery_state_left_queue AFTER DELETE ON public.delivery_state FOR EACH ROW WHEN (old.queued) EXECUTE FUNCTION media_hooks_state_left_queue_v1();

CREATE TRIGGER dispatch_outbox_delete INSTEAD OF DELETE ON public.dispatch_outbox FOR EACH ROW EXECUTE FUNCTION media_hooks_outbox_delete_v1();

CREATE TRIGGER dispatch_outbox_insert INSTEAD OF INSERT ON public.dispatch_outbox FOR EACH ROW EXECUTE FUNCTION media_hooks_outbox_insert_v1();

CREATE TRIGGER dispatch_outbox_update INSTEAD OF UPDATE ON public.dispatch_outbox FOR EACH ROW EXECUTE FUNCTION media_hooks_outbox_update_v1();

CREATE TRIGGER webhook_delivery_write INSTEAD OF INSERT OR DELETE OR UPDATE ON public.webhook_delivery FOR EACH ROW EXECUTE FUNCTION media_hooks_delivery_all_write_v1();

CREATE TRIGGER webhook_delivery_all_write INSTEAD OF INSERT OR DELETE OR UPDATE ON public.webhook_delivery_all FOR EACH ROW EXECUTE FUNCTION media_hooks_delivery_all_write_v1();

CREATE TRIGGER webhook_delivery_immutable AFTER UPDATE OF delivery_id, destination_id, asset_id, event_type, payload, body, created_at ON public.webhook_delivery_v1 FOR EACH ROW EXECUTE FUNCTION media_hooks_delivery_is_immutable();

CREATE TRIGGER webhook_delivery_release_queue_head AFTER UPDATE OF state, closed_reason ON public.webhook_delivery_v1 FOR EACH ROW WHEN ((((new.state = 'succeeded'::text) AND (old.state <> 'succeeded'::text)) OR ((new.closed_reason IS NOT NULL) AND (old.closed_reason IS NULL)))) EXECUTE FUNCTION media_hooks_release_queue_head_v1();

CREATE TRIGGER webhook_delivery_release_queue_head_on_purge AFTER DELETE ON public.webhook_delivery_v1 FOR EACH ROW WHEN (((old.state <> 'succeeded'::text) AND (old.closed_reason IS NULL))) EXECUTE FUNCTION media_hooks_release_queue_head_v1();

CREATE TRIGGER webhook_destination_queue_backlog BEFORE UPDATE OF ordering, coalescing ON public.webhook_destination FOR EACH ROW WHEN ((((new.ordering = 'asset'::text) AND (old.ordering <> 'asset'::text)) OR ((new.coalescing = 'asset'::text) AND (old.coalescing <> 'asset'::text)))) EXECUTE FUNCTION media_hooks_queue_backlog_v1();

-- Sequences --------------------------------------------------------------------------------------

CREATE SEQUENCE media_hooks_emit_seq;

-- Functions --------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION public.media_hooks_acquire_permits_v2(p_destination_id text, p_want integer, p_holder text, p_hold_seconds double precision, p_slot_poll_seconds double precision, p_disabled_poll_seconds double precision, p_ahead_seconds double precision, p_release integer[] DEFAULT '{}'::integer[])
 RETURNS TABLE(slots integer[], starts double precision[], granted_at timestamp with time zone, retry_in double precision, reason text)
 LANGUAGE plpgsql
AS $function$
DECLARE
    lim destination_limiter;
    dest webhook_destination;
    now_ts timestamptz;
    untils timestamptz[];
    holders bigint[];
    empty_in double precision;
    tokens integer;
    in_flight integer := 0;
    next_expiry timestamptz;
    free_slots integer;
    n integer;
    got integer[] := '{}';
    holder_key bigint := media_hooks_holder_key_v1(p_holder);
    rate_bound boolean;
    rate_wait double precision := 0;
    slot_wait double precision := 0;
BEGIN
    IF p_ahead_seconds IS NULL OR p_ahead_seconds < 0 THEN
        RAISE EXCEPTION 'p_ahead_seconds must be 0 or more, got %', p_ahead_seconds;
    END IF;
    IF cardinality(p_release) > 0 THEN
        PERFORM media_hooks_release_permits_v1(p_destination_id, p_release, p_holder);
    END IF;
    lim := media_hooks_lock_limiter_v1(p_destination_id);
    -- Read after the lock, with a fresh snapshot: a grant sees every earlier grant, release and
    -- pause, and its clock is later than theirs.
    SELECT * INTO dest FROM webhook_destination d WHERE d.destination_id = p_destination_id;
    now_ts := clock_timestamp();

    IF NOT dest.enabled THEN
        RETURN QUERY SELECT '{}'::integer[], '{}'::double precision[], now_ts,
            p_disabled_poll_seconds, 'disabled'::text;
        RETURN;
    END IF;
    IF dest.paused_until > now_ts THEN
        RETURN QUERY SELECT '{}'::integer[], '{}'::double precision[], now_ts,
            extract(epoch FROM dest.paused_until - now_ts)::double precision,
            format('paused until %s (%s)',
                   to_char(dest.paused_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                   coalesce(dest.paused_reason, 'no reason given'));
        RETURN;
    END IF;

    empty_in := media_hooks_empty_in_v1(lim.level, lim.level_at, dest.rate_per_second, now_ts);
    tokens := media_hooks_starts_allowed_v1(
        empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds);

    -- Every unexpired hold counts, including slots above a lowered max_in_flight.
    untils := lim.slot_until;
    holders := lim.slot_holder;
    FOR i IN 1 .. coalesce(array_length(untils, 1), 0) LOOP
        IF untils[i] > now_ts THEN
            in_flight := in_flight + 1;
            next_expiry := least(next_expiry, untils[i]);
        END IF;
    END LOOP;
    free_slots := greatest(dest.max_in_flight - in_flight, 0);

    n := least(p_want, tokens, free_slots);
    IF n > 0 THEN
        -- Lowest free slots first; an index past the end of the arrays extends them.
        FOR i IN 1 .. dest.max_in_flight LOOP
            EXIT WHEN cardinality(got) = n;
            IF untils[i] IS NULL OR untils[i] <= now_ts THEN
                untils[i] := now_ts + make_interval(secs => p_hold_seconds);
                holders[i] := holder_key;
                got := got || i;
            END IF;
        END LOOP;
        -- A start promised ahead keeps the level above burst until its moment.
        UPDATE destination_limiter l
           SET level = media_hooks_level_after_v1(
                   empty_in, dest.rate_per_second, p_ahead_seconds, n),
               level_at = now_ts,
               slot_until = untils, slot_holder = holders
         WHERE l.destination_id = p_destination_id;
        IF n = p_want THEN
            RETURN QUERY SELECT got,
                media_hooks_start_offsets_v1(
                    empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds, n),
                now_ts, 0::double precision, NULL::text;
            RETURN;
        END IF;
    END IF;

    rate_bound := tokens <= n;
    IF rate_bound THEN
        -- The next start, the (n + 1)-th, is worth asking for once it is within the horizon.
        rate_wait := media_hooks_rate_wait_v1(
            empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds, n);
    END IF;
    IF free_slots <= n THEN
        -- Releases are not announced: ask again after a short poll, or when a hold expires.
        slot_wait := least(p_slot_poll_seconds,
            greatest(coalesce(extract(epoch FROM next_expiry - now_ts)::double precision,
                              p_slot_poll_seconds), 0));
    END IF;
    RETURN QUERY SELECT got,
        media_hooks_start_offsets_v1(
            empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds, greatest(n, 0)),
        now_ts, greatest(rate_wait, slot_wait),
        CASE WHEN rate_bound AND rate_wait >= slot_wait THEN 'rate' ELSE 'in flight' END;
END;
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_backoff_seconds_v1(p_failed integer, p_base double precision, p_cap double precision, p_draw double precision)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT low + p_draw * (high - low)
    FROM (SELECT 0.8 * nominal AS low, greatest(least(1.2 * nominal, p_cap), 0.8 * nominal) AS high
          -- The exponent is bounded so that a huge attempt number cannot overflow.
          FROM (SELECT least(p_cap, p_base * power(2.0::double precision,
                                                   least(greatest(p_failed, 1) - 1, 64)))
                       AS nominal) AS n) AS bounds
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_body_v1(p_delivery_id text, p_created_at timestamp with time zone)
 RETURNS bytea
 LANGUAGE sql
 STABLE
AS $function$
    SELECT b.body FROM delivery_body AS b
    WHERE b.delivery_id = p_delivery_id AND b.created_at = p_created_at
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_closed_row_v1(s delivery_state, p_closed_reason text, p_closed_by text, p_wait_reason text)
 RETURNS delivery_history
 LANGUAGE sql
 STABLE
AS $function$
    SELECT * FROM media_hooks_history_row_v1(
        s, 'dead', s.budget_used, s.next_attempt_at, s.last_outcome, s.last_error,
        p_wait_reason, p_closed_reason, p_closed_by)
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_delivery_all_write_v1()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_delivery_is_immutable()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_empty_in_v1(p_level double precision, p_level_at timestamp with time zone, p_rate double precision, p_at timestamp with time zone)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT greatest(p_level / p_rate - extract(epoch FROM p_at - p_level_at)::double precision, 0)
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_end_leases_v1(p_delivery_ids text[], p_expired_only boolean, p_cause text, p_error text)
 RETURNS TABLE(delivery_id text, state text)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH ending AS (
        SELECT d.delivery_id, d.lease_token, d.attempt_count,
               CASE
                   -- In seconds, not as an interval: no stored value can overflow the test.
                   WHEN extract(epoch FROM now() - d.budget_started_at) >= w.max_age_seconds
                       THEN 'dead: older than the maximum delivery age (' || w.max_age_seconds
                            || ' s); the last lease ended without an outcome (' || p_cause || ')'
                   WHEN d.budget_used >= w.max_attempts
                       THEN 'dead: retry budget spent (' || w.max_attempts
                            || ' attempts); the last lease ended without an outcome ('
                            || p_cause || ')'
               END AS death
        FROM webhook_delivery AS d
        JOIN webhook_destination AS w ON w.destination_id = d.destination_id
        WHERE d.delivery_id = ANY (p_delivery_ids)
          -- As one CASE (0004's reason): the state can only filter rows found by key, never
          -- send the planner to the partial index of leased rows.
          AND CASE WHEN d.state = 'leased' THEN NOT p_expired_only OR d.lease_until < now()
                   ELSE false END
        FOR UPDATE OF d SKIP LOCKED
    ),
    moved AS (
        UPDATE webhook_delivery AS d
        SET state = CASE WHEN ending.death IS NULL THEN 'pending' ELSE 'dead' END,
            next_attempt_at = now(),
            lease_until = NULL,
            lease_token = NULL,
            last_outcome = 'ambiguous',
            last_error = p_error,
            wait_reason = coalesce(ending.death, p_cause || ': due again now'),
            updated_at = now()
        FROM ending
        WHERE d.delivery_id = ending.delivery_id
        RETURNING d.delivery_id, d.state, ending.lease_token, ending.attempt_count
    ),
    closed AS (
        UPDATE delivery_attempt AS a
        SET finished_at = now(),
            outcome = 'ambiguous',
            error = p_error,
            retry_reason = p_cause
        FROM moved
        WHERE a.delivery_id = moved.delivery_id
          AND a.attempt_no = moved.attempt_count
          AND a.lease_token = moved.lease_token
          AND a.finished_at IS NULL
    )
    SELECT moved.delivery_id, moved.state FROM moved;
END;
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_end_leases_v2(p_delivery_ids text[], p_expired_only boolean, p_cause text, p_error text)
 RETURNS TABLE(delivery_id text, state text)
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_end_previous_leases_v1(p_delivery_ids text[], p_expired_only boolean, p_cause text, p_error text)
 RETURNS TABLE(delivery_id text, state text)
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF cardinality(p_delivery_ids) > 0 THEN
        RETURN QUERY
        SELECT * FROM media_hooks_end_leases_v1(p_delivery_ids, p_expired_only, p_cause, p_error);
    END IF;
END
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_event_delivery_id_v1(p_event_id text, p_destination_id text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$
    SELECT 'fan_' || left(encode(sha256(convert_to(p_event_id || '/' || p_destination_id, 'UTF8')), 'hex'), 32)
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_free_slots_v1(INOUT untils timestamp with time zone[], INOUT holders bigint[], p_slots integer[], p_holder_key bigint, OUT released integer)
 RETURNS record
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
DECLARE
    slot integer;
BEGIN
    released := 0;
    FOREACH slot IN ARRAY p_slots LOOP
        IF holders[slot] = p_holder_key AND untils[slot] IS NOT NULL THEN
            untils[slot] := NULL;
            holders[slot] := NULL;
            released := released + 1;
        END IF;
    END LOOP;
END;
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_held_by_v2(p_ordering text, p_coalescing text, p_destination_id text, p_asset_id text, p_event_type text, p_created_at timestamp with time zone, p_emit_seq bigint, p_delivery_id text)
 RETURNS SETOF text
 LANGUAGE sql
 STABLE
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_history_row_v1(s delivery_state, p_state text, p_budget_used integer, p_next_attempt_at timestamp with time zone, p_last_outcome text, p_last_error text, p_wait_reason text, p_closed_reason text DEFAULT NULL::text, p_closed_by text DEFAULT NULL::text)
 RETURNS delivery_history
 LANGUAGE sql
 STABLE
AS $function$
    SELECT s.delivery_id, s.destination_id, s.asset_id, s.event_type, s.created_at, s.emit_seq,
           s.queued, p_state, s.attempt_count, p_budget_used, s.budget_started_at,
           s.dispatch_count, p_next_attempt_at, s.current_message_id, p_last_outcome,
           p_last_error, p_wait_reason, p_closed_reason, p_closed_by, now()
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_holder_key_v1(p_holder text)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT hashtextextended(p_holder, 0) $function$;

CREATE OR REPLACE FUNCTION public.media_hooks_horizon_v1(p_ahead double precision, p_rate double precision)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT least(p_ahead, 1 / p_rate) $function$;

CREATE OR REPLACE FUNCTION public.media_hooks_in_cohort(delivery webhook_delivery_v1, destination_ids text[], event_types text[], asset_ids text[], created_after timestamp with time zone, created_before timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT (cardinality(destination_ids) = 0 OR delivery.destination_id = ANY (destination_ids))
       AND (cardinality(event_types) = 0 OR delivery.event_type = ANY (event_types))
       AND (cardinality(asset_ids) = 0 OR delivery.asset_id = ANY (asset_ids))
       AND (created_after IS NULL OR delivery.created_at >= created_after)
       AND (created_before IS NULL OR delivery.created_at < created_before)
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_in_cohort_v2(p_destination_id text, p_event_type text, p_asset_id text, p_created_at timestamp with time zone, destination_ids text[], event_types text[], asset_ids text[], created_after timestamp with time zone, created_before timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT (cardinality(destination_ids) = 0 OR p_destination_id = ANY (destination_ids))
       AND (cardinality(event_types) = 0 OR p_event_type = ANY (event_types))
       AND (cardinality(asset_ids) = 0 OR p_asset_id = ANY (asset_ids))
       AND (created_after IS NULL OR p_created_at >= created_after)
       AND (created_before IS NULL OR p_created_at < created_before)
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_lease_previous_layout_v1(p_run_id text, p_delivery_ids text[], p_message_ids text[], p_lease_seconds double precision)
 RETURNS TABLE(delivery_id text, message_id text, lease_token uuid, attempt_no integer, budget_used integer, body bytea)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
AS $function$
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
            UPDATE webhook_delivery AS d
            SET state = 'leased',
                lease_token = gen_random_uuid(),
                lease_until = now() + make_interval(secs => p_lease_seconds),
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
            RETURNING d.delivery_id, d.destination_id, d.current_message_id AS message_id,
                      d.lease_token, d.attempt_count AS attempt_no, d.budget_used, d.body
        ),
        opened AS (
            INSERT INTO delivery_attempt
                (delivery_id, attempt_no, destination_id, message_id, run_id, lease_token)
            SELECT l.delivery_id, l.attempt_no, l.destination_id, l.message_id, p_run_id,
                   l.lease_token
            FROM leased AS l
        )
        SELECT l.delivery_id, l.message_id, l.lease_token, l.attempt_no, l.budget_used, l.body
        FROM leased AS l;
        GET DIAGNOSTICS leased_now = ROW_COUNT;
        leased_total := leased_total + leased_now;
        EXIT WHEN leased_total = cardinality(p_delivery_ids);
        -- Held offers are handed back parked (after each pass: the second leases deliveries
        -- whose expired lease just ended, which may be held as well).
        UPDATE webhook_delivery AS d
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
                                                 d.emit_seq, d.delivery_id));
        EXIT WHEN pass = 2;
        -- Some were not leased: those whose lease expired end now; the second pass leases the
        -- ones that came out pending (the rest were leased already, or are stale or terminal).
        PERFORM 1 FROM media_hooks_end_leases_v1(
            p_delivery_ids, true,
            'lease expiry (taken over by run ' || p_run_id || ')',
            'lease expired before an outcome was recorded (worker lost or too slow)') AS ended
        WHERE ended.state = 'pending';
        EXIT WHEN NOT FOUND;
    END LOOP;
END;
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_lease_state_v1(p_run_id text, p_delivery_ids text[], p_message_ids text[], p_lease_seconds double precision)
 RETURNS TABLE(delivery_id text, message_id text, lease_token uuid, attempt_no integer, budget_used integer, body bytea)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_lease_v2(p_run_id text, p_delivery_ids text[], p_message_ids text[], p_lease_seconds double precision)
 RETURNS TABLE(delivery_id text, message_id text, lease_token uuid, attempt_no integer, budget_used integer, body bytea)
 LANGUAGE plpgsql
AS $function$
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
    $function$;

CREATE OR REPLACE FUNCTION public.media_hooks_lease_with_permits_v4(p_destination_id text, p_holder text, p_hold_seconds double precision, p_slot_poll_seconds double precision, p_disabled_poll_seconds double precision, p_ahead_seconds double precision, p_release integer[], p_run_id text, p_delivery_ids text[], p_message_ids text[])
 RETURNS TABLE(examined integer, granted_at timestamp with time zone, retry_in double precision, reason text, slot integer, start_at timestamp with time zone, answered_at timestamp with time zone, delivery_id text, message_id text, lease_token uuid, attempt_no integer, budget_used integer, body bytea)
 LANGUAGE plpgsql
AS $function$
DECLARE
    lim destination_limiter;
    dest webhook_destination;
    holder_key bigint := media_hooks_holder_key_v1(p_holder);
    untils timestamptz[];
    holders bigint[];
    changed boolean := false;
    released integer;
    empty_in double precision;
    tokens integer;
    in_flight integer := 0;
    next_expiry timestamptz;
    free_slots integer;
    granted integer;
    got integer[] := '{}';
    rate_bound boolean;
    rate_wait double precision := 0;
    slot_wait double precision := 0;
    -- The leases, column by column: rows are returned once their starts are scheduled.
    leased_ids text[];
    leased_messages text[];
    tokens_out uuid[];
    attempts integer[];
    budgets integer[];
    bodies bytea[];
    used integer;
    leased_at timestamptz;
    offsets double precision[];
BEGIN
    IF p_ahead_seconds IS NULL OR p_ahead_seconds < 0 THEN
        RAISE EXCEPTION 'p_ahead_seconds must be 0 or more, got %', p_ahead_seconds;
    END IF;
    lim := media_hooks_lock_limiter_v1(p_destination_id);
    -- Read after the lock, with a fresh snapshot: a grant sees every earlier grant, release and
    -- pause, and its clock is later than theirs.
    SELECT * INTO dest FROM webhook_destination d WHERE d.destination_id = p_destination_id;
    granted_at := clock_timestamp();
    untils := lim.slot_until;
    holders := lim.slot_holder;

    -- Finished requests' slots first (media_hooks_release_permits_v1's rule: only this
    -- holder's holds).
    FOREACH released IN ARRAY coalesce(p_release, '{}') LOOP
        IF holders[released] = holder_key AND untils[released] IS NOT NULL THEN
            untils[released] := NULL;
            holders[released] := NULL;
            changed := true;
        END IF;
    END LOOP;

    -- The grant: media_hooks_acquire_permits_v2's rule. Nothing while disabled or paused.
    IF NOT dest.enabled THEN
        granted := 0;
        retry_in := p_disabled_poll_seconds;
        reason := 'disabled';
    ELSIF dest.paused_until > granted_at THEN
        granted := 0;
        retry_in := extract(epoch FROM dest.paused_until - granted_at)::double precision;
        reason := format('paused until %s (%s)',
                         to_char(dest.paused_until AT TIME ZONE 'UTC',
                                 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                         coalesce(dest.paused_reason, 'no reason given'));
    ELSE
        empty_in := media_hooks_empty_in_v1(
            lim.level, lim.level_at, dest.rate_per_second, granted_at);
        tokens := media_hooks_starts_allowed_v1(
            empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds);
        -- Every unexpired hold counts, including slots above a lowered max_in_flight.
        FOR i IN 1 .. coalesce(array_length(untils, 1), 0) LOOP
            IF untils[i] > granted_at THEN
                in_flight := in_flight + 1;
                next_expiry := least(next_expiry, untils[i]);
            END IF;
        END LOOP;
        free_slots := greatest(dest.max_in_flight - in_flight, 0);
        granted := least(cardinality(p_delivery_ids), tokens, free_slots);
        -- Lowest free slots first; an index past the end of the arrays extends them.
        FOR i IN 1 .. dest.max_in_flight LOOP
            EXIT WHEN cardinality(got) >= granted;
            IF untils[i] IS NULL OR untils[i] <= granted_at THEN
                untils[i] := granted_at + make_interval(secs => p_hold_seconds);
                holders[i] := holder_key;
                got := got || i;
            END IF;
        END LOOP;
        IF granted > 0 THEN
            -- The grant's starts, as acquire_permits_v2 counts them (withdrawn below: only
            -- the leased ones are scheduled).
            lim.level := media_hooks_level_after_v1(
                empty_in, dest.rate_per_second, p_ahead_seconds, granted);
            lim.level_at := granted_at;
        END IF;
        retry_in := 0;
        IF granted = 0 OR granted < cardinality(p_delivery_ids) THEN
            rate_bound := tokens <= granted;
            IF rate_bound THEN
                -- The next start is worth asking for once it is within the horizon.
                rate_wait := media_hooks_rate_wait_v1(
                    empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds, granted);
            END IF;
            IF free_slots <= granted THEN
                -- Releases are not announced: ask again after a short poll, or when a hold
                -- expires.
                slot_wait := least(p_slot_poll_seconds,
                    greatest(coalesce(extract(epoch FROM next_expiry - granted_at)::double precision,
                                      p_slot_poll_seconds), 0));
            END IF;
            retry_in := greatest(rate_wait, slot_wait);
            reason := CASE WHEN rate_bound AND rate_wait >= slot_wait THEN 'rate'
                           ELSE 'in flight' END;
        END IF;
    END IF;
    examined := granted;

    IF granted > 0 THEN
        SELECT coalesce(array_agg(l.delivery_id ORDER BY l.n), '{}'),
               coalesce(array_agg(l.message_id ORDER BY l.n), '{}'),
               coalesce(array_agg(l.lease_token ORDER BY l.n), '{}'),
               coalesce(array_agg(l.attempt_no ORDER BY l.n), '{}'),
               coalesce(array_agg(l.budget_used ORDER BY l.n), '{}'),
               coalesce(array_agg(l.body ORDER BY l.n), '{}')
          INTO leased_ids, leased_messages, tokens_out, attempts, budgets, bodies
          FROM media_hooks_lease_v2(
              p_run_id, p_delivery_ids[1:granted], p_message_ids[1:granted], p_hold_seconds)
               WITH ORDINALITY
               AS l (delivery_id, message_id, lease_token, attempt_no, budget_used, body, n);
        used := cardinality(leased_ids);
        -- Offers no longer theirs to send give their slots back at once.
        FOR i IN used + 1 .. granted LOOP
            untils[got[i]] := NULL;
            holders[got[i]] := NULL;
        END LOOP;
        -- v3's schedule: the grant's starts withdrawn, the rest of the bucket drained until
        -- now, and the leased starts scheduled from the moment the lease is made (0009): a
        -- lease that waited on a lock neither spends the starts of the time it waited nor
        -- sends them on top of the next grant. A start promised ahead keeps the level above
        -- burst until its moment.
        leased_at := clock_timestamp();
        empty_in := media_hooks_empty_in_v1(lim.level - granted, lim.level_at,
                                            dest.rate_per_second, leased_at);
        offsets := media_hooks_start_offsets_v1(
            empty_in, dest.rate_per_second, dest.burst, p_ahead_seconds, used);
        lim.level := media_hooks_level_after_v1(
            empty_in, dest.rate_per_second, p_ahead_seconds, used);
        lim.level_at := leased_at;
        changed := true;
    END IF;

    IF changed THEN
        UPDATE destination_limiter l
           SET level = lim.level, level_at = lim.level_at,
               slot_until = untils, slot_holder = holders
         WHERE l.destination_id = p_destination_id;
    END IF;
    answered_at := clock_timestamp();
    IF reason = 'rate' AND granted > 0 THEN
        retry_in := greatest(
            media_hooks_rate_wait_v1(empty_in, dest.rate_per_second, dest.burst,
                                     p_ahead_seconds, used)
            - extract(epoch FROM answered_at - leased_at)::double precision,
            0);
    END IF;

    IF coalesce(used, 0) = 0 THEN
        RETURN NEXT;
        RETURN;
    END IF;
    FOR i IN 1 .. used LOOP
        slot := got[i];
        start_at := leased_at + make_interval(secs => offsets[i]);
        delivery_id := leased_ids[i];
        message_id := leased_messages[i];
        lease_token := tokens_out[i];
        attempt_no := attempts[i];
        budget_used := budgets[i];
        body := bodies[i];
        RETURN NEXT;
    END LOOP;
END;
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_level_after_v1(p_empty_in double precision, p_rate double precision, p_ahead double precision, p_count integer)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT p_rate * media_hooks_restart_in_v1(p_empty_in, p_rate, p_ahead) + p_count
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_lock_limiter_v1(p_destination_id text)
 RETURNS destination_limiter
 LANGUAGE plpgsql
AS $function$
DECLARE
    lim destination_limiter;
BEGIN
    SELECT * INTO lim FROM destination_limiter l
     WHERE l.destination_id = p_destination_id FOR UPDATE;
    IF FOUND THEN
        RETURN lim;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM webhook_destination d WHERE d.destination_id = p_destination_id) THEN
        RAISE EXCEPTION 'unknown destination %', p_destination_id USING ERRCODE = 'no_data_found';
    END IF;
    INSERT INTO destination_limiter (destination_id) VALUES (p_destination_id)
    ON CONFLICT (destination_id) DO NOTHING;
    SELECT * INTO lim FROM destination_limiter l
     WHERE l.destination_id = p_destination_id FOR UPDATE;
    RETURN lim;
END;
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_make_partitions_v1(p_until timestamp with time zone)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO '$user', 'public'
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_outbox_delete_v1()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_outbox_insert_v1()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    delivery_body bytea;
BEGIN
    SELECT d.body INTO delivery_body
    FROM webhook_delivery AS d
    WHERE d.delivery_id = NEW.delivery_id;
    -- A missing delivery is left to the foreign key's own error.
    IF FOUND AND NEW.body IS DISTINCT FROM delivery_body THEN
        RAISE EXCEPTION 'dispatch % has a body that is not its delivery''s', NEW.message_id
            USING ERRCODE = 'check_violation',
                  HINT = 'dispatch_outbox shows each dispatch with its delivery''s body';
    END IF;
    INSERT INTO dispatch_outbox_v2
        (message_id, delivery_id, dispatch_no, destination_id, run_id, created_at, published_at)
    VALUES (NEW.message_id, NEW.delivery_id, NEW.dispatch_no, NEW.destination_id, NEW.run_id,
            coalesce(NEW.created_at, now()), NEW.published_at)
    RETURNING created_at INTO NEW.created_at;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_outbox_update_v1()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_parking_v2(p_held boolean, p_due timestamp with time zone)
 RETURNS TABLE(next_attempt_at timestamp with time zone, wait_reason text)
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN p_held THEN timestamptz '9999-01-01 00:00:00+00' ELSE p_due END,
           CASE WHEN p_held THEN 'held behind an earlier delivery of its asset (ordered destination)' END
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_pause_destination_v1(p_destination_id text, p_seconds double precision, p_reason text)
 RETURNS TABLE(paused_from timestamp with time zone, paused_until timestamp with time zone)
 LANGUAGE plpgsql
AS $function$
DECLARE
    now_ts timestamptz;
    until_ts timestamptz;
BEGIN
    PERFORM media_hooks_lock_limiter_v1(p_destination_id);
    now_ts := clock_timestamp();
    until_ts := now_ts + make_interval(secs => p_seconds);
    UPDATE webhook_destination d
       SET paused_reason = CASE WHEN d.paused_until >= until_ts THEN d.paused_reason ELSE p_reason END,
           paused_until = greatest(d.paused_until, until_ts),
           updated_at = now_ts
     WHERE d.destination_id = p_destination_id
    RETURNING d.paused_until INTO until_ts;
    RETURN QUERY SELECT now_ts, until_ts;
END;
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_payload_v1(p_delivery_id text, p_created_at timestamp with time zone)
 RETURNS jsonb
 LANGUAGE sql
 STABLE
AS $function$
    SELECT b.payload FROM delivery_body AS b
    WHERE b.delivery_id = p_delivery_id AND b.created_at = p_created_at
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_queue_backlog_v1()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_rate_wait_v1(p_empty_in double precision, p_rate double precision, p_burst integer, p_ahead double precision, p_count integer)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT greatest(media_hooks_restart_in_v1(p_empty_in, p_rate, p_ahead)
                    + (p_count + 1 - p_burst) / p_rate
                    - media_hooks_horizon_v1(p_ahead, p_rate), 0)
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_record_outcomes_v1(p_outcomes jsonb)
 RETURNS TABLE(delivery_id text, state text, stopped text)
 LANGUAGE plpgsql
AS $function$
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
            JOIN webhook_delivery AS d ON d.delivery_id = g.delivery_id
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
               d.attempt_count AS attempt_no,
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
        JOIN webhook_delivery AS d
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
    moved AS (
        UPDATE webhook_delivery AS d
        SET state = decided.next_state,
            next_attempt_at = CASE WHEN decided.next_state = 'pending'
                                   THEN now() + make_interval(secs => decided.delay)
                                   ELSE d.next_attempt_at END,
            -- A rate-limited or spared attempt gives its unit of retry budget back.
            budget_used = CASE WHEN decided.outcome = 'rate_limited' OR decided.spare
                               THEN greatest(d.budget_used - 1, 0) ELSE d.budget_used END,
            lease_until = NULL,
            lease_token = NULL,
            last_outcome = decided.outcome,
            last_error = decided.error,
            wait_reason = decided.reason,
            updated_at = now()
        FROM decided
        WHERE d.delivery_id = decided.delivery_id
          AND d.lease_token = decided.lease_token
        RETURNING d.delivery_id, d.destination_id, d.state, d.next_attempt_at, decided.attempt_no,
                  decided.outcome, decided.http_status, decided.error, decided.excerpt,
                  decided.reason, decided.finished_ago
    ),
    closed AS (
        UPDATE delivery_attempt AS a
        SET finished_at = greatest(a.started_at,
                                   now() - make_interval(secs => greatest(moved.finished_ago, 0))),
            outcome = moved.outcome,
            http_status = moved.http_status,
            error = moved.error,
            response_excerpt = moved.excerpt,
            next_attempt_at = CASE WHEN moved.state = 'pending' THEN moved.next_attempt_at END,
            retry_reason = moved.reason
        FROM moved
        WHERE a.delivery_id = moved.delivery_id AND a.attempt_no = moved.attempt_no
    ),
    -- Latest wins (0020): on a destination that coalesces by asset, a success closes the older
    -- deliveries of its asset and type still waiting, as sweep_superseded would. Sent after it,
    -- one would leave the receiver on stale content, and nothing else closes it: the sweep and
    -- the claim's rule (media_hooks_held_by_v2) read only open rows, never a newer success.
    -- One asset's open queue is read (webhook_delivery_queue); a row another session
    -- holds is skipped.
    superseded AS (
        UPDATE webhook_delivery AS o
        SET state = 'dead',
            closed_reason = 'superseded',
            closed_by = stale.newer_id,
            wait_reason = 'superseded by ' || stale.newer_id,
            updated_at = now()
        FROM (
            SELECT older.delivery_id, n.delivery_id AS newer_id
            FROM moved AS m
            JOIN webhook_delivery AS n ON n.delivery_id = m.delivery_id
            JOIN webhook_destination AS w
              ON w.destination_id = n.destination_id AND w.coalescing = 'asset'
            CROSS JOIN LATERAL (
                SELECT e.delivery_id
                FROM webhook_delivery AS e
                WHERE e.destination_id = n.destination_id AND e.asset_id = n.asset_id
                  AND e.queued IS NOT FALSE
                  AND e.state = 'pending' AND e.closed_reason IS NULL
                  AND e.event_type = n.event_type
                  AND (e.created_at, coalesce(e.emit_seq, 0), e.delivery_id)
                      < (n.created_at, coalesce(n.emit_seq, 0), n.delivery_id)
                FOR UPDATE SKIP LOCKED
            ) AS older
            WHERE m.state = 'succeeded'
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
        JOIN webhook_delivery AS d ON d.delivery_id = g.delivery_id
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
                   (SELECT x.destination_id FROM webhook_delivery AS x
                    WHERE x.delivery_id = g.delivery_id))
           ) END
    FROM given AS g
    LEFT JOIN moved ON moved.delivery_id = g.delivery_id;
END;
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_record_outcomes_v2(p_outcomes jsonb)
 RETURNS TABLE(delivery_id text, state text, stopped text)
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_release_holder_v1(p_holder text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    holder_key bigint := media_hooks_holder_key_v1(p_holder);
    lim destination_limiter;
    slot integer;
    released integer := 0;
BEGIN
    FOR lim IN
        SELECT * FROM destination_limiter l
         WHERE holder_key = ANY (l.slot_holder)
         ORDER BY l.destination_id
           FOR UPDATE
    LOOP
        FOR slot IN 1 .. coalesce(array_length(lim.slot_holder, 1), 0) LOOP
            IF lim.slot_holder[slot] = holder_key AND lim.slot_until[slot] IS NOT NULL THEN
                lim.slot_until[slot] := NULL;
                lim.slot_holder[slot] := NULL;
                released := released + 1;
            END IF;
        END LOOP;
        UPDATE destination_limiter l SET slot_until = lim.slot_until, slot_holder = lim.slot_holder
         WHERE l.destination_id = lim.destination_id;
    END LOOP;
    RETURN released;
END;
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_release_permits_v1(p_destination_id text, p_slots integer[], p_holder text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    lim destination_limiter;
    freed record;
BEGIN
    SELECT * INTO lim FROM destination_limiter l
     WHERE l.destination_id = p_destination_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    SELECT * INTO freed FROM media_hooks_free_slots_v1(
        lim.slot_until, lim.slot_holder, p_slots, media_hooks_holder_key_v1(p_holder));
    IF freed.released > 0 THEN
        UPDATE destination_limiter l SET slot_until = freed.untils, slot_holder = freed.holders
         WHERE l.destination_id = p_destination_id;
    END IF;
    RETURN freed.released;
END;
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_release_queue_head_v1()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM media_hooks_wake_queue_head_v1(OLD.destination_id, OLD.asset_id, OLD.delivery_id);
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_restart_in_v1(p_empty_in double precision, p_rate double precision, p_ahead double precision)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT greatest(p_empty_in, media_hooks_horizon_v1(p_ahead, p_rate) / 2)
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_retry_after_seconds_v1(p_seconds double precision)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$
    SELECT least(greatest(p_seconds, 0), 3600)
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_rfc3339_v1(moment timestamp with time zone)
 RETURNS text
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT to_char(moment AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_scope_ok_v1(p_scope text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT p_scope IN ('none', 'asset')
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_secrets_well_formed_v1(p_secrets text[])
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT coalesce(bool_and(s ~ '^(whsec_[A-Za-z0-9+/]+={0,2}|fernet:[A-Za-z0-9_-]+={0,2})$'), true)
    FROM unnest(p_secrets) AS s
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_share_like_v1(p_model regclass, p_relations text[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_start_offsets_v1(p_empty_in double precision, p_rate double precision, p_burst integer, p_ahead double precision, p_count integer)
 RETURNS double precision[]
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT coalesce(array_agg(
               CASE WHEN p_empty_in + (k - p_burst) / p_rate <= 1e-9 THEN 0
                    ELSE media_hooks_restart_in_v1(p_empty_in, p_rate, p_ahead)
                         + (k - p_burst) / p_rate
               END ORDER BY k),
           '{}')
      FROM generate_series(1, p_count) AS k
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_starts_allowed_v1(p_empty_in double precision, p_rate double precision, p_burst integer, p_ahead double precision)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT greatest(
        floor(p_burst
              + p_rate * (media_hooks_horizon_v1(p_ahead, p_rate)
                          - media_hooks_restart_in_v1(p_empty_in, p_rate, p_ahead))
              + 1e-9)::integer,
        0)
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_state_left_queue_v1()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM media_hooks_wake_queue_head_v1(OLD.destination_id, OLD.asset_id, OLD.delivery_id);
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_subscribed_v1(p_destination_id text, p_event_type text)
 RETURNS boolean
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT NOT EXISTS (SELECT 1 FROM destination_subscription s
                       WHERE s.destination_id = p_destination_id)
        OR EXISTS (SELECT 1 FROM destination_subscription s
                   WHERE s.destination_id = p_destination_id
                     AND (s.pattern = p_event_type
                          OR (right(s.pattern, 2) = '.*'
                              AND starts_with(p_event_type, left(s.pattern, -1)))))
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_wake_queue_head_v1(p_destination_id text, p_asset_id text, p_leaving text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.media_hooks_whole_seconds_v1(p_seconds double precision)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT round(p_seconds)::bigint::text
$function$;
