"""The package's layers (``media_hooks/__init__.py``): every import goes to the module's own
folder or to a layer below it, and nothing below the Dagster layer imports Dagster."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "media_hooks"

# Bottom to top; folders of one rank stand side by side and do not import each other.
RANKS = {
    "core": 0,
    "sql": 0,
    "store": 1,
    "http": 1,
    "outbox": 2,
    "outbox.maintenance": 3,
    "engine": 4,
    "observe": 4,
    "orchestration": 5,
    "devtools": 6,
    "cli": 7,
}
DAGSTER_FROM = RANKS["orchestration"]


def layer_of(module: str) -> str:
    """The layer of a dotted module name inside the package (``media_hooks.X.Y`` -> ``X``)."""
    parts = module.split(".")[1:]
    if parts[:2] == ["outbox", "maintenance"]:
        return "outbox.maintenance"
    return parts[0] if parts else ""


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of every import in the file, those inside functions too."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "media_hooks":
                # `from media_hooks import core` names a layer.
                found += [(node.lineno, f"media_hooks.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "sql" not in p.relative_to(PACKAGE).parts)


def test_every_folder_of_the_package_has_a_layer():
    folders = {layer_of(module_name(p)) for p in modules() if p.parent != PACKAGE}
    assert folders <= set(RANKS), folders - set(RANKS)


def upward(own: str, imports: list[tuple[int, str]]) -> list[str]:
    """The imports of a module of layer ``own`` that do not go to its own layer or below."""
    return [
        f"line {line}: {target} ({layer_of(target)} is not below {own})"
        for line, target in imports
        if target.startswith("media_hooks.")
        and layer_of(target) != own
        and RANKS[layer_of(target)] >= RANKS[own]
    ]


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_go_downward(path: Path):
    own = layer_of(module_name(path))
    if own == "":
        return  # the package's own __init__: a docstring
    assert not upward(own, imports_of(path))


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_nothing_below_the_dagster_layer_imports_dagster(path: Path):
    own = layer_of(module_name(path))
    if own == "" or RANKS[own] >= DAGSTER_FROM:
        return
    dagster = [
        f"line {line}: {target}"
        for line, target in imports_of(path)
        if target == "dagster" or target.startswith(("dagster.", "dagster_"))
    ]
    assert not dagster, dagster


def test_an_upward_or_sideways_import_is_caught(tmp_path: Path):
    """The check itself: an engine module importing the Dagster layer inside a function, or
    the operator's views, is reported; its own folder and the layers below are not."""
    source = tmp_path / "bad.py"
    source.write_text(
        "from media_hooks.outbox import leases\n"
        "from media_hooks.engine.delivery import DeliveryCounts\n"
        "from media_hooks.observe import figures\n"
        "def f():\n"
        "    from media_hooks.orchestration import jobs\n"
    )
    found = upward("engine", imports_of(source))
    assert [line.split(":")[0] for line in found] == ["line 3", "line 5"]
