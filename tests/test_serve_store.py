"""The requests store on both backends (issue 17): SQLite file and PostgreSQL, one suite.

Every test here takes ``store_url`` (tests/conftest.py): None for SQLite, a fresh database
on the session's throwaway PostgreSQL server otherwise.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from serve_support import ROOT
from support.ports import free_port
from support.rows import rename_table, select
from support.service import start_service

from wirekit.cli import main
from wirekit.serve.control.metrics import Metrics, stats_from_store
from wirekit.serve.record.store import RequestStore, StoreUnavailable
from wirekit.serve.record.storedb import MIGRATIONS_PG, MIGRATIONS_SQLITE, open_db


def call(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def new_store(tmp_path, store_url, name="s.db", **kw) -> RequestStore:
    return RequestStore(tmp_path / name, url=store_url, **kw)


def stats_args(store: RequestStore) -> list[str]:
    if store.url:
        return ["serve", "stats", "--store-url", store.url, "--json"]
    return ["serve", "stats", "--store", str(store.path), "--json"]


def db_rows(store: RequestStore, columns: str = "id, status") -> list[tuple]:
    """Rows straight from the database, by id."""
    return select(store.url or store.path, f"SELECT {columns} FROM requests ORDER BY id")


_CRASH = """
import asyncio, os, sys
from wirekit.serve.record.store import RequestStore

store = RequestStore(sys.argv[1], url=sys.argv[2] or None, payloads=True, flush_interval=60)

async def crash_before_handoff():
    store.open()
    store.arrival("x", "m", "c", 1.0, 3, b"abc")
    store.completion(
        "x", "n/0/m", 1.5, "ok", 1, model="m", client="c", time_in=1.0, size=3, payload=b"abc"
    )
    store.arrival("z", "m", "c", 1.0, 3, b"ghi")
    store.completion(
        "z", "n/0/m", 1.7, "error", 1, model="m", client="c", time_in=1.0, size=3,
        reason="backend answered ErrorReply(code=3)",
    )
    store.arrival("y", "m", "c", 2.0, 3, b"def")  # never answered
    os._exit(0)  # no flush, no close: the writer never saw these rows

