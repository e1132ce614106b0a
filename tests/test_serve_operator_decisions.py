"""Every change to what is served is a decision, whoever made it (issue 38, item 8).

A real ``wirekit serve`` process with no controller, on each event loop: an operator sets a
quota, adds a model, changes its settings and removes it through the real ``wirekit serve
models`` commands (and has a quota and an add refused).  Each change is a decision -- who
(``operator@127.0.0.1``), what (``kind``), the values before and after, when, how it ended --
shown by ``GET /controller`` (what the live page's timeline reads), stored in the store's
``decisions`` table (read back from the SQLite file with SQL; on PostgreSQL too), and shown
on the page's timeline in a real Chromium.  Requests refused before anything was tried (an
unknown model) are not decisions.  The controller's own decisions say ``by: controller``;
rows stored before these columns existed read back as what they were.

The admin path has no compiled twin: nothing here depends on ``WIREKIT_PURE``.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from browser_support import Browser, require_chromium
from serve_support import TIMEOUT, BackendProcess, DispatcherProcess, deployment

from wirekit.cli import main as wirekit_main
from wirekit.serve.config import ControllerConfig
from wirekit.serve.control.catalog import Catalog
from wirekit.serve.control.controller import Controller, Decision
from wirekit.serve.record.decisions import read_decisions
from wirekit.serve.record.store import RequestStore
from wirekit.serve.record.storedb import MIGRATIONS_SQLITE, open_db

#: who asks, as the dispatcher knows it: the admin API's one token, the client's address
OPERATOR = "operator@127.0.0.1"
#: the columns a decision row is compared on (``time`` and ``replica`` checked apart)
COMPARED = ("by", "kind", "model", "node", "device", "old", "new", "status", "before", "after")
#: a port nothing listens on (discard): the load of a model there fails at once
DEAD_PORT = 9
#: seconds between two polls of the page
POLL = 0.3


def models_cli(url: str, *argv: str) -> tuple[int, str, str]:
    """``wirekit serve models ARGV --url URL`` (the real command line; the token is the
    file the dispatcher wrote, found from the URL): exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    status = wirekit_main(
        ["serve", "models", *argv, "--url", url, *(["--json"] if argv[0] != "list" else [])],
        out,
        err,
    )
    return status, out.getvalue(), err.getvalue()


def http_json(url: str) -> Any:
    """``GET url`` (no token: ``/controller`` is read-only)."""

    async def get() -> Any:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()

    return asyncio.run(get())


def operate(url: str, port_b: int, directory: Path) -> tuple[float, float]:
    """The operator's changes of these tests (see :func:`expected`); their time span."""
    failing = directory / "m3.json"  # an OIP model whose server is not there: 502
    failing.write_text(json.dumps({
        "name": "m3",
        "model": {"backend": "oip", "load": True, "load_timeout": 5},
        "placements": [{"node": "n1", "device": 1, "quota": 0.25, "port": DEAD_PORT}],
    }))  # fmt: skip
    t0 = time.time()
    status, out, err = models_cli(url, "quota", "m1", "n1:1", "0.25")
    assert status == 0 and json.loads(out)["status"] == "applied", err
    status, _out, err = models_cli(url, "add", "--name", "m2", "--place", f"n1:0:0.5:{port_b}")
    assert status == 0, err
    status, _out, err = models_cli(url, "set", "m2", "--model-timeout", "7")
    assert status == 0, err
    # refused: n1/0 is full (m1 0.5, m2 0.5); m2 exists already
    status, _out, err = models_cli(url, "quota", "m1", "n1:0", "0.75")
    assert status == 1 and "HTTP 409" in err, err
    status, _out, err = models_cli(url, "add", "--name", "m2", "--place", f"n1:1:0.5:{port_b}")
    assert status == 1 and "already exists" in err, err
    status, _out, err = models_cli(url, "add", str(failing))
    assert status == 1 and "HTTP 502" in err, err
    # refused before anything was tried: not a decision
    status, _out, err = models_cli(url, "quota", "nope", "n1:0", "0.1")
    assert status == 1 and "HTTP 404" in err, err
    status, out, err = models_cli(url, "remove", "m2")
    assert status == 0 and json.loads(out)["removed"] == "m2", err
    return t0, time.time()


