"""Celery workers on this host, each as on a host of its own: for the tests and the benchmark.

Each worker is ``media-hooks worker`` (the documented command) in a process group of its own,
with its own ``MEDIA_HOOKS_HOME`` and environment: it shares nothing with the others but
PostgreSQL and the broker. ``LocalWorkers`` starts them, waits until the broker says each one
serves its queue, kills one with its whole process group (a lost host), and ends every one it
started, whatever happened. ``executions`` and ``attempted_by_worker`` read from a run's
Dagster events which worker executed which step, and how many deliveries each attempted.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil
from dagster import DagsterEventType, DagsterInstance

from media_hooks.orchestration.celery import app as celery_app
from media_hooks.orchestration.celery.settings import (
    BROKER_VARIABLE,
    DEFAULT_QUEUE,
    QUEUE_VARIABLE,
    CelerySettings,
)

READY_SECONDS = 120.0
STOP_SECONDS = 20.0


@dataclass
class Worker:
    name: str
    home: Path
    process: subprocess.Popen
    runs: bool

    @property
    def log(self) -> Path:
        return self.home / "worker.log"

    def alive(self) -> bool:
        return self.process.poll() is None


class LocalWorkers:
    """Workers started here; a context manager that ends them all."""

    def __init__(self, folder: Path, env: Mapping[str, str]) -> None:
        self.folder = folder
        self.env = dict(env)
        self.settings = CelerySettings(env[BROKER_VARIABLE], env.get(QUEUE_VARIABLE, DEFAULT_QUEUE))
        self.app = celery_app.make(self.settings)
        self.workers: list[Worker] = []

    def __enter__(self) -> LocalWorkers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(
        self, count: int, *, runs: bool = False, concurrency: int = 1, **env: str
    ) -> list[Worker]:
        """``count`` workers, started together; returns once the broker says each serves its
        queue (a worker that exits first is an error, with its log's last lines)."""
        started = [self._start_one(runs, concurrency, env) for _ in range(count)]
        self.workers += started
        self._wait_ready(started)
        return started

    def _start_one(self, runs: bool, concurrency: int, env: Mapping[str, str]) -> Worker:
        role = "runs" if runs else "steps"
        name = f"{role}-{uuid.uuid4().hex[:8]}@%h"
        home = self.folder / name.split("@")[0]
        home.mkdir(parents=True)
        args = [sys.executable, "-m", "media_hooks.cli", "worker", "--name", name]
        args += [f"--concurrency={concurrency}", *(["--runs"] if runs else [])]
        with open(home / "worker.log", "wb") as log:
            process = subprocess.Popen(
                args,
                env={**self.env, **env, "MEDIA_HOOKS_HOME": str(home)},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Its own group: a kill takes the worker and every process it forked.
                process_group=0,
            )
        return Worker(
            name=name.replace("%h", socket.gethostname()), home=home, process=process, runs=runs
        )

    def _wait_ready(self, workers: list[Worker]) -> None:
        deadline = time.monotonic() + READY_SECONDS
        waiting = {w.name: w for w in workers}
        while waiting:
            for worker in waiting.values():
                if not worker.alive():
                    raise RuntimeError(f"worker {worker.name} exited: {self.tail(worker)}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"workers not ready after {READY_SECONDS:.0f} s: {list(waiting)}"
                )
            # A ping waits up to a second for the answers: the wait between two looks.
            answered = self.app.control.ping(destination=list(waiting), timeout=1.0) or []
            for reply in answered:
                waiting.pop(next(iter(reply)), None)

    def kill(self, worker: Worker) -> None:
        """SIGKILL to the worker's whole process group, as when its host is lost."""
        try:
            os.killpg(worker.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        worker.process.wait()

    def stop(self) -> None:
        """Ends every worker started here: SIGTERM to each group, SIGKILL to what remains."""
        for worker in self.workers:
            _signal_group(worker, signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for worker in self.workers:
            try:
                worker.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
            # The group too: a pool process may outlive its parent for a moment.
            _signal_group(worker, signal.SIGKILL)
            worker.process.wait()
        self.app.close()

    def cpu_seconds(self) -> float:
        """CPU seconds (user and system) the live workers' processes have used so far, their
        pool processes and reaped children included: a figure no other load on the machine
        enters."""
        total = 0.0
        for worker in self.workers:
            if not worker.alive():
                continue
            try:
                root = psutil.Process(worker.process.pid)
                for process in [root, *root.children(recursive=True)]:
                    times = process.cpu_times()
                    total += times.user + times.system + times.children_user + times.children_system
            except psutil.NoSuchProcess:
                continue
        return total

    @staticmethod
    def tail(worker: Worker, lines: int = 15) -> str:
        try:
            return "\n".join(worker.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def delete_queues(settings: CelerySettings) -> None:
    """Deletes the deployment's queues from the broker (a test's or a benchmark run's own)."""
    app = celery_app.make(settings)
    try:
        with app.connection_for_write() as connection:
            channel = connection.channel()
            for queue in (settings.steps_queue, settings.runs_queue):
                channel.queue_delete(queue)
    finally:
        app.close()


def _signal_group(worker: Worker, sig: signal.Signals) -> None:
    try:
        os.killpg(worker.process.pid, sig)
    except ProcessLookupError:
        pass


def executions(instance: DagsterInstance, run_id: str) -> dict[str, list[str]]:
    """Each step of the run with the Celery workers that executed it, in order (dagster-celery
    reports each execution as an engine event naming its worker)."""
    found: dict[str, list[str]] = defaultdict(list)
    events = instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT).records
    for record in events:
        entry = record.event_log_entry
        worker = entry.dagster_event.engine_event_data.metadata.get("Celery worker")
        if worker is not None:
            found[entry.step_key].append(worker.value)
    return dict(found)


def attempted_by_worker(instance: DagsterInstance, run_id: str) -> dict[str, int]:
    """Deliveries attempted per worker: each shard's count, credited to the worker whose
    execution of it produced its output (the last one)."""
    executed = executions(instance, run_id)
    counted: dict[str, int] = defaultdict(int)
    outputs = instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_OUTPUT).records
    for record in outputs:
        entry = record.event_log_entry
        if entry.step_key.startswith("deliver_shard"):
            attempted = entry.dagster_event.step_output_data.metadata["attempted"].value
            counted[executed[entry.step_key][-1]] += attempted
    return dict(counted)
