"""The warm run server: ``media-hooks run`` without importing Dagster each time.

    python -m media_hooks.orchestration.run_server SOCKET IDLE_SECONDS   (see media_hooks.cli.warm)

Before its first delivery, ``media-hooks run`` spends about a second of CPU importing Dagster
and its storage: most of a small run's wall time, and the gap between the job and its engine on
a run of thousands. This server imports them once (``zygote.preload``), listens on a Unix
socket under ``MEDIA_HOOKS_HOME`` (a folder only its user may enter; a peer of another user is
refused as well), and answers each connection by forking a child that runs the command line it
was sent as the command's own process would: on the caller's stdin, stdout and stderr (passed
over the socket), in its environment, working folder and import path. The project's run code
is loaded by the server too, and a child keeps it only while it is what the caller would
import (``project_code``: a changed checkout reaches the next run). The child tells the caller
its pid first; the server tells the caller the child's exit status when it ends.

The caller (``media_hooks.cli.warm``) passes its signals on to the child. When the caller ends
without waiting (killed), the child kills itself at once, as if it had been killed with it: a
run that kill interrupted is recovered as a killed ``media-hooks run``'s is.

It stays single-threaded (a fork copies only the forking thread; a lock another thread held
would stay held in the child), one server per socket (a lock file), and ends after
``IDLE_SECONDS`` with no request and no child running, or at SIGTERM once its children ended.
"""

from __future__ import annotations

import fcntl
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
from pathlib import Path
from typing import NoReturn

from media_hooks.orchestration import project_code, zygote

# A request: the command line, environment, working folder and import path (a few kB; an
# environment larger than this is refused, and the caller runs the command itself).
MAX_MESSAGE_BYTES = 1 << 20
BACKLOG = 16
REQUEST_TIMEOUT_SECONDS = 5.0


def peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def send(conn: socket.socket, message: dict) -> None:
    conn.send(json.dumps(message).encode())


class _Child:
    """A forked child: its pid, a pidfd readable when it ends, the caller's connection."""

    def __init__(self, pid: int, conn: socket.socket) -> None:
        self.pid = pid
        self.conn = conn
        self.pidfd = os.pidfd_open(pid)

    def ended(self) -> None:
        """Reaps the child and tells the caller its exit status."""
        _, status = os.waitpid(self.pid, 0)
        try:
            send(self.conn, {"status": os.waitstatus_to_exitcode(status)})
        except OSError:
            pass  # the caller is gone
        self.close()

    def close(self) -> None:
        self.conn.close()
        os.close(self.pidfd)


class Server:
    def __init__(
        self, listener: socket.socket, socket_path: Path, lock: int, idle_seconds: float
    ) -> None:
        self.listener: socket.socket | None = listener
        self.socket_path = socket_path
        self.lock = lock
        self.idle_seconds = idle_seconds
        self.children: dict[int, _Child] = {}
        self.stopping = False
        # SIGTERM wakes the loop through this pair (Python's handler runs between bytecodes).
        self.wakeup, self._wakeup_write = socket.socketpair()
        self.wakeup.setblocking(False)
        self._wakeup_write.setblocking(False)

    def serve(self) -> None:
        signal.set_wakeup_fd(self._wakeup_write.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._stop)
        with selectors.DefaultSelector() as selector:
            selector.register(self.listener, selectors.EVENT_READ)
            selector.register(self.wakeup, selectors.EVENT_READ)
            while not (self.stopping and not self.children):
                if self.stopping and self.listener is not None:
                    selector.unregister(self.listener)
                    self.close_listener()
                busy = self.children or self.stopping
                events = selector.select(None if busy else self.idle_seconds)
                if not events and not self.children:
                    return  # idle
                for key, _ in events:
                    if key.fileobj is self.listener:
                        self.accept(selector)
                    elif key.fileobj is self.wakeup:
                        self.wakeup.recv(64)
                    else:
                        selector.unregister(key.fileobj)
                        self.children.pop(key.fileobj).ended()

    def _stop(self, *_: object) -> None:
        """SIGTERM: no new requests; the server ends once the runs it started ended."""
        self.stopping = True

    def close_listener(self) -> None:
        """New callers find no server (and run the command themselves) from here on."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            self.socket_path.unlink(missing_ok=True)

    def accept(self, selector: selectors.BaseSelector) -> None:
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        request = _request(conn)
        if request is None:
            conn.close()
            return
        message, fds = request
        pid = os.fork()
        if pid == 0:
            self._become_child(conn, fds, message)
        for fd in fds:
            os.close(fd)
        child = _Child(pid, conn)
        self.children[child.pidfd] = child
        selector.register(child.pidfd, selectors.EVENT_READ)

    def _become_child(self, conn: socket.socket, fds: list[int], message: dict) -> None:
        """In the forked child: drop the server's descriptors, then run the command."""
        signal.set_wakeup_fd(-1)
        self.close_listener_fd()
        os.close(self.lock)  # a run outliving the server must not keep the next one out
        self.wakeup.close()
        self._wakeup_write.close()
        for child in self.children.values():
            child.close()
        _run_child(conn, fds, message)

    def close_listener_fd(self) -> None:
        # Not close_listener: the socket's path is the server's, it stays.
        if self.listener is not None:
            self.listener.close()