def expected(timeout_before: float) -> list[dict[str, Any]]:
    """The decisions :func:`operate` makes, oldest first (``timeout_before``: m2's
    timeout when added, the config's default)."""
    m2 = {
        "backend": "mip",
        "timeout": timeout_before,
        "attempts": 3,
        "max_batch": 1,
        "target": None,
        "quotas": {"n1/0": 0.5, "n1/1": 0.0},  # every row of the model, quota 0 included
    }
    m3 = {**m2, "backend": "oip", "timeout": 5.0}
    quota = {"kind": "quota", "model": "m1", "node": "n1"}
    model = {"model": "m2", "node": "", "device": -1, "old": 0.0, "new": 0.0}
    rows = [
        {**quota, "device": 1, "old": 0, "new": 0.25, "status": "applied", "before": 0,
         "after": 0.25},
        {**model, "kind": "add", "status": "applied", "before": None, "after": m2},
        {**model, "kind": "set", "status": "applied", "before": {"timeout": timeout_before},
         "after": {"timeout": 7.0}},
        {**quota, "device": 0, "old": 0.5, "new": 0.75, "status": "refused", "before": 0.5,
         "after": 0.75},
        {**model, "kind": "add", "status": "refused", "before": None,
         "after": {**m2, "quotas": {"n1/0": 0.0, "n1/1": 0.5}}},
        {**model, "kind": "add", "model": "m3", "status": "failed", "before": None,
         "after": {**m3, "quotas": {"n1/0": 0.0, "n1/1": 0.25}}},
        {**model, "kind": "remove", "status": "applied", "before": {**m2, "timeout": 7.0},
         "after": None},
    ]  # fmt: skip
    return [{"by": OPERATOR, **row} for row in rows]


def compared(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: row[k] for k in COMPARED} for row in rows]


def check_decisions(rows: list[dict[str, Any]], span: tuple[float, float]) -> None:
    """``rows`` are the decisions of :func:`operate`, made within ``span``."""
    timeout_before = rows[1]["after"]["timeout"] if len(rows) > 1 and rows[1]["after"] else 0
    assert compared(rows) == expected(timeout_before)
    assert all(span[0] <= row["time"] <= span[1] for row in rows)
    assert [row["reason"] for row in rows] == ["admin"] * 7
    assert "0.5 is free" in rows[3]["error"] and "already exists" in rows[4]["error"]
    assert rows[5]["error"].startswith("model 'm3' not added: its load failed")
    assert [row["error"] is None for row in rows] == [True, True, True, False, False, False, True]


# ---- a real process, each loop, SQLite ------------------------------------------------------


@pytest.fixture(scope="module")
def backends():
    with BackendProcess("serve_handlers:tag_a") as a, BackendProcess("serve_handlers:tag_b") as b:
        yield a.port, b.port


def one_model_on_two_devices(port: int) -> tuple[dict, list[dict]]:
    """The models and nodes of every deployment here: ``m1`` on two CPU devices of ``n1``
    (share 0.5 on the first, 0 on the second: room for a quota change), both at ``port``."""
    models = {"m1": {"timeout": 5}}
    nodes = [
        {
            "id": "n1",
            "devices": ["CPU", "CPU"],
            "models": ["m1"],
            "quotas": [0.5, 0],
            "ports": [port, port],
        }
    ]
    return models, nodes


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def operated(request, backends, tmp_path_factory):
    """A dispatcher with no controller on ``request.param``'s loop, after :func:`operate`:
    (the dispatcher, its SQLite store file, the time span of the changes)."""
    port_a, port_b = backends
    directory = tmp_path_factory.mktemp(f"operator-{request.param}")
    store = directory / "r.db"
    doc = deployment(
        store,
        *one_model_on_two_devices(port_a),
    )
    with DispatcherProcess.of(doc, directory, args=("--loop", request.param)) as dispatcher:
        span = operate(dispatcher.http, port_b, directory)
        yield dispatcher, store, span


