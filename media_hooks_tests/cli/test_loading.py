"""A command starts with its own code only, loaded without the cyclic garbage collector."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from media_hooks.cli import loading
from media_hooks.cli.loading import collector_paused

# Runs `main(argv)` in a fresh interpreter and prints the command modules it loaded.
_LOADED = """
import json, sys
from media_hooks.cli import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.endswith("_commands"))))
"""


def _loaded_command_modules(*argv: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", _LOADED, json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout.splitlines()[-1])


def test_a_command_line_that_names_a_command_loads_only_that_commands_module():
    assert _loaded_command_modules("status", "--help") == ["media_hooks.cli.status_commands"]
    assert _loaded_command_modules("db", "status", "--help") == ["media_hooks.cli.db_commands"]


@pytest.mark.parametrize("argv", [("--help",), ("stauts",), ()], ids=["help", "misspelt", "none"])
def test_without_a_command_every_command_is_loaded_to_list_them(argv):
    loaded = _loaded_command_modules(*argv)
    assert {"media_hooks.cli.run_commands", "media_hooks.cli.status_commands"} <= set(loaded)


@pytest.fixture
def own_process(monkeypatch):
    monkeypatch.setattr(loading, "_own_process", True)
    yield
    gc.unfreeze()


def test_in_a_program_that_calls_main_the_collector_is_left_alone():
    frozen = gc.get_freeze_count()
    with collector_paused():
        assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_the_collector_is_paused_inside_and_what_was_made_there_is_frozen(own_process):
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with collector_paused():
        assert not gc.isenabled()
        made = [[] for _ in range(1_000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(made)


def test_a_collector_that_was_off_stays_off_and_an_error_still_resumes_it(own_process):
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("an import failed")
    assert gc.isenabled()
