"""The fork server of ``WarmRunLauncher``: Dagster loaded once, each launched run forked from it.

    python -m media_hooks.orchestration.zygote     (started by the launcher, never by hand)

At start it imports Dagster, its PostgreSQL storage, the engine's libraries and the project's
run code (with the garbage collector paused, then frozen: see ``media_hooks.cli.loading``),
then answers one request a line on stdin, ``{"run_id": ..., "instance_ref": ...}``, by
forking a child that executes that run and writing the child's pid, ``{"pid": N}``, on
stdout. A child keeps the project's code only while its files are those loaded
(``project_code``): a definitions reload in ``media-hooks dev`` still reaches the next run. At
end of input (the launcher's process ended or closed it) it exits; runs it started go on to
their end.

It stays single-threaded (forking a process with threads can copy a lock another thread
held), and children are reaped by the kernel (SIGCHLD ignored): the launcher tracks runs
through Dagster's run storage, not exit codes.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from media_hooks.orchestration import project_code

# Imported by the server, inherited by every child.
PRELOAD = (
    "dagster",
    "dagster._cli.api",
    "dagster._core.execution.api",
    "dagster_postgres",
    "psycopg",
    "psycopg_pool",
    "requests",
    "aiohttp",
    "cryptography.fernet",
    "psutil",
)


def preload() -> None:
    from media_hooks.cli.loading import collector_paused, own_process

    own_process()
    with collector_paused():
        for name in PRELOAD:
            importlib.import_module(name)
        project_code.load()


def execute(run_id: str, instance_ref: str) -> int:
    """Executes run ``run_id`` as ``dagster api execute_run`` does; a run that cannot start is
    marked failed at once (not left STARTING until run monitoring's start timeout)."""
    from dagster import DagsterInstance, DagsterRunStatus
    from dagster._cli.api import _execute_run_command_body  # private; Dagster is pinned
    from dagster._core.instance.ref import InstanceRef
    from dagster._serdes import deserialize_value
    from dagster._utils.interrupts import capture_interrupts

    from media_hooks.config import Settings
    from media_hooks.orchestration.instance import keep_storage_connections

    with (
        capture_interrupts(),
        DagsterInstance.from_ref(deserialize_value(instance_ref, InstanceRef)) as instance,
    ):
        try:
            keep_storage_connections(instance, Settings.from_env())
            return _execute_run_command_body(
                run_id, instance, write_stream_fn=lambda _event: None, set_exit_code_on_failure=True
            )
        except BaseException as exc:  # it raises only before the run starts
            run = instance.get_run_by_id(run_id)
            if run is not None and run.status == DagsterRunStatus.CANCELING:
                instance.report_run_canceled(run)
            elif run is not None and not run.is_finished:
                reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                instance.report_run_failed(run, f"the run's process could not start it: {reason}")
            raise


def end_child(work: Callable[[], int]) -> NoReturn:
    """Run a forked child's ``work`` and end the child with its status, whatever happens: a
    child never returns into its server's loop. An unexpected exception is printed (status
    1); the streams are flushed first, since ``os._exit`` skips it."""
    code = 1
    try:
        code = work()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child must end here, whatever happened
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _child(request: dict) -> NoReturn:
    def run() -> int:
        # The server's dispositions are not the run's: its subprocesses are waited for, and an
        # interrupt (a terminate request, Ctrl-C) cancels it.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.dup2(2, 1)  # stdout is the launcher's pipe: the run prints where the server's errors go
        project_code.keep_or_forget()
        return execute(request["run_id"], request["instance_ref"])

    end_child(run)


def serve(requests, replies) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()


def main() -> None:
    # Ctrl-C of `media-hooks dev` reaches the whole process group: the runs handle it (they are
    # canceled), the server just ends with its input.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload()
    sys.stdout.write(json.dumps({"ready": os.getpid()}) + "\n")
    sys.stdout.flush()
    serve(sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