def test_get_controller_lists_the_operators_decisions_without_a_controller(operated):
    dispatcher, _store, span = operated
    state = http_json(f"{dispatcher.http}/controller")
    assert state["enabled"] is False
    check_decisions(state["decisions"], span)
    # what the decisions did is what is served now
    assert {(q["model"], q["node"], q["device"], q["quota"]) for q in state["quotas"]} == {
        ("m1", "n1", 0, 0.5),
        ("m1", "n1", 1, 0.25),
    }


def stored_sqlite(path: Path) -> list[dict[str, Any]]:
    """The ``decisions`` table of the SQLite store at ``path``, by SQL (JSON parsed)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=TIMEOUT)
    try:
        conn.row_factory = sqlite3.Row
        rows = [dict(r) for r in conn.execute("SELECT * FROM decisions ORDER BY id")]
    finally:
        conn.close()
    for row in rows:
        for column in ("before", "after", "metrics"):
            row[column] = json.loads(row[column])
    return rows


def test_the_store_holds_the_operators_decisions(operated):
    dispatcher, store, span = operated
    rows = stored_sqlite(store)
    check_decisions(rows, span)
    # the replica that took them (its default name: <host>:<store path>)
    assert {row["replica"] for row in rows} == {f"{socket.gethostname()}:{store}"}
    assert all(row["metrics"] == {} and row["device_type"] in ("CPU", "") for row in rows)
    assert dispatcher.count("could not be stored") == 0


TIMELINE = """
[...document.querySelectorAll("#events tbody tr")].map((tr) => ({
  kind: tr.dataset.kind, model: tr.dataset.model, row: tr.dataset.row, by: tr.dataset.by,
  old: tr.dataset.old, new: tr.dataset.new,
  cells: [...tr.querySelectorAll("td")].map((td) => td.textContent),
}))
"""


@pytest.mark.parametrize("operated", ["asyncio"], indirect=True)  # one loop is enough
def test_the_page_timeline_shows_the_operators_decisions(operated):
    """The live page, opened after the changes, puts every decision ``/controller`` lists on
    its timeline (newest first), with who made it and what changed."""
    dispatcher, _store, _span = operated
    binary = require_chromium()

    async def look() -> tuple[list[str], list[dict[str, Any]]]:
        async with Browser(binary, width=1200) as tab:
            await tab.open(f"{dispatcher.http}/?poll={POLL}")
            await tab.wait_for("Number(document.body.dataset.polls || 0) >= 2")
            await tab.evaluate("document.getElementById('more-events').hidden || "
                               "document.getElementById('more-events').click()")  # fmt: skip
            return tab.problems(), await tab.evaluate(TIMELINE)

    problems, events = asyncio.run(asyncio.wait_for(look(), timeout=60))
    assert problems == []
    shown = [(e["kind"], e["model"], e["row"], e["by"], e["old"], e["new"]) for e in events]
    assert shown[::-1] == [
        ("decision applied", "m1", "n1/1/m1", OPERATOR, "0", "0.25"),
        ("model added", "m2", "", OPERATOR, "", ""),
        ("settings set", "m2", "", OPERATOR, "", ""),
        ("decision refused", "m1", "n1/0/m1", OPERATOR, "0.5", "0.75"),
        ("add refused", "m2", "", OPERATOR, "", ""),
        ("add failed", "m3", "", OPERATOR, "", ""),
        ("model removed", "m2", "", OPERATOR, "", ""),
    ]
    by_kind = {e["kind"]: e["cells"] for e in events}
    assert by_kind["model added"][4] == f"admin ({OPERATOR})"
    assert by_kind["model added"][5] == "n1/0 0.5, n1/1 0"
    assert by_kind["settings set"][5].endswith("→ 7")
    assert "already exists" in by_kind["add refused"][4]


# ---- PostgreSQL ----------------------------------------------------------------------------


def test_a_shared_store_holds_the_operators_decisions(backends, tmp_path, pg_url):
    """The same changes on a dispatcher whose store is PostgreSQL: stored there, unfenced
    (no controller, no leader needed), with the replica's name."""
    port_a, port_b = backends
    doc = deployment(
        tmp_path / "r.db",
        *one_model_on_two_devices(port_a),
        store={"path": str(tmp_path / "r.db"), "url": pg_url, "replica": "r1"},
    )
    with DispatcherProcess.of(doc, tmp_path) as dispatcher:
        span = operate(dispatcher.http, port_b, tmp_path)
        state = http_json(f"{dispatcher.http}/controller")
    check_decisions(state["decisions"], span)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        cur = conn.execute("SELECT * FROM decisions ORDER BY id")
        names = [c.name for c in cur.description or ()]
        rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    for row in rows:
        row["before"], row["after"] = json.loads(row["before"]), json.loads(row["after"])
    check_decisions(rows, span)
    assert {row["replica"] for row in rows} == {"r1"}


