"""A PNG chart of request starts per destination, each against its limit.

A destination's start rate is a leaky bucket (``media_hooks.outbox.rate_limits``): in any window of t
seconds at most ``burst + rate·t`` requests start. So a one-second bar may stand above the rate
by up to the burst (a bucket that drained during a quiet moment), while over time the starts
keep to the rate. The chart shows both sides of that promise: the bars against the rate and
against ``burst + rate·1 s``, and the running total against the envelope ``burst + rate·t``.
A 429's pause is shaded: the gap in a destination's starts there is the publisher's asking.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Limit:
    rate_per_second: float
    burst: int

    def envelope(self, seconds: float) -> float:
        """The most starts any window of ``seconds`` may hold."""
        return self.burst + self.rate_per_second * seconds


EXPLANATION = (
    "At most burst + rate·t requests start in any t seconds: a one-second bar may exceed the "
    "rate by up to the burst after a quiet moment, and the running total stays under "
    "burst + rate·t.\nShaded: a pause a 429's Retry-After asked for (the publisher's, not "
    "the limiter's: nothing starts then)."
)


# A pause a 429 (or a 503 with Retry-After) asked for: seconds since the first start, from the
# answer to the time the destination could start again.
Pause = tuple[float, float]
PAUSE_LABEL = "paused by a 429 (Retry-After)"
PAUSE_GID = "pause"


def _mark_pauses(per_second: Any, running: Any, pauses: Sequence[Pause]) -> None:
    """Shade each pause on both plots of a destination's row; name it once, in the legend. The
    bar of second s stands centred on s for the interval [s, s + 1): there a time t is at
    t - 0.5; the running total is drawn at the time itself."""
    for number, (start, end) in enumerate(pauses):
        end = max(end, start + 0.1)
        label = PAUSE_LABEL if number == 0 else None
        shade = {"color": "tab:orange", "alpha": 0.25, "label": label, "gid": PAUSE_GID}
        per_second.axvspan(start - 0.5, end - 0.5, **shade)
        running.axvspan(start, end, **shade)


def plot_request_rates(
    starts: Mapping[str, Mapping[int, int]],
    limits: Mapping[str, Limit],
    path: Path,
    title: str = "request starts",
    pauses: Mapping[str, Sequence[Pause]] | None = None,
) -> Path:
    """Draws the chart (``draw_request_rates``) into the PNG ``path``."""
    from matplotlib import pyplot

    figure = draw_request_rates(starts, limits, title, pauses)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path


def draw_request_rates(
    starts: Mapping[str, Mapping[int, int]],
    limits: Mapping[str, Limit],
    title: str = "request starts",
    pauses: Mapping[str, Sequence[Pause]] | None = None,
):
    """One row per destination: on the left, starts in each whole second (zeros filled) with
    its rate and ``burst + rate·1 s``; on the right, starts so far with ``burst + rate·t``; on
    both, each pause a 429 asked for, shaded. ``starts`` maps destination -> {second since the
    first start: count}; ``pauses`` destination -> its pauses."""
    # Agg draws to files only: no display is needed, and none is opened.
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    names = sorted(starts, key=lambda name: (-limits[name].rate_per_second, name))
    last_second = max((max(series, default=0) for series in starts.values()), default=0)
    seconds = list(range(last_second + 1))
    # When in its second each start happened is not known: the running total is drawn at each
    # second's end, where it is exact.
    ends = [s + 1 for s in seconds]
    rows = max(len(names), 1)
    figure, axes = pyplot.subplots(
        rows, 2, sharex=True, figsize=(13, 2.4 * rows + 0.6), squeeze=False
    )
    for (per_second, running), name in zip(axes, names, strict=False):
        limit = limits[name]
        counts = [starts[name].get(s, 0) for s in seconds]
        per_second.bar(seconds, counts, width=0.9, label="starts in the second")
        per_second.axhline(
            limit.rate_per_second,
            linestyle="--",
            color="tab:red",
            label=f"rate {limit.rate_per_second:g}/s",
        )
        per_second.axhline(
            limit.envelope(1),
            linestyle=":",
            color="tab:purple",
            label=f"burst + rate·1 s = {limit.envelope(1):g}",
        )
        per_second.set_ylim(0, limit.envelope(1) * 1.25)
        per_second.set_ylabel("starts / s")
        per_second.set_title(name, loc="left", fontsize=10)

        running.plot(
            [0, *ends], [0, *accumulate(counts)], marker=".", markersize=4, label="starts so far"
        )
        running.plot(
            [0, ends[-1]],
            [limit.envelope(0), limit.envelope(ends[-1])],
            linestyle=":",
            color="tab:purple",
            label=f"burst + rate·t = {limit.burst} + {limit.rate_per_second:g}·t",
        )
        running.set_ylabel("starts")
        _mark_pauses(per_second, running, (pauses or {}).get(name, ()))
        per_second.legend(loc="upper right", fontsize=8)
        running.legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since the first request")
    axes[-1, 1].set_xlabel("seconds since the first request (t)")
    figure.suptitle(title)
    figure.text(0.5, 0.005, EXPLANATION, ha="center", va="bottom", fontsize=8.5)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    return figure
