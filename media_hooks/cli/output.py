"""Printing data: aligned tables for people, one JSON document for programs."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def print_json(document: Any) -> None:
    json.dump(document, sys.stdout, default=_default, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows as aligned text columns under their headers."""
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]
    return "\n".join(lines)


def fields(rows: Sequence[tuple[str, Any]]) -> str:
    """``name  value`` lines, names aligned, for one record; rows whose value is None are left
    out."""
    shown = [(name, str(value)) for name, value in rows if value is not None]
    width = max((len(name) for name, _ in shown), default=0)
    return "\n".join(f"  {name.ljust(width)}  {value}" for name, value in shown)


def format_bytes(count: int) -> str:
    """A size in the unit people read: "640 B", "812.3 kB", "74.2 MB", "1.3 GB"."""
    if count < 1000:
        return f"{count} B"
    value = count / 1000
    for unit in ("kB", "MB"):
        if value < 1000:
            return f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def program() -> str:
    """How to run this program again from here, for the commands we suggest: ``media-hooks``
    when that is what PATH finds, else the path it was started by (``.venv/bin/media-hooks``
    from a virtual environment that is not activated)."""
    started = Path(sys.argv[0])
    if started.name != "media-hooks":
        return "media-hooks"  # python -m media_hooks.cli, or embedded in another program
    found = shutil.which("media-hooks")
    if found and Path(found).resolve() == started.resolve():
        return "media-hooks"
    return shlex.quote(str(started))