asyncio.run(crash_before_handoff())
"""


def crash_in_a_process(path, store_url) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", _CRASH, str(path), store_url or ""],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr


def test_stats_from_the_store_on_both_backends(tmp_path, store_url):
    store = new_store(tmp_path, store_url)
    store.open()

    def done(rid, model, t_in, device, t_out, status, attempts, reason=None):
        store.arrival(rid, model, "c", t_in, 20)
        store.completion(
            rid,
            device,
            t_out,
            status,
            attempts,
            model=model,
            client="c",
            time_in=t_in,
            size=20,
            reason=reason,
        )

    async def fill():
        done("a", "m1", 10.0, "n/0/m1", 10.5, "ok", 1)
        done("b", "m1", 11.0, "n/0/m1", 11.25, "ok", 2)
        done("c", "m2", 12.0, None, 13.0, "failed", 3, "no device answered after 3 attempt(s)")
        store.arrival("d", "m2", "c", 14.0, 20)  # still queued
        await store.flush()

    asyncio.run(fill())
    store.close()
    code, out, err = call(*stats_args(store))
    assert code == 0, err
    stats = json.loads(out)
    assert stats["queue"] == 1
    m1 = stats["models"]["m1"]
    assert m1["response_time"] == {"count": 2, "avg": 0.375, "min": 0.25, "max": 0.5}
    assert stats["models"]["m2"]["statuses"] == {"failed": 1}
    # the live counters loaded from the store agree with the SQL figures
    reader = store.reader()
    try:
        live = Metrics()
        live.load(reader)
        assert live.snapshot() == stats_from_store(reader)
        assert [r.id for r in reader.rows()] == ["a", "b", "c", "d"]
    finally:
        reader.close()
    # a failed row records why (issue 21)
    assert db_rows(store, "id, reason") == [
        ("a", None),
        ("b", None),
        ("c", "no device answered after 3 attempt(s)"),
        ("d", None),
    ]
    # reopening (the same replica) ends the row it left queued as lost (its dispatcher died)
    store = new_store(tmp_path, store_url)
    store.open()
    assert (store.lost_at_open, store.lost_by_model) == (1, {"m2": 1})
    store.close()
    stats = json.loads(call(*stats_args(store))[1])
    assert stats["queue"] == 0 and stats["models"]["m2"]["statuses"]["lost"] == 1
    code, out, _ = call(*stats_args(store)[:-1])  # the table
    assert code == 0 and "m1" in out and "375.000" in out and "queue total: 0" in out
    assert "lost=1" in out


def test_stats_of_no_store_or_not_a_store(tmp_path, pg_url):
    code, _out, err = call("serve", "stats", "--store", str(tmp_path / "none.db"))
    assert code == 2 and "no store" in err
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    code, _out, err = call("serve", "stats", "--store", str(junk))
    assert code == 1 and "not a requests store" in err
    code, _out, err = call("serve", "stats", "--store-url", pg_url)  # an empty database
    assert code == 1 and "is not a requests store" in err and err.count("\n") == 1


def test_journal_replays_answered_requests_after_a_crash(tmp_path, store_url):
    """Completions journaled but never handed to the database (the process died) are
    replayed at the next start, with their reason; an arrival journaled without its answer
    is found and ended lost (with the time it was found); replaying twice counts nothing
    twice."""
    store = new_store(tmp_path, store_url, "j.db")
    crash_in_a_process(tmp_path / "j.db", store_url)
    journals = list(tmp_path.glob("j.db.journal.*"))
    assert len(journals) == 1 and journals[0].stat().st_size > 0
    saved = journals[0].read_bytes()
    again = new_store(tmp_path, store_url, "j.db")
    before = time.time()
    again.open()
    assert again.replayed_at_open == 2
    assert again.lost_at_open == 1
    again.close()
    assert not list(tmp_path.glob("j.db.journal.*"))
    # the same journal once more (a crash during a replay): by id, nothing doubles
    journals[0].write_bytes(saved)
    again = new_store(tmp_path, store_url, "j.db")
    again.open()
    assert again.lost_at_open == 0  # ended once: not counted again
    again.close()
    rows = db_rows(store, "id, status, time_in, time_out, payload, reason")
    lost_at = rows[1][3]
    assert lost_at >= before
    assert [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in rows] == [
        ("x", "ok", 1.0, 1.5, b"abc", None),
        # journaled on arrival (issue 26): found, and lost -- never answered
        ("y", "lost", 2.0, lost_at, b"def", "the dispatcher stopped before answering"),
        # its payload from its arrival record (the completion's has none)
        ("z", "error", 1.0, 1.7, b"ghi", "backend answered ErrorReply(code=3)"),
    ]


def test_migrations_are_versioned_and_idempotent(tmp_path, store_url):
    store = new_store(tmp_path, store_url)
    for _ in range(2):
        db = open_db(store_url or store.path)
        try:
            newest = len(MIGRATIONS_PG if store_url else MIGRATIONS_SQLITE)
            assert db.migrate() == newest
            assert db.migrate() == newest
        finally:
            db.close()
    if store_url:
        import psycopg

        with psycopg.connect(store_url) as conn:
            versions = conn.execute("SELECT version FROM wirekit_schema ORDER BY 1").fetchall()
        assert versions == [(n + 1,) for n in range(len(MIGRATIONS_PG))]


def test_a_store_file_from_before_versioning_is_upgraded(tmp_path):
    """A file made by wirekit 0.1 (no reason/replica columns, user_version 0) keeps its
    rows and gains the new columns."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS_SQLITE[0])
    conn.execute(
        "INSERT INTO requests (id, model, client, time_in, status, payload_size)"
        " VALUES ('old', 'm', 'c', 1.0, 'queued', 3)"
    )
    conn.commit()
    conn.close()
    store = RequestStore(path)
    store.open()
    store.close()
    assert store.lost_at_open == 1
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS_SQLITE)
    assert conn.execute("SELECT id, status, reason FROM requests").fetchall() == [
        ("old", "lost", "the dispatcher stopped before answering")
    ]
    conn.close()


def test_replicas_starting_at_once_migrate_once(tmp_path, pg_url):
    """Eight stores opening one fresh PostgreSQL database at the same moment: every one
    opens, each migration is applied exactly once (the advisory lock)."""
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def start(n: int) -> None:
        store = RequestStore(tmp_path / f"r{n}.db", url=pg_url, replica=f"r{n}")
        barrier.wait(30)
        try:
            store.open()
            store.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    import psycopg

    with psycopg.connect(pg_url) as conn:
        versions = conn.execute("SELECT version FROM wirekit_schema ORDER BY 1").fetchall()
    assert versions == [(n + 1,) for n in range(len(MIGRATIONS_PG))]


