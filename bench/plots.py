"""The report's PNG plots, drawn from the results document (so ``--report`` can redraw them).

Each plot is drawn only when its measurement produced figures; ``draw`` returns the file
names it wrote, which the report links.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

# Agg draws to files only: no display is needed, and none is opened.
import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot  # noqa: E402

from bench import stats  # noqa: E402

Document = dict[str, Any]


def _bars(axis, labels: list[str], entries: list[dict], color: str, label: str | None = None):
    medians = [e["median"] or 0 for e in entries]
    low = [(e["median"] or 0) - (e["min"] or 0) for e in entries]
    high = [(e["max"] or 0) - (e["median"] or 0) for e in entries]
    axis.barh(labels, medians, xerr=[low, high], color=color, capsize=3, label=label)
    for y, value in enumerate(medians):
        axis.text(value, y, f" {value:,.0f}", va="center", fontsize=8)


def deliver(measurement: Document, path: Path) -> None:
    figures = measurement["figures"]
    names = [n for n in figures if figures[n]["per_second"]["median"] is not None]
    figure, axes = pyplot.subplots(1, 2, figsize=(11, 0.55 * len(names) + 1.6), sharey=True)
    _bars(axes[0], names, [figures[n]["per_second"] for n in names], "tab:blue")
    axes[0].set_title("end to end (process wall time)", fontsize=10)
    _bars(axes[1], names, [figures[n]["steady_per_second"] for n in names], "tab:green")
    axes[1].set_title("steady state (receiver's timestamps)", fontsize=10)
    for axis in axes:
        axis.set_xlabel("deliveries / s (median, min-max)")
    axes[0].invert_yaxis()  # the first path on top (the axes share it)
    size = measurement["size"]
    figure.suptitle(
        f"Deliver to an instant receiver: {size['deliveries']:,} deliveries, "
        f"{size['destinations']} destinations"
    )
    _save(figure, path)


def claim(measurement: Document, path: Path) -> None:
    figures = measurement["figures"]
    pages = measurement["size"]["pages"]
    figure, axis = pyplot.subplots(figsize=(8, 4))
    width = 0.27
    for offset, (name, color) in enumerate(
        (("bare", "tab:gray"), ("one", "tab:blue"), ("two", "tab:green"))
    ):
        medians = [figures[f"{name}_{p}"]["per_second"]["median"] or 0 for p in pages]
        xs = [n + (offset - 1) * width for n in range(len(pages))]
        axis.bar(xs, medians, width, label=name, color=color)
    sketch = figures["sketch"]["per_second"]["median"]
    if sketch:
        axis.axhline(
            sketch, color="tab:red", linestyle="--", label="record's sketch (row at a time)"
        )
    axis.set_xticks(range(len(pages)), [f"page {p:,}" for p in pages])
    axis.set_ylabel("rows claimed / s (median)")
    axis.legend(fontsize=8)
    axis.set_title(f"Claim a backlog of {measurement['size']['backlog']:,} due rows")
    _save(figure, path)


def publishers(measurement: Document, path: Path) -> None:
    scenarios = measurement["size"]
    figure, axes = pyplot.subplots(
        len(scenarios), 1, figsize=(9, 3 * len(scenarios)), squeeze=False
    )
    for axis, (name, scenario) in zip(axes[:, 0], scenarios.items(), strict=True):
        for run, series in measurement["series"][name].items():
            if not series:
                continue
            width, rates = series["bin_seconds"], series["per_second"]
            axis.plot(
                [n * width for n in range(len(rates))], rates, drawstyle="steps-post", label=run
            )
        axis.axhline(
            scenario["sum_of_limits_per_second"],
            color="tab:red",
            linestyle="--",
            label=f"sum of limits {scenario['sum_of_limits_per_second']:g}/s",
        )
        axis.set_title(
            f"{name}: {scenario['destinations']} destinations, {scenario['deliveries']:,} "
            f"deliveries, ideal {scenario['ideal_seconds']:g} s",
            loc="left",
            fontsize=10,
        )
        axis.set_ylabel("requests started / s")
        axis.legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the run's first request")
    _save(figure, path)


def fidelity(measurement: Document, path: Path) -> None:
    limits = measurement["limits"]
    series = measurement["series"]
    names = list(limits)
    figure, axes = pyplot.subplots(2, len(names), figsize=(3.2 * len(names), 6), squeeze=False)
    for column, name in enumerate(names):
        rate, burst = limits[name]
        times = sorted(series.get(name, []))
        top, bottom = axes[0, column], axes[1, column]
        counts = stats.per_second(times, 0.0)
        top.bar(range(len(counts)), counts, width=0.9, label="starts")
        top.axhline(rate, color="tab:red", linestyle="--", label=f"limit {rate:g}/s")
        top.set_title(name, fontsize=10)
        top.legend(fontsize=7)
        if times:
            first = times[0]
            top.set_xlabel("s")
            bottom.step(
                [t - first for t in times], range(1, len(times) + 1), where="post", label="starts"
            )
            span = times[-1] - first
            bottom.plot(
                [0, span],
                [burst, burst + rate * span],
                color="tab:red",
                linestyle="--",
                label="burst + rate·t",
            )
        bottom.set_xlabel("s since its first start")
        bottom.legend(fontsize=7)
    axes[0, 0].set_ylabel("starts in each second")
    axes[1, 0].set_ylabel("starts so far")
    figure.suptitle("Rate fidelity at the receiver: two engine runs at once")
    _save(figure, path)


def memory(measurement: Document, path: Path) -> None:
    figures = measurement["figures"]
    backlogs = measurement["size"]["backlogs"]
    figure, axis = pyplot.subplots(figsize=(7, 4))
    for run, color in (("engine", "tab:blue"), ("job", "tab:orange")):
        entries = [figures.get(f"{run}_{b}", {}).get("peak_rss_mib") for b in backlogs]
        if not all(entries):
            continue
        medians = [e["median"] for e in entries]
        low = [e["median"] - e["min"] for e in entries]
        high = [e["max"] - e["median"] for e in entries]
        axis.errorbar(backlogs, medians, yerr=[low, high], marker="o", label=run, color=color)
    axis.set_xscale("log")
    axis.set_xlabel("due deliveries in the backlog")
    axis.set_ylabel("peak RSS of the run's process tree, MiB")
    axis.set_ylim(bottom=0)
    axis.legend()
    axis.set_title("Memory by backlog")
    _save(figure, path)


def latency(measurement: Document, path: Path) -> None:
    figure, axis = pyplot.subplots(figsize=(7, 4))
    for run, values in measurement["series"].items():
        if values:
            ranks = [(n + 1) / len(values) for n in range(len(values))]
            axis.step(values, ranks, where="post", label=run)
    axis.set_xlabel("emit to receiver, s")
    axis.set_ylabel("fraction of deliveries")
    axis.legend()
    axis.set_title("Latency: lag-sensor catch-up runs vs a run started by hand")
    _save(figure, path)


def _save(figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    pyplot.close(figure)


def sustained(measurement: Document, path: Path) -> None:
    from bench import sustained_report

    sustained_report.grid(measurement, path)


PLOTS: dict[str, Callable[[Document, Path], None]] = {
    "deliver": deliver,
    "claim": claim,
    "publishers": publishers,
    "fidelity": fidelity,
    "memory": memory,
    "latency": latency,
    "sustained": sustained,
}


def draw(document: Document, out: Path) -> dict[str, str]:
    """Every plot whose measurement has figures; returns measurement -> file name."""
    drawn = {}
    for name, plot in PLOTS.items():
        measurement = document["measurements"].get(name, {})
        if not measurement.get("figures"):
            continue
        filename = f"{name}.png"
        plot(measurement, out / filename)
        drawn[name] = filename
    return drawn
