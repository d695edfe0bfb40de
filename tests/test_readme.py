"""The README is the page people land on: its first lines are the two commands a fresh
machine needs (CI runs exactly its test command), it stays short, and every relative link
in it and in docs/ leads to a file (and heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.paths import REPO

README = REPO / "README.md"
FIRST_LINES = [
    "# SCO — the Spot Capacity Orchestrator",
    "",
    "```sh",
    "make up     # fresh machine: venv + install, the region in a box, r1's worker, "
    "demand -> acquisitions",
    "make test   # the whole suite: its tools, ruff, mypy (strict), the test cloud, "
    "every test on real services",
    "```",
]
MAX_LINES = 200

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def markdown_files() -> list[Path]:
    files = [README, *sorted((REPO / "docs").rglob("*.md"))]
    assert len(files) > 1, "no Markdown under docs/: the link check would pass vacuously"
    return files


def prose(text: str) -> str:
    """The text with fenced blocks and code spans blanked: links there are examples."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes, a
    repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    found = set()
    for _, title in HEADING.findall(FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken_links(path: Path) -> list[str]:
    text = path.read_text()
    broken = []
    for target in LINK.findall(prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{path.relative_to(REPO)}: {target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text()):
            broken.append(f"{path.relative_to(REPO)}: {target}: no such heading")
    return broken


def test_readme_starts_with_the_two_commands() -> None:
    assert README.read_text().splitlines()[: len(FIRST_LINES)] == FIRST_LINES


def test_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_the_link_check_catches_a_broken_link(tmp_path: Path) -> None:
    page = REPO / "docs" / "probe-not-committed.md"
    text = "# Probe\n\n[gone](nowhere.md), [bad heading](../README.md#no-such-heading), "
    text += "[fine](#probe), `[in code](missing.md)`\n"
    try:
        page.write_text(text)
        assert broken_links(page) == [
            "docs/probe-not-committed.md: nowhere.md: no such file",
            "docs/probe-not-committed.md: ../README.md#no-such-heading: no such heading",
        ]
    finally:
        page.unlink()


def test_generated_tables_live_in_docs_and_make_points_there() -> None:
    """`make bench` and `make estate-readme` rewrite the sections between their markers;
    the sections are in docs/evidence.md, and the README keeps none."""
    evidence = (REPO / "docs" / "evidence.md").read_text()
    for name in ("bench", "estate"):
        assert f"<!-- {name}:begin -->" in evidence and f"<!-- {name}:end -->" in evidence
        assert f"<!-- {name}:begin -->" not in README.read_text()
    makefile = (REPO / "Makefile").read_text()
    assert "bench/run_all.py --readme docs/evidence.md" in makefile
    assert "--out docs/estate --readme docs/evidence.md" in makefile
    # The image paths the estate command writes (relative to the rewritten file) resolve.
    assert "![eval_synthetic](estate/eval_synthetic.png)" in evidence
    assert "![eval_dc-azure](estate/eval_dc-azure.png)" in evidence
