"""The requests store: one SQLite (WAL) row per request, written in batches off the request path.

The request path only puts a tuple on a queue; a writer thread drains the queue and writes
everything waiting in one transaction.  A completion can carry an asyncio future that is
resolved once its row is committed, so a dispatcher can answer a client only after the request
is on disk (``durable_ack``): after a ``kill -9`` every answered request is in the store.
Commits under concurrency cover many requests at once (group commit), so the store is not the
bottleneck.  WAL mode with ``synchronous=NORMAL`` survives the death of the process; only a
power loss can take back the last commits.

Statuses: ``queued`` (waiting or being processed), ``ok``, ``error`` (the backend answered
with an error), ``failed`` (no device answered within the attempts), ``abandoned`` (the
dispatcher stopped before answering; set at the next start).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id            TEXT PRIMARY KEY,
    model         TEXT NOT NULL,
    client        TEXT NOT NULL,
    device        TEXT,             -- node/device/model that answered; 'cache' for a cache hit
    time_in       REAL NOT NULL,    -- unix time, seconds
    time_out      REAL,             -- NULL while queued
    status        TEXT NOT NULL,
    payload_size  INTEGER NOT NULL, -- bytes of the request (its MIP encoding)
    attempts      INTEGER NOT NULL DEFAULT 0,
    payload       BLOB              -- the request itself, when store.payloads is on
);
CREATE INDEX IF NOT EXISTS requests_model_status ON requests (model, status);
"""

QUEUED, OK, ERROR, FAILED, ABANDONED = "queued", "ok", "error", "failed", "abandoned"

_INSERT = (
    "INSERT INTO requests (id, model, client, time_in, status, payload_size, payload)"
    " VALUES (?, ?, ?, ?, 'queued', ?, ?)"
)
_UPDATE = "UPDATE requests SET device = ?, time_out = ?, status = ?, attempts = ? WHERE id = ?"

_ARRIVAL, _COMPLETION, _MARK, _STOP = 0, 1, 2, 3


def connect(path: str | Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection to a store file (created with the schema unless ``readonly``)."""
    if readonly:
        uri = Path(path).resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        return conn
    conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(SCHEMA)
    return conn


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One row of the store, as read back."""

    id: str
    model: str
    client: str
    device: str | None
    time_in: float
    time_out: float | None
    status: str
    payload_size: int
    attempts: int

    @property
    def response_time(self) -> float | None:
        return None if self.time_out is None else self.time_out - self.time_in


def read_rows(conn: sqlite3.Connection) -> Iterator[RequestRow]:
    """Every row of the store, oldest first."""
    cur = conn.execute(
        "SELECT id, model, client, device, time_in, time_out, status, payload_size, attempts"
        " FROM requests ORDER BY time_in, rowid"
    )
    for row in cur:
        yield RequestRow(*row)


class RequestStore:
    """The store with its writer thread.  ``open()`` before use, ``close()`` at the end."""

    def __init__(self, path: str | Path, *, payloads: bool = False, batch_max: int = 1024):
        self.path = Path(path)
        self.payloads = payloads
        self.batch_max = batch_max
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self.abandoned_at_open = 0
        self.commits = 0  #: write transactions so far
        self.rows_written = 0  #: inserts + updates so far
        self.error: BaseException | None = None  #: what stopped the writer, if anything

    def open(self) -> None:
        """Create or open the file, mark the rows a previous run left queued as abandoned,
        and start the writer."""
        self._conn = connect(self.path)
        cur = self._conn.execute(
            "UPDATE requests SET status = ? WHERE status = ?", (ABANDONED, QUEUED)
        )
        self.abandoned_at_open = cur.rowcount
        self._thread = threading.Thread(target=self._run, name="wirekit-store", daemon=True)
        self._thread.start()

    def reader(self) -> sqlite3.Connection:
        """A separate connection for reading (WAL lets it read while the writer writes)."""
        return connect(self.path)

    # -- the request path: only queue puts -----------------------------------------------

    def arrival(
        self, rid: str, model: str, client: str, time_in: float, size: int, payload: Any = None
    ) -> None:
        """Queue the insert of a new request (status ``queued``)."""
        blob = bytes(payload) if self.payloads and payload is not None else None
        self._queue.put((_ARRIVAL, (rid, model, client, time_in, size, blob)))

    def completion(
        self,
        rid: str,
        device: str | None,
        time_out: float,
        status: str,
        attempts: int,
        done: asyncio.Future[None] | None = None,
    ) -> None:
        """Queue the completion of a request; ``done`` is resolved once it is committed."""
        self._queue.put((_COMPLETION, (device, time_out, status, attempts, rid), done))

    async def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        fut = asyncio.get_running_loop().create_future()
        self._queue.put((_MARK, None, fut))
        await fut

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, stop the writer and close the file."""
        if self._thread is not None:
            self._queue.put((_STOP,))
            self._thread.join(timeout)
            self._thread = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the writer thread --------------------------------------------------------------

    def _run(self) -> None:
        conn = self._conn
        assert conn is not None
        get = self._queue.get
        get_nowait = self._queue.get_nowait
        stop = False
        while not stop:
            batch = [get()]
            try:
                while len(batch) < self.batch_max:
                    batch.append(get_nowait())
            except queue.Empty:
                pass
            waiters: list[asyncio.Future[None]] = []
            try:
                conn.execute("BEGIN")
                for op in batch:
                    kind = op[0]
                    if kind == _ARRIVAL:
                        conn.execute(_INSERT, op[1])
                        self.rows_written += 1
                    elif kind == _COMPLETION:
                        conn.execute(_UPDATE, op[1])
                        self.rows_written += 1
                        if op[2] is not None:
                            waiters.append(op[2])
                    elif kind == _MARK:
                        waiters.append(op[2])
                    else:
                        stop = True
                conn.execute("COMMIT")
                self.commits += 1
            except BaseException as exc:  # keep answering: waiters learn of the failure
                self.error = exc
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                _resolve(waiters, exc)
                continue
            _resolve(waiters, None)


def _resolve(waiters: list[asyncio.Future[None]], exc: BaseException | None) -> None:
    """Resolve futures from the writer thread, one loop callback per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for fut in waiters:
        by_loop.setdefault(fut.get_loop(), []).append(fut)
    for loop, futs in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(_settle, futs, exc)


def _settle(futs: list[asyncio.Future[None]], exc: BaseException | None) -> None:
    for fut in futs:
        if not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(RuntimeError(f"request store write failed: {exc}"))
