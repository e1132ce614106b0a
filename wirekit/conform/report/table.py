"""The human table: one row per case; under a failure, expected vs got and a hex excerpt
of what the target sent."""

from __future__ import annotations

from collections.abc import Sequence

from ..core.runner import FAIL, PASS, SKIP, Result

#: bytes of a failure's received data shown (the first ones: replies start at byte 0)
EXCERPT_BYTES = 48


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


def summary(results: Sequence[Result]) -> str:
    """``N passed, N failed (N MUST), N skipped``."""
    passed = sum(r.status == PASS for r in results)
    failed = sum(r.status == FAIL for r in results)
    must = sum(r.must_failed for r in results)
    skipped = sum(r.status == SKIP for r in results)
    return f"{passed} passed, {failed} failed ({must} MUST), {skipped} skipped"


def render_table(title: str, results: Sequence[Result], *, details: bool = True) -> str:
    """The report as text: a header line, the table, the details of failures, a summary."""
    header = ("case", "section", "level", "result")
    rows = [
        (r.case.id, r.case.section.removeprefix("specs/"), r.case.level.value, r.status.upper())
        for r in results
    ]
    widths = [max(len(h), *(len(row[k]) for row in rows)) if rows else len(h)
              for k, h in enumerate(header)]  # fmt: skip
    lines = [title, ""]
    for k, row in enumerate([header, *rows]):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if k == 0 or not details:
            continue
        result = results[k - 1]
        if result.status == FAIL:
            lines.append(f"    expected: {result.expected}")
            lines.append(f"    got:      {result.got}")
            if result.received:
                lines.append(f"    received ({len(result.received)} bytes):")
                lines.extend("      " + line for line in hex_lines(result.received))
        elif result.status == SKIP and result.got:
            lines.append(f"    skipped: {result.got}")
    lines += ["", summary(results)]
    return "\n".join(lines) + "\n"