def test_a_restart_ends_only_its_own_queued_rows(tmp_path, pg_url):
    """Two replicas on one store: one restarting must not end the other's requests in
    flight."""
    a = RequestStore(tmp_path / "a.db", url=pg_url, replica="a")
    b = RequestStore(tmp_path / "b.db", url=pg_url, replica="b")

    async def both():
        a.open()
        b.open()
        a.arrival("a1", "m", "c", 1.0, 3)
        b.arrival("b1", "m", "c", 1.0, 3)
        await a.flush()
        await b.flush()

    asyncio.run(both())
    a.close()
    a = RequestStore(tmp_path / "a.db", url=pg_url, replica="a")
    a.open()
    assert a.lost_at_open == 1
    a.close()
    b.close()
    assert db_rows(a) == [("a1", "lost"), ("b1", "queued")]


def test_two_replicas_cannot_share_one_journal(tmp_path, pg_url):
    first = RequestStore(tmp_path / "same.db", url=pg_url)
    first.open()
    try:
        with pytest.raises(StoreUnavailable, match="another wirekit serve replica"):
            RequestStore(tmp_path / "same.db", url=pg_url).open()
    finally:
        first.close()


def test_an_unreachable_store_is_one_clear_line(tmp_path):
    url = "postgresql://nobody@127.0.0.1:1/none"
    code, _out, err = call("serve", "stats", "--store-url", url)
    assert code == 1 and err.startswith("wirekit serve stats: cannot reach the store at")
    assert err[-1] == "\n"
    with pytest.raises(StoreUnavailable, match="cannot reach the store"):
        RequestStore(tmp_path / "x.db", url=url).open()
    code, _out, err = call("serve", "stats", "--store-url", "mysql://x")
    assert code == 2 and "postgresql://" in err


def test_a_failed_request_row_records_why(tmp_path, store_url):
    """Issue 21: the dispatcher stores the reason of a failed request (every device
    refused) and of an error answer, on both backends."""

    from serve_support import deployment, run

    from wirekit.mip.client import AsyncClient

    closed = free_port()
    path = tmp_path / "f.db"
    store = {"path": str(path), "url": store_url} if store_url else {"path": str(path)}
    doc = deployment(
        path,
        {"m": {"timeout": 2, "attempts": 2}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [closed]}],
        store=store,
        cache={"max_entries": 0},
        backoff=0,
    )

    async def main():
        service = await start_service(doc)
        try:
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['m']}"
            async with AsyncClient(address, timeout=10) as c:
                reply = await c.request(_request("x"))
            assert type(reply).__name__ == "ErrorReply"
            await service.store.flush()
        finally:
            await service.stop()

    run(main())
    checked = RequestStore(path, url=store_url)
    (row,) = db_rows(checked, "status, reason")
    assert row[0] == "failed"
    assert row[1].startswith("no device answered after 1 attempt(s): n/0/m: ")


def _request(text: str):
    from wirekit.mip import Inference, Item

    return Inference.request([[Item.text(text)]])


def test_answers_given_while_the_database_was_away_reach_it_when_it_is_back(tmp_path, store_url):
    """The writes fail (the table is renamed away, as a database that is down would make
    them): the requests are still answered and journaled; once the database is back, the
    next journal rotation replays what the failed writes lost -- no restart needed."""
    store = new_store(tmp_path, store_url, "h.db", journal_max=1)  # rotate every hand-over

    def rename(old: str, new: str) -> None:
        rename_table(store_url or tmp_path / "h.db", old, new)

    def answer(rid: str) -> None:
        store.arrival(rid, "m", "c", 1.0, 3)
        store.completion(rid, "n/0/m", 1.5, "ok", 1, model="m", client="c", time_in=1.0, size=3)

    async def main():
        store.open()
        answer("before")
        await store.flush()
        rename("requests", "requests_away")
        answer("during")
        with pytest.raises(RuntimeError, match="request store write failed"):
            await store.flush()
        assert store.error is not None
        rename("requests_away", "requests")
        answer("after")
        await store.flush()  # retires the journal that holds "during": replayed
        await store.flush()

    asyncio.run(main())
    store.close()
    assert store.healed >= 1
    assert db_rows(store) == [("after", "ok"), ("before", "ok"), ("during", "ok")]
    assert not list(tmp_path.glob("h.db.journal.*"))


