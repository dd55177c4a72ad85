"""The IO manager: what one step hands the next, kept in the project's PostgreSQL.

Dagster's default IO manager keeps step outputs in a local folder, which only works while every
step of a run executes on one host. On the Celery executor the delivery run's steps execute on
workers that share nothing but PostgreSQL and the broker, so outputs live in
``dagster_step_output`` (migration 0019), one row per output, written once by the step that
produced it and read by the steps that take it. The same on every executor: a run behaves
alike wherever its steps execute, and Dagster's re-execution of a failed run finds its parent's
outputs whichever host asks.

Values are pickled, as Dagster's own filesystem IO manager pickles them. A row is only as
trusted as the database that holds it: whoever can write this table can already change every
destination's URL and secrets.
"""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from dagster import InitResourceContext, InputContext, IOManager, OutputContext, io_manager

from media_hooks.orchestration.resources.postgres import PostgresResource
from media_hooks.store import db
from media_hooks.store.sqlfiles import query

PURGE_BATCH = 1000


def _key(context: OutputContext) -> dict[str, str]:
    """Where an output lives: its run, step, name and mapping key (Dagster's identifier)."""
    run_id, step_key, name, *mapping = context.get_identifier()
    return {
        "run_id": run_id,
        "step_key": step_key,
        "output_name": name,
        "mapping_key": mapping[0] if mapping else "",
    }


class PostgresStepOutputs(IOManager):
    def __init__(self, postgres: PostgresResource) -> None:
        self._postgres = postgres

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        params = {**_key(context), "value": pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)}
        with self._postgres.connection(db.Role.RECONCILER) as conn:
            db.retrying(
                "store a step output",
                lambda: conn.execute(query("save_step_output"), params),
            )

    def load_input(self, context: InputContext) -> Any:
        key = _key(context.upstream_output)
        with self._postgres.connection(db.Role.RECONCILER) as conn:
            row = db.retrying(
                "load a step output",
                lambda: conn.execute(query("load_step_output"), key).fetchone(),
            )
        if row is None:
            raise FileNotFoundError(
                f"no stored output {key['output_name']!r} of step {key['step_key']!r} in run "
                f"{key['run_id']} (purged by retention, or the step never finished)"
            )
        return pickle.loads(row["value"])


@io_manager(
    required_resource_keys={"postgres"},
    description="Step outputs in the project's PostgreSQL (dagster_step_output), so that the "
    "steps of one run may execute on different hosts (the Celery executor).",
)
def postgres_step_outputs(init_context: InitResourceContext) -> PostgresStepOutputs:
    return PostgresStepOutputs(init_context.resources.postgres)


def purge(conn: psycopg.Connection, older_than_seconds: float, *, max_batches: int) -> int:
    """Delete step outputs stored more than ``older_than_seconds`` ago, a batch at a time, at
    most ``max_batches`` batches (the next retention run carries on)."""
    params = {
        "cutoff": datetime.now(UTC) - timedelta(seconds=older_than_seconds),
        "batch_size": PURGE_BATCH,
    }
    deleted = 0
    for _ in range(max_batches):
        batch = db.retrying(
            "purge step outputs",
            lambda: conn.execute(query("purge_step_outputs"), params).fetchone()["deleted"],
        )
        deleted += batch
        if batch < PURGE_BATCH:
            break
    return deleted
