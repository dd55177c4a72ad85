"""``media-hooks demo``: the main job end to end, with a summary, a chart and what to try next."""

from __future__ import annotations

import argparse
import sys

from media_hooks.cli.output import fields, print_json, program, table
from media_hooks.core.config import Settings
from media_hooks.devtools.demo import DemoResult, run_demo

COLUMNS = (
    ("destination_id", "destination"),
    ("deliveries", "events"),
    ("delivered", "delivered"),
    ("retried", "retried"),
    ("rate_limited", "rate-limited"),
    ("ambiguous", "ambiguous"),
    ("dead", "dead"),
    ("attempts", "attempts"),
)


DESCRIPTION = """\
Runs the main job end to end on its own data, in about half a minute: a local receiver that
verifies signatures stands in for three publishers (demo-cdn, demo-partner, demo-archive, each
with its own rate limit; demo-partner misbehaves on purpose: 500s, 429s with Retry-After, an
answer slower than its timeout, a rejection), a few hundred media events are emitted, and the
Dagster delivery job runs until they are delivered or dead. Prints per destination what was
delivered, retried, rate-limited, ambiguous and dead and the rate achieved against its limit,
and draws request starts per second against each limit in
MEDIA_HOOKS_HOME/demo/request_rate.png, the pauses the 429s asked for shaded. Run it again at
will: it replaces only its own demo-* destinations and their deliveries."""


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo",
        help="the main job end to end: a local receiver, destinations, events, delivery runs",
        description=DESCRIPTION,
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=run)


# Under the table, how its counts add up, and what the progress lines' "to send again" was.
COUNTS_EXPLAINED = (
    "attempts = delivered + dead + retried + rate-limited: retried is an error or no answer in "
    "time (ambiguous, counted in retried too), sent again after a backoff; rate-limited is a "
    "429 that paused the destination, sent again after its Retry-After without spending the "
    'retry budget; a run\'s retried and rate-limited are what it left "to send again".'
)


def _rate(row: dict) -> str:
    achieved = "-" if row["achieved_rate"] is None else f"{row['achieved_rate']:.1f}/s"
    return f"{achieved} (peak {row['peak_starts_per_second']}/s) vs {row['rate_per_second']:g}/s"


def _next_steps(result: DemoResult, embedded: bool) -> list[tuple[str, str]]:
    me = program()
    examples = result.examples
    steps = [(f"{me} status", "the whole picture")]
    if "unfinished" in examples:
        steps.append((f"{me} inspect {examples['unfinished']}", "not delivered yet: why"))
    steps += [
        (f"{me} inspect {examples['rate_limited_then_succeeded']}", "a 429, a pause, a success"),
        (f"{me} inspect {examples['ambiguous_then_succeeded']}", "a timeout, then a retry"),
        (f"{me} inspect {examples['dead']}", "a rejection: dead"),
        (f"{me} dev", "the Dagster UI: these runs, the job, sensors"),
    ]
    if embedded:
        steps.append((f"{me} db stop", "stop the embedded PostgreSQL server (`db status`: where)"))
    return steps


def render(result: DemoResult, embedded: bool) -> str:
    rows = [[*(row[key] for key, _ in COLUMNS), _rate(row)] for row in result.destinations]
    headers = [header for _, header in COLUMNS] + ["achieved rate vs limit"]
    r = result.receiver
    return "\n".join(
        [
            "",
            table(headers, rows),
            COUNTS_EXPLAINED,
            "",
            f"receiver: {r['requests']} requests, {r['accepted_ids']} distinct deliveries "
            f"accepted, {r['duplicate_requests']} duplicate(s) answered from memory, "
            f"{r['rejected_signatures']} bad signature(s)",
            f"{len(result.runs)} Dagster run(s): {', '.join(run['run_id'] for run in result.runs)}",
            f"chart of request starts against each limit: {result.chart}",
            f"finished in {result.seconds:.0f}s",
            "",
            "where to look next:",
            fields(_next_steps(result, embedded)),
        ]
    )


def run(args: argparse.Namespace) -> int:
    # With --json, progress goes to stderr so stdout holds one JSON document.
    stream = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    settings = Settings.from_env()
    result = run_demo(settings, say)
    if args.json:
        print_json(result.as_dict())
    else:
        print(render(result, settings.embedded))
    return 0
