"""The ``--json`` report: one JSON object for the whole run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.runner import FAIL, PASS, SKIP, Result, exit_status


def to_document(protocol: str, role: str, target: str, results: Sequence[Result]) -> dict[str, Any]:
    """The run as a JSON-ready dict: what was tested, each case's verdict, the totals."""
    cases = []
    for r in results:
        entry: dict[str, Any] = {
            "id": r.case.id,
            "section": r.case.section,
            "level": r.case.level.value,
            "status": r.status,
            "send": r.case.send,
            "expect": r.case.expect,
            "elapsed": round(r.elapsed, 4),
        }
        if r.status == FAIL:
            entry.update(expected=r.expected, got=r.got, received_hex=r.received.hex())
        elif r.status == SKIP:
            entry["reason"] = r.got
        cases.append(entry)
    return {
        "protocol": protocol,
        "role": role,
        "target": target,
        "cases": cases,
        "summary": {
            "passed": sum(r.status == PASS for r in results),
            "failed": sum(r.status == FAIL for r in results),
            "must_failed": sum(r.must_failed for r in results),
            "skipped": sum(r.status == SKIP for r in results),
        },
        "exit_status": exit_status(results),
    }
