"""The Markdown report, rendered from the results document alone (``latest.json``).

One section per measurement: its size, a table of every path's figures (median, min-max and
the number of runs), the ratios measured in the same session, its notes and its plot. Before
them: the machine, and every target with its measured value. After them: the headline ratios
and one plot, as text for docs/performance.md.
"""

from __future__ import annotations

from typing import Any

Document = dict[str, Any]

SECTIONS = {
    "emit": "1. Emit",
    "claim": "2. Claim",
    "deliver": "3. Deliver, instant receiver",
    "fixed_cost": "3b. The job's fixed cost",
    "publishers": "4. Many slow publishers",
    "fidelity": "5. Rate fidelity",
    "memory": "6. Memory",
    "latency": "7. Latency",
    "sustained": "8. Sustained load",
    "celery": "9. Celery workers",
    "node": "10. The Node.js worker",
}
MET = {True: "met", False: "**not met**", None: "not measured"}


def number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def cell(summary: dict[str, Any]) -> str:
    if not summary or summary.get("median") is None:
        return "—"
    text = number(summary["median"])
    if summary["n"] > 1:
        text += f" ({number(summary['min'])}–{number(summary['max'])})"
    return f"{text}, n={summary['n']}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _size(size: dict[str, Any]) -> str:
    parts = []
    for key, value in size.items():
        words = key.replace("_", " ")
        if isinstance(value, dict):  # a scenario, or a figure per path
            parts.append(f"{key}: " + _size(value).replace("; ", ", "))
        elif isinstance(value, list):
            parts.append(f"{words} " + "/".join(number(v) for v in value))
        else:
            parts.append(f"{words} {number(value)}")
    return "; ".join(parts)


def measurement_section(name: str, measurement: Document, plots: dict[str, str]) -> str:
    heading = f"## {SECTIONS.get(name, name)}"
    if "skipped" in measurement:
        return f"{heading}\n\nSkipped: {measurement['skipped']}.\n"
    if "error" in measurement:
        return f"{heading}\n\nFailed: `{measurement['error']}`.\n"
    parts = [f"{heading}: {measurement['title'].split(': ', 1)[-1]}"]
    parts.append(
        f"Size: {_size(measurement['size'])}. Measured in {measurement['measured_seconds']} s."
    )
    metrics = measurement["metrics"]
    rows = [
        [f"`{path}`", *(cell(entry.get(metric, {})) for metric in metrics)]
        for path, entry in measurement["figures"].items()
    ]
    if rows:
        parts.append(table(["path", *metrics.values()], rows))
    else:
        parts.append("No figures at this size.")
    for path, reason in measurement.get("not_measured", {}).items():
        parts.append(f"- `{path}` not measured: {reason}.")
    errors = [
        f"- `{path}`: {error}"
        for path, entry in measurement["figures"].items()
        for error in entry.get("errors", [])
    ]
    if errors:
        parts.append("Runs that did not complete:\n\n" + "\n".join(errors))
    if measurement.get("ratios"):
        parts.append(
            table(
                ["ratio, same session", "metric", "value"],
                [
                    [f"`{r['of']}` / `{r['to']}`", r["metric"], number(r["value"])]
                    for r in measurement["ratios"]
                ],
            )
        )
    for key, value in measurement.get("derived", {}).items():
        parts.append(f"{key.replace('_', ' ')}: {number(value)}")
    if measurement.get("notes"):
        parts.append("\n".join(f"- {note}" for note in measurement["notes"]))
    if name in plots:
        parts.append(f"![{name}]({plots[name]})")
    return "\n\n".join(parts) + "\n"


