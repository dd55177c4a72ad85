"""The arithmetic of the report: medians with their range, ratios, steady state, envelopes.

Every function takes plain numbers or receiver timestamps, so each rule of the report (what
"steady state" is, how a rate or an envelope is checked) is written once, here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Steady state: the middle of a run by the receiver's timestamps, without its first and last
# tenth (start-up, the first burst of a token bucket, the tail of the last destinations).
STEADY_TRIM = 0.1


def summary(values: Sequence[float | None], digits: int = 3) -> dict[str, Any]:
    """Median, min and max of the runs that produced a figure (None: the run gave none)."""
    kept = [v for v in values if v is not None]
    if not kept:
        return {"median": None, "min": None, "max": None, "n": 0, "runs": list(values)}
    return {
        "median": _round(statistics.median(kept), digits),
        "min": _round(min(kept), digits),
        "max": _round(max(kept), digits),
        "n": len(kept),
        "runs": [_round(v, digits) if v is not None else None for v in values],
    }


def _round(value: float, digits: int) -> float:
    """``digits`` significant digits: rows/s and fractions alike stay readable."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, max(0, digits - 1 - math.floor(math.log10(abs(value)))))


def ratio(numerator: Mapping[str, Any], denominator: Mapping[str, Any]) -> float | None:
    """The ratio of two summaries' medians (None when either has none)."""
    top, bottom = numerator.get("median"), denominator.get("median")
    if top is None or not bottom:
        return None
    return _round(top / bottom, 3)


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile (``fraction`` 0.5 for p50, 0.99 for p99)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def steady_window(times: Sequence[float], trim: float = STEADY_TRIM) -> tuple[float, float]:
    """The middle of the span of ``times``: without its first and last ``trim`` of the time."""
    first, last = min(times), max(times)
    span = last - first
    return first + trim * span, last - trim * span


def steady_rate(times: Sequence[float], trim: float = STEADY_TRIM) -> float | None:
    """Starts per second over the middle of the span of ``times``.

    Counted as (starts in the window - 1) / (last - first start in it): evenly paced starts at
    r/s give exactly r, whatever the window's edges cut.
    """
    if len(times) < 3:
        return None
    low, high = steady_window(times, trim)
    inside = [t for t in times if low <= t <= high]
    if len(inside) < 2 or inside[-1] <= inside[0]:
        return None
    return (len(inside) - 1) / (inside[-1] - inside[0])


def rate_over(times: Iterable[float], low: float, high: float) -> float | None:
    """Starts per second counted in the window [low, high] (all destinations together)."""
    if high <= low:
        return None
    return sum(1 for t in times if low <= t <= high) / (high - low)


def envelope_excess(times: Sequence[float], rate: float, burst: float) -> tuple[float, float]:
    """The largest excess of starts over ``burst + rate * t`` in any window, and its length.

    A limiter that keeps its promise gives an excess of at most 0: in every window [a, b] the
    starts number at most ``burst + rate * (b - a)``. The worst window has a start at each end,
    so it is max over i <= j of (j - i + 1) - burst - rate * (t_j - t_i), found in one pass.
    """
    best_excess, best_length = -math.inf, 0.0
    best_start_value, best_start_time = -math.inf, 0.0
    for j, t in enumerate(sorted(times)):
        # -i + rate * t_i, the best left end so far (i <= j)
        value = -j + rate * t
        if value > best_start_value:
            best_start_value, best_start_time = value, t
        excess = (j + 1) - rate * t + best_start_value - burst
        if excess > best_excess:
            best_excess, best_length = excess, t - best_start_time
    return best_excess, best_length


def per_second(times: Sequence[float], origin: float, width: float = 1.0) -> list[float]:
    """Starts per second in each bin of ``width`` seconds since ``origin`` (zeros filled)."""
    if not times:
        return []
    counts = [0] * (int((max(times) - origin) / width) + 1)
    for t in times:
        counts[int((t - origin) / width)] += 1
    return [count / width for count in counts]


def plot_bin(times: Sequence[float]) -> float:
    """A bin width for a rate over time: a second, or less for a short run (30 bins at least)."""
    if len(times) < 2:
        return 1.0
    return min(1.0, max(0.05, (max(times) - min(times)) / 30))


def target(
    text: str,
    value: float | None,
    bound: float,
    *,
    at_most: bool = False,
    depends: Iterable[Mapping[str, Any] | None] = (),
) -> dict:
    """One target of the report: its words, the measured value, and whether it is met. It is
    not measured (``met`` None) without a value, or when a run of a path it ``depends`` on
    (their figures) did not complete: a run cut short proves nothing either way."""
    errors = [e for entry in depends if entry for e in entry.get("errors", [])]
    missing = value is None or any(entry is None for entry in depends)
    met = None if missing or errors else (value <= bound if at_most else value >= bound)
    found = {"target": text, "value": value, "met": met}
    if errors:
        found["why_not_measured"] = errors[0]
    return found


def summarize(runs: Mapping[str, Sequence[Mapping[str, Any]]], metrics: Sequence[str]) -> dict:
    """Per path, the summary of each metric over its runs, and the errors of runs that had one."""
    figures: dict[str, dict[str, Any]] = {}
    for path, results in runs.items():
        entry: dict[str, Any] = {m: summary([r.get(m) for r in results]) for m in metrics}
        errors = [r["error"] for r in results if r.get("error")]
        if errors:
            entry["errors"] = errors
        figures[path] = entry
    return figures


def ratios(
    figures: Mapping[str, Mapping[str, Any]], pairs: Iterable[tuple[str, str]], metric: str
) -> list[dict[str, Any]]:
    """``of / to`` of the medians of ``metric``, for each pair whose paths both ran."""
    return [
        {
            "of": of,
            "to": to,
            "metric": metric,
            "value": ratio(figures[of][metric], figures[to][metric]),
        }
        for of, to in pairs
        if of in figures and to in figures
    ]
