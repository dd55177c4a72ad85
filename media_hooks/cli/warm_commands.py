"""``media-hooks warm``: the warm run server that ``media-hooks run`` hands its runs to."""

from __future__ import annotations

import argparse
import time

from media_hooks import numeric
from media_hooks.cli import warm
from media_hooks.cli.output import print_json, table
from media_hooks.config import home_from_env
from media_hooks.errors import RuntimeFailure, UserError

DESCRIPTION = """\
`media-hooks run` imports Dagster and its storage before its first delivery: about a second of
CPU. A warm run server has them imported already; a run handed to it starts in a process
forked from it, on the command's own terminal, environment and folder, and with the project's
code as it is now. The first `media-hooks run` without one starts one in the background after
its run; it ends after IDLE_SECONDS without a run. MEDIA_HOOKS_WARM_RUNS=off turns it off.
"""
IDLE = numeric.Range(1, numeric.DAY_SECONDS, low_inclusive=True, unit="seconds")
STOP_WAIT_SECONDS = 10.0


def register(commands: argparse._SubParsersAction) -> None:
    group = commands.add_parser(
        "warm",
        help="the warm run server `media-hooks run` hands its runs to: start, stop, status",
        description=DESCRIPTION,
    )
    sub = group.add_subparsers(dest="warm_command", required=True, parser_class=type(group))
    start = sub.add_parser("start", help="start it (if none runs) and wait until it answers")
    start.add_argument(
        "--idle-seconds",
        type=numeric.argument(IDLE),
        default=warm.IDLE_SECONDS,
        metavar="S",
        help="end after S seconds without a run (default %(default)g)",
    )
    start.add_argument("--json", action="store_true", help="print one JSON document")
    start.set_defaults(handler=run_start)
    stop = sub.add_parser(
        "stop", help="stop every warm run server of this home (runs in progress go on)"
    )
    stop.add_argument("--json", action="store_true", help="print one JSON document")
    stop.set_defaults(handler=run_stop)
    status = sub.add_parser("status", help="the warm run servers of this home")
    status.add_argument("--json", action="store_true", help="print one JSON document")
    status.set_defaults(handler=run_status)


def _disabled_check() -> None:
    if not warm.enabled():
        raise UserError(
            f"warm runs are off ({warm.ENV}=off, or this system has no pidfd_open): "
            "`media-hooks run` runs in its own process"
        )


def run_start(args: argparse.Namespace) -> int:
    _disabled_check()
    home = home_from_env()
    pid = warm.server_pid(home)
    started = pid is None
    if started:
        pid = warm.start(home, args.idle_seconds, wait=True)
    if pid is None:
        raise RuntimeFailure(
            f"the warm run server did not start (see {home / 'logs' / 'run-server.log'})"
        )
    if args.json:
        print_json({"pid": pid, "started": started, "socket": str(warm.socket_path(home))})
    else:
        print(f"warm run server pid {pid} {'started' if started else 'already running'}")
    return 0


def run_stop(args: argparse.Namespace) -> int:
    servers = warm.servers(home_from_env())
    for server in servers:
        warm.stop(server)
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    while any(server.listening() for server in servers) and time.monotonic() < deadline:
        time.sleep(0.05)
    lingering = [s.pid for s in servers if s.listening()]
    if args.json:
        print_json({"stopped": [s.pid for s in servers], "still_listening": lingering})
    elif not servers:
        print("no warm run server runs")
    else:
        pids = ", ".join(str(s.pid) for s in servers)
        print(f"stopped warm run server(s) {pids}; runs they started go on to their end")
    if lingering:
        raise RuntimeFailure(f"warm run server(s) {lingering} still listen")
    return 0


def run_status(args: argparse.Namespace) -> int:
    home = home_from_env()
    servers = warm.servers(home)
    current = warm.socket_path(home)
    if args.json:
        print_json(
            {
                "enabled": warm.enabled(),
                "servers": [
                    {"pid": s.pid, "socket": str(s.socket), "current": s.socket == current}
                    for s in servers
                ],
            }
        )
        return 0
    print(f"warm runs: {'on' if warm.enabled() else 'off'}")
    if servers:
        rows = [[s.pid, "yes" if s.socket == current else "no (idles out)"] for s in servers]
        print(table(["pid", "takes this interpreter's runs"], rows))
    else:
        print("no warm run server runs")
    return 0
