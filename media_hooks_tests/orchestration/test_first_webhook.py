"""docs/first-webhook.md, run as written: its five commands, read from the page itself (every
`sh` block), so the page cannot drift from what works. With the SSRF guard on, as a newcomer has
it, the signed request reaches the receiver the page starts, and `inspect` says it succeeded.

One change to the page's text: its receiver's port (8765) becomes a free one in every command
that names it, so that the test never meets a port in use on the machine that runs it.
"""

from __future__ import annotations

import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from media_hooks_tests.conftest import REPO, default_sigint, run_cli

PAGE = REPO / "docs" / "first-webhook.md"
PAGE_PORT = "8765"
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)


def page_commands() -> list[str]:
    """Every command of the page's `sh` blocks, in order."""
    return [
        line.strip()
        for block in SH_BLOCK.findall(PAGE.read_text())
        for line in block.splitlines()
        if line.strip()
    ]


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


class Terminal:
    """The second terminal: the receiver the page starts, its lines read as they come."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "media_hooks.cli", *argv],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=default_sigint,  # Ctrl-C stops it, as the page says
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, pattern: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no line matching {pattern!r} in {self.seen}")


@pytest.fixture
def env(cli_env, own_storage_url):
    # A newcomer's environment: the SSRF guard on.
    guarded = {k: v for k, v in cli_env.items() if k != "MEDIA_HOOKS_ALLOW_PRIVATE_URLS"}
    return dict(guarded, MEDIA_HOOKS_DAGSTER_STORAGE_URL=own_storage_url)


def test_the_page_has_five_commands_and_the_receiver_first():
    commands = page_commands()
    assert len(commands) == 5, commands
    assert [shlex.split(c)[:2] for c in commands] == [
        ["media-hooks", "receiver"],
        ["media-hooks", "destination"],
        ["media-hooks", "emit"],
        ["media-hooks", "run"],
        ["media-hooks", "inspect"],
    ]
    # The one explicit choice that lets a local receiver through is on the page.
    assert "--allow-private-url" in shlex.split(commands[1])


def test_the_walkthrough_as_written_delivers_a_signed_request(env, conn):
    assert "MEDIA_HOOKS_ALLOW_PRIVATE_URLS" not in env  # the guard is on
    port = _free_port()
    receiver_cmd, *rest = page_commands()
    assert PAGE_PORT in receiver_cmd and PAGE_PORT in rest[0]
    argv = [shlex.split(c.replace(PAGE_PORT, port))[1:] for c in (receiver_cmd, *rest)]

    terminal = Terminal(argv[0], env)
    try:
        terminal.wait_line(r"listening on .*verifying 1 secret")
        done = [run_cli(*words, env=env, timeout=180) for words in argv[1:]]
        for words, result in zip(argv[1:], done, strict=True):
            assert result.returncode == 0, (words, result.stdout, result.stderr)
        arrived = terminal.wait_line("webhook-id=my-first-webhook")
        terminal.process.send_signal(signal.SIGINT)  # Ctrl-C
        assert terminal.process.wait(timeout=20) == 0
        stopped = terminal.wait_line("stopped:")
    finally:
        if terminal.process.poll() is None:
            terminal.process.kill()
            terminal.process.wait()

    # The request was signed with the page's secret and verified by the receiver, once.
    assert " 200 " in arrived and arrived.endswith(" verified"), arrived
    assert "1 request(s), 1 effect(s)" in stopped
    _, emitted, ran, inspected = done
    assert emitted.stdout.strip() == "recorded my-first-webhook"
    assert re.search(r"claimed 1, succeeded 1, ", ran.stdout), ran.stdout
    assert "attention" not in ran.stdout
    assert "verdict: succeeded" in inspected.stdout, inspected.stdout
    assert "attempt 1 by run" in inspected.stdout and "HTTP 200" in inspected.stdout
    row = conn.execute(
        "SELECT allow_private_url, enabled FROM webhook_destination WHERE destination_id = 'mine'"
    ).fetchone()
    assert (row["allow_private_url"], row["enabled"]) == (True, True)
