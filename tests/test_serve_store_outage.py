"""A PostgreSQL outage under load (issue 38, item 2): the store catches up when the database
comes back.

A real ``wirekit serve`` process (both loops; both twins when the suite runs again under
``WIREKIT_PURE=1``) on a real throwaway PostgreSQL server of this module's own, a
``wirekit mip serve`` backend, blocking MIP clients answering all along.  The server is
stopped (``pg_ctl stop -m fast``: every session ends, new ones are refused) and started again
on the same port.  Meanwhile the requests are still answered and journaled; ``/readyz`` says
how many rows wait to reach the store, ``/stats`` answers 200 with this process's figures,
its backlog and why the store cannot be read, ``/metrics`` has the backlog gauge.  Once the
database is back, within a generous event-driven bound: every answered request has its one
final row in the store, nothing stays ``queued``, the backlog is 0, the first ``/stats``
after the restart is a 200 with the store's figures (its broken connection reopened), and the
log has no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mip_net import CliServer
from pg_server import TIMEOUT as PG_TIMEOUT
from pg_server import PgServer, pg_bindir
from serve_support import TIMEOUT, DispatcherProcess, deployment
from support.loops import LOOPS
from support.rows import rename_table, rows_by_text
from support.rows import select as sql

from wirekit.mip.client import Client
from wirekit.serve.record.store import RequestStore
from wirekit.serve.record.storedb import open_db

#: how long the store may take to catch up once the database is back (generous: the
#: verdict waits for the rows, this only bounds a failure)
CATCH_UP = 30.0
#: requests answered during the outage before the database comes back, and its seconds at
#: least (a duration, not a verdict)
DURING, OUTAGE = 150, 4.0


class RestartablePg(PgServer):
    """A throwaway PostgreSQL server that can be stopped and started again on its port."""

    def _pg_ctl(self, *argv: str) -> None:
        done = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.dir / "data"), *argv)
        if done.returncode:
            raise RuntimeError(f"pg_ctl {argv[-1]} failed: {done.stderr[-1000:]}")

    def stop_fast(self) -> None:
        """``pg_ctl stop -m fast``: the sessions are ended, the server exits."""
        self._pg_ctl("-m", "fast", "-w", "-t", str(int(PG_TIMEOUT)), "stop")

    def start_again(self) -> None:
        """Started again with the options of the first start (same port and socket)."""
        opts = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir}"
            " -c max_connections=200 -c fsync=off -c synchronous_commit=off"
            " -c full_page_writes=off"
        )
        self._pg_ctl("-l", str(self.dir / "log"), "-w", "-t", str(int(PG_TIMEOUT)), "-o", opts,
                     "start")  # fmt: skip


@pytest.fixture(scope="module")
def pg() -> Iterator[RestartablePg]:
    """This module's own PostgreSQL server (the session's is shared: it cannot be stopped)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing: str | None = "psycopg is not installed (the 'pg' extra)"
    else:
        bindir = pg_bindir()
        missing = None if bindir else "no PostgreSQL binaries (apt-get install postgresql)"
    if missing is not None:
        if os.environ.get("WIREKIT_REQUIRE_PG") == "1":
            pytest.fail(f"WIREKIT_REQUIRE_PG=1 but {missing}")
        pytest.skip(missing)
    assert bindir is not None
    server = RestartablePg(bindir).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_db(pg: RestartablePg, request) -> str:
    """A new database on :func:`pg` (the server running)."""
    import psycopg

    name = f"outage_{request.node.callspec.id.replace('-', '_')}_{os.getpid()}"
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return pg.url.rpartition("/")[0] + "/" + name


