"""``media-hooks run`` handed to the warm run server (``orchestration.run_server``).

A ``media-hooks run`` first looks for a warm run server of its interpreter under
``MEDIA_HOOKS_HOME/run/``. When one answers, the command runs in a child forked from it (on
this process's streams, environment, folder and import path) and this process only waits:
it passes its signals on (Ctrl-C, SIGTERM, SIGHUP stop the run as they would stop the command)
and exits with the child's status, dying by the same signal when the child was killed. When
none answers, the command runs here as before, and then starts a server in the background for
the next one; the server ends after ``IDLE_SECONDS`` without a run (``media-hooks warm stop``
ends it at once; ``MEDIA_HOOKS_WARM_RUNS=off`` turns all of this off).

The socket's name is a digest of what the server has loaded: this interpreter, its import path
and the state of its site-packages (a change of an installed package changes their folder),
and the server's own code. A server that no longer matches is never asked again; it idles out.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from media_hooks.config import home_from_env
from media_hooks.errors import UserError

ENV = "MEDIA_HOOKS_WARM_RUNS"
SERVER_MODULE = "media_hooks.orchestration.run_server"
IDLE_SECONDS = 600.0
START_TIMEOUT_SECONDS = 120.0
FORK_TIMEOUT_SECONDS = 30.0
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The server's own code: a change of it is a change of server.
_SERVER_SOURCES = (
    "orchestration/run_server.py",
    "orchestration/zygote.py",
    "orchestration/project_code.py",
    "cli/loading.py",
)
_PACKAGE = Path(__file__).resolve().parent.parent
# Linux's limit on a Unix socket's path (sun_path, less its terminating NUL).
_MAX_SOCKET_PATH = 107


def enabled() -> bool:
    value = os.environ.get(ENV, "on").strip().lower()
    if value not in ("on", "off"):
        raise UserError(f"{ENV} must be 'on' or 'off', got {value!r}")
    return value == "on" and hasattr(os, "pidfd_open")


def _digest() -> str:
    parts = [sys.executable, sys.version, *sys.path[1:]]
    for entry in sys.path:
        if entry.endswith("-packages") and os.path.isdir(entry):
            parts.append(str(os.stat(entry).st_mtime_ns))
    hasher = hashlib.sha256("\0".join(parts).encode())
    for source in _SERVER_SOURCES:
        hasher.update((_PACKAGE / source).read_bytes())
    return hasher.hexdigest()[:16]


def run_folder(home: Path) -> Path:
    return home / "run"


def socket_path(home: Path) -> Path | None:
    """Where this interpreter's server listens; None when the path is too long for a socket."""
    path = run_folder(home) / f"warm-{_digest()}.sock"
    return path if len(os.fsencode(path)) <= _MAX_SOCKET_PATH else None


def _ignored() -> list[int]:
    """The signals this process was started ignoring (``nohup``, a script's ``&``): the child
    ignores them too, as the command in its own process would."""
    return [signum for signum in FORWARDED if signal.getsignal(signum) == signal.SIG_IGN]


class _Forwarder:
    """Passes the signals this process gets on to the child; remembers those before it."""

    def __init__(self) -> None:
        self.child: int | None = None
        self.pending: list[int] = []
        ignored = _ignored()
        self._saved = {
            signum: signal.signal(signum, self._handle)
            for signum in FORWARDED
            if signum not in ignored
        }

    def _handle(self, signum: int, _frame: object) -> None:
        if self.child is None:
            self.pending.append(signum)
        else:
            _signal(self.child, signum)

    def forward_to(self, child: int) -> None:
        self.child = child
        for signum in self.pending:
            _signal(child, signum)
        self.pending.clear()

    def restore(self) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # it has just ended: its status is on the way


def _receive(conn: socket.socket) -> dict | None:
    data = conn.recv(4096)
    return json.loads(data) if data else None


def _request(words: list[str]) -> bytes:
    message = {
        "argv": words,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "path": sys.path,
        "ignored": _ignored(),
    }
    return json.dumps(message).encode()


