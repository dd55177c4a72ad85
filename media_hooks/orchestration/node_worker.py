"""A delivery step's destinations delivered by the Node.js worker (node/, docs/node.md),
launched through Dagster Pipes.

The worker speaks the external side of Pipes (node/src/pipes.js): its log lines reach the
step's log, its per-destination counts come back as a custom message, and it closes the
session with the error that ended it, if one did. A canceled run's interrupt reaches
``PipesSubprocessClient``, which forwards it (SIGINT): the worker hands back what it holds
and exits. Its exit is the step's outcome.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dagster import DagsterEventType, Failure, OpExecutionContext, PipesSubprocessClient

# Private path: the Dagster family is pinned exactly (pyproject.toml), so it is stable here.
from dagster._core.errors import DagsterPipesExecutionError

from media_hooks.core import numeric
from media_hooks.core.config import Settings
from media_hooks.engine.counts import DeliveryCounts

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / "node"
CLI = NODE_DIR / "bin" / "media-hooks-node.js"
INSTALL = "npm ci --prefix node"
# How long a stopped worker may take to finish its requests in flight and record them.
STOP_SECONDS = 60.0
# What Dagster records when the external process closes Pipes with an error (pipes/context.py).
_CLOSED_WITH_ERROR = "[pipes] external process pipes closed with exception"
# The worker's errors a step retry cannot mend: bad usage or settings, and outcomes the
# database refused to record (a retry would end green and hide them, as for the engine).
_FINAL = ("UserError", "OutcomesNotRecorded")


class NodeWorkerFailed(RuntimeError):
    """The worker ended with a runtime failure (exit 1): a step retry may succeed."""


@dataclass(frozen=True)
class WorkerReport:
    """Per destination: rows claimed, and the delivery counts (DeliveryCounts' names)."""

    claimed: dict[str, int]
    counts: dict[str, dict[str, int]]


def executable() -> str:
    """``node``, with the package's dependencies installed; else a Failure saying how."""
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules").is_dir():
        missing = "node is not installed" if node is None else f"{NODE_DIR}/node_modules is missing"
        raise Failure(
            description=f"the node runtime cannot start: {missing} (install Node 20 or later, "
            f"then run `{INSTALL}` in {REPO})",
            allow_retries=False,
        )
    return node


def command(
    node: str, destination_ids: Sequence[str], *, run_id: str, page_size: int, max_rows: int | None
) -> list[str]:
    options = ["--run-id", run_id, "--page-size", str(page_size)]
    if max_rows is not None:
        options += ["--max-rows", str(max_rows)]
    return [node, str(CLI), "worker", *options, "--", *destination_ids]


def environment(database_url: str, settings: Settings) -> dict[str, str]:
    """What the step knows that the worker's own environment may not: the run's database (in
    the environment, never on a command line) and the deployment's lease override."""
    return {
        "MEDIA_HOOKS_DATABASE_URL": database_url,
        "MEDIA_HOOKS_LEASE_SECONDS": numeric.plain(settings.lease_seconds),
    }


def deliver(
    context: OpExecutionContext,
    destination_ids: Sequence[str],
    *,
    database_url: str,
    settings: Settings,
    page_size: int,
    max_rows: int | None,
) -> WorkerReport:
    """Run the worker on ``destination_ids`` under this step's run id, waited for. Raises
    Failure (final) for bad settings or usage and for outcomes not recorded, NodeWorkerFailed
    for another runtime failure."""
    if max_rows == 0:
        # The run's row cap left this shard nothing to claim (shard_caps): as the engine's
        # workers would, each destination claims nothing, and no worker is started.
        nothing = DeliveryCounts().as_dict()
        return WorkerReport({d: 0 for d in destination_ids}, {d: nothing for d in destination_ids})
    client = PipesSubprocessClient(
        env=environment(database_url, settings),
        cwd=str(REPO),
        termination_timeout_seconds=STOP_SECONDS,
    )
    run = command(
        executable(), destination_ids, run_id=context.run_id, page_size=page_size, max_rows=max_rows
    )
    before = _last_engine_event(context)
    try:
        invocation = client.run(context=context, command=run)
    except DagsterPipesExecutionError as exc:
        raise _failure(context, before, str(exc)) from None
    reports = [m for m in invocation.get_custom_messages() if isinstance(m, dict)]
    destinations = reports[-1]["destinations"] if reports else {}
    return WorkerReport(
        claimed={d: c["claimed"] for d, c in destinations.items()},
        counts={
            d: {k: v for k, v in c.items() if k not in ("claimed", "error")}
            for d, c in destinations.items()
        },
    )


def _engine_events(context: OpExecutionContext, limit: int | None = None):
    """The run's engine events, newest first."""
    return context.instance.get_records_for_run(
        context.run_id, of_type=DagsterEventType.ENGINE_EVENT, ascending=False, limit=limit
    ).records


def _last_engine_event(context: OpExecutionContext) -> int:
    newest = _engine_events(context, limit=1)
    return newest[0].storage_id if newest else 0


def _failure(context: OpExecutionContext, after: int, exited: str) -> Exception:
    """The worker's own one-line error, as this launch of it closed Pipes with it (engine
    events after ``after``): final for the errors of _FINAL, retryable otherwise."""
    step_key = context.get_step_execution_context().step.key
    for record in _engine_events(context):
        if record.storage_id <= after:
            break
        entry = record.event_log_entry
        if entry.step_key != step_key or entry.dagster_event.message != _CLOSED_WITH_ERROR:
            continue
        error = entry.dagster_event.engine_event_data.error
        line = f"node worker: {error.message.strip().removeprefix(f'{error.cls_name}: ')}"
        if any(name in _FINAL for name in _class_names(error)):
            return Failure(description=line, allow_retries=False)
        return NodeWorkerFailed(line)
    return NodeWorkerFailed(f"node worker: {exited}")


def _class_names(error) -> list[str]:
    """The class names of an error and of its causes."""
    names = []
    while error is not None:
        names.append(error.cls_name)
        error = error.cause
    return names