def get(url: str) -> tuple[int, str]:
    """Status and body of a GET (an error status is an answer too)."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_until(predicate, what: str, limit: float) -> None:
    """Call ``predicate()`` until it is true (AssertionError after ``limit`` seconds)."""
    until = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > until:
            raise AssertionError(f"not within {limit} s: {what}")
        time.sleep(0.05)


class Load:
    """Blocking MIP clients, each sending request after request (each its own text) and
    keeping the texts answered."""

    def __init__(self, address: str, clients: int = 2) -> None:
        self.address = address
        self.answered: list[str] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(n,)) for n in range(clients)]

    def _client(self, n: int) -> None:
        try:
            with Client(self.address, timeout=TIMEOUT) as c:
                for k in range(10**9):
                    if self._stop.is_set():
                        return
                    text = f"c{n}-{k}"
                    (item,) = c.infer_one(text)
                    assert item.as_text() == f"F:{text.upper()}", item.as_text()
                    with self._lock:
                        self.answered.append(text)
        except BaseException as exc:
            self.errors.append(exc)

    @property
    def count(self) -> int:
        return len(self.answered)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(TIMEOUT)

    def wait_for(self, n: int, what: str) -> None:
        """Until ``n`` more requests are answered than now."""
        target = self.count + n
        wait_until(lambda: self.count >= target or bool(self.errors), what, CATCH_UP)
        assert not self.errors, self.errors


def config(tmp_path: Path, url: str, port: int) -> Path:
    path = tmp_path / "deployment.json"
    node = {"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1.0], "ports": [port]}
    store = {"path": str(tmp_path / "a.db"), "url": url, "replica": "a", "payloads": True}
    doc = deployment(tmp_path / "a.db", {"m": {"timeout": 5}}, [node], store=store,
                     cache={"max_entries": 0})  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def backlog_gauge(metrics_text: str) -> float | None:
    for line in metrics_text.splitlines():
        if line.startswith("wirekit_serve_store_backlog "):
            return float(line.split()[1])
    return None


@pytest.mark.parametrize("loop", LOOPS)
def test_what_was_answered_during_a_database_outage_reaches_the_store_once_it_is_back(
    tmp_path, pg, pg_db, loop
):
    with (
        CliServer(handler="serve_handlers:tag_fast") as backend,
        DispatcherProcess(
            config(tmp_path, pg_db, int(backend.address.rsplit(":", 1)[1])), args=("--loop", loop)
        ) as proc,
        Load(proc.mip_address("m")) as load,
    ):
        load.wait_for(100, "requests answered before the outage")
        pg.stop_fast()
        down_at = time.monotonic()
        try:
            # the requests are still answered; what the operator sees meanwhile
            load.wait_for(DURING, "requests answered during the outage")
            readyz: list[dict] = []

            def backlog_said() -> bool:
                _status, body = get(f"{proc.http}/readyz")
                doc = json.loads(body)
                readyz.append(doc)
                return any("rows waiting to reach the store" in r for r in doc["reasons"])

            with contextlib.suppress(AssertionError):  # checked below, after the rows
                wait_until(backlog_said, "/readyz says the backlog", 10.0)
            during_stats = get(f"{proc.http}/stats")
            during_metrics = get(f"{proc.http}/metrics")
            time.sleep(max(0.0, down_at + OUTAGE - time.monotonic()))
        finally:
            pg.start_again()
        # the first /stats after the restart: its connection broke, it is reopened
        first_stats = get(f"{proc.http}/stats")
        load.wait_for(100, "requests answered after the outage")
        load.__exit__()
        answered = list(load.answered)

        def caught_up() -> bool:
            """Every answered request in the store, none queued, none waiting (the backlog
            drops once the journal that held a row is replayed: its other rows too)."""
            stored = rows_by_text(pg_db, "status")
            return (
                all(stored.get(text) == [("ok",)] for text in answered)
                and not sql(pg_db, "SELECT id FROM requests WHERE status = 'queued'")
                and json.loads(get(f"{proc.http}/stats")[1]).get("backlog") == 0
            )

        try:
            wait_until(caught_up, "every answered request's row in the store", CATCH_UP)
        except AssertionError:
            stored = rows_by_text(pg_db, "status")
            missing = [t for t in answered if stored.get(t) != [("ok",)]]
            queued = sql(pg_db, "SELECT COUNT(*) FROM requests WHERE status = 'queued'")[0][0]
            backlog = json.loads(get(f"{proc.http}/stats")[1]).get("backlog")
            raise AssertionError(
                f"{len(missing)} of {len(answered)} answered requests not in the store"
                f" {CATCH_UP} s after the database came back ({queued} rows queued,"
                f" backlog {backlog})"
            ) from None
        after = json.loads(get(f"{proc.http}/stats")[1])
        final_readyz = json.loads(get(f"{proc.http}/readyz")[1])
        log = proc.log
    # one row per request, each answered once
    stored = rows_by_text(pg_db, "status")
    assert all(len(rows) == 1 for rows in stored.values())
    # /readyz said the backlog while the database was away
    assert readyz and any(
        "rows waiting to reach the store" in r for doc in readyz for r in doc["reasons"]
    ), readyz[-1:]
    assert readyz[-1]["store"]["backlog"] > 0
    # /stats and /metrics answered meanwhile, with what this process knows
    status, body = during_stats
    assert status == 200, body
    doc = json.loads(body)
    assert doc["backlog"] > 0
    assert doc["store_unavailable"]
    assert doc["models"]["m"]["requests"] > 0
    status, body = during_metrics
    assert status == 200, body
    assert (backlog_gauge(body) or 0) > 0
    # the first /stats after the restart is the store's figures again
    status, body = first_stats
    assert status == 200, body
    assert "store_unavailable" not in json.loads(body)
    # caught up: nothing waiting, ready again, the store's figures in /stats
    assert after["backlog"] == 0 and "store_unavailable" not in after
    assert after["models"]["m"]["requests"] >= len(answered)
    assert final_readyz["store"]["backlog"] == 0, final_readyz
    assert not [r for r in final_readyz["reasons"] if "rows waiting" in r], final_readyz
    assert "Traceback" not in log, log[-3000:]
    assert proc.count("/stats cannot read the store") <= 1, log[-3000:]
    # the models' listener says the outage once per burst (not once per retry)
    assert proc.count("listening on wirekit_catalog") <= 2, log[-3000:]


# -- in process: the idle catch-up, a reader's broken connection ------------------------------


def test_a_store_catches_up_without_a_new_request_once_the_database_is_back(tmp_path, store_url):
    """The writes fail (the table renamed away, as a database that is down makes them): the
    rows wait in the journal (``backlog``); once the database is back the writer finds out
    by itself (nothing more is handed over), the event loop retires the journal at its word,
    and its replay brings the rows to the store -- no new request, no restart."""
    store = RequestStore(tmp_path / "i.db", url=store_url)

    def rename(old: str, new: str) -> None:
        rename_table(store_url or tmp_path / "i.db", old, new)

    def answer(rid: str) -> None:
        store.arrival(rid, "m", "c", 1.0, 3)
        store.completion(rid, "n/0/m", 1.5, "ok", 1, model="m", client="c", time_in=1.0, size=3)

    target = store_url or tmp_path / "i.db"

    def stored() -> list[tuple]:
        return sql(target, "SELECT id, status FROM requests ORDER BY id")

    answered = [("before", "ok"), ("during-1", "ok"), ("during-2", "ok")]
    # "queued" is not answered yet: it waits queued (a stop leaves it so, the next start
    # ends it lost)
    expected = [*answered, ("queued", "queued")]
    seen: dict[str, object] = {}  # the backlog at each step (the rows are checked first)

    async def main() -> None:
        store.open()
        answer("before")
        await store.flush()
        seen["before"] = getattr(store, "backlog", None)
        rename("requests", "requests_away")
        answer("during-1")
        answer("during-2")
        store.arrival("queued", "m", "c", 1.0, 3)  # still in flight
        with pytest.raises(RuntimeError, match="request store write failed"):
            await store.flush()
        seen["during"] = getattr(store, "backlog", None)
        rename("requests_away", "requests")
        until = time.monotonic() + 20.0  # generous: the rows end the wait
        while await asyncio.to_thread(stored) != expected and time.monotonic() < until:
            await asyncio.sleep(0.05)
        seen["rows"] = await asyncio.to_thread(stored)
        seen["after"] = getattr(store, "backlog", None)

    try:
        asyncio.run(main())
    finally:
        store.close()
    assert seen["rows"] == expected
    assert (seen["before"], seen["during"], seen["after"]) == (0, 3, 0)
    assert store.healed >= 2
    assert not list(tmp_path.glob("i.db.journal.*"))


def test_a_reader_whose_session_was_ended_reads_on_a_new_one(pg_url):
    """A PostgreSQL reader (``/stats``' connection) whose session the server ended -- as a
    restart of the server does -- reopens it and answers the read, rather than failing."""
    import psycopg

    db = open_db(pg_url)
    try:
        db.migrate()
        assert db.status_counts() == []
        pid = db.conn.info.backend_pid  # type: ignore[attr-defined]
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert db.status_counts() == []
        assert db.conn.info.backend_pid != pid  # type: ignore[attr-defined]
    finally:
        db.close()
