"""A PNG chart of request starts per second per destination, each against its limit."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def plot_request_rates(
    starts: Mapping[str, Mapping[int, int]],
    limits: Mapping[str, float],
    path: Path,
    title: str = "request starts per second",
) -> Path:
    """One panel per destination: starts in each whole second (zeros filled) and a dashed line
    at its rate limit. ``starts`` maps destination -> {second since the first start: count}."""
    # Agg draws to files only: no display is needed, and none is opened.
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    names = sorted(starts, key=lambda name: (-limits.get(name, 0), name))
    last_second = max((max(series, default=0) for series in starts.values()), default=0)
    seconds = list(range(last_second + 1))
    figure, axes = pyplot.subplots(
        len(names) or 1, 1, sharex=True, figsize=(9, 2.2 * max(len(names), 1)), squeeze=False
    )
    for axis, name in zip(axes[:, 0], names, strict=False):
        series = starts[name]
        axis.bar(seconds, [series.get(s, 0) for s in seconds], width=0.9, label="starts")
        limit = limits.get(name)
        if limit is not None:
            axis.axhline(limit, linestyle="--", color="tab:red", label=f"limit {limit:g}/s")
        axis.set_ylabel("starts / s")
        axis.set_title(name, loc="left", fontsize=10)
        axis.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since the first request")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path
