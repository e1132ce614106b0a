"""The fenced code blocks of README.md, docs/*.md and specs/*.md, and the markers that say how
each runs.

One finder for tests/test_docs.py (the ```` ```python ```` blocks) and
tests/test_readme_shell.py (the ```` ```sh ````, ```` ```bash ```` and ```` ```console ````
blocks).  A block is a fence line ```` ```LANG ```` up to the next ```` ``` ````; fences of
other languages (``json``, ``toml``, plain) are data, not code, and are left alone.

A marker is an HTML comment (invisible on GitHub) on the line just before a fence:

- ``<!-- not run: REASON -->`` -- a block that cannot run here; the tests skip it with its
  reason and pin how many there are, so a new one is a deliberate choice.
- ``<!-- run: HOW -->`` -- a shell block's prepared environment (tests/test_readme_shell.py
  says what HOW may say).  Only shell blocks take it: a Python block always runs as it is.

A marker anywhere else (not right before a code fence) is an error, so a marker cannot drift
away from its block unnoticed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the pages of the documentation site that hold code: the README, docs/'s own pages (not its
#: symlinks: docs/SECURITY.md and docs/specs/ are the files beside them) and the specs
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if not p.is_symlink()),
    *sorted((ROOT / "specs").glob("*.md")),
]

PYTHON = frozenset({"python"})
SHELL = frozenset({"sh", "bash", "console"})

_MARKER = re.compile(r"^<!--\s*(?P<kind>not run|run):\s*(?P<text>.+?)\s*-->$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its code and its marker."""

    path: Path
    line: int  # 1-based line of the first code line
    lang: str
    code: str
    not_run: str | None  # the reason, when marked ``not run``
    run: str | None = None  # the HOW of a ``run:`` marker

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def is_doctest(self) -> bool:
        return any(line.lstrip().startswith(">>>") for line in self.code.splitlines())


def code_blocks(path: Path, languages: frozenset[str]) -> list[Block]:
    """The blocks of ``path`` in ``languages``, in order, with their markers (checked)."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    k = 0
    while k < len(lines):
        stripped = lines[k].strip()
        marker = _MARKER.match(stripped)
        if marker:
            fence = lines[k + 1].strip() if k + 1 < len(lines) else ""
            lang = fence[3:] if fence.startswith("```") else ""
            if lang not in PYTHON | SHELL:
                raise AssertionError(
                    f"{path.name}:{k + 1}: a {marker.group('kind')} marker not just before a "
                    "```python or shell fence"
                )
            if marker.group("kind") == "run" and lang not in SHELL:
                raise AssertionError(f"{path.name}:{k + 1}: a run: marker before a {lang} block")
        elif stripped.startswith("```") and stripped != "```":
            lang = stripped[3:]
            start = k + 1
            end = start
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            if end == len(lines):
                raise AssertionError(f"{path.name}:{k + 1}: ```{lang} block never closed")
            if lang in languages:
                before = _MARKER.match(lines[k - 1].strip()) if k else None
                kind, text = (before.group("kind"), before.group("text")) if before else ("", "")
                blocks.append(
                    Block(
                        path,
                        start + 1,
                        lang,
                        "\n".join(lines[start:end]) + "\n",
                        text if kind == "not run" else None,
                        text if kind == "run" else None,
                    )
                )
            k = end
        elif stripped == "```":  # a plain fence: skip its body (it may hold anything)
            end = k + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            k = end
        k += 1
    return blocks


def find_block(path: Path, line: int, languages: frozenset[str]) -> Block:
    """The block of ``path`` whose first code line is ``line``."""
    return next(b for b in code_blocks(path, languages) if b.line == line)
