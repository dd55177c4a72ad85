"""The project's run code as a fork server loads it (media_hooks.orchestration.project_code).

What a warm run does with it (kept while current, imported afresh after a change) is tested
through real commands and a real server in test_run_server.py; here, what makes keeping it
safe: nothing the project reads from the environment while it loads escapes the comparison.
"""

from __future__ import annotations

import json
import subprocess
import sys

from media_hooks.orchestration import project_code
from media_hooks_tests.conftest import REPO

# Loads the run code as a server does, in a fresh interpreter, recording every variable of
# ours read from the environment meanwhile (os.environ[...], .get, os.getenv, `in`).
_RECORD_LOAD = """
import json, os
import dagster, dagster_postgres  # the server's other imports: Dagster reads its own
read = set()
lookup = os._Environ.__getitem__
def recorded(self, key):
    read.add(key)
    return lookup(self, key)
os._Environ.__getitem__ = recorded
from media_hooks.orchestration import project_code
project_code.load()
print(json.dumps(sorted(k for k in read if k.startswith("MEDIA_HOOKS_"))))
"""


def test_the_project_reads_from_the_environment_while_loading_only_what_a_child_compares():
    done = subprocess.run(
        [sys.executable, "-c", _RECORD_LOAD],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr

    read = json.loads(done.stdout)

    assert set(read) <= set(project_code.LOAD_TIME_VARIABLES)
    assert "MEDIA_HOOKS_SCHEDULE_TIMEZONE" in read  # the recording sees what is read