def _request(conn: socket.socket) -> tuple[dict, list[int]] | None:
    """A caller's request and its three streams; None (and why, in the log) if refused."""
    fds: list[int] = []
    try:
        if peer_uid(conn) != os.getuid():
            raise ValueError("a caller of another user")
        # The server answers one caller at a time: one that connects and stalls must not
        # hold up the rest (a caller sends its request as it connects).
        conn.settimeout(REQUEST_TIMEOUT_SECONDS)
        data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE_BYTES, 3)
        conn.settimeout(None)
        if len(fds) != 3:
            raise ValueError("a request without its three streams")
        return json.loads(data), fds
    except (OSError, ValueError) as exc:
        print(f"run server {os.getpid()}: request refused: {exc}", file=sys.stderr, flush=True)
        for fd in fds:
            os.close(fd)
        return None


def _watch_caller(conn: socket.socket) -> None:
    """Kills this process when the caller ends without waiting for it (it sends nothing after
    its request, so a read returns only at its end)."""
    try:
        conn.recv(1)
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def _run_child(conn: socket.socket, fds: list[int], message: dict) -> NoReturn:
    try:
        send(conn, {"pid": os.getpid()})
    except OSError:
        os._exit(1)  # the caller gave up waiting (and runs the command itself): nothing began

    def run() -> int:
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in message["ignored"]:  # as the caller was started
            signal.signal(signum, signal.SIG_IGN)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=stream.isatty())
        os.environ.clear()
        os.environ.update(message["env"])
        os.chdir(message["cwd"])
        sys.path[:] = message["path"]
        sys.argv = ["media-hooks", *message["argv"]]
        threading.Thread(target=_watch_caller, args=(conn,), daemon=True).start()
        project_code.keep_or_forget()
        from media_hooks.cli import run_in_this_process

        return run_in_this_process()

    zygote.end_child(run)


def _hold_lock(socket_path: Path) -> int | None:
    """The server's lock (held for its life), or None when another server holds it."""
    fd = os.open(f"{socket_path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def listen(socket_path: Path) -> socket.socket:
    socket_path.unlink(missing_ok=True)  # a server that ended without removing it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(socket_path))
    listener.listen(BACKLOG)
    listener.setblocking(False)
    return listener


def main() -> None:
    socket_path, idle_seconds = Path(sys.argv[1]), float(sys.argv[2])
    # A terminal's Ctrl-C is for the runs, and its hang-up is not for a server that outlives it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    lock = _hold_lock(socket_path)
    if lock is None:
        print(json.dumps({"ready": None}), flush=True)  # another server answers there
        return
    zygote.preload()
    os.chdir("/")
    server = Server(listen(socket_path), socket_path, lock, idle_seconds)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    try:
        server.serve()
    finally:
        server.close_listener()
        os.close(lock)


if __name__ == "__main__":
    main()
