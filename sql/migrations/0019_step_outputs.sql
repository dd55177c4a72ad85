-- 0019: what one step of a Dagster run hands the next, kept in PostgreSQL (issue 31).
--
-- On the Celery executor a delivery run's steps execute on workers that share nothing but this
-- database and the broker: prepare on one, each shard on another, the summary on a third. What
-- a step hands the next (the prepared cohort, each shard, each shard's counts) can then no
-- longer stay in a local folder, where Dagster's default IO manager keeps it. The project's IO
-- manager (media_hooks/orchestration/resources/step_outputs.py) keeps one row per output here:
-- a few hundred bytes each, a handful per run. A step executed again (a Celery task delivered
-- again after its worker died, a Dagster retry) overwrites its row. The retention job deletes
-- rows past its window; re-executing an older run from a failed step needs its rows.
-- keeps: no invariant of docs/architecture.md (Dagster's hand-over between steps, not delivery state).

CREATE TABLE dagster_step_output (
    run_id text NOT NULL,
    step_key text NOT NULL,
    output_name text NOT NULL,
    -- A dynamic output's mapping key ('' for a plain output).
    mapping_key text NOT NULL DEFAULT '',
    value bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, step_key, output_name, mapping_key)
);

CREATE INDEX dagster_step_output_created ON dagster_step_output (created_at);
