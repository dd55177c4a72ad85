"""``media-hooks run`` under supervision: bounded in time, quiet, and as safe as the daemon.

The command executes delivery runs in its own process: it is their Dagster run worker, and no
daemon watches it. So it does what the daemon's sensors do, itself:

- Before its first run it recovers the delivery runs whose worker process is gone (a killed
  ``media-hooks run``, a ``media-hooks dev`` that died): marks them failed, frees their pool
  slots, releases their rows (``orchestration.recovery``). The run that follows neither waits
  for leaked slots nor leaves those rows for the enqueue timeout.
- After a run that failed it releases that run's rows at once, waiting up to
  ``SETTLE_PATIENCE_SECONDS`` for the database to come back if it is unreachable; what it
  cannot release, the next run's recovery (or the lag sensor) does.
- ``Watchdog``: ``--max-seconds`` bounds the wall time whatever Dagster does. At the deadline
  the run in progress is stopped the way Dagster stops a run (marked canceling, then
  interrupted: the executor passes the interrupt to its steps, which hand back what they hold,
  and a step still waiting for a pool slot never starts). If it has not ended
  ``MEDIA_HOOKS_RUN_STOP_GRACE_SECONDS`` later (15 s), the process kills its children, records
  what it can and exits.
- ``DagsterConsole``: Dagster's console output (its loggers, its storage's retry warnings, its
  step processes' tracebacks) goes to a log file under ``MEDIA_HOOKS_HOME``; the terminal gets
  the command's own lines: one per run, one per failed run saying why.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import psutil
from dagster import DagsterInstance

from media_hooks.core.config import Settings
from media_hooks.orchestration import recovery, run_workers
from media_hooks.orchestration.instance import keep_storage_connections, open_instance
from media_hooks.orchestration.jobs import deliver_webhooks
from media_hooks.orchestration.running import DeliveryRun, execute_delivery
from media_hooks.store import db

# How long a failed run's release waits for an unreachable database to come back.
SETTLE_PATIENCE_SECONDS = 30.0
_SETTLE_POLL_SECONDS = 1.0
# What the process still records, at most, once it has given up on a run that will not stop.
_LAST_WORDS_SECONDS = 5.0
_LOG_ROTATE_BYTES = 10 * 1024 * 1024
JOB_NAME = deliver_webhooks.name


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C reached a delivery run of this process, which ended CANCELED."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


class DagsterConsole:
    """Where Dagster's console output goes while a run executes: a log file, not the terminal."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > _LOG_ROTATE_BYTES:
            path.replace(path.with_name(path.name + ".1"))
        self.path = path
        self._log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        # The terminal, for the command's own lines even while the descriptors point at the log.
        self.terminal = os.fdopen(os.dup(2), "w", buffering=1)

    def log_error(self) -> None:
        """The exception being handled, with its traceback, into the log."""
        os.write(self._log_fd, traceback.format_exc().encode())

    def note(self, text: str) -> None:
        os.write(self._log_fd, f"== {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC {text}\n".encode())

    @contextmanager
    def captured(self) -> Iterator[None]:
        """Descriptors 1 and 2 point at the log meanwhile: this process's output, and that of
        every process it starts (step processes inherit them)."""
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        os.dup2(self._log_fd, 1)
        os.dup2(self._log_fd, 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, target in zip(saved, (1, 2), strict=True):
                os.dup2(fd, target)
                os.close(fd)


class Watchdog:
    """Calls ``stop`` once ``seconds`` have passed since ``started``, then ``overrun`` (which ends
    the process) ``grace`` seconds later, unless the watched block ended first."""

    def __init__(
        self,
        seconds: float | None,
        *,
        grace: float,
        stop: Callable[[], None],
        overrun: Callable[[], None],
        started: float | None = None,
    ) -> None:
        started = time.monotonic() if started is None else started
        self._deadline = None if seconds is None else started + seconds
        self._grace = grace
        self._stop = stop
        self._overrun = overrun
        self._done = threading.Event()
        self.expired = False

    def seconds_left(self) -> float | None:
        """Until the hard end (the deadline plus the grace); None without a deadline."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline + self._grace - time.monotonic())

    def __enter__(self) -> Watchdog:
        if self._deadline is not None:
            threading.Thread(target=self._watch, name="max-seconds", daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()

    def _watch(self) -> None:
        if self._done.wait(max(0.0, self._deadline - time.monotonic())):
            return
        self.expired = True
        self._stop()
        if self._done.wait(self._grace):
            return
        self._overrun()


class RunSupervisor:
    """Executes delivery runs in this process and cleans up after the ones that fail."""

    def __init__(
        self,
        url: str,
        settings: Settings,
        console: DagsterConsole,
        *,
        max_seconds: float | None,
        started: float | None = None,
    ) -> None:
        self.instance: DagsterInstance | None = None
        self.url = url
        self.settings = settings
        self.console = console
        self.stop_reason = f"--max-seconds {max_seconds:g} reached" if max_seconds else ""
        self.grace = settings.run_stop_grace_seconds
        self.watchdog = Watchdog(
            max_seconds,
            grace=self.grace,
            stop=self.stop,
            overrun=self.overrun,
            started=started,
        )
        self._executing = threading.Event()
        self._abandoning = threading.Event()

    def open(self) -> None:
        """Opens the Dagster instance (its storage may take a while to answer, or not)."""
        with self.console.captured():
            self.instance = open_instance(self.settings)
            keep_storage_connections(self.instance, self.settings)

    def recover(self) -> list[recovery.Recovered]:
        with self.console.captured(), db.connect(self.url, autocommit=True) as conn:
            return recovery.recover(
                self.instance,
                conn,
                JOB_NAME,
                window_seconds=recovery.window_seconds(self.settings.enqueue_timeout_seconds),
            )

    def execute(self, config: dict) -> DeliveryRun:
        self.console.note(f"media-hooks run (pid {os.getpid()}): a delivery run starts")
        with self.console.captured():
            self._executing.set()
            try:
                run = execute_delivery(self.instance, config, tags={"media_hooks/trigger": "cli"})
            except Exception:
                traceback.print_exc()  # into the log: the terminal gets one line
                raise
            finally:
                self._executing.clear()
        if self._abandoning.is_set():
            threading.Event().wait()  # the watchdog reports and ends the process
        if run.interrupted and not self.watchdog.expired:
            # Ctrl-C reached the run's step, which handed back what it held: the command
            # stops as for a Ctrl-C anywhere else.
            raise RunInterrupted(run.run_id)
        return run

    # Called from the watchdog's thread -------------------------------------------------------

    def stop(self) -> None:
        """Stops the run in progress as Dagster stops a run."""
        if not self._executing.is_set() or self.instance is None:
            return
        for run in run_workers.runs_of_this_process(self.instance, JOB_NAME):
            self.instance.report_run_canceling(run, f"media-hooks run: {self.stop_reason}")
        os.kill(os.getpid(), signal.SIGINT)

    def overrun(self) -> None:
        """The run did not stop: kill what this process started, record what the database
        allows within a few seconds, say so and exit."""
        self._abandoning.set()
        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        reason = f"{self.stop_reason}, and it did not stop within {self.grace:g} s"
        outcome: list = []
        last_words = threading.Thread(
            target=lambda: outcome.append(self.settle_mine(reason, captured=False)), daemon=True
        )
        last_words.start()
        last_words.join(_LAST_WORDS_SECONDS)
        settled = (outcome[0][0] if outcome else None) or []
        # Marked failed here, unless this process's own run thread, seeing its steps die after
        # the cancel, recorded the run as canceled first: either way it has ended.
        runs = ", ".join(f"{done.run_id} ({done.released} due again)" for done in settled)
        print(
            f"media-hooks: killed the delivery run(s) of this process: {reason}; "
            + (f"ended and released: {runs}" if runs else "the next run releases their rows"),
            file=self.console.terminal,
        )
        os._exit(1)

    # Settling a failed run --------------------------------------------------------------------

    def _settle_run(self, run_id: str, reason: str) -> recovery.Recovered:
        run = self.instance.get_run_by_id(run_id)
        marked = None
        if run is not None and not run.is_finished:
            # Dagster could not record the run's end (its storage was unreachable): record it.
            self.instance.report_run_failed(run, f"media_hooks: {reason}")
            run = self.instance.get_run_by_id(run_id)
            marked = reason
        with db.connect(self.url, autocommit=True) as conn:
            done = recovery.release(self.instance, conn, run, reason=marked)
        return done

    def settle(
        self, run_id: str, reason: str
    ) -> tuple[recovery.Recovered | None, BaseException | None]:
        """Records a failed run as failed and releases its rows, waiting for the database."""
        return self._patiently(lambda: self._settle_run(run_id, reason))

    def settle_mine(
        self, reason: str, *, captured: bool = True
    ) -> tuple[list[recovery.Recovered] | None, BaseException | None]:
        """``settle`` for every run this process was executing (their ids are unknown)."""
        return self._patiently(
            lambda: [
                self._settle_run(run.run_id, reason)
                for run in run_workers.runs_of_this_process(self.instance, JOB_NAME)
            ],
            captured=captured,
        )

    def _patiently(self, attempt: Callable, *, captured: bool = True):
        """``attempt()``, again every second while it fails, for up to the settle patience (or
        what is left of --max-seconds): the database may be coming back."""
        left = self.watchdog.seconds_left()
        patience = SETTLE_PATIENCE_SECONDS if left is None else min(SETTLE_PATIENCE_SECONDS, left)
        deadline = time.monotonic() + patience
        self.console.note(f"settling the run(s) of this process (up to {patience:.0f} s)")
        while True:
            try:
                if not captured:
                    return attempt(), None
                with self.console.captured():  # a storage retry warning goes to the log
                    return attempt(), None
            except Exception as exc:  # the database or Dagster's storage is unreachable
                if time.monotonic() + _SETTLE_POLL_SECONDS > deadline:
                    return None, exc
                time.sleep(_SETTLE_POLL_SECONDS)  # waiting for a server: nothing to wait on
