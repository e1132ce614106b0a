"""Spec sections as cases cite them: ``specs/FILE.md#anchor``, the anchor GitHub gives the
heading (lower case, punctuation dropped, spaces to hyphens, ``-1``, ``-2`` ... for a repeated
one).  The reports name a failed case's section by its heading; a test checks that every
case's section resolves to a heading of ``specs/*.md``."""

from __future__ import annotations

import functools
import re
from pathlib import Path

#: the checkout's root: ``specs/`` sits beside the ``wirekit`` package (absent when
#: wirekit is installed from a wheel: the reports then show the anchor alone)
ROOT = Path(__file__).resolve().parents[3]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_DROP = re.compile(r"[^\w\- ]")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a markdown heading (before de-duplication): its text lower
    cased, markup characters and punctuation dropped (letters, digits, ``_``, ``-`` and
    spaces stay), each space a hyphen."""
    text = heading.strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    return _DROP.sub("", text).replace(" ", "-")


def headings(markdown: str) -> dict[str, str]:
    """Anchor -> heading text of every ATX heading outside code fences, in order, with
    GitHub's ``-1``, ``-2`` suffixes on repeated anchors."""
    found: dict[str, str] = {}
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match is None:
            continue
        title = match.group(2)
        anchor = github_anchor(title)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found[f"{anchor}-{count}" if count else anchor] = title.replace("`", "")
    return found


@functools.lru_cache(maxsize=32)
def _file_headings(path: Path) -> dict[str, str] | None:
    try:
        return headings(path.read_text(encoding="utf-8"))
    except OSError:
        return None


def heading_of(section: str, root: Path = ROOT) -> str | None:
    """The heading ``section`` (``specs/mip.md#error-codes``) names, or None when the file
    or the anchor is not there (or ``section`` has no anchor)."""
    path, _, anchor = section.partition("#")
    if not anchor:
        return None
    found = _file_headings(root / path)
    return None if found is None else found.get(anchor)
