"""Names and numbers validated where they enter ``wirekit serve``; a start nothing can stop
(issue 25).

* One name rule (:func:`wirekit.serve.config.check_name`) for the config file and the admin
  API; numbers out of range are a 400 / a config error naming the field, never a 500;
  request bodies are strict JSON and every answer is valid JSON.
* A journal with records that cannot be stored, a store file with rows of odd types and
  bytes, a PostgreSQL change log with a record that cannot be read: the start goes on, the
  bad record is kept and reported once with its position.
* ``/metrics`` and ``/stats`` answer for odd-but-valid names; log lines cannot be forged.

Through a real ``wirekit serve`` subprocess on loopback wherever a process is involved.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from mip_net import CliServer
from serve_support import DispatcherProcess, deployment, run
from yarl import URL

from wirekit.cli import main as wirekit_main
from wirekit.mip import Item, ItemType
from wirekit.serve.config import (
    MAX_NAME_LENGTH,
    ConfigError,
    ModelConfig,
    check_name,
    parse_config,
    parse_model,
    parse_quota,
    parse_settings,
)
from wirekit.serve.dispatch.payload import dumps, item_value, loads, to_item
from wirekit.serve.logs import EscapingFilter, printable
from wirekit.serve.record.store import RequestStore

TOKEN = "validation-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=20)
HUGE = 10**400  # an integer no float holds


def strict_json(text: str | bytes) -> Any:
    """Parse ``text`` as RFC 8259 JSON (no NaN, no Infinity): AssertionError otherwise."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in an answer: not JSON")

    return json.loads(text, parse_constant=refuse)


# -- the name rule -------------------------------------------------------------------------

GOOD_NAMES = [
    "m",
    "résumé-v2",
    "模型",
    "with space",
    'quo"te',
    "a.b",
    "a:b",
    "%41",
    "{x}=1,y",
    "#hash",
    "🙂",
    "x" * MAX_NAME_LENGTH,
]

BAD_NAMES = [
    ("", "empty"),
    ("\ud800x", "U+D800"),
    ("a\nb", "U+000A"),
    ("a\rb", "U+000D"),
    ("a\x00b", "U+0000"),
    ("\x1b[31mred", "U+001B"),
    ("a\u2028b", "U+2028"),
    ("a\u202eb", "U+202E"),
    ("a\u00a0b", "U+00A0"),
    ("x" * (MAX_NAME_LENGTH + 1), f"{MAX_NAME_LENGTH} characters at most"),
    ("x" * 9000, f"{MAX_NAME_LENGTH} characters at most"),
    ("a/b", "'/'"),
    ("a\\b", "'\\\\'"),
    (".", "cannot be '.'"),
    ("..", "cannot be '..'"),
    (" m", "start or end with a space"),
    ("m ", "start or end with a space"),
    (5, "a string"),
    (None, "a string"),
]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_the_name_rule_takes_printable_names(name):
    assert check_name(name, "where") == name


@pytest.mark.parametrize(("name", "why"), BAD_NAMES)
def test_the_name_rule_refuses_what_cannot_be_stored_logged_or_called(name, why):
    with pytest.raises(ConfigError) as info:
        check_name(name, "models.x")
    assert info.value.where == "models.x"
    assert why in info.value.reason


def _config(**change: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "models": {"m": {"timeout": 1}},
        "nodes": [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [9000]}],
    }
    for path, value in change.items():
        target = doc
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[int(key) if key.isdigit() else key]
        target[keys[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        (_config(nodes__0__models=["a\nb"]), "nodes[0].models[0]"),
        (_config(models={"a\nb": {}}), "models"),
        (_config(models={"m": {"apps": ["x/y"]}}), "models.m.apps[0]"),
        (_config(nodes__0__id="\ud800"), "nodes[0].id"),
        (_config(nodes__0__endpoint="host\nX-Forged: 1"), "nodes[0].endpoint"),
        (
            _config(models={"m": {"backend": "clipper"}}, nodes__0__ports=[".."]),
            "nodes[0].ports[0]",
        ),
    ],
)
def test_the_config_applies_the_name_rule_to_every_name(doc, where):
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert info.value.where == where


