"""The row protocol against its model, from several sessions at once (docs/protocol-model.md).

CI runs it for about a minute per server. ``MEDIA_HOOKS_MODEL_SECONDS=N`` runs it for N
seconds instead; ``MEDIA_HOOKS_MODEL_REPORT=path.json`` writes what was run: sequences, steps,
the rules hit, the counterexamples found, the server's version.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from media_hooks_tests.protocol_model.machine import Figures, ProtocolMachine

# The default run: batches of sequences until this much time has gone (the last batch ends
# its sequence, and one shrink may follow a failure).
CI_SECONDS = 45.0
SECONDS = float(os.environ.get("MEDIA_HOOKS_MODEL_SECONDS", CI_SECONDS))
REPORT = os.environ.get("MEDIA_HOOKS_MODEL_REPORT")
# Each batch runs this many sequences of up to this many steps.
BATCH = settings(
    max_examples=8,
    stateful_step_count=50,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _server_version(database_url: str) -> str:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT version()").fetchone()[0]


def test_protocol_against_its_model(database_url: str) -> None:
    ProtocolMachine.database_url = database_url
    ProtocolMachine.figures = figures = Figures()
    long_profile = "MEDIA_HOOKS_MODEL_SECONDS" in os.environ
    started = time.monotonic()
    try:
        while time.monotonic() - started < SECONDS:
            try:
                run_state_machine_as_test(ProtocolMachine, settings=BATCH)
            except Exception as failure:  # an invariant broken, or a statement that failed
                figures.counterexamples.append(_described(failure))
                if not long_profile:
                    raise
    finally:
        if REPORT:
            _write_report(Path(REPORT), figures, time.monotonic() - started, database_url)
    assert not figures.counterexamples, "\n\n".join(figures.counterexamples)


def _described(failure: BaseException) -> str:
    """The failure with Hypothesis's notes (the shrunk steps, the SQL each session ran), and
    those of the failures inside it when its replay was flaky (an exception group)."""
    notes = "\n".join(getattr(failure, "__notes__", ()))
    inner = getattr(failure, "exceptions", ())
    return "\n".join(
        [f"{type(failure).__name__}: {failure}", notes, *(_described(e) for e in inner)]
    )


def _write_report(path: Path, figures: Figures, seconds: float, database_url: str) -> None:
    report = {
        "seconds": round(seconds, 1),
        "server_version": _server_version(database_url),
        "sequences": figures.sequences,
        "steps": figures.steps,
        "rules": dict(sorted(figures.rules.items())),
        "outcomes": dict(sorted(figures.outcomes.items())),
        "counterexamples": figures.counterexamples,
    }
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