def hand_over(words: list[str]) -> int | None:
    """Runs the command in a warm server's child and returns its exit status; None when no
    server took it (nothing ran: the caller runs the command itself)."""
    path = socket_path(home_from_env())
    if path is None or not path.exists():
        return None
    forwarder = _Forwarder()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            try:
                conn.settimeout(FORK_TIMEOUT_SECONDS)
                conn.connect(str(path))
                socket.send_fds(conn, [_request(words)], [0, 1, 2])
                started = _receive(conn)
                conn.settimeout(None)
            except (OSError, ValueError):
                # Refused, or no answer in time (a stopped server): closing the connection
                # ends a child that was forked and did not begin.
                started = None
            if not started:  # nothing was forked, or it ended before it began
                return _unless_stopped(forwarder)
            forwarder.forward_to(started["pid"])
            try:
                ended = _receive(conn)
            except (OSError, ValueError):
                ended = None
    finally:
        forwarder.restore()
    if ended is None:
        print(
            f"media-hooks: the run's process (pid {started['pid']}) ended and its exit status "
            "is unknown: its server stopped",
            file=sys.stderr,
        )
        return 1
    return _exit_as(ended["status"])


def _unless_stopped(forwarder: _Forwarder) -> int | None:
    """None (run the command here), unless this process was told to stop meanwhile."""
    forwarder.restore()
    for signum in forwarder.pending:
        signal.raise_signal(signum)  # SIGTERM, SIGHUP: their default ends the process
    return None


def _exit_as(status: int) -> int:
    """The exit status to end with: the child's, or its signal (this process dies by it)."""
    if status >= 0:
        return status
    sys.stdout.flush()
    sys.stderr.flush()
    if -status in FORWARDED:
        signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
    return 128 - status


def start(home: Path, idle_seconds: float = IDLE_SECONDS, wait: bool = False) -> int | None:
    """Starts this interpreter's server in the background; with ``wait``, returns its pid once it
    answers (None when it could not start)."""
    path = socket_path(home)
    if path is None:
        raise UserError(f"MEDIA_HOOKS_HOME is too long a path for the run server's socket: {home}")
    folder = run_folder(home)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)  # its socket runs commands as this user: no one else may reach it
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # Nothing of the caller's configuration: each run brings its own environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIA_HOOKS_", "PG"))}
    with open(logs / "run-server.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, str(path), f"{idle_seconds:g}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if wait else subprocess.DEVNULL,
            stderr=log,
            env=env,
            # Its own process group (a terminal's signals are not for it) in this session:
            # where Linux's autogroup scheduler gives each session its share of the CPU, its
            # runs get what a run in a process of the command's own would.
            process_group=0,
        )
    if not wait:
        return None
    with process.stdout, selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        line = process.stdout.readline() if selector.select(START_TIMEOUT_SECONDS) else b""
    ready = json.loads(line)["ready"] if line else None
    return ready if ready is not None else server_pid(home)


def start_quietly() -> None:
    """Starts a server for the next run unless one runs (or none can: then runs stay cold)."""
    try:
        home = home_from_env()
        if enabled() and server_pid(home) is None:
            start(home)
    except (OSError, UserError):
        pass


@dataclass(frozen=True)
class RunningServer:
    pid: int
    socket: Path

    def listening(self) -> bool:
        return self.socket.exists() and _holder(Path(f"{self.socket}.lock")) == self.pid


def servers(home: Path) -> list[RunningServer]:
    """The warm run servers of this home (of this interpreter or not)."""
    found = []
    for lock in sorted(run_folder(home).glob("warm-*.sock.lock")):
        pid = _holder(lock)
        if pid is not None:
            found.append(RunningServer(pid, lock.with_suffix("")))
    return found


def server_pid(home: Path) -> int | None:
    """The pid of the server that takes this interpreter's runs, when one runs."""
    path = socket_path(home)
    return _holder(Path(f"{path}.lock")) if path is not None else None


def stop(server: RunningServer) -> None:
    """Asks a server to end: it stops listening at once, and ends when its runs have."""
    _signal(server.pid, signal.SIGTERM)


def _holder(lock: Path) -> int | None:
    """The pid written in ``lock`` by the server that holds it; None when none holds it."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return int(os.read(fd, 32) or 0) or None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
