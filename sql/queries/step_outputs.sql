-- What one step of a Dagster run hands the next (media_hooks/orchestration/resources/step_outputs.py).
-- keeps: no invariant of docs/architecture.md: these rows are Dagster's hand-over between steps, never
--   delivery state; nothing here reads or moves a delivery.

-- name: save_step_output
-- description: Store one step output; a step executed again replaces what it stored before.
INSERT INTO dagster_step_output (run_id, step_key, output_name, mapping_key, value)
VALUES (%(run_id)s, %(step_key)s, %(output_name)s, %(mapping_key)s, %(value)s)
ON CONFLICT (run_id, step_key, output_name, mapping_key)
DO UPDATE SET value = EXCLUDED.value, created_at = now();

-- name: load_step_output
-- description: One step output, by the run and step that stored it.
SELECT value
FROM dagster_step_output
WHERE run_id = %(run_id)s
  AND step_key = %(step_key)s
  AND output_name = %(output_name)s
  AND mapping_key = %(mapping_key)s;

-- name: purge_step_outputs
-- description: Delete one batch of step outputs stored before the cutoff; returns how many.
WITH victims AS (
    SELECT run_id, step_key, output_name, mapping_key
    FROM dagster_step_output
    WHERE created_at < %(cutoff)s
    ORDER BY created_at
    LIMIT %(batch_size)s
),
deleted AS (
    DELETE FROM dagster_step_output AS o
    USING victims AS v
    WHERE (o.run_id, o.step_key, o.output_name, o.mapping_key)
        = (v.run_id, v.step_key, v.output_name, v.mapping_key)
    RETURNING 1
)
SELECT count(*)::integer AS deleted FROM deleted;