def test_the_admin_documents_apply_the_same_rule():
    devices = {("n", 0): "CPU"}
    short = {"name": "a\nb", "placements": [{"node": "n", "device": 0, "quota": 0.1, "port": 1}]}
    with pytest.raises(ConfigError) as info:
        parse_model(short, devices)
    assert info.value.where == "name"
    short = {"name": "ok", "placements": [{"node": "\ud800", "device": 0, "quota": 0.1}]}
    with pytest.raises(ConfigError) as info:
        parse_model(short, devices)
    assert info.value.where == "placements[0].node"
    with pytest.raises(ConfigError) as info:
        parse_quota({"node": "n\n", "device": 0, "quota": 0.5})
    assert info.value.where == "body.node"


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        (_config(models={"m": {"timeout": HUGE}}), "models.m.timeout"),
        (_config(models={"m": {"target": HUGE}}), "models.m.target"),
        (_config(models={"m": {"timeout": float("nan")}}), "models.m.timeout"),
        (_config(models={"m": {"timeout": float("inf")}}), "models.m.timeout"),
        (_config(models={"m": {"timeout": 1e300}}), "models.m.timeout"),
        (_config(models={"m": {"attempts": HUGE}}), "models.m.attempts"),
        (_config(nodes__0__quotas=[HUGE]), "nodes[0].quotas[0]"),
        (_config(nodes__0__quotas=[-HUGE]), "nodes[0].quotas[0]"),
        (_config(nodes__0__ports=[HUGE]), "nodes[0].ports[0]"),
        (_config(backoff=HUGE), "backoff"),
        (_config(cache={"ttl": float("inf")}), "cache.ttl"),
        (_config(mip={"request_timeout": HUGE}), "mip.request_timeout"),
    ],
)
def test_numbers_out_of_range_are_config_errors_naming_the_field(doc, where):
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert info.value.where == where
    assert len(str(info.value)) < 300  # a 400-digit number is told by its size


