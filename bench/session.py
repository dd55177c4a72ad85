"""One benchmark session: its size, scratch databases, receiver, Dagster storage, time.

Every measurement gets the session and asks it for what it needs: a fresh database cloned
from a seeded template, a fresh Dagster storage (so no run of an earlier measurement is
"in flight" for a later one's sensor), the environment of a process bound to both, and the
receiver's URL. Closing the session drops every database it made and stops the receiver.
"""

from __future__ import annotations

import compileall
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bench.fast_receiver import fast_receiver
from bench.processes import REPO
from bench.scratch import Scratch, database_name, server_url
from bench.sizes import Size

T = TypeVar("T")
# A run stopped within this much of its time slice's end was stopped by the slice.
REPEAT_CUT_SECONDS = 1.0
INSTANCE_TEMPLATE = REPO / "dagster.yaml"


@dataclass
class Session:
    size: Size
    scratch: Scratch
    receiver: str
    home: Path
    # time.monotonic() after which nothing new starts and runs are cut short: the end of the
    # current time slice (the session's, a measurement's, a path's; see ``time_slice``).
    deadline: float

    def remaining(self) -> float:
        """Seconds left in the current time slice."""
        return self.deadline - time.monotonic()

    @contextmanager
    def time_slice(self, seconds: float) -> Iterator[None]:
        """At most ``seconds`` more (and never past the enclosing slice's end) for what runs
        inside; what it leaves unused goes back to the enclosing slice."""
        outer = self.deadline
        self.deadline = min(outer, time.monotonic() + seconds)
        try:
            yield
        finally:
            self.deadline = outer

    def share(self, parts: int) -> AbstractContextManager[None]:
        """A slice of an equal part of what is left, of ``parts`` parts still to come."""
        return self.time_slice(self.remaining() / max(parts, 1))

    def env(self, url: str, storage: str | None = None, **extra: str) -> dict[str, str]:
        """A process's environment bound to database ``url`` (and Dagster storage ``storage``),
        with nothing of the caller's media_hooks or Dagster configuration."""
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("MEDIA_HOOKS_", "DAGSTER_"))
        }
        env.update(
            MEDIA_HOOKS_DATABASE_URL=url,
            MEDIA_HOOKS_HOME=str(self.home),
            MEDIA_HOOKS_ALLOW_PRIVATE_URLS="1",
            PYTHONPATH=str(REPO),
            **extra,
        )
        if storage is not None:
            from media_hooks.orchestration.instance import as_url

            env["MEDIA_HOOKS_DAGSTER_STORAGE_URL"] = as_url(storage)
        return env

    def dagster_template(self) -> str:
        """The template of every Dagster storage, made on first use (Dagster loads then)."""
        return self.scratch.template("dagster", self._init_dagster_storage)

    @contextmanager
    def dagster_storage(self) -> Iterator[str]:
        """A fresh Dagster storage database (its schema made once, then cloned)."""
        url = self.scratch.create(self.dagster_template())
        try:
            yield url
        finally:
            self.scratch.drop(database_name(url))

    def _init_dagster_storage(self, url: str) -> None:
        from dagster import DagsterInstance

        from media_hooks.orchestration.instance import STORAGE_VARIABLE, as_url

        with (
            environment(**{STORAGE_VARIABLE: as_url(url)}),
            DagsterInstance.from_config(str(self.dagster_home())) as instance,
        ):
            instance.get_runs(limit=1)  # the storage makes its tables on first use

    def dagster_home(self) -> Path:
        """A new DAGSTER_HOME with the project's instance template (its storage: the
        environment's MEDIA_HOOKS_DAGSTER_STORAGE_URL)."""
        home = Path(tempfile.mkdtemp(prefix="dagster_", dir=self.home))
        shutil.copyfile(INSTANCE_TEMPLATE, home / "dagster.yaml")
        return home

    def interleaved(self, paths: Mapping[str, Callable[[], T]]) -> dict[str, list[T]]:
        """Each path once per round, in turn (A B C, A B C, ...), so that a neighbour's burst
        of load falls on every path, not on one.

        In the first round each path gets an equal share of the time left (what a quick path
        leaves over goes to the next: put the slow paths last); a run still going at the end
        of its share is stopped and marked incomplete. After it, a path runs again only while
        its last run fits in the time left, so a slow path costs its own repeats, not the
        others'; a path whose run did not complete is not run again, and a repeat stopped
        because the time ran out is dropped."""
        results: dict[str, list[T]] = {path: [] for path in paths}
        last: dict[str, float] = {}
        for number in range(self.size.rounds):
            for position, (path, run) in enumerate(paths.items()):
                if number and (path not in last or last[path] > self.remaining()):
                    last.pop(path, None)
                    continue
                if self.remaining() <= 0:
                    continue
                began = time.monotonic()
                with self.share(len(paths) - position if not number else 1):
                    result = run()
                incomplete = isinstance(result, dict) and result.get("complete") is False
                if incomplete and number and self.remaining() <= REPEAT_CUT_SECONDS:
                    # A repeat the measurement's time ran out on measured the clock, not the
                    # path (its first run completed): it is dropped, and the path not repeated.
                    last.pop(path)
                    continue
                results[path].append(result)
                last[path] = time.monotonic() - began
                if incomplete:
                    last.pop(path)
        return results


@contextmanager
def environment(**values: str) -> Iterator[None]:
    """This process's ``os.environ`` with ``values`` set, restored afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def session(size: Size) -> Iterator[Session]:
    # Every measured process starts from compiled bytecode, as an installed copy does: where
    # PYTHONDONTWRITEBYTECODE is set, an editable checkout would otherwise be compiled again at
    # each start, and the job, which imports more of the project, would pay more for it.
    for package in ("media_hooks", "bench"):
        compileall.compile_dir(REPO / package, quiet=1)
    with ExitStack() as stack:
        home = Path(tempfile.mkdtemp(prefix="mh_bench_home_"))
        stack.callback(shutil.rmtree, home, True)
        scratch = stack.enter_context(Scratch(server_url()))
        receiver = stack.enter_context(fast_receiver())
        deadline = time.monotonic() + size.session_seconds
        yield Session(size, scratch, receiver, home, deadline)
