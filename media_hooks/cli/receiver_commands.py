"""``media-hooks receiver``: a verifying, deduplicating receiver to develop against."""

from __future__ import annotations

import argparse
import signal
import threading

from media_hooks.core import numeric
from media_hooks.core.errors import RuntimeFailure, UserError
from media_hooks.devtools.receiver import ReceivedRequest, Receiver, random_faults


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "receiver",
        help="run a webhook receiver that verifies signatures and deduplicates by webhook-id",
    )
    parser.add_argument(
        "--port",
        type=numeric.argument(numeric.PORT_OR_ANY),
        default=0,
        help="TCP port (default: any free one)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="whsec_…",
        help="verify signatures with this secret (repeat during a rotation)",
    )
    parser.add_argument(
        "--tolerance",
        type=numeric.argument(numeric.SECONDS_UP_TO_A_DAY),
        default=300,
        metavar="SECONDS",
        help="timestamp tolerance",
    )
    parser.add_argument(
        "--fail-rate",
        type=numeric.argument(numeric.FRACTION),
        default=0.0,
        metavar="FRACTION",
        help="answer 500 this often",
    )
    parser.add_argument(
        "--rate-limit-rate",
        type=numeric.argument(numeric.FRACTION),
        default=0.0,
        metavar="FRACTION",
        help="answer 429 with Retry-After this often",
    )
    parser.add_argument(
        "--retry-after",
        type=numeric.argument(numeric.Range(0, 86400, low_inclusive=True, integer=True)),
        default=1,
        metavar="SECONDS",
        help="Retry-After of a 429",
    )
    parser.add_argument(
        "--delay",
        type=numeric.argument(numeric.Range(0, 3600, low_inclusive=True, unit="seconds")),
        default=0.0,
        metavar="SECONDS",
        help="answer this much later",
    )
    parser.set_defaults(handler=run_receiver)


def _validate(args: argparse.Namespace) -> None:
    if args.fail_rate + args.rate_limit_rate > 1:
        raise UserError("--fail-rate and --rate-limit-rate together must not exceed 1")


def log_line(entry: ReceivedRequest) -> str:
    """One line per request; headers and secrets are never printed."""
    status = "dropped" if entry.status is None else str(entry.status)
    millis = (entry.finished_monotonic - entry.arrived_monotonic) * 1000
    parts = [
        entry.arrived_at.isoformat(timespec="milliseconds"),
        status,
        f"webhook-id={entry.webhook_id or '-'}",
        f"bytes={len(entry.body)}",
        f"{millis:.1f}ms",
    ]
    if entry.verified is not None:
        parts.append("verified" if entry.verified else "unverified")
    if entry.duplicate:
        parts.append("duplicate")
    if entry.error:
        parts.append(f"error={entry.error!r}")
    return " ".join(parts)


def run_receiver(args: argparse.Namespace) -> int:
    _validate(args)
    receiver = Receiver(
        secrets=args.secret,
        host=args.host,
        port=args.port,
        script=random_faults(args.fail_rate, args.rate_limit_rate, args.delay, args.retry_after),
        tolerance_seconds=args.tolerance,
        on_request=lambda entry: print(log_line(entry), flush=True),
        # A long-running receiver keeps a bounded log; deduplication remembers every id.
        history=1000,
    )
    try:
        receiver.start()
    except OSError as exc:
        raise RuntimeFailure(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    verifying = f"verifying {len(args.secret)} secret(s)" if args.secret else "not verifying"
    print(f"listening on {receiver.url} ({verifying}); Ctrl-C stops", flush=True)
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        receiver.stop()
    print(
        f"stopped: {receiver.request_count} request(s), {receiver.effects} effect(s), "
        f"max {receiver.max_in_flight} in flight",
        flush=True,
    )
    return 0
