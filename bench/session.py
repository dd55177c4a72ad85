"""One benchmark session: its size, scratch databases, receiver, Dagster storage, time budget.

Every measurement gets the session and asks it for what it needs: a fresh database cloned
from a seeded template, a fresh Dagster storage (so no run of an earlier measurement is
"in flight" for a later one's sensor), the environment of a process bound to both, and the
receiver's URL. Closing the session drops every database it made and stops the receiver.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bench.fast_receiver import fast_receiver
from bench.processes import REPO
from bench.scratch import Scratch, database_name, server_url
from bench.sizes import Size

T = TypeVar("T")
INSTANCE_TEMPLATE = REPO / "dagster.yaml"


@dataclass
class Session:
    size: Size
    scratch: Scratch
    receiver: str
    home: Path
    # time.monotonic() after which nothing new starts and runs are cut short: the session's
    # time limit (``Size.session_seconds``).
    deadline: float

    def remaining(self) -> float:
        """Seconds left before the session's time limit."""
        return self.deadline - time.monotonic()

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

    @contextmanager
    def dagster_storage(self) -> Iterator[str]:
        """A fresh Dagster storage database (its schema made once, then cloned)."""
        template = self.scratch.template("dagster", self._init_dagster_storage)
        url = self.scratch.create(template)
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

    def interleaved(self, name: str, paths: Mapping[str, Callable[[], T]]) -> dict[str, list[T]]:
        """Each path once per round, in turn (A B C, A B C, ...), so that a neighbour's burst
        of load falls on every path, not on one. The first round always runs (the session's
        time limit permitting). After it, a path runs again only while the measurement's time
        so far plus that path's last run fits in the measurement's budget (``Size.budget``)
        and before the session's time limit: a slow path costs its own repeats, not the
        others'. A path whose run did not complete is not run again."""
        budget = self.size.budget.get(name, 0.0)
        results: dict[str, list[T]] = {path: [] for path in paths}
        last: dict[str, float] = {}
        started = time.monotonic()
        for number in range(self.size.rounds):
            for path, run in paths.items():
                if number and (path not in last or not self._another(started, last[path], budget)):
                    last.pop(path, None)
                    continue
                if not number and self.remaining() <= 0:
                    continue
                began = time.monotonic()
                result = run()
                results[path].append(result)
                last[path] = time.monotonic() - began
                if isinstance(result, dict) and result.get("complete") is False:
                    last.pop(path)
        return results

    def _another(self, started: float, last: float, budget: float) -> bool:
        now = time.monotonic()
        return now - started + last <= budget and now + last <= self.deadline


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
    with ExitStack() as stack:
        home = Path(tempfile.mkdtemp(prefix="mh_bench_home_"))
        stack.callback(shutil.rmtree, home, True)
        scratch = stack.enter_context(Scratch(server_url()))
        receiver = stack.enter_context(fast_receiver())
        deadline = time.monotonic() + size.session_seconds
        yield Session(size, scratch, receiver, home, deadline)
