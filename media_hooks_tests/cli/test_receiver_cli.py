"""``media-hooks receiver`` as a real process: listens, verifies, logs, stops on a signal."""

from __future__ import annotations

import base64
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from media_hooks.http.outcomes import REJECTED, SUCCESS
from media_hooks.http.sender import Sender
from media_hooks_tests.conftest import REPO, default_sigint, run_cli

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()


def plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MEDIA_HOOKS_")}


class Running:
    """The receiver subprocess, with its stdout read line by line on a thread."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "media_hooks.cli", "receiver", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=plain_env(),
            cwd=REPO,
            preexec_fn=default_sigint,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, pattern: str, timeout: float = 20) -> str:
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

    def stop(self, sig: int) -> int:
        self.process.send_signal(sig)
        return self.process.wait(timeout=20)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_receiver_accepts_a_signed_request_logs_it_and_stops(sig: int) -> None:
    running = Running("--port", "0", "--secret", SECRET)
    try:
        url = re.search(r"listening on (\S+)", running.wait_line("listening on")).group(1)
        assert "verifying 1 secret" in running.seen[-1]
        with Sender(url, [SECRET], timeout_seconds=5, allow_private=True) as sender:
            assert sender.send("dlv_cli_1", b'{"x": 1}').outcome == SUCCESS
            assert sender.send("dlv_cli_1", b'{"x": 1}').outcome == SUCCESS
        with Sender(url, [], timeout_seconds=5, allow_private=True) as unsigned:
            assert unsigned.send("dlv_cli_2", b"{}").outcome == REJECTED
        first = running.wait_line("webhook-id=dlv_cli_1")
        assert " 200 " in first and "verified" in first and "duplicate" not in first
        assert "duplicate" in running.wait_line("webhook-id=dlv_cli_1")
        rejected = running.wait_line("webhook-id=dlv_cli_2")
        assert " 401 " in rejected and "unverified" in rejected
        assert running.stop(sig) == 0
        summary = running.wait_line("stopped:")
        assert "3 request(s), 1 effect(s)" in summary
        stderr = running.process.stderr.read()
        assert SECRET[6:] not in "\n".join(running.seen) + stderr
    finally:
        if running.process.poll() is None:
            running.process.kill()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fail-rate", "2"], "--fail-rate: must be a number at least 0 and at most 1"),
        (["--fail-rate", "nan"], "--fail-rate: must be a number at least 0 and at most 1"),
        (["--tolerance", "inf"], "--tolerance: must be a number of seconds greater than 0"),
        (["--fail-rate", "0.7", "--rate-limit-rate", "0.5"], "together must not exceed 1"),
        (["--delay", "-1"], "--delay: must be a number of seconds at least 0 and at most 3600"),
        (["--delay", "nan"], "--delay: must be a number of seconds at least 0"),
        (["--port", "70000"], "--port: must be a whole number at least 0 and at most 65535"),
        (["--secret", "whsec_###hunter2###"], "webhook secret"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    done = run_cli("receiver", *args, env=plain_env(), timeout=30)
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "hunter2" not in done.stderr + done.stdout
    assert "listening" not in done.stdout


def test_a_port_in_use_is_a_runtime_failure() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("receiver", "--port", str(port), env=plain_env(), timeout=30)
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
