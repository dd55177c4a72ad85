"""What every session ran, in the order it ran: the note printed with a counterexample.

Named statements (sql/queries) are shown by name with their parameters; anything else by its
text. A shrunk failing sequence is read as SQL, session by session, not as rule calls.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from media_hooks.store.sqlfiles import queries

# Long parameter values (bodies, JSON documents) are cut to this many characters.
_SHOWN_CHARS = 160


class Trace:
    """Lines appended from every session's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: list[str] = []
        self._names = {text: name for name, text in queries().items()}

    def statement(self, session: str, text: str, params: object) -> None:
        name = self._names.get(text.strip().rstrip(";"))
        shown = (
            f"{name} {_params(params)}" if name else f"{' '.join(text.split())} {_params(params)}"
        )
        self.event(session, shown.strip())

    def event(self, session: str, what: str) -> None:
        with self._lock:
            self._lines.append(f"{session:>9}: {what}")

    def render(self) -> str:
        with self._lock:
            return "\n".join(self._lines)


def _params(params: object) -> str:
    if params is None:
        return ""
    if isinstance(params, Mapping):
        items = ", ".join(f"{k}={_value(v)}" for k, v in params.items())
        return "{" + items + "}"
    if isinstance(params, Sequence) and not isinstance(params, (str, bytes)):
        return "(" + ", ".join(_value(v) for v in params) + ")"
    return _value(params)


def _value(value: Any) -> str:
    shown = json.dumps(value.obj) if isinstance(value, Jsonb) else repr(value)
    return shown if len(shown) <= _SHOWN_CHARS else shown[:_SHOWN_CHARS] + "..."


class TracedCursor(psycopg.Cursor):
    """A cursor that writes every statement to its connection's trace before running it."""

    def execute(self, query, params=None, **kwargs):  # type: ignore[override]
        traced = getattr(self.connection, "traced", None)
        if traced is not None:
            trace, session = traced
            trace.statement(session, str(query), params)
        return super().execute(query, params, **kwargs)

    def copy(self, statement, params=None, **kwargs):  # type: ignore[override]
        traced = getattr(self.connection, "traced", None)
        if traced is not None:
            trace, session = traced
            trace.statement(session, str(statement), params)
        return super().copy(statement, params, **kwargs)


def connect(url: str, trace: Trace, session: str, *, autocommit: bool) -> psycopg.Connection:
    """A dict-row connection whose statements go to ``trace`` under ``session``."""
    conn = psycopg.connect(
        url, autocommit=autocommit, row_factory=dict_row, cursor_factory=TracedCursor
    )
    conn.traced = (trace, session)  # type: ignore[attr-defined]
    return conn
