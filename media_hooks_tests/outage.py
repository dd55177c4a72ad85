"""A database outage on demand: a TCP proxy in front of the test server that a test can cut.

Every connection made through the proxy is a real PostgreSQL session on the test server.
``cut()`` drops them all and refuses new ones (connection refused), as when the database host
goes away; ``restore()`` lets connections through again on the same address. The session's
shared server keeps running for everyone else.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from psycopg import conninfo


def _upstream_address(server_url: str) -> tuple[int, object]:
    params = conninfo.conninfo_to_dict(server_url)
    host = params.get("host") or "127.0.0.1"
    port = int(params.get("port") or 5432)
    if host.startswith("/"):  # a Unix socket folder (the embedded server)
        return socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
    return socket.AF_INET, (host, port)


class DatabaseProxy:
    def __init__(self, server_url: str) -> None:
        self._family, self._upstream = _upstream_address(server_url)
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = 0
        self.restore()

    def url(self, database_url: str) -> str:
        """``database_url``'s database and user, reached through the proxy."""
        params = conninfo.conninfo_to_dict(database_url)
        params.update(host="127.0.0.1", port=str(self.port))
        return conninfo.make_conninfo(**params)

    def restore(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and drop every open one."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            open_sockets, self._sockets = self._sockets, set()
        for sock in open_sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                server = socket.socket(self._family, socket.SOCK_STREAM)
                server.connect(self._upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut while connecting
                    client.close()
                    server.close()
                    return
                self._sockets |= {client, server}
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, target), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        for sock in (source, target):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._lock:
            self._sockets -= {source, target}


@contextmanager
def database_proxy(server_url: str) -> Iterator[DatabaseProxy]:
    proxy = DatabaseProxy(server_url)
    try:
        yield proxy
    finally:
        proxy.cut()
