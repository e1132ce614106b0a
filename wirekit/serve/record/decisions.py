"""Every change to what is served is a decision (issues 16 and 38): the controller's quota
changes and the operators' changes through the admin API (a quota set, a model added, removed
or its settings changed).  They are a table of their own in the requests store, rarely
written -- each in its own short transaction, off the event loop.

A decision says who made it (``by``: :data:`CONTROLLER`, or :func:`operator` -- ``operator``
and the admin client's address), what (``kind``: one of :data:`DECISION_KINDS`), the values
``before`` and ``after`` (JSON values: a quota's two numbers; a model's description for
``add`` -- before None -- and ``remove`` -- after None; the settings that changed, old and new,
for ``set``), when (``time``), how it ended (``status``: ``applied``, ``refused``,
``failed``, with ``error``) and where: ``node``/``device``/``device_type`` of the row a quota
decision moved (``""``/``-1``/``""`` for the decisions about a whole model), ``old``/``new``
its quota (``0``/``0`` for the others), ``replica``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .storedb import DECISION_COLUMNS, StoreDB

#: ``by`` of the controller's own decisions
CONTROLLER = "controller"
#: ``by`` of an operator's decision when the admin client's address is not known
OPERATOR = "operator"
#: what a decision changed: a row's quota, a model added, removed, or its settings set
QUOTA, ADD, REMOVE, SET = "quota", "add", "remove", "set"
DECISION_KINDS = (QUOTA, ADD, REMOVE, SET)
#: the reason of every operator's decision (the controller's say why its policy decided)
ADMIN_REASON = "admin"
#: the columns stored as JSON text
_JSON_COLUMNS = frozenset({"metrics", "before", "after"})


def operator(peer: str | None) -> str:
    """``by`` of a change asked through the admin API by the client at ``peer`` (its IP
    address; the API has one token, so the address is all it knows of who asked)."""
    return f"{OPERATOR}@{peer}" if peer else OPERATOR


def model_decision(
    *,
    time: float,
    kind: str,
    model: str,
    by: str,
    before: Any,
    after: Any,
    status: str,
    error: str | None = None,
) -> dict[str, Any]:
    """An operator's decision about a whole model (``kind`` ``add``, ``remove`` or
    ``set``), shaped as the controller's
    (:func:`~wirekit.serve.control.controller.decision_record`): stored and shown by
    ``GET /controller`` alike."""
    return {
        "time": time,
        "node": "",
        "device": -1,
        "device_type": "",
        "model": model,
        "old": 0.0,
        "new": 0.0,
        "status": status,
        "reason": ADMIN_REASON,
        "error": error,
        "metrics": {},
        "by": by,
        "kind": kind,
        "before": before,
        "after": after,
    }


def store_decision(
    decision: dict[str, Any],
    *,
    open_db: Callable[[], StoreDB],
    leader: Any = None,
) -> None:
    """Store one decision (``decision``: its :data:`~.storedb.DECISION_COLUMNS` by name,
    ``metrics``, ``before`` and ``after`` as JSON values).  With a ``leader`` lock it goes
    through the lock, fenced by its term (raising
    :class:`~wirekit.serve.record.pgsync.NotLeader`, storing nothing, without the lead); else on a
    connection of its own (``open_db()``)."""
    values = tuple(
        json.dumps(decision.get(c), sort_keys=True) if c in _JSON_COLUMNS else decision[c]
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


def _parsed(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError):  # written by something else
        return {"unreadable": str(text)}


def read_decisions(open_db: Callable[[], StoreDB], limit: int) -> list[dict[str, Any]]:
    """The last ``limit`` decisions, oldest first (``metrics``, ``before`` and ``after``
    parsed back).  A row written without ``by``/``kind`` (by a wirekit before issue 38) is a
    quota decision: the controller's, or an operator's with reason ``admin``."""
    db = open_db()
    try:
        rows = db.decisions(limit)
    finally:
        db.close()
    for row in rows:
        row["metrics"] = _parsed(row["metrics"])
        if row.get("kind") is None:
            row["by"] = OPERATOR if row["reason"] == ADMIN_REASON else CONTROLLER
            row["kind"], row["before"], row["after"] = QUOTA, row["old"], row["new"]
            continue
        row["before"] = _parsed(row["before"])
        row["after"] = _parsed(row["after"])
    return rows
