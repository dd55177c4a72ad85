"""PostgresResource: the project's database, as a connection pool for ops and sensors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from dagster import ConfigurableResource, InitResourceContext
from psycopg_pool import ConnectionPool
from pydantic import Field, PrivateAttr

from media_hooks.core.config import Settings
from media_hooks.store import db


class PostgresResource(ConfigurableResource):
    """A pool on ``MEDIA_HOOKS_DATABASE_URL`` (or the embedded default), opened per process."""

    database_url: str | None = Field(
        default=None,
        description="libpq URL; empty means the project's configuration "
        "(MEDIA_HOOKS_DATABASE_URL, else the embedded server under MEDIA_HOOKS_HOME).",
    )
    max_connections: int = Field(
        default=8, description="Pool size per process: one delivery op uses a few at once."
    )

    _pool: ConnectionPool | None = PrivateAttr(default=None)

    def url(self) -> str:
        if self.database_url:
            return self.database_url
        return db.ready_url(Settings.from_env())

    def setup_for_execution(self, context: InitResourceContext) -> None:
        # Every connection has bounded timeouts for its role from the start (media_hooks.store.db).
        self._pool = db.open_pool(self.url(), max_size=self.max_connections)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @property
    def pool(self) -> ConnectionPool:
        if self._pool is None:
            raise RuntimeError("PostgresResource used outside a run or sensor context")
        return self._pool

    @contextmanager
    def connection(self, role: db.Role = db.Role.OPERATOR) -> Iterator[psycopg.Connection]:
        """A pooled connection in autocommit mode, as the engine's functions expect, with the
        timeouts of ``role`` (media_hooks.store.db)."""
        with db.borrow(self.pool, role) as conn:
            try:
                yield conn
            finally:
                # The pool hands this connection to the engine next, which expects defaults.
                conn.autocommit = False
