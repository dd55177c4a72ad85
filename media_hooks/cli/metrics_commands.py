"""``media-hooks metrics``: a Prometheus exporter of the operator's figures."""

from __future__ import annotations

import argparse
import signal
import threading
from functools import partial

from prometheus_client import start_http_server

from media_hooks.core import numeric
from media_hooks.core.config import Settings
from media_hooks.core.errors import RuntimeFailure
from media_hooks.observe.metrics import HistoryCounter, registry_for
from media_hooks.store import db

# 0: count the history at every scrape, as before the counter existed.
HISTORY_EVERY = numeric.Range(0, numeric.DAY_SECONDS, low_inclusive=True, unit="seconds")
DEFAULT_HISTORY_EVERY_SECONDS = 300.0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "metrics", help="serve the figures of `status` as Prometheus gauges until interrupted"
    )
    parser.add_argument(
        "--port",
        type=numeric.argument(numeric.PORT_OR_ANY),
        required=True,
        help="TCP port (0: any free one)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--history-every",
        type=numeric.argument(HISTORY_EVERY),
        default=DEFAULT_HISTORY_EVERY_SECONDS,
        metavar="SECONDS",
        help="count the succeeded deliveries and the attempts by outcome this often, apart from "
        "the scrapes (default 300; 0: at every scrape)",
    )
    parser.set_defaults(handler=run_metrics)


def run_metrics(args: argparse.Namespace) -> int:
    # Checked once up front, so a wrong configuration is an error now, not a silent 0 later.
    url = db.ready_url(Settings.from_env())
    connect = partial(db.connect, url, autocommit=True)
    history = HistoryCounter(connect, args.history_every) if args.history_every else None
    registry = registry_for(connect, history)
    try:
        server, thread = start_http_server(args.port, addr=args.host, registry=registry)
    except OSError as exc:
        raise RuntimeFailure(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    if history is not None:
        history.start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    host, port = server.server_address[:2]
    print(f"serving Prometheus metrics at http://{host}:{port}/metrics; Ctrl-C stops", flush=True)
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        if history is not None:
            history.stop()
    return 0