def test_decisions_are_stored_and_read_back_on_both_backends(tmp_path, store_url):
    db = open_db(store_url or tmp_path / "d.db")
    try:
        db.migrate()
        for k in range(3):
            db.record_decision(
                (100.0 + k, "n", 0, "CPU", "m", 0.5, 0.6, "applied", f"slow {k}", None, "{}", "r1",
                 "controller", "quota", "0.5", "0.6")  # who and what (issue 38)
            )  # fmt: skip
        last = db.decisions(2)
    finally:
        db.close()
    assert [d["reason"] for d in last] == ["slow 1", "slow 2"]
    assert last[-1] == {
        "time": 102.0, "node": "n", "device": 0, "device_type": "CPU", "model": "m",
        "old": 0.5, "new": 0.6, "status": "applied", "reason": "slow 2", "error": None,
        "metrics": "{}", "replica": "r1", "by": "controller", "kind": "quota", "before": "0.5",
        "after": "0.6",
    }  # fmt: skip


def test_serve_store_url_flag_replaces_the_config(tmp_path):
    """``wirekit serve --store-url`` puts the store on PostgreSQL whatever the file says:
    an unreachable one stops the start with one line, exit 1; not a postgresql:// URL,
    exit 2."""
    from serve_support import deployment

    config = tmp_path / "d.json"
    config.write_text(
        json.dumps(
            deployment(
                tmp_path / "x.db",
                {"m": {}},
                [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [1]}],
            )
        )
    )
    url = "postgresql://someone:secret@127.0.0.1:1/none"
    code, _out, err = call("serve", "--config", str(config), "--store-url", url)
    assert code == 1 and err.startswith("wirekit serve: cannot reach the store at postgresql://")
    assert "secret" not in err and "someone:***@" in err and err.count("\n") == 1
    code, _out, err = call("serve", "--config", str(config), "--store-url", "sqlite:///x")
    assert code == 2 and "postgresql://" in err
    assert not (tmp_path / "x.db").exists()  # the SQLite file of the config was not made


def test_recent_window_of_every_replica_on_postgresql(tmp_path, pg_url):
    """The figures a leader's controller reads: every replica's requests since a time."""
    from wirekit.serve.record.storedb import PostgresDB

    stores = [RequestStore(tmp_path / f"r{n}.db", url=pg_url, replica=f"r{n}") for n in (1, 2)]

    async def fill():
        for n, store in enumerate(stores):
            store.open()
            for k in range(10):  # response times 0.1 .. 1.0 s, answered at 100 + ...
                rid = f"{n}-{k}"
                t_in = 100.0 + k
                store.arrival(rid, "m", "c", t_in, 3)
                store.complete(rid, "m", "c", "n/0/m", t_in, t_in + (k + 1) / 10, "ok", 3, 1)
            store.arrival(f"{n}-old", "m", "c", 1.0, 3)  # long ago, and failed
            store.complete(f"{n}-old", "m", "c", None, 1.0, 2.0, "failed", 3, 1, None, False, "x")
            store.arrival(f"{n}-q", "m", "c", 109.5, 3)  # still queued
            # another model: a backend error on its device, an answer from the cache
            store.arrival(f"{n}-e", "m2", "c", 106.0, 3)
            store.complete(f"{n}-e", "m2", "c", "n/1/m2", 106.0, 106.5, "error", 3, 1)
            store.arrival(f"{n}-c", "m2", "c", 107.0, 3)
            store.complete(f"{n}-c", "m2", "c", "cache", 107.0, 107.0, "ok", 3, 0)
            await store.flush()

    asyncio.run(fill())
    db = PostgresDB(pg_url)
    try:
        got = db.recent(since=105.0)  # the last five of each replica arrived since then
        rows = db.recent_rows(since=105.0)  # the same per device
    finally:
        db.close()
        for store in stores:
            store.close()
    m = got["m"]
    # arrived since 105: k = 5..9 and the queued one; answered since 105: k = 5..9 (k = 4
    # was answered at 104.5), response times 0.6 .. 1.0 s; the old failure is outside
    assert (m["requests"], m["ok"], m["errors"], m["queue"]) == (2 * 6, 2 * 5, 0, 2)
    assert m["max"] == 1.0 and abs(m["avg"] - 0.8) < 1e-9 and abs(m["p50"] - 0.8) < 1e-9
    assert 0.9 <= m["p95"] <= m["p99"] <= 1.0
    # per device: what each device finished since 105 (the queued one has no device yet, an
    # answer from the cache is on no device)
    assert set(rows) == {"n/0/m", "n/1/m2"}
    r = rows["n/0/m"]
    assert (r["requests"], r["ok"], r["errors"], r["queue"]) == (2 * 5, 2 * 5, 0, None)
    assert r["max"] == 1.0 and abs(r["avg"] - 0.8) < 1e-9 and abs(r["p50"] - 0.8) < 1e-9
    r = rows["n/1/m2"]
    assert (r["requests"], r["ok"], r["errors"], r["queue"], r["avg"]) == (2, 0, 2, None, None)
