"""The paths the report compares, each run as a measured process against the receiver.

Through stable interfaces only, so the figures survive a redesign of the job's internals:

- the job: ``media-hooks run --until-idle --json`` (the public command line), a subprocess;
- the engine: ``media_hooks.engine.delivery_run.deliver_due(pool, run_id, settings, ...)`` in a
  process of its own (``bench.run_peer engine``), its batches in threads;
- the peers (``bench.peers``): a bare ``requests`` loop, the design record's rejected design
  and Procrastinate.

Each run clears the receiver's log first and reads it afterwards, so its figures come from
the requests the receiver actually saw.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import cpu, stats
from bench.fast_receiver import Start, take_log
from bench.processes import Finished, python_command, run_together
from bench.session import Session


@dataclass(frozen=True)
class PathRun:
    """One run of a path: its process and the requests the receiver saw during it."""

    path: str
    finished: Finished
    starts: list[Start]
    # What the process said about itself: its JSON document (a list of them for several
    # processes at once; None when it printed none).
    reported: Any
    # CPU seconds during the run: the machine's, the server's (None: not on this machine),
    # the receiver's and the delivering side's (bench.cpu).
    cpu_seconds: dict[str, float | None] | None = None

    @property
    def delivered(self) -> int:
        """Distinct deliveries the receiver saw (a repeat of one counts once)."""
        return len({start.webhook_id for start in self.starts})

    def figures(self, expected: int | None = None, *, wall: bool = True) -> dict[str, Any]:
        """The per-run figures every delivery measurement reports.

        The run is complete when the receiver saw every expected delivery and, where its wall
        time is a figure (``wall``), the process ended by itself: a process stopped after it
        had delivered everything still gives true receiver-side figures.
        """
        times = [start.at for start in self.starts]
        delivered_all = expected is None or self.delivered >= expected
        complete = delivered_all and (self.finished.complete or not wall)
        figures: dict[str, Any] = {
            "complete": complete,
            "seconds": self.finished.seconds,
            "delivered": self.delivered,
            "requests": len(self.starts),
            "per_second": self.delivered / self.finished.seconds,
            "steady_per_second": stats.steady_rate(times),
            "peak_rss_mib": self.finished.peak_rss_mib,
            **self.cpu_figures(),
        }
        if not complete:
            why = self.finished.failure() if not self.finished.complete else "not all delivered"
            figures["error"] = f"{why} ({self.delivered} of {expected} delivered)"
        return figures

    def cpu_figures(self) -> dict[str, float | None]:
        """CPU per delivery in ms: the whole machine's, the database server's, the
        delivering side's (the engine, the job and its Dagster processes, or a peer) and the
        measured process tree's own."""
        spent = self.cpu_seconds or {}

        def per_delivery(part: str) -> float | None:
            total = spent.get(part)
            return None if total is None or not self.delivered else total * 1000 / self.delivered

        return {
            "machine_cpu_ms_per_delivery": per_delivery("machine"),
            "server_cpu_ms_per_delivery": per_delivery("server"),
            "client_cpu_ms_per_delivery": per_delivery("client"),
            "process_cpu_ms_per_delivery": per_delivery("process"),
        }


def _run(
    session: Session,
    path: str,
    commands: list[list[str]],
    env: dict[str, str],
    timeout: float | None,
    until: Callable[[], bool] | None = None,
) -> PathRun:
    take_log(session.receiver)  # whatever an earlier run left
    # No run outlives the session's time limit (a second to stop it cleanly).
    limit = min(timeout or session.size.run_timeout, max(1.0, session.remaining()))
    server = cpu.postmaster(env["MEDIA_HOOKS_DATABASE_URL"])
    before = cpu.read(server, session.receiver)
    finished = run_together(commands, env=env, timeout=limit, until=until)
    spent = cpu.spent(before, cpu.read(server, session.receiver))
    starts = take_log(session.receiver)
    return PathRun(path, finished, starts, _documents(finished.stdout), spent)


def _documents(stdout: str) -> Any:
    """The JSON a process printed: one document, or one a line from several processes."""
    try:
        return json.loads(stdout)
    except ValueError:
        pass
    try:
        return [json.loads(line) for line in stdout.splitlines() if line.strip()]
    except ValueError:
        return None


def run_job(
    session: Session,
    url: str,
    storage: str,
    timeout: float | None = None,
    until: Callable[[], bool] | None = None,
    **env: str,
) -> PathRun:
    """``media-hooks run --until-idle --json``: the Dagster job, as the CLI runs it (with any
    configuration given as environment variables)."""
    command = python_command("media_hooks.cli", "run", "--until-idle", "--json")
    env = session.env(url, storage, **env)
    return _run(session, "job", [command], env, timeout, until)


def run_engine(
    session: Session,
    url: str,
    *,
    copies: int = 1,
    timeout: float | None = None,
    until: Callable[[], bool] | None = None,
    **env: str,
) -> PathRun:
    """The engine in a process of its own (``copies`` processes at once): ``deliver_due`` with
    its defaults (the job's: claim pages of 250, batches of 1,000) and the configuration's
    (a delivery's threads on one CPU), and any configuration given as environment variables."""
    commands = [
        python_command("bench.run_peer", "engine", url, "--run-id", f"bench-engine-{n}")
        for n in range(1, copies + 1)
    ]
    return _run(session, "engine", commands, session.env(url, **env), timeout, until)


def run_peer(
    session: Session, peer: str, url: str, *args: str, timeout: float | None = None
) -> PathRun:
    command = python_command("bench.run_peer", peer, url, *args)
    return _run(session, peer, [command], session.env(url), timeout)


def run_command(session: Session, path: str, command: list[str], url: str, **env: str) -> PathRun:
    """Any other command (a Node.js process, say) as path ``path``, bound to database ``url``
    (and any more environment variables given)."""
    return _run(session, path, [command], session.env(url, **env), None)


def starts_by_destination(starts: list[Start]) -> dict[str, list[float]]:
    """Start times per destination, by the last segment of the receiver path."""
    grouped: dict[str, list[float]] = {}
    for start in starts:
        grouped.setdefault(start.path.rsplit("/", 1)[-1], []).append(start.at)
    return grouped


def job_runs(run: PathRun) -> int | None:
    """How many Dagster runs ``--until-idle`` made."""
    return len(run.reported["runs"]) if isinstance(run.reported, dict) else None
