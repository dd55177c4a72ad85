"""The documentation: a short README with the rest in ``docs/``, every relative link going to a
file of the repository, nothing pointing outside it, and the quick start's two commands as CI
runs them."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 200

# The quick start's commands, exactly: a new reader copies them, and CI runs the second.
DEMO_COMMAND = "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/media-hooks demo"
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/pytest"

# [text](target) and ![alt](target), the target up to a space or the closing parenthesis.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
# Names of files outside the repository that nothing in it may send a reader to. Spelt in
# pieces so that this file does not name them itself.
_OUTSIDE = ("CONTRACT" + ".md", "DESIGN" + ".md", "../" + "shared")


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def prose(text: str) -> str:
    """Markdown without its code: links inside code blocks and spans are examples, not links."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    return _LINK.findall(prose(text))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_link(source: Path, target: str) -> str | None:
    """Why a relative link from ``source`` does not resolve inside the repository, or None."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
        return None  # an absolute URL (https:, mailto:): not a file of ours
    path_part, _, anchor = target.partition("#")
    resolved = (source.parent / path_part).resolve() if path_part else source
    if not resolved.is_relative_to(ROOT):
        return "points outside the repository"
    if not resolved.exists():
        return "no such file"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"no heading #{anchor} in {resolved.relative_to(ROOT)}"
    return None


def test_the_readme_is_under_200_lines():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines; keep it under {README_MAX_LINES} and move the rest to docs/"
    )


def test_the_link_checker_sees_a_broken_link_and_an_escape(tmp_path):
    page = ROOT / "docs" / "README.md"
    assert broken_link(page, "architecture.md#the-invariants") is None
    assert broken_link(page, "architecture.md#no-such-heading") is not None
    assert broken_link(page, "no-such-page.md") == "no such file"
    assert broken_link(page, "../../elsewhere/notes.md") == "points outside the repository"
    assert links("[a](x.md) `[b](y.md)` ![c](z.png)") == ["x.md", "z.png"]


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path):
    broken = [
        f"{target}: {why}"
        for target in links(page.read_text(encoding="utf-8"))
        if (why := broken_link(page, target))
    ]
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def released_migrations() -> set[Path]:
    """Released migrations are history and never edited: what they say stays as it was."""
    folder = ROOT / "sql" / "migrations"
    manifest = tomllib.loads((folder / "manifest.toml").read_text(encoding="utf-8"))
    return {folder / name for name in manifest["migrations"]}


def tracked_text_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    history = released_migrations()
    files = []
    for name in filter(None, listed.decode().split("\0")):
        path = ROOT / name
        if path.is_file() and path not in history and b"\0" not in path.read_bytes()[:8192]:
            files.append(path)
    return files


def test_no_tracked_file_points_outside_the_repository():
    mentions = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in tracked_text_files()
        for name in _OUTSIDE
        if name in path.read_text(encoding="utf-8", errors="replace")
    ]
    assert not mentions, f"{len(mentions)} mention(s): " + "; ".join(mentions[:20])


def test_the_quick_start_commands_are_the_ones_ci_runs():
    text = README.read_text(encoding="utf-8")
    blocks = [block.strip() for block in re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S)]
    assert DEMO_COMMAND in blocks
    assert TEST_COMMAND in blocks
