"""The human table: one row per case; under a failure, what was sent, what was expected
and the spec section that asks for it, what came back, and a hex excerpt of the bytes the
target sent before the verdict.  Every line fits :data:`WIDTH` columns."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from ..core.runner import FAIL, PASS, SKIP, Result
from .sections import heading_of

#: bytes of a failure's received data shown (the first ones: replies start at byte 0)
EXCERPT_BYTES = 48
#: the width of every line of the table (long anchors are shortened, details wrapped)
WIDTH = 100
_INDENT = "    "
_LABEL = 11  # "expected:" and the rest, padded to one width


def hex_lines(data: bytes, limit: int = EXCERPT_BYTES) -> list[str]:
    """A hex excerpt of the first ``limit`` bytes, 16 a line, with their offsets."""
    shown = data[:limit]
    lines = [
        f"{start:08x}: " + " ".join(f"{b:02x}" for b in shown[start : start + 16])
        for start in range(0, len(shown), 16)
    ]
    if len(data) > limit:
        lines.append(f"... ({len(data)} bytes in all)")
    return lines


def received_label(data: bytes) -> str:
    """What the hex excerpt under a failure is."""
    return f"bytes received from the target before the verdict ({len(data)}):"


def summary(results: Sequence[Result]) -> str:
    """``N passed, N failed (N MUST), N skipped``."""
    passed = sum(r.status == PASS for r in results)
    failed = sum(r.status == FAIL for r in results)
    must = sum(r.must_failed for r in results)
    skipped = sum(r.status == SKIP for r in results)
    return f"{passed} passed, {failed} failed ({must} MUST), {skipped} skipped"


def rests_on(section: str) -> str:
    """A case's section by the heading it names: ``specs/mip.md, section "Error codes"``; the
    anchor when the spec is not at hand (wirekit installed without its checkout)."""
    title = heading_of(section)
    return f'{section.partition("#")[0]}, section "{title}"' if title else section


def failure_lines(result: Result) -> list[tuple[str, str]]:
    """The labelled details of a failed case: (label, text) pairs."""
    case = result.case
    lines = [("sent", case.send), ("expected", case.expect)]
    if result.expected and result.expected != case.expect:
        lines.append(("waited for", result.expected))
    lines += [("rests on", rests_on(case.section)), ("got", result.got)]
    return lines


def _wrapped(label: str, text: str, width: int = WIDTH) -> list[str]:
    head = f"{_INDENT}{label + ':':<{_LABEL}} "
    return textwrap.wrap(
        text or "-",
        width=width,
        initial_indent=head,
        subsequent_indent=" " * len(head),
        break_long_words=True,
        break_on_hyphens=False,
    )


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 3)] + "..."


def render_table(title: str, results: Sequence[Result], *, details: bool = True) -> str:
    """The report as text: a header line, the table, the details of failures and skips,
    a summary.  A section too long for its column is cut with ``...`` (a failure's
    details give it whole)."""
    header = ("case", "section", "level", "result")
    rows = [
        (r.case.id, r.case.section.removeprefix("specs/"), r.case.level.value, r.status.upper())
        for r in results
    ]
    widths = [max(len(h), *(len(row[k]) for row in rows)) if rows else len(h)
              for k, h in enumerate(header)]  # fmt: skip
    room = WIDTH - (widths[0] + widths[2] + widths[3] + 3 * 2)
    widths[1] = max(len(header[1]), min(widths[1], room))
    lines = [_shorten(line, WIDTH) for line in textwrap.wrap(title, WIDTH)] or [""]
    lines.append("")
    for k, row in enumerate([header, *rows]):
        cells = (row[0], _shorten(row[1], widths[1]), row[2], row[3])
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
        if k == 0 or not details:
            continue
        result = results[k - 1]
        if result.status == FAIL:
            for label, text in failure_lines(result):
                lines.extend(_wrapped(label, text))
            if result.received:
                lines.append(_INDENT + received_label(result.received))
                lines.extend(_INDENT + "  " + line for line in hex_lines(result.received))
        elif result.status == SKIP and result.got:
            lines.extend(_wrapped("skipped", result.got))
    lines += ["", summary(results)]
    return "\n".join(lines) + "\n"