def targets_section(document: Document) -> str:
    rows = []
    measurements = document["measurements"]
    for name in (name for name in SECTIONS if name in measurements):
        for target in measurements[name].get("targets", []):
            verdict = MET[target["met"]]
            if "why_not_measured" in target:
                verdict += f": {target['why_not_measured']}"
            rows.append([target["target"], number(target["value"]), verdict, SECTIONS[name]])
    if not rows:
        return "## Targets\n\nNo target was measured in this session.\n"
    met = sum(1 for row in rows if row[2] == MET[True])
    return (
        f"## Targets\n\n{met} of {len(rows)} met.\n\n"
        + table(["target", "measured", "", "section"], rows)
        + "\n"
    )


def _grouping(machine: dict[str, Any]) -> str:
    """Where the measured processes ran, as the scheduler sees it (bench/processes.py); a
    report from before the choice existed ran them in sessions of their own."""
    where = (
        "each in a session of its own (`--own-sessions`)"
        if machine.get("own_sessions", True)
        else "each a process group in the benchmark's session"
    )
    autogroup = {True: "on", False: "off"}.get(machine.get("autogroup"), "unknown")
    return f"{where}; the kernel's autogroup scheduling: {autogroup}"


def machine_section(document: Document) -> str:
    machine, pg, git = document["machine"], document["postgres"], document["git"]
    rows = [
        [
            "CPU",
            f"{machine['cpu_model']}, {machine['cpus']} cores ({machine['cpus_usable']} usable)",
        ],
        ["memory", f"{machine['memory_gib']} GiB"],
        ["Python", machine["python"]],
        ["platform", machine["platform"]],
        ["PostgreSQL", f"{pg['version']}, {pg['server']}"],
        ["measured processes", _grouping(machine)],
        [
            "load average (1, 5, 15 min)",
            f"before {machine['load_average_before']}, after {machine['load_average_after']}",
        ],
        ["commit", f"{git['commit']}{' (with uncommitted changes)' if git['dirty'] else ''}"],
        ["command", f"`{document['command']}`"],
        ["started", f"{document['started_at']}, {document['seconds']:.0f} s in all"],
    ]
    return "## The machine\n\n" + table(["", ""], rows) + "\n"


def _headline(document: Document) -> list[str]:
    """The headline lines: one per measurement that has its key ratio."""
    measurements = document["measurements"]
    lines = []

    def ratio(name: str, of: str, to: str, metric: str) -> Any:
        for r in measurements.get(name, {}).get("ratios", []):
            if (r["of"], r["to"], r["metric"]) == (of, to, metric):
                return r["value"]
        return None

    def median(name: str, path: str, metric: str) -> Any:
        entry = measurements.get(name, {}).get("figures", {}).get(path, {})
        return entry.get(metric, {}).get("median")

    def cut(name: str, *paths: str) -> str:
        figures = measurements.get(name, {}).get("figures", {})
        if any(figures.get(path, {}).get("errors") for path in paths):
            return " (a run was cut short: see the report)"
        return ""

    if (value := ratio("emit", "emit_many", "bare_copy", "per_second")) is not None:
        lines.append(
            f"Bulk emit records {number(median('emit', 'emit_many', 'per_second'))} rows/s, "
            f"{number(value)}x a bare COPY of the same rows."
        )
    if (value := ratio("claim", "one_1000", "sketch", "per_second")) is not None:
        lines.append(
            f"The set-based claim takes {number(median('claim', 'one_1000', 'per_second'))} "
            f"rows/s (page 1,000), {number(value)}x the design record's row-at-a-time sketch "
            f"and {number(ratio('claim', 'one_1000', 'bare_1000', 'per_second'))}x its own bare "
            "statement."
        )
    for path in ("engine", "job"):
        value = ratio("deliver", path, "procrastinate", "per_second")
        if value is not None:
            lines.append(
                f"Against an instant receiver the {path} delivers "
                f"{number(median('deliver', path, 'per_second'))}/s end to end: {number(value)}x "
                f"Procrastinate, {number(ratio('deliver', path, 'rejected_design', 'per_second'))}x "
                "the record's rejected single loop, "
                f"{number(ratio('deliver', path, 'bare_requests', 'per_second'))}x a bare "
                f"requests loop{cut('deliver', path, 'procrastinate')}."
            )
    for path in ("engine", "job"):
        entries = {
            name: entry
            for name, entry in measurements.get("publishers", {}).get("figures", {}).items()
            if name.startswith(f"{path}_")
        }
        if entries:
            lines.append(
                f"On slow, rate-limited publishers the {path} reaches "
                + " and ".join(
                    f"{number(e['fraction_of_limits']['median'])} ({n.split('_', 1)[1]})"
                    for n, e in entries.items()
                )
                + f" of the sum of their limits in steady state{cut('publishers', *entries)}."
            )
    fidelity = measurements.get("fidelity", {}).get("targets", [])
    if fidelity:
        held = all(t["met"] for t in fidelity)
        lines.append(
            "Two runs at once keep every destination's limit at the receiver (within 3% below "
            "it, never above burst + rate·t): "
            + ("yes." if held else "not every target held; see the report.")
        )
    memory = measurements.get("memory", {})
    for r in memory.get("ratios", []):
        backlogs = memory["size"]["backlogs"]
        lines.append(
            f"Peak memory of the {r['of'].split('_')[0]}'s run over {backlogs[-1]:,} due "
            f"deliveries is {number(r['value'])}x its peak over {backlogs[0]:,}"
            f"{cut('memory', r['of'], r['to'])}."
        )
    for path in ("sensor", "by_hand"):
        p50 = median("latency", path, "p50_seconds")
        if p50 is not None:
            lines.append(
                f"Emit to receiver ({path.replace('_', ' ')}): p50 {number(p50)} s, p99 "
                f"{number(median('latency', path, 'p99_seconds'))} s."
            )
    return lines