def test_settings_and_quota_bodies_refuse_numbers_out_of_range():
    model = ModelConfig("m")
    for doc, where in [
        ({"timeout": HUGE}, "timeout"),
        ({"target": HUGE}, "target"),
        ({"timeout": float("nan")}, "timeout"),
        ({"max_batch": HUGE}, "max_batch"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_settings(doc, model)
        assert info.value.where == where
    for doc, where in [
        ({"node": "n", "device": 0, "quota": HUGE}, "body.quota"),
        ({"node": "n", "device": 0, "quota": float("nan")}, "body.quota"),
        ({"node": "n", "device": 0, "quota": 1.5}, "body.quota"),
        ({"node": "n", "device": HUGE, "quota": 0.5}, "body.device"),
        ({"node": "n", "device": -1, "quota": 0.5}, "body.device"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_quota(doc)
        assert info.value.where == where
    assert parse_quota({"node": "n", "device": 1, "quota": 1}) == ("n", 1, 1.0)


def test_wirekit_serve_refuses_a_config_with_a_bad_name(tmp_path):
    config = tmp_path / "deployment.json"
    config.write_text(json.dumps(_config(nodes__0__models=["a\nb"])))
    for argv in (["serve", "--config", str(config)], ["serve", "check", "--config", str(config)]):
        out, err = io.StringIO(), io.StringIO()
        code = wirekit_main(argv, out, err)
        assert code == 1
        assert "nodes[0].models[0]" in err.getvalue() and "U+000A" in err.getvalue()
        assert err.getvalue().count("\n") == 1  # one line: the name is not written raw


# -- strict JSON in and out ----------------------------------------------------------------


@pytest.mark.parametrize("text", ['{"x": NaN}', '{"x": Infinity}', "[-Infinity]", b"[NaN]"])
def test_bodies_are_strict_json(text):
    with pytest.raises(ValueError, match="not a JSON number"):
        loads(text)
    assert loads('{"x": 1.5e300, "y": 10}') == {"x": 1.5e300, "y": 10}


def test_an_input_too_large_for_a_float_is_refused_where_it_is_used():
    for text in ("[1e999]", "[-1e400]", "[1" + "0" * 400 + ".0]"):
        with pytest.raises(ValueError, match="out of range"):
            to_item(loads(text))
    with pytest.raises(ConfigError) as info:
        parse_settings(loads('{"timeout": 1e999}'), ModelConfig("m"))
    assert info.value.where == "timeout"


def test_answers_are_always_valid_json():
    text = dumps({"avg": float("nan"), "max": [float("inf"), 1.0], "ok": "NaN"})
    assert strict_json(text) == {"avg": None, "max": [None, 1.0], "ok": "NaN"}
    # a backend's JSON item holding NaN is not JSON: shown as its bytes, losing nothing
    item = Item(ItemType.JSON, b"[NaN, 1]")
    shown = item_value(item)
    assert shown == {"type": int(ItemType.JSON), "b64": base64.b64encode(b"[NaN, 1]").decode()}
    assert item_value(Item.json([1.5, "x"])) == [1.5, "x"]


# -- log lines -----------------------------------------------------------------------------


def test_log_lines_cannot_be_forged():
    assert printable("résumé 模型 ok") == "résumé 模型 ok"
    assert printable("a\nb\r\x1b[2J\u2028\u202e\ud800") == "a\\nb\\r\\x1b[2J\\u2028\\u202e\\ud800"
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("wirekit.serve.test-forgery")
    logger.addFilter(EscapingFilter())
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("model %s added", "m\n2099-01-01 wirekit.serve model root added")
        logger.warning("peer said %r and %d", "x\ny", 3)
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert lines == [
        "model m\\n2099-01-01 wirekit.serve model root added added",
        "peer said 'x\\ny' and 3",
    ]


def test_every_serve_logger_escapes():
    import importlib
    import pkgutil

    import wirekit.serve

    for info in pkgutil.iter_modules(wirekit.serve.__path__):
        importlib.import_module(f"wirekit.serve.{info.name}")
    names = [n for n in logging.root.manager.loggerDict if n.startswith("wirekit.serve")]
    assert "wirekit.serve" in names
    for name in names:
        if name == "wirekit.serve.test-forgery":
            continue
        logger = logging.getLogger(name)
        assert any(isinstance(f, EscapingFilter) for f in logger.filters), name


# -- through a real wirekit serve -------------------------------------------------------------


def _doc(tmp_path: Path, port: int, names: tuple[str, ...] = ("m",)) -> dict[str, Any]:
    share = 0.5 / len(names)
    return deployment(
        tmp_path / "requests.db",
        {name: {"timeout": 5} for name in names},
        [
            {
                "id": "n",
                "devices": ["CPU"],
                "models": list(names),
                "quotas": [share] * len(names),
                "ports": [port] * len(names),
            }
        ],
        admin={"token": TOKEN},
        cache={"max_entries": 0},
    )


async def _send(http, method: str, url: str | URL, body: bytes | None = None) -> tuple[int, str]:
    async with http.request(method, url, data=body, headers=AUTH) as r:
        return r.status, await r.text()


async def _serves(http, base: str, model: str = "m") -> None:
    """The dispatcher still answers: a prediction, /metrics (parsed), /stats (strict)."""
    from prometheus_client.parser import text_string_to_metric_families

    url = URL(f"{base}/v1/models/{quote(model, safe='')}:predict", encoded=True)
    status, text = await _send(http, "POST", url, b'{"inputs": [["ok"]]}')
    assert status == 200, text
    assert strict_json(text)["outputs"] == [["A:OK"]]
    async with http.get(f"{base}/metrics") as r:
        assert r.status == 200
        families = list(text_string_to_metric_families(await r.text()))
    assert any(f.name == "wirekit_serve_queue_length" for f in families)
    async with http.get(f"{base}/stats") as r:
        assert r.status == 200
        strict_json(await r.text())


def _placement(name: Any, port: int, quota: Any = 0.1, **model: Any) -> bytes:
    place = {"node": "n", "device": 0, "quota": quota, "port": port}
    doc = {"name": name, "model": model, "placements": [place]}
    return json.dumps(doc).encode()


def test_bad_names_and_numbers_get_400_and_the_dispatcher_keeps_serving(tmp_path):
    """Each input of issue 25 that got in (or gave a 500) before: a 400 naming the field, and
    the process serves on -- and starts again on the same store afterwards."""
    with CliServer(handler="serve_handlers:tag_a") as backend:
        port = int(backend.address.rsplit(":", 1)[1])
        doc = _doc(tmp_path, port)
        with DispatcherProcess.of(doc, tmp_path) as proc:
            base = proc.http

            async def main() -> None:
                models = f"{base}/admin/models"
                bad: list[tuple[str, str, bytes, str]] = [
                    ("POST", models, _placement("\ud800x", port), "name"),
                    ("POST", models, _placement("a\nb", port), "name"),
                    ("POST", models, _placement("x" * 9000, port), "name"),
                    ("POST", models, _placement("a/b", port), "name"),
                    ("POST", models, _placement("..", port), "name"),
                    ("POST", models, _placement("q", port, quota=HUGE), "nodes[0].quotas[0]"),
                    ("POST", models, _placement("q", port, timeout=HUGE), "models.q.timeout"),
                    ("POST", models, _placement("q", port, target=HUGE), "models.q.target"),
                    ("POST", models, _placement("q", port, apps=["x\ny"]), "models.q.apps[0]"),
                    ("PATCH", f"{models}/m", b'{"timeout": %d}' % HUGE, "timeout"),
                    ("PATCH", f"{models}/m", b'{"target": 1e999}', "target"),
                    ("PATCH", f"{models}/m", b'{"target": NaN}', ""),
                    (
                        "PUT",
                        f"{models}/m/quota",
                        b'{"node": "n", "device": 0, "quota": %d}' % HUGE,
                        "body.quota",
                    ),
                    (
                        "PUT",
                        f"{models}/m/quota",
                        b'{"node": "n", "device": %d, "quota": 1}' % HUGE,
                        "body.device",
                    ),
                    (
                        "PUT",
                        f"{models}/m/quota",
                        b'{"node": "n", "device": 0, "quota": Infinity}',
                        "",
                    ),
                    ("POST", f"{base}/v1/models/m:predict", b'{"inputs": [[NaN]]}', ""),
                    ("POST", f"{base}/v1/models/m:predict", b'{"instances": [-Infinity]}', ""),
                    ("POST", f"{base}/v1/models/m:predict", b'{"instances": [1e999]}', ""),
                    ("POST", f"{base}/m/predict", b'{"input": NaN}', ""),
                ]
                async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
                    for method, url, body, where in bad:
                        status, text = await _send(http, method, url, body)
                        assert status == 400, (method, url, body[:80], status, text)
                        answer = strict_json(text)
                        if where:
                            assert answer["where"] == where, answer
                        await _serves(http, base)
                    status, text = await _send(http, "GET", models)
                    assert status == 200
                    assert list(strict_json(text)["models"]) == ["m"]  # nothing got in

            run(main())
            assert proc.stop() == 0
        # the store holds nothing a start cannot replay: the same config starts again
        with DispatcherProcess.of(doc, tmp_path) as again:

            async def check() -> None:
                async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
                    await _serves(http, again.http)

            run(check())


ODD_NAMES = ('quo"te', "spa ce", "ünï©ødé", "模型", "a{b}=c,d", "#x", "🙂")


def test_metrics_and_stats_answer_for_odd_names_and_odd_store_rows(tmp_path):
    """Odd-but-valid names (config and admin API) and a store file with rows no name rule
    ever checked -- backslashes, line breaks, quotes, bytes that are not UTF-8, a number as
    the model, a status that is bytes, an ok row with no times --: the start succeeds,
    ``/metrics`` parses with prometheus_client's parser and ``/stats`` is strict JSON."""
    from prometheus_client.parser import text_string_to_metric_families

    store = tmp_path / "requests.db"
    conn = sqlite3.connect(store)
    conn.execute(
        "CREATE TABLE requests (id TEXT PRIMARY KEY, model TEXT NOT NULL, client TEXT NOT NULL,"
        " device TEXT, time_in REAL NOT NULL, time_out REAL, status TEXT NOT NULL,"
        " payload_size INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, payload BLOB)"
    )
    rows = [
        ("r1", "back\\slash", "ok", 1.0, 1.5),
        ("r2", "line\nbreak", "ok", 1.0, 1.25),
        ("r3", 'quo"te', "ok", 1.0, 2.0),
        ("r4", sqlite3.Binary(b"\xffnot-utf8"), "ok", 1.0, 1.5),
        ("r5", 42, "failed", 1.0, 1.5),
        ("r6", "bytes-status", sqlite3.Binary(b"\xfe"), 1.0, 1.5),
        ("r7", "no-times", "ok", 1.0, None),
    ]
    for rid, model, status, t_in, t_out in rows:
        conn.execute(
            "INSERT INTO requests (id, model, client, time_in, time_out, status, payload_size)"
            " VALUES (?, CAST(? AS TEXT), 'c', ?, ?, CAST(? AS TEXT), 0)",
            (rid, model, t_in, t_out, status),
        )
    conn.commit()
    conn.close()
    with CliServer(handler="serve_handlers:tag_a") as backend:
        port = int(backend.address.rsplit(":", 1)[1])
        with DispatcherProcess.of(_doc(tmp_path, port, ODD_NAMES[:3]), tmp_path) as proc:
            base = proc.http

            async def main() -> None:
                async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
                    for name in ODD_NAMES[3:]:  # the others through the admin API
                        status, text = await _send(
                            http, "POST", f"{base}/admin/models", _placement(name, port, 0.01)
                        )
                        assert status == 201, text
                    for name in ODD_NAMES:  # each can be called by its name
                        await _serves(http, base, name)
                    async with http.get(f"{base}/metrics") as r:
                        assert r.status == 200
                        text = await r.text()
                    async with http.get(f"{base}/stats") as r:
                        assert r.status == 200
                        stats = strict_json(await r.text())
                families = {f.name: f for f in text_string_to_metric_families(text)}
                labelled = {s.labels["model"] for s in families["wirekit_serve_requests"].samples}
                assert set(ODD_NAMES) <= labelled  # this process's requests
                # the store's models (a previous run's rows) have their queue gauge
                queued = {s.labels["model"] for s in families["wirekit_serve_queue_length"].samples}
                assert {"back\\slash", "line\nbreak", 'quo"te', "\ufffdnot-utf8", "42"} <= queued
                assert set(ODD_NAMES) | {"back\\slash", "line\nbreak", "42"} <= set(stats["models"])
                assert stats["models"]["no-times"]["response_time"]["count"] == 1

            run(main())


def _journal_line(rid: str, model: str = "m", **change: Any) -> str:
    rec = [rid, model, "c", "n/0/m", (1.0).hex(), (1.5).hex(), "ok", 3, 1, None]
    fields = ["id", "model", "client", "device", "t_in", "t_out", "status", "size", "att", "blob"]
    for key, value in change.items():
        rec[fields.index(key)] = value
    return json.dumps(rec)


def _bad_journal(path: Path) -> dict[int, str]:
    """A journal (``<path>.journal.1``) of two good records and records that cannot be
    stored; returns line number -> what is wrong, for the bad ones."""
    lines: list[bytes] = [
        _journal_line("good-1").encode(),
        _journal_line("s", model="\ud800x").encode(),  # a lone surrogate (valid JSON)
        b"this is not JSON",
        b'["\xff\xfe not UTF-8"]',
        _journal_line("t", status=["ok"]).encode(),
        _journal_line("u", size=10**30).encode(),
        b'{"a": "dict, not a record"}',
        _journal_line("v", client="c\x00").encode(),
        _journal_line("w", t_in="not-a-time").encode(),
        _journal_line("good-2").encode(),
    ]
    data = b"\n".join(lines) + b"\n" + b'["torn by a crash'  # the last line: skipped
    path.with_name(path.name + ".journal.1").write_bytes(data)
    return {
        2: "model",
        3: "not JSON",
        4: "not UTF-8",
        5: "status",
        6: "size",
        7: "not a journal record",
        8: "client",
        9: "time in",
    }


def _open_and_read(path, store_url):
    """Open the store at ``path`` (replaying its journals), read its request ids, close it:
    ``(store, replayed_at_open, sorted ids)``."""
    store = RequestStore(path, url=store_url)
    store.open()
    try:
        replayed = store.replayed_at_open
        reader = store.reader()
        try:
            ids = sorted(r.id for r in reader.rows())
        finally:
            reader.close()
    finally:
        store.close()
    return store, replayed, ids


def test_a_journal_with_bad_records_is_quarantined_on_both_backends(tmp_path, store_url):
    path = tmp_path / "s.db"
    bad = _bad_journal(path)
    store, replayed, ids = _open_and_read(path, store_url)
    assert replayed == 2
    assert ids == ["good-1", "good-2"]
    kept = [json.loads(line) for line in store.quarantine_path.read_text().splitlines()]
    assert [k["line"] for k in kept] == sorted(bad)
    for k in kept:
        assert k["journal"] == "s.db.journal.1"
        assert bad[k["line"]] in k["error"], k
    assert base64.b64decode(kept[2]["record_b64"]) == b'["\xff\xfe not UTF-8"]'
    assert kept[0]["record"] == _journal_line("s", model="\ud800x")  # kept as written
    assert not path.with_name("s.db.journal.1").exists()


def test_wirekit_serve_starts_over_a_journal_with_bad_records(tmp_path):
    """The issue's case: a model name with a lone surrogate in the journal stopped every
    start (exit 1) until the file was deleted by hand."""
    store = tmp_path / "requests.db"
    bad = _bad_journal(store)
    with CliServer(handler="serve_handlers:tag_a") as backend:
        port = int(backend.address.rsplit(":", 1)[1])
        with DispatcherProcess.of(_doc(tmp_path, port), tmp_path) as proc:
            line = proc.wait_for_log("quarantined to")[0]
            assert f"{len(bad)} record(s)" in line and "requests.db.journal.1" in line
            assert "line 2 (byte " in line and "line 3 (byte " in line
            assert len([x for x in proc.log_lines if "quarantined" in x]) == 1  # once

            async def main() -> None:
                async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
                    await _serves(http, proc.http)
                    async with http.get(f"{proc.http}/stats") as r:
                        stats = strict_json(await r.text())
                assert stats["models"]["m"]["requests"] >= 3  # good-1, good-2, this one

            run(main())
    kept = store.with_name("requests.db.journal.quarantine").read_text().splitlines()
    assert sorted(json.loads(k)["line"] for k in kept) == sorted(bad)


def test_a_change_log_record_that_cannot_be_read_does_not_stop_a_replica(tmp_path, pg_url):
    """On a shared store: a change in the log that is not JSON, or not the shape of its
    kind, is skipped (and left in the log), reported once; the replica starts and serves."""
    import psycopg

    from wirekit.serve.record.storedb import open_db

    db = open_db(pg_url)
    try:
        db.migrate()
    finally:
        db.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for kind, doc in [
            ("quota", "{not json"),
            ("add", '{"model": {"name": "a\\nb"}, "rows": []}'),
            ("quota", "[1, 2]"),
        ]:
            conn.execute(
                "INSERT INTO catalog_changes (origin, kind, doc) VALUES ('elsewhere', %s, %s)",
                (kind, doc),
            )
    with CliServer(handler="serve_handlers:tag_a") as backend:
        port = int(backend.address.rsplit(":", 1)[1])
        doc = _doc(tmp_path, port)
        doc["store"]["url"] = pg_url
        with DispatcherProcess.of(doc, tmp_path) as proc:
            line = proc.wait_for_log("catalog change 1 ")[0]
            assert "cannot be read, skipped" in line
            proc.wait_for_log("catalog change 3 ")

            async def main() -> None:
                async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
                    await _serves(http, proc.http)
                    status, text = await _send(http, "GET", f"{proc.http}/admin/models")
                assert status == 200 and list(strict_json(text)["models"]) == ["m"]

            run(main())
    with psycopg.connect(pg_url, autocommit=True) as conn:
        kept = conn.execute("SELECT seq FROM catalog_changes WHERE seq <= 3").fetchall()
    assert [s for (s,) in kept] == [1, 2, 3]


def test_a_compaction_keeps_what_it_cannot_read(pg_url):
    import psycopg

    from wirekit.serve.record.pgsync import ChangeLog
    from wirekit.serve.record.storedb import open_db

    db = open_db(pg_url)
    try:
        db.migrate()
    finally:
        db.close()
    log = ChangeLog(pg_url, "here")
    try:
        log.append("quota", {"model": "m", "node": "n", "device": 0, "share": 0.5})
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO catalog_changes (origin, kind, doc) VALUES ('x', 'quota', 'oops')"
            )
            conn.execute(
                "INSERT INTO catalog_changes (origin, kind, doc) VALUES ('x', 'add', '{}')"
            )
        log.append("quota", {"model": "m", "node": "n", "device": 0, "share": 0.25})
        assert log.compact(keep=0) == 4
        assert log.since(0)[0].doc["quotas"] == {
            '["m", "n", 0]': {"model": "m", "node": "n", "device": 0, "share": 0.25}
        }
        with psycopg.connect(pg_url, autocommit=True) as conn:
            left = conn.execute("SELECT seq, doc FROM catalog_changes ORDER BY seq").fetchall()
        assert left == [(2, "oops")]
    finally:
        log.close()


def test_a_record_the_database_refuses_is_quarantined_and_the_rest_replayed(tmp_path, store_url):
    """A record every field of which checks out but that the database refuses (here a
    constraint added by hand) is quarantined with the database's reason; the records
    beside it in the same journal are stored."""
    path = tmp_path / "s.db"
    store = RequestStore(path, url=store_url)
    store.open()
    store.close()
    if store_url:
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE requests ADD CONSTRAINT no_x CHECK (id <> 'x')")
    else:
        conn = sqlite3.connect(path)
        conn.execute(
            "CREATE TRIGGER no_x BEFORE INSERT ON requests WHEN NEW.id = 'x'"
            " BEGIN SELECT RAISE(ABORT, 'no x'); END"
        )
        conn.commit()
        conn.close()
    lines = [_journal_line("a"), _journal_line("x"), _journal_line("b")]
    path.with_name("s.db.journal.1").write_text("\n".join(lines) + "\n")
    store, replayed, ids = _open_and_read(path, store_url)
    assert replayed == 2
    assert ids == ["a", "b"]
    (kept,) = [json.loads(line) for line in store.quarantine_path.read_text().splitlines()]
    assert kept["line"] == 2 and kept["record"] == lines[1]
    assert "the store refused it" in kept["error"]
