"""A measured process: wall time, peak memory of its whole process tree, a time limit.

Every path the report compares runs as a process of its own, started here: the job (``media-hooks
run``, whose steps are more processes), the engine and each peer. While it runs, the resident
memory of the process and all its descendants is summed every ``SAMPLE_SECONDS``; the peak of
that sum is the run's peak RSS. A process still running at its time limit is stopped with its
whole process group (its forkserver and step processes included) and the run is marked as not
complete.

Each measured process is a process group of its own inside the harness's session, not a session
of its own. Linux's autogroup scheduler (``/proc/sys/kernel/sched_autogroup_enabled``) makes
every session one scheduling group, and PostgreSQL makes every backend a session of its own: on
a small machine that also runs the server and the receiver, a CPU-bound run in a session of its
own measured the scheduler's split more than the path (docs/performance.md has the
figures). ``python -m bench --own-sessions`` measures that arrangement (as ``setsid`` or cron
start a process).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
NODE_CLI = REPO / "node" / "bin" / "media-hooks-node.js"
SAMPLE_SECONDS = 0.1
UNTIL_EVERY = 5
# How long a stopped run may take to end by itself before it is killed.
STOP_GRACE_SECONDS = 3
# Set by ``python -m bench --own-sessions``: each measured process in a session of its own.
own_sessions = False


@dataclass(frozen=True)
class Finished:
    """What one measured process did."""

    seconds: float
    peak_rss_mib: float
    returncode: int | None  # None: stopped (its time limit, or its ``until``)
    stdout: str
    stderr: str

    @property
    def complete(self) -> bool:
        return self.returncode == 0

    def failure(self) -> str:
        """One line saying why the process did not complete."""
        if self.returncode is None:
            return f"stopped after {self.seconds:.0f} s"
        last = (self.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"exit status {self.returncode}: {last[:300]}"


def tree_rss(root: psutil.Process) -> int:
    """Resident bytes of ``root`` and every descendant (processes that vanish count 0)."""
    total = 0
    try:
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    for process in family:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            pass
    return total


def python_command(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def run_measured(
    command: list[str],
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    until: Callable[[], bool] | None = None,
) -> Finished:
    """Run ``command`` from the repository root, sampling its tree's memory until it exits, or
    until ``timeout`` seconds pass or ``until()`` is true (asked every few samples), when it is
    stopped; the wall time is then the time to that moment."""
    started = time.perf_counter()
    process = start(command, env, capture=True)
    peak = 0
    handle = psutil.Process(process.pid)
    deadline = None if timeout is None else started + timeout
    returncode: int | None = None
    for sample in itertools.count():
        peak = max(peak, tree_rss(handle))
        try:
            # A retried communicate() loses no output; the last call returns all of it.
            out, err = process.communicate(timeout=SAMPLE_SECONDS)
            returncode = process.returncode
            seconds = time.perf_counter() - started
            break
        except subprocess.TimeoutExpired:
            pass
        timed_out = deadline is not None and time.perf_counter() >= deadline
        if timed_out or (until is not None and sample % UNTIL_EVERY == 0 and until()):
            seconds = time.perf_counter() - started
            out, err = stop_group(process)
            break
    return Finished(
        seconds=seconds,
        peak_rss_mib=peak / 2**20,
        returncode=returncode,
        stdout=out,
        stderr=err,
    )


def start(
    command: list[str],
    env: dict[str, str] | None = None,
    *,
    capture: bool = False,
    log: Path | None = None,
) -> subprocess.Popen:
    """Start ``command`` from the repository root in a process group of its own (a session
    of its own with ``own_sessions``), so that ``stop_group`` reaches everything it starts; its
    output is captured (text), appended to ``log``, or discarded."""
    grouping: dict[str, Any] = {"start_new_session": True} if own_sessions else {"process_group": 0}
    if log is not None:
        with log.open("a") as output:
            return subprocess.Popen(
                command, env=env, cwd=REPO, stdout=output, stderr=output, **grouping
            )
    output = subprocess.PIPE if capture else subprocess.DEVNULL
    return subprocess.Popen(
        command, env=env, cwd=REPO, stdout=output, stderr=output, text=True, **grouping
    )


def run_together(
    commands: list[list[str]],
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    until: Callable[[], bool] | None = None,
) -> Finished:
    """Run several commands at once (each measured as by ``run_measured``), as one: the
    longest wall time, the sum of the peaks, the first failure, their outputs line by line."""
    if len(commands) == 1:
        return run_measured(commands[0], env, timeout, until)
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        done = list(pool.map(lambda c: run_measured(c, env, timeout, until), commands))
    failed = [f for f in done if not f.complete]
    return Finished(
        seconds=max(f.seconds for f in done),
        peak_rss_mib=sum(f.peak_rss_mib for f in done),
        returncode=failed[0].returncode if failed else 0,
        stdout="".join(f.stdout for f in done),
        stderr="".join(f.stderr for f in done),
    )


def stop_group(process: subprocess.Popen) -> tuple[str | None, str | None]:
    """Stop a process started in a process group of its own and everything it started; returns
    what it printed."""
    _signal_group(process, signal.SIGTERM)
    try:
        out, err = process.communicate(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        out, err = process.communicate()
    # Step processes may outlive the group's leader for a moment.
    _signal_group(process, signal.SIGKILL)
    return out, err


def _signal_group(process: subprocess.Popen, number: int) -> None:
    try:
        os.killpg(process.pid, number)
    except (ProcessLookupError, PermissionError):
        pass


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL a process started in a process group of its own, with everything it started."""
    _signal_group(process, signal.SIGKILL)


def node_packages(*folders: Path) -> str | None:
    """Installs the Node.js packages of ``folders`` (``npm ci``) where node_modules is missing;
    returns one line saying why it could not (node or npm absent, npm failed), or None."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    for folder in folders:
        if (folder / "node_modules").is_dir():
            continue
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--prefix", str(folder)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            return f"npm ci --prefix {folder.relative_to(REPO)} failed: {last[:300]}"
    return None