# ---- the controller's own, and rows stored before -----------------------------------------


def test_the_controllers_decisions_say_by_controller(tmp_path):
    from test_serve_controller import Asks, catalog

    from wirekit.serve.control.actuators import LogActuator

    cat: Catalog = catalog()
    store = RequestStore(tmp_path / "r.db")
    decision = Decision("n1", 0, "CPU", "a", 0.5, 0.25, "test", {"seen": 1})
    ctl = Controller(ControllerConfig(), cat, dict, LogActuator(), store=store,
                     policy=Asks(decision))  # fmt: skip
    [record] = asyncio.run(ctl.step())
    [stored] = store.decisions()
    for row in (record, stored):
        assert (row["by"], row["kind"], row["before"], row["after"]) == (
            "controller",
            "quota",
            0.5,
            0.25,
        )
        assert (row["reason"], row["metrics"], row["old"], row["new"]) == (
            "test",
            {"seen": 1},
            0.5,
            0.25,
        )


def test_decisions_stored_before_the_columns_read_back_as_what_they_were(tmp_path):
    """A store written by a wirekit before issue 38 (schema version 3): its controller's
    and operator's quota decisions are given ``by``, ``kind``, ``before``, ``after`` when the
    schema is brought up to date."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for step in MIGRATIONS_SQLITE[:3]:
        conn.executescript(step)
    conn.execute("PRAGMA user_version = 3")
    for reason, old, new in (("over target", 0.5, 0.75), ("admin", 0.75, 1.0)):
        conn.execute(
            "INSERT INTO decisions (time, node, device, device_type, model, old, new, status,"
            " reason, error, metrics, replica) VALUES (1, 'n1', 0, 'CPU', 'a', ?, ?,"
            " 'applied', ?, NULL, '{}', NULL)",
            (old, new, reason),
        )
    conn.commit()
    conn.close()
    db = open_db(path)
    assert db.migrate() == len(MIGRATIONS_SQLITE)
    db.close()
    rows = read_decisions(lambda: open_db(path), 10)
    assert [(r["by"], r["kind"], r["before"], r["after"]) for r in rows] == [
        ("controller", "quota", 0.5, 0.75),
        ("operator", "quota", 0.75, 1.0),
    ]
    raw = sqlite3.connect(path).execute("SELECT by, kind, before, after FROM decisions")
    assert [(b, k, json.loads(x), json.loads(y)) for b, k, x, y in raw] == [
        ("controller", "quota", 0.5, 0.75),
        ("operator", "quota", 0.75, 1.0),
    ]