def performance_section(document: Document) -> str:
    """The headline ratios and one plot, as text for docs/performance.md."""
    lines = [
        "## Performance",
        "",
        f"Measured by `python -m bench` on {document['machine']['cpus']} cores "
        f"({document['machine']['cpu_model']}), PostgreSQL {document['postgres']['version']}, "
        f"at the {document['size']} size; every ratio is of two figures measured in the same "
        f"session, each the median of up to {document['rounds']} interleaved runs. The full "
        "report, with the machine, every figure's range and run count, and the targets: "
        "`bench/results/REPORT.md`.",
        "",
    ]
    lines += [f"- {line}" for line in _headline(document)]
    if "deliver" in document.get("plots", {}):
        lines += ["", f"![deliveries per second](bench/results/{document['plots']['deliver']})"]
    lines += [
        "",
        "Run it from the repository root: `python -m bench` (under 20 minutes), `--quick` "
        "(under 2), `--smoke` (CI's, under a minute on a quiet machine); "
        "`pip install -e '.[dev,bench]'` first, for the peers.",
    ]
    return "\n".join(lines) + "\n"


def render(document: Document) -> str:
    size = document["size"]
    head = [
        "# media_hooks benchmark report",
        "",
        f"Size: **{size}**. "
        + (
            "Full size: issue 13's own scenarios."
            if size == "full"
            else "Scaled down from issue 13's scenarios (each section gives its size): the "
            "figures are provisional."
        )
        + " The machine is shared and has 2 cores: compare ratios measured in the same "
        "session, not figures across sessions.",
        "",
        "",
    ]
    plots = document.get("plots", {})
    body = [machine_section(document), targets_section(document)]
    measurements = document["measurements"]
    body += [
        measurement_section(name, measurements[name], plots)
        for name in SECTIONS
        if name in measurements
    ]
    body.append(
        "## For docs/performance.md\n\nThe text below is generated for docs/performance.md's "
        '"The current report":\n\n'
        + "\n".join(
            "> " + line if line else ">" for line in performance_section(document).splitlines()
        )
    )
    return "\n".join(head) + "\n".join(body) + "\n"
