"""``python -m bench``: the benchmark report, from the repository root.

    python -m bench            # full size, under 20 minutes
    python -m bench --quick    # scaled down, under 2 minutes
    python -m bench --smoke    # tiny, for CI: proves every measurement runs (figures mean little)
    python -m bench --only deliver,latency --quick
    python -m bench --only sustained   # the sustained-load section, run only when named
    python -m bench --only celery  # the Celery workers (run only when named: needs a broker)
    python -m bench --only node    # the Node worker beside the engine and pg-boss (needs npm)
    python -m bench --report   # rewrite REPORT.md and the plots from latest.json

Runs against ``MEDIA_HOOKS_DATABASE_URL`` when set, otherwise the embedded server, each
measurement in scratch databases it drops afterwards. Writes ``latest.json``, ``REPORT.md``
and PNG plots to ``bench/results/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from bench import plots, processes, report, suite
from bench.scratch import RESULTS
from bench.sizes import FULL, QUICK, SMOKE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="media_hooks' benchmark report: every measurement beside its peers, as "
        "ratios measured in one session (run from the repository root).",
    )
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="scaled down: under 2 minutes")
    sizes.add_argument("--smoke", action="store_true", help="tiny: CI's check that it all runs")
    sizes.add_argument(
        "--report", action="store_true", help="only rewrite the report and plots from latest.json"
    )
    parser.add_argument(
        "--only",
        default="",
        metavar="NAMES",
        help="comma-separated measurements: " + ", ".join(suite.MEASUREMENTS) + "; and, only "
        "when named: " + ", ".join(suite.ON_REQUEST),
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    parser.add_argument(
        "--own-sessions",
        action="store_true",
        help="start each measured process in a session of its own (as setsid or cron do), "
        "not in a process group of the benchmark's session (see bench/processes.py)",
    )
    args = parser.parse_args(argv)
    processes.own_sessions = args.own_sessions
    only = [name for name in args.only.split(",") if name]
    unknown = sorted(set(only) - set(suite.ALL))
    if unknown:
        parser.error(f"unknown measurement {unknown[0]!r} (choose from {', '.join(suite.ALL)})")
    if args.report:
        if not (args.out / "latest.json").is_file():
            parser.error(f"no {args.out / 'latest.json'} to report from: run the benchmark first")
        document = json.loads((args.out / "latest.json").read_text())
        document["plots"] = plots.draw(document, args.out)
        suite.write(document, args.out)
        (args.out / "REPORT.md").write_text(report.render(document))
        print(f"rewrote {args.out / 'REPORT.md'}")
        return 0
    size = SMOKE if args.smoke else QUICK if args.quick else FULL
    command = shlex.join(["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])])
    document = suite.run(size, only, args.out, command)
    print(
        f"{document['seconds']:.0f} s; wrote {args.out / 'latest.json'} and {args.out / 'REPORT.md'}"
    )
    failed = [name for name, m in document["measurements"].items() if "error" in m]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
