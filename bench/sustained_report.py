"""The sustained-load benchmark's targets, plots and summary, from its results document alone.

``python -m bench.sustained --report --out DIR`` redraws them from ``DIR/sustained.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot  # noqa: E402

from bench import stats  # noqa: E402

Document = dict[str, Any]
ISSUE_DELIVERIES = 5_000_000
WAL_BOUND = 2048
HOT_BOUND = 0.8
QUARTER = 5  # windows: a quarter of 20
MET = {True: "met", False: "**not met**", None: "not measured"}
# The table whose row every move of a delivery updates, the HOT target's: delivery_state; in the
# documents of the schema before it (0033 and earlier), which --report still redraws,
# webhook_delivery.
HOT_TABLES = ("delivery_state", "webhook_delivery")


def hot_table(tables: dict[str, Any]) -> str:
    """Which of HOT_TABLES a run measured (``tables``: a window's, or a figure by table)."""
    return next((name for name in HOT_TABLES if name in tables), HOT_TABLES[0])


def _windows(document: Document) -> list[dict[str, Any]]:
    return document.get("windows", [])


def _quotient(top: float | None, bottom: float | None) -> float | None:
    if top is None or not bottom:
        return None
    return round(top / bottom, 3)


def _flatness(windows: list[dict[str, Any]], per_rate: bool = False) -> float | None:
    """The last quarter's peak of the history tables' size over the first quarter's; with
    ``per_rate``, of the size per delivery a second of the window's throughput (what a
    retention window keeps is proportional to the rate: this one does not rise with it)."""
    if len(windows) < 4 * QUARTER or (per_rate and not all(w["per_second"] for w in windows)):
        return None

    def held(w: dict[str, Any]) -> float:
        return w["history_bytes"] / w["per_second"] if per_rate else w["history_bytes"]

    first = max(held(w) for w in windows[:QUARTER])
    last = max(held(w) for w in windows[-QUARTER:])
    return _quotient(last, first)


# What decides how much of the WAL is full-page images (bench/results/sustained-deep-fpi/).
WAL_SETTINGS = ("wal_compression", "data_checksums", "full_page_writes", "max_wal_size",
                "checkpoint_timeout")  # fmt: skip


def targets(document: Document) -> list[dict[str, Any]]:
    """Issue 34's targets, each with the measured value and whether it is met."""
    windows = _windows(document)
    totals = document.get("totals", {})
    complete = document.get("complete", False)
    first = windows[0] if windows else {}
    last = windows[-1] if complete else {}
    delivering = totals.get("delivering_wal_bytes_per_delivery")
    hot = hot_table(totals.get("hot_ratio", {}))
    wal_target = (
        "WAL per delivery to deliver it at most 2 KB (whole run: the server's WAL less the "
        "producer's and retention's own; the engine's, autovacuum's and checkpoints' count)"
        if delivering is not None
        else "WAL per delivery at most 2 KB (whole run, the server's: emit, retention and "
        "vacuum included; this server cannot tell a session's own WAL)"
    )
    found = [
        stats.target(
            wal_target,
            delivering if delivering is not None else totals.get("wal_bytes_per_delivery"),
            WAL_BOUND,
            at_most=True,
        ),
        stats.target(
            f"HOT updates at least 80% of {hot}'s updates (whole run)",
            totals.get("hot_ratio", {}).get(hot),
            HOT_BOUND,
        ),
        stats.target(
            "deliveries/s in the last 5% window at least 0.9x the first",
            _quotient(last.get("per_second"), first.get("per_second")),
            0.9,
        ),
        stats.target(
            "p99 claim latency in the last window at most 1.5x the first",
            _quotient(last.get("claim_p99_ms"), first.get("claim_p99_ms")),
            1.5,
            at_most=True,
        ),
        stats.target(
            "history tables + indexes flat: last quarter's peak at most 1.2x the first quarter's",
            _flatness(windows) if complete else None,
            1.2,
            at_most=True,
        ),
        stats.target(
            "run of at least 5,000,000 deliveries (the issue's report)",
            document.get("deliveries_done"),
            ISSUE_DELIVERIES,
        ),
        stats.target(
            "`media-hooks check --all` holds at the end: invariant violations",
            _violations(document.get("check_at_end")),
            0,
            at_most=True,
        ),
    ]
    for target, bound in zip(
        found, (WAL_BOUND, HOT_BOUND, 0.9, 1.5, 1.2, ISSUE_DELIVERIES, 0), strict=True
    ):
        target["bound"] = bound
    return found


def _violations(check: dict[str, Any] | None) -> int | None:
    """How many rows broke an invariant in the end-of-run check (None: not checked)."""
    return None if check is None else sum(c["violations"] for c in check["checks"])


def _number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _mib(value: int | None) -> str:
    return "—" if value is None else f"{value / 2**20:,.1f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _verdict(target: dict[str, Any]) -> str:
    text = MET[target["met"]]
    if target["value"] is not None and target["bound"]:
        text += f" ({target['value'] / target['bound']:.2f} of the bound)"
    return text


def render(document: Document) -> str:
    """SUMMARY.md: the run, the targets, a table of the windows, the tables at the end, plots."""
    size, windows, totals = document["size"], _windows(document), document.get("totals", {})
    pg, found = document["postgres"], targets(document)
    parts = [
        f"# Sustained load: {size['name']} ({document.get('deliveries_done', 0):,} deliveries)",
        f"`{document.get('command', 'python -m bench --only sustained')}` on "
        f"{document['machine']['cpus']} cores ({document['machine']['cpu_model']}), PostgreSQL "
        f"{pg['version']} ({pg['server']}), started {document['started_at']}, "
        f"{document['seconds']:.0f} s. Load average before "
        f"{document['machine']['load_average']}, after {document['machine'].get('load_average_after')}. "
        "The machine is shared: deliveries/s and latencies are noisy; WAL per delivery, HOT "
        "ratios and sizes are not.",
        f"Autovacuum: found {pg['autovacuum_found']}"
        + (
            ", turned on for the run (ALTER SYSTEM) and back off after it"
            if pg["turned_on_for_the_run"]
            else ""
        )
        + "; its settings: "
        + ", ".join(f"{k} {v}" for k, v in pg["settings"].items() if k.startswith("autovacuum"))
        + ". WAL: "
        + ", ".join(f"{k} {pg['settings'][k]}" for k in WAL_SETTINGS if k in pg["settings"])
        + ".",
        f"Settings: {size['destinations']} destinations ({size['failing']} failing publishers "
        f"answering 500 to {size['fail_percent']}% of requests; max_attempts {size['max_attempts']}, "
        f"backoff {size['backoff_base']}-{size['backoff_cap']} s), {size['in_flight']} in flight "
        f"each, claim pages of {size['page_size']}, engine runs of at most {size['run_rows']:,} "
        f"rows; the producer emits {size['emit_batch']:,} a transaction (COPY) while fewer than "
        f"{size['backlog']:,} are due"
        + (f", at most {size['rate']:,g} a second" if size.get("rate") else "")
        + f"; retention every {size['retention_every']:g} s "
        + (
            f"drops the partitions ({document['partition_seconds']:,} s wide) whose deliveries "
            f"all ended more than {size['retain_seconds']:g} s ago and forgets ids older than "
            if document.get("partition_seconds")
            else f"purges terminal deliveries older than {size['retain_seconds']:g} s and "
            "tombstones older than "
        )
        + f"{size['duplicate_seconds']:g} s (the duplicate window)."
        + (
            f" Before the run, {size['history']:,} delivered deliveries were written as history "
            f"(in {document.get('history_preload_seconds')} s), spread over the "
            f"{0.8 * size['retain_seconds']:g} s before it."
            if size.get("history")
            else ""
        ),
        f"Outcome: {document.get('deliveries_done', 0):,} deliveries done by the last window's "
        f"end; by the time the engine stopped, {document.get('succeeded_by_the_end', 0):,} "
        f"succeeded, {document.get('dead_by_the_end', 0):,} dead, "
        f"{document.get('emitted', 0):,} emitted; "
        + (
            "all 20 windows closed."
            if document.get("complete")
            else "**the run did not finish its 20 windows** (time limit or a role failed)."
        )
        + (f" Role errors: {document['role_errors']}" if document.get("role_errors") else ""),
        "## Targets (issue 34)",
        _table(
            ["target", "measured", ""],
            [[t["target"], _number(t["value"]), _verdict(t)] for t in found],
        ),
        "The existing report's targets (`python -m bench`) are not measured by this run. "
        "The history a retention window keeps follows the rate: per delivery a second of each "
        "window's throughput, the last quarter's peak is "
        f"{_number(_flatness(windows, per_rate=True) if document.get('complete') else None)}x "
        "the first quarter's.",
        "## Whole run",
        _table(
            ["table", "updates per delivery", "HOT ratio", "new version on another page"],
            [
                [
                    f"`{name}`",
                    _number(totals["updates_per_delivery"].get(name)),
                    _number(ratio),
                    _number(totals.get("new_page_ratio", {}).get(name)),
                ]
                for name, ratio in totals.get("hot_ratio", {}).items()
            ],
        ),
        f"WAL: {_number(totals.get('wal_bytes_per_delivery'))} bytes per delivery "
        f"({_mib(totals.get('wal_bytes'))} MiB for {totals.get('deliveries', 0):,} deliveries): "
        f"the producer's own {_number(totals.get('emit_wal_bytes_per_delivery'))}, "
        f"retention's own {_number(totals.get('retention_wal_bytes_per_delivery'))}, the rest "
        "(engine, autovacuum, checkpoints) "
        f"{_number(totals.get('delivering_wal_bytes_per_delivery'))}. Full-page images "
        f"(the first change of a page after a checkpoint): {_number(totals.get('fpi_per_delivery'))}"
        f" per delivery, {_number(_fpi_bytes(windows))} bytes per delivery in the windows "
        "whose WAL could be read.",
        *_wal_breakdown(totals),
        "## Windows (5% of the run each)",
        _table(
            [
                "window",
                "deliveries/s",
                "claim p50/p99 ms",
                "lease p99 ms",
                "record p50/p99 ms",
                "WAL B/delivery (all / delivering / full pages)",
                "HOT delivery",
                "history MiB",
                "dead tuples (delivery)",
                "autovacuum runs",
            ],
            [_window_row(w) for w in windows],
        ),  # fmt: skip
    ]
    if windows:
        end = windows[-1]["tables"]
        parts += [
            "## Tables at the last window's end",
            _table(
                ["table", "total MiB", "heap MiB", "indexes MiB", "live", "dead"],
                [
                    [
                        f"`{n}`",
                        _mib(t["total_bytes"]),
                        _mib(t["heap_bytes"]),
                        _mib(t["index_bytes"]),
                        _number(t["live_tuples"]),
                        _number(t["dead_tuples"]),
                    ]
                    for n, t in end.items()
                ],
            ),  # fmt: skip
        ]
    if document.get("index_bytes_at_end"):
        parts += [
            "Indexes at the end (after the roles stopped):",
            _table(
                ["table", "index", "MiB", "scans"],
                [
                    [
                        f"`{i['table_name']}`",
                        f"`{i['name']}`",
                        _mib(i["bytes"]),
                        _number(i["idx_scan"]),
                    ]
                    for i in document["index_bytes_at_end"]
                ],
            ),
        ]
    parts += [f"![{name}]({file})" for name, file in document.get("plots", {}).items()]
    return "\n\n".join(parts) + "\n"


# The breakdown's tables show this many lines each; the JSON has every one.
BREAKDOWN_LINES = 15


def _wal_breakdown(totals: dict[str, Any]) -> list[str]:
    """The whole run's WAL per delivery by kind of record and by relation, all writers
    together (read with pg_walinspect; by relation on PostgreSQL 16 and later)."""
    parts = []
    for key, what in (
        ("wal_by_kind_per_delivery", "kind of record"),
        (
            "wal_by_relation_per_delivery",
            "relation (records that name none, commits among them, left out)",
        ),
    ):
        found = totals.get(key) or {}
        if found:
            lines = list(found.items())[:BREAKDOWN_LINES]
            parts += [
                f"All of the WAL by {what}, bytes per delivery:",
                _table(["", "B/delivery"], [[f"`{name}`", _number(v)] for name, v in lines]),
            ]
    return parts


def _fpi_bytes(windows: list[dict[str, Any]]) -> float | None:
    """Full-page image bytes per delivery over the windows that measured them."""
    read = [w for w in windows if w.get("fpi_bytes_per_delivery") is not None]
    deliveries = sum(w["deliveries"] for w in read)
    if not deliveries:
        return None
    return sum(w["fpi_bytes_per_delivery"] * w["deliveries"] for w in read) / deliveries


def _window_row(w: dict[str, Any]) -> list[str]:
    delivery = w["tables"].get(hot_table(w["tables"]), {})
    vacuums = sum(t["autovacuum_runs"] for t in w["tables"].values())
    return [
        str(w["window"]),
        _number(w["per_second"]),
        f"{_number(w['claim_p50_ms'])} / {_number(w['claim_p99_ms'])}",
        _number(w["lease_p99_ms"]),
        f"{_number(w['record_p50_ms'])} / {_number(w['record_p99_ms'])}",
        f"{_number(w['wal_bytes_per_delivery'])} / "
        f"{_number(w.get('delivering_wal_bytes_per_delivery'))} / "
        f"{_number(w.get('fpi_bytes_per_delivery'))}",
        _number(delivery.get("hot_ratio")),
        _mib(w["history_bytes"]),
        _number(delivery.get("dead_tuples")),
        str(vacuums),
    ]


# Plots: one figure per metric over the run -----------------------------------------------------


def _x(windows: list[dict[str, Any]]) -> list[float]:
    return [w["deliveries_done"] / 1000 for w in windows]


def _lines(
    windows: list[dict[str, Any]], series: dict[str, Callable[[dict], float | None]], axis
) -> None:
    xs = _x(windows)
    for label, value in series.items():
        ys = [value(w) for w in windows]
        if any(y is not None for y in ys):
            axis.plot(xs, [float("nan") if y is None else y for y in ys], marker="o", label=label)
    axis.set_xlabel("deliveries done (thousands)")
    axis.set_ylim(bottom=0)
    if len(series) > 1:
        axis.legend(fontsize=8)


def _table_series(key: str, scale: float = 1.0) -> Callable[[list[dict]], dict]:
    def series(windows: list[dict[str, Any]]) -> dict[str, Callable[[dict], float | None]]:
        names = windows[0]["tables"] if windows else {}
        return {
            name: (lambda w, n=name: _scaled(w["tables"].get(n, {}).get(key), scale))
            for name in names
            if any(w["tables"].get(name, {}).get(key) for w in windows)
        }

    return series


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def _percentiles(kind: str) -> Callable[[list[dict]], dict]:
    return lambda _: {
        "p50": lambda w: w[f"{kind}_p50_ms"],
        "p99": lambda w: w[f"{kind}_p99_ms"],
    }


# name: (title, y label, the series of a run's windows)
METRICS: dict[str, tuple[str, str, Callable[[list[dict]], dict]]] = {
    "deliveries_per_second": (
        "Deliveries per second", "terminal deliveries / s", lambda _: {"": lambda w: w["per_second"]}
    ),
    "claim_latency": ("Claim (claim_destination_page)", "ms", _percentiles("claim")),
    "lease_latency": ("Lease step (lease_with_permits)", "ms", _percentiles("lease")),
    "record_latency": ("Record (record_classified)", "ms", _percentiles("record")),
    "wal_per_delivery": (
        "WAL per delivery", "bytes",
        lambda _: {
            "all (the server's)": lambda w: w["wal_bytes_per_delivery"],
            "delivering (all less emit and retention)": (
                lambda w: w.get("delivering_wal_bytes_per_delivery")
            ),
            "emit": lambda w: w.get("emit_wal_bytes_per_delivery"),
            "retention": lambda w: w.get("retention_wal_bytes_per_delivery"),
            "full-page images (all writers)": lambda w: w.get("fpi_bytes_per_delivery"),
        },
    ),  # fmt: skip
    "hot_ratio": ("HOT updates / updates, per table", "ratio", _table_series("hot_ratio")),
    "table_sizes": (
        "Table + index size (pg_total_relation_size)", "MiB", _table_series("total_bytes", 2**-20)
    ),
    "index_sizes": ("Index size (pg_indexes_size)", "MiB", _table_series("index_bytes", 2**-20)),
    "dead_tuples": ("Dead tuples (n_dead_tup)", "tuples", _table_series("dead_tuples")),
    "autovacuum_runs": ("Autovacuum runs in the window", "runs", _table_series("autovacuum_runs")),
}  # fmt: skip


def draw(document: Document, out: Path) -> dict[str, str]:
    """One PNG per metric; returns metric -> file name."""
    windows = _windows(document)
    if not windows:
        return {}
    drawn = {}
    for name, (title, label, series) in METRICS.items():
        figure, axis = pyplot.subplots(figsize=(7, 3.6))
        _lines(windows, series(windows), axis)
        axis.set_ylabel(label)
        axis.set_title(title, fontsize=10)
        figure.tight_layout()
        figure.savefig(out / f"sustained_{name}.png", dpi=80)
        pyplot.close(figure)
        drawn[name] = f"sustained_{name}.png"
    return drawn


def grid(measurement: Document, path: Path) -> None:
    """The report's one plot of the section: every metric, one panel each."""
    windows = measurement["windows"]
    figure, axes = pyplot.subplots(4, 3, figsize=(13, 12))
    for axis, (title, label, series) in zip(axes.flat, METRICS.values(), strict=False):
        _lines(windows, series(windows), axis)
        axis.set_title(title, fontsize=9)
        axis.set_ylabel(label, fontsize=8)
    for axis in list(axes.flat)[len(METRICS) :]:
        axis.set_visible(False)
    figure.suptitle("Sustained load, per 5% window")
    figure.tight_layout()
    figure.savefig(path, dpi=70)
    pyplot.close(figure)


# As a section of python -m bench ---------------------------------------------------------------

SUITE_METRICS = {
    "per_second": "deliveries/s",
    "claim_p99_ms": "claim p99, ms",
    "record_p99_ms": "record p99, ms",
    "wal_bytes_per_delivery": "WAL bytes/delivery, all",
    "delivering_wal_bytes_per_delivery": "WAL bytes/delivery, delivering",
    "hot_ratio": "HOT ratio, the delivery's row (delivery_state)",
    "history_mib": "history tables + indexes, MiB",
}


def _suite_value(window: dict[str, Any], metric: str) -> float | None:
    if metric == "hot_ratio":
        return window["tables"].get(hot_table(window["tables"]), {}).get("hot_ratio")
    if metric == "history_mib":
        return round(window["history_bytes"] / 2**20, 2)
    return window.get(metric)


def as_measurement(document: Document) -> Document:
    """The suite's shape (bench.report): one row of figures per window."""
    windows = _windows(document)
    figures = {
        f"window {w['window']:02d}": {
            metric: stats.summary([_suite_value(w, metric)]) for metric in SUITE_METRICS
        }
        for w in windows
    }
    if not document.get("complete"):
        for entry in figures.values():
            entry["errors"] = ["the run did not finish its 20 windows"]
    return {
        "title": document["title"],
        "size": {
            k: document["size"][k]
            for k in (
                "deliveries",
                "destinations",
                "failing",
                "retain_seconds",
                "duplicate_seconds",
            )
        },
        "metrics": SUITE_METRICS,
        "figures": figures,
        "ratios": [],
        "targets": [{k: t[k] for k in ("target", "value", "met")} for t in targets(document)],
        "derived": {
            "wal_bytes_per_delivery_whole_run": document["totals"]["wal_bytes_per_delivery"],
            "hot_ratio_delivery_row_whole_run": document["totals"]["hot_ratio"].get(
                hot_table(document["totals"]["hot_ratio"])
            ),
        },
        "notes": [
            "A delivery counts when it reaches a terminal state; the producer keeps emitting "
            "until the last window closes. WAL, all: the whole server's (emit, delivery, "
            "retention, vacuum); delivering: that less the producer's and retention's own "
            "(PostgreSQL 18 and later). `python -m bench.sustained` writes one plot per metric "
            "and the per-table figures.",
        ],
        "windows": windows,
        "totals": document["totals"],
    }
