"""The controller's decisions (issue 16): a table of their own in the requests store, rarely
written -- each in its own short transaction, off the event loop."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .storedb import DECISION_COLUMNS, StoreDB


def store_decision(
    decision: dict[str, Any],
    *,
    open_db: Callable[[], StoreDB],
    leader: Any = None,
) -> None:
    """Store one decision (``decision``: its :data:`~.storedb.DECISION_COLUMNS` by name,
    the metrics as a dict).  With a ``leader`` lock it goes on the lock's session (raising
    :class:`~wirekit.serve.record.pgsync.NotLeader`, storing nothing, without the lead);
    else on a connection of its own (``open_db()``)."""
    values = tuple(
        json.dumps(decision[c], sort_keys=True) if c == "metrics" else decision[c]
        for c in DECISION_COLUMNS
    )
    if leader is not None:
        marks = ", ".join(["%s"] * len(DECISION_COLUMNS))
        leader.execute(
            f"INSERT INTO decisions ({', '.join(DECISION_COLUMNS)}) VALUES ({marks})", values
        )
        return
    db = open_db()
    try:
        db.record_decision(values)
    finally:
        db.close()


def read_decisions(open_db: Callable[[], StoreDB], limit: int) -> list[dict[str, Any]]:
    """The last ``limit`` decisions, oldest first (``metrics`` parsed back)."""
    db = open_db()
    try:
        rows = db.decisions(limit)
    finally:
        db.close()
    for row in rows:
        try:
            row["metrics"] = json.loads(row["metrics"])
        except (TypeError, ValueError, RecursionError):  # written by something else
            row["metrics"] = {"unreadable": str(row["metrics"])}
    return rows
