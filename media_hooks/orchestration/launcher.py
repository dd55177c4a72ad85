"""``WarmRunLauncher``: runs launched by the schedules, the sensors and the Launchpad start
without importing Dagster again.

Dagster's DefaultRunLauncher asks the code server to start a run, and the code server starts
a fresh interpreter for each one (multiprocessing's spawn), which imports Dagster, its
storage and the project before the run's first event: 1-3 s of CPU on a 2-core machine, most
of what a small catch-up run of the lag sensor costs. This launcher forks each run from a
server that imported them once (``zygote``) and executes it as ``dagster api execute_run``
does; the project's own code is imported after the fork, so a reload reaches the next run.

It launches this way a run whose code runs under this process's interpreter (the code
server's executable is this one, as in the single-machine deployment ``media-hooks dev``
makes); any other run, or any run while the server cannot start, goes to the code server as
with the DefaultRunLauncher. Terminating a run interrupts its process (SIGINT, Dagster's own
interrupt), found through the worker tag written at launch (``run_workers``).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
from typing import IO

from dagster import DagsterRun, DefaultRunLauncher
from dagster._core.launcher import LaunchRunContext  # private paths; Dagster is pinned
from dagster._core.storage.tags import GRPC_INFO_TAG
from dagster._serdes import serialize_value

from media_hooks.errors import first_line
from media_hooks.orchestration import run_workers

ZYGOTE_MODULE = "media_hooks.orchestration.zygote"
# Importing Dagster takes a few seconds of CPU; a loaded machine may take many times that.
START_TIMEOUT_SECONDS = 120.0
FORK_TIMEOUT_SECONDS = 30.0


class ZygoteUnavailable(RuntimeError):
    """The fork server could not start, or ended before it took the run: nothing was forked."""


class LaunchUnanswered(RuntimeError):
    """The fork server took the run but did not say which process executes it: it may be
    executing, so the run is not launched another way."""


def _line(stream: IO[str], timeout: float) -> str | None:
    """One line from ``stream`` within ``timeout`` seconds: '' at its end, None if none came."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(timeout):
            return None
    return stream.readline()


def _sent(process: subprocess.Popen, request: str) -> bool:
    try:
        process.stdin.write(request)
        process.stdin.flush()
    except BrokenPipeError:
        return False
    return True


class Zygote:
    """The fork server process: started on first use, and again when it has ended."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def fork(self, run_id: str, instance_ref: str) -> int:
        """Starts a process executing ``run_id``; its pid."""
        request = json.dumps({"run_id": run_id, "instance_ref": instance_ref}) + "\n"
        with self._lock:
            process = self._running()
            if not _sent(process, request):
                # It had ended before the request (nothing was forked): a new one takes it.
                self._stop()
                process = self._running()
                if not _sent(process, request):
                    self._stop()
                    raise ZygoteUnavailable("the warm run server ended as it started")
            reply = _line(process.stdout, FORK_TIMEOUT_SECONDS)
            if not reply:
                self._stop()
                why = "it ended" if reply == "" else f"nothing in {FORK_TIMEOUT_SECONDS:g} s"
                raise LaunchUnanswered(
                    f"the warm run server took the run but did not answer: {why}"
                )
            return json.loads(reply)["pid"]

    def start(self) -> None:
        """Starts the server ahead of the first launch (which otherwise starts it)."""
        with self._lock:
            self._running()

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _running(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._process = subprocess.Popen(
            [sys.executable, "-m", ZYGOTE_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if not _line(self._process.stdout, START_TIMEOUT_SECONDS):
            self._stop()
            raise ZygoteUnavailable("the warm run server did not start")
        return self._process

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            process.stdin.close()  # its end of input: it exits
        except BrokenPipeError:
            pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


def runs_here(run: DagsterRun) -> bool:
    """Whether ``run``'s code runs under this process's interpreter (its code server's)."""
    origin = run.job_code_origin
    return origin is not None and origin.executable_path == sys.executable


class WarmRunLauncher(DefaultRunLauncher):
    """Forks each run from a server that has Dagster loaded (see the module's docstring)."""

    def __init__(self, inst_data=None) -> None:
        super().__init__(inst_data=inst_data)
        self.zygote = Zygote()

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> WarmRunLauncher:
        return cls(inst_data=inst_data)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        if not runs_here(run):
            super().launch_run(context)
            return
        try:
            pid = self.zygote.fork(run.run_id, serialize_value(self._instance.get_ref()))
        except ZygoteUnavailable as exc:
            if context.workspace is None:
                raise
            self._instance.report_engine_event(
                f"{first_line(exc)}: launching through the code server instead", run
            )
            super().launch_run(context)
            return
        worker = run_workers.process_of(run.run_id, pid)
        if worker is not None:  # None: it already ended, and its events say how
            self._instance.add_run_tags(run.run_id, worker.tag())
        self._instance.report_engine_event(
            f"Launched in a process forked from the warm run server (pid {pid}).", run
        )

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        if GRPC_INFO_TAG in run.tags:  # launched through the code server
            return super().terminate(run_id)
        self._instance.report_run_canceling(run)
        worker = run_workers.worker_of(run)
        gone = worker.is_gone() if worker is not None else None
        if gone is not False:
            self._instance.report_engine_event(
                f"Cannot interrupt the run: {_why(worker, gone)}.", run
            )
            return False
        os.kill(worker.pid, signal.SIGINT)
        return True

    def dispose(self) -> None:
        self.zygote.close()


def _why(worker: run_workers.Worker | None, gone: bool | None) -> str:
    if worker is None:
        return "it has no worker process recorded"
    if gone:
        return f"its process ({worker.describe()}) is gone"
    return f"its process ({worker.describe()}) runs on another host"
