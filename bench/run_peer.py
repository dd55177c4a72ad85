"""Runs one path of a measurement as a process of its own and prints its JSON figures.

    python -m bench.run_peer engine URL --run-id R [--page-size N]
    python -m bench.run_peer bare URL
    python -m bench.run_peer rejected URL
    python -m bench.run_peer procrastinate URL --concurrency N

The paths themselves are in ``bench.peers`` (a module of its own, so that Procrastinate's
app is not made in ``__main__``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from bench import peers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("engine", "bare", "rejected", "procrastinate"):
        command = commands.add_parser(name)
        command.add_argument("url")
    commands.choices["engine"].add_argument("--run-id", required=True)
    commands.choices["engine"].add_argument("--page-size", type=int)
    commands.choices["procrastinate"].add_argument("--concurrency", type=int, required=True)
    args = parser.parse_args()
    actions: dict[str, Callable[[], dict]] = {
        "engine": lambda: peers.engine(args.url, args.run_id, **_given(args, "page_size")),
        "bare": lambda: peers.bare(args.url),
        "rejected": lambda: peers.rejected(args.url),
        "procrastinate": lambda: peers.procrastinate_worker(args.url, args.concurrency),
    }
    print(json.dumps(actions[args.command]()), flush=True)


def _given(args: argparse.Namespace, *names: str) -> dict[str, int]:
    """The options given on the command line (the rest keep deliver_due's defaults)."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


if __name__ == "__main__":
    main()
