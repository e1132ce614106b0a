"""The requests store: one SQLite (WAL) row per request, written in batches off the request path.

The request path never touches SQLite.  Arrivals and completions are collected in a list on
the event loop and handed to a writer thread every ``flush_interval`` seconds (or when
``batch_max`` rows wait); the writer writes each hand-over in one transaction.

Durability without the store on the request path: with ``journal`` on (the default) each
completion is also appended to a journal file (``<store>.journal.<n>``, one JSON line, one
``write`` system call) *before* the client is answered.  A ``kill -9`` cannot take back what
was written to the kernel, so after a crash the next ``open()`` replays the journals into
SQLite: every answered request is in the store.  Journals are deleted once the rows they hold
are committed.  (A power loss can still take back the last moments; that needs fsync.)

Statuses: ``queued`` (waiting or being processed), ``ok``, ``error`` (the backend answered
with an error), ``failed`` (no device answered within the attempts), ``abandoned`` (the
dispatcher stopped before answering; set at the next start).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import queue
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from wirekit._impl import load_fast

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

_INSERT_ROW = (
    "INSERT INTO requests (id, model, client, time_in, payload_size, payload, device,"
    " time_out, status, attempts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_CHUNK = 32  # rows per INSERT statement (one statement, many rows: a quarter cheaper)
_INSERT_CHUNK = _INSERT_ROW + ", (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)" * (_CHUNK - 1)
_UPDATE = "UPDATE requests SET device = ?, time_out = ?, status = ?, attempts = ? WHERE id = ?"

_REPLAY = (
    "INSERT INTO requests (id, model, client, device, time_in, time_out, status, payload_size,"
    " attempts, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET device = excluded.device, time_out = excluded.time_out,"
    " status = excluded.status, attempts = excluded.attempts,"
    " payload = COALESCE(excluded.payload, requests.payload)"
)

_ARRIVAL, _COMPLETION, _BATCH, _STOP = 0, 1, 2, 3
_encode_json_str = json.encoder.encode_basestring_ascii  # '"..."', escaped, ASCII only
_STATUS_JSON = {v: _encode_json_str(v) for v in (QUEUED, OK, ERROR, FAILED, ABANDONED)}


def _json_time(value: Any) -> str:
    """A time for the journal: a finite float as its exact hex form in a JSON string."""
    if type(value) is float and value - value == 0:
        return f'"{value.hex()}"'
    return _json_num(value)


def _line_head(rid: str, names: str, time_in: str) -> str:
    """The start of a completion's journal line, ``[id, model, client, device, time in,``
    (``names`` from :meth:`RequestStore._names`, ``time_in`` from :func:`_json_time`).

    With :func:`_line_end`, the one encoder of the journal line ``[id, model, client,
    device, time in, time out, status, size, attempts, payload]``: times as exact hex floats
    in JSON strings (``"0x1.9a...p+30"``: several times cheaper to write than repr), read
    back with ``float.fromhex`` by :meth:`RequestStore._replay`; the payload base64 or null.
    """
    return f"[{_encode_json_str(rid)},{names}{time_in},"


def _line_end(head: str, time_out: str, status: str, size: Any, attempts: Any, blob: str) -> str:
    """The whole journal line from its :func:`_line_head` (``time_out`` from
    :func:`_json_time`, ``blob`` from :func:`_json_blob`)."""
    return (
        f"{head}{time_out},{_STATUS_JSON.get(status) or _encode_json_str(status)},"
        f"{size if type(size) is int else _json_num(size)},"
        f"{attempts if type(attempts) is int else _json_num(attempts)},{blob}]\n"
    )


def _json_blob(payload: Any) -> str:
    """The journal's payload field: base64 in a JSON string, or null."""
    if payload is None:
        return "null"
    return '"' + base64.b64encode(payload).decode("ascii") + '"'


def _from_journal_time(value: Any) -> Any:
    return float.fromhex(value) if isinstance(value, str) else value


def _json_num(value: Any) -> str:
    """JSON text of a number, as ``json.dumps`` writes it (a fast path for finite floats)."""
    cls = type(value)
    if cls is int or (cls is float and value - value == 0):
        return repr(value)
    return json.dumps(value)


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
    """The store with its writer thread.  ``open()`` before use, ``close()`` at the end.

    ``arrival`` and ``completion`` are meant to be called from one thread (the event loop's);
    they only append to a list (and, for a completion, to the journal).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        payloads: bool = False,
        batch_max: int = 1024,
        journal: bool = True,
        flush_interval: float = 0.05,
        journal_max: int = 4 << 20,
    ) -> None:
        self.path = Path(path)
        self.payloads = payloads
        self.batch_max = batch_max
        self.journal = journal
        self.flush_interval = flush_interval
        self.journal_max = journal_max
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._pending: list[tuple[int, tuple[Any, ...]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._jfd: int | None = None
        self._jpath: Path | None = None
        self._jsize = 0
        self._jseq = 0
        self._jbuf: list[str] = []  # journal records not written yet (deferred)
        self._hex_of: float | None = None  # the last time written, and its text
        self._hex = ""
        self._jmemo: dict[tuple[str, str, str | None], str] = {}
        self.abandoned_at_open = 0
        self.replayed_at_open = 0  #: completions recovered from journals by ``open()``
        self.commits = 0  #: write transactions so far
        self.rows_written = 0  #: inserts + updates so far
        self.error: BaseException | None = None  #: the last write failure, if any

    # -- life cycle ---------------------------------------------------------------------

    def open(self) -> None:
        """Create or open the file, replay journals a crash left, mark the rows a previous
        run left queued as abandoned, and start the writer."""
        self._conn = connect(self.path)
        self.replayed_at_open = self._replay()
        cur = self._conn.execute(
            "UPDATE requests SET status = ? WHERE status = ?", (ABANDONED, QUEUED)
        )
        self.abandoned_at_open = cur.rowcount
        if self.journal:
            self._new_journal()
        self._thread = threading.Thread(target=self._run, name="wirekit-store", daemon=True)
        self._thread.start()

    def reader(self) -> sqlite3.Connection:
        """A separate connection for reading (WAL lets it read while the writer writes)."""
        return connect(self.path)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is waiting, stop the writer, remove the journal, close the file."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._thread is not None:
            ops, self._pending = self._pending, []
            self._queue.put((_BATCH, ops, self._retire_journal(), None))
            self._queue.put((_STOP,))
            self._thread.join(timeout)
            self._thread = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the request path: list appends and one journal write -----------------------------

    def arrival(
        self, rid: str, model: str, client: str, time_in: float, size: int, payload: Any = None
    ) -> None:
        """Record a new request (status ``queued``)."""
        blob = bytes(payload) if self.payloads and payload is not None else None
        self._add(_ARRIVAL, (rid, model, client, time_in, size, blob))

    def completion(
        self,
        rid: str,
        device: str | None,
        time_out: float,
        status: str,
        attempts: int,
        *,
        model: str,
        client: str,
        time_in: float,
        size: int,
        payload: Any = None,
        defer: bool = False,
    ) -> None:
        """Record how a request ended.  With the journal on, this returns once the record
        is written to the journal file (safe from a crash of this process) -- unless
        ``defer``: then the record waits in memory, and the caller must call
        :meth:`write_journal` before it answers the client (so that the completions of one
        loop pass go out in one system call)."""
        self.complete(
            rid, model, client, device, time_in, time_out, status, size, attempts, payload, defer
        )

    def complete(
        self,
        rid: str,
        model: str,
        client: str,
        device: str | None,
        time_in: float,
        time_out: float,
        status: str,
        size: int,
        attempts: int,
        payload: Any = None,
        defer: bool = False,
    ) -> None:
        """:meth:`completion` with every argument positional, in the order of the journal
        line (the dispatcher's per-request path)."""
        if self._jfd is not None:
            key = (model, client, device)
            names = self._jmemo.get(key)
            if names is None:
                names = self._names(key)
            line = _line_end(
                _line_head(rid, names, self._time(time_in)),
                self._time(time_out),
                status,
                size,
                attempts,
                _json_blob(payload if self.payloads else None),
            )
            self._jsize += len(line)
            self._jbuf.append(line)
            if not defer:
                self.write_journal()
        self._add(_COMPLETION, (device, time_out, status, attempts, rid))

    def line_head(
        self, rid: str, model: str, client: str, device: str | None, time_in: float, size: int
    ) -> str | None:
        """The start of a completion's journal line, made ahead (while the request is with
        its backend) for :meth:`complete_head`; None when that shortcut does not apply."""
        if self._jfd is None or self.payloads:
            return None
        key = (model, client, device)
        names = self._jmemo.get(key)
        if names is None:
            names = self._names(key)
        return _line_head(rid, names, self._time(time_in))

    def complete_head(
        self,
        head: str,
        rid: str,
        device: str | None,
        time_out: float,
        status: str,
        size: int,
        attempts: int,
    ) -> None:
        """:meth:`complete` (deferred) with the journal line started by :meth:`line_head`
        (same id, device, size; the journal still on)."""
        line = _line_end(head, self._time(time_out), status, size, attempts, "null")
        self._jsize += len(line)
        self._jbuf.append(line)
        self._add(_COMPLETION, (device, time_out, status, attempts, rid))

    # -- the batch forms (the dispatcher's MIP lane: the requests of one read, the answers
    # -- of one flush) ------------------------------------------------------------------

    def arrivals(
        self, model: str, client: str, time_in: float, requests: list[tuple[str, int, Any]]
    ) -> None:
        """:meth:`arrival` of requests of ``model`` from ``client`` that arrived together at
        ``time_in``, each ``(id, size, request bytes)``."""
        self._pending.extend(_arrival_ops(requests, model, client, time_in, self.payloads))
        self._kick()

    def completions_ok(
        self,
        model: str,
        client: str,
        time_out: float,
        answers: list[tuple[str, str, float, int, int, Any]],
    ) -> None:
        """:meth:`complete` (deferred: :meth:`write_journal` before the answers go out) of
        requests of ``model`` from ``client`` answered ``ok`` at ``time_out``, each ``(id,
        device, time in, size, attempts, request bytes)``."""
        journal = self._jfd is not None
        lines, nbytes, ops = _ok_records(
            answers,
            time_out,
            self._time(time_out) if journal else "",
            partial(self._device_names, model, client),
            journal,
            self.payloads,
        )
        if lines:
            self._jbuf.extend(lines)
            self._jsize += nbytes
        self._pending.extend(ops)
        self._kick()

    def _device_names(self, model: str, client: str, device: str | None) -> str:
        """:meth:`_names` of ``(model, client, device)``, memoised."""
        key = (model, client, device)
        names = self._jmemo.get(key)
        return names if names is not None else self._names(key)

    def _time(self, value: Any) -> str:
        """:func:`_json_time`, remembering the last time (the requests of one read, and the
        answers of one flush, share theirs)."""
        if value is not self._hex_of:
            self._hex_of, self._hex = value, _json_time(value)
        return self._hex

    def _names(self, key: tuple[str, str, str | None]) -> str:
        """The JSON text of model, client and device, each followed by a comma (memoised:
        they repeat)."""
        text = "".join(f"{self._json_str(v)}," for v in key)
        memo = self._jmemo
        if len(memo) < 4096:
            memo[key] = text
        return text

    def write_journal(self) -> None:
        """Write the deferred journal records (one system call); a no-op when none wait."""
        buf = self._jbuf
        if not buf or self._jfd is None:
            return
        data = memoryview(("".join(buf) if len(buf) > 1 else buf[0]).encode("ascii"))
        buf.clear()
        while data:
            data = data[os.write(self._jfd, data) :]

    def _json_str(self, value: str | None) -> str:
        """JSON text of a string, or null."""
        if value is None:
            return "null"
        return _encode_json_str(value)

    async def flush(self) -> None:
        """Hand everything over now and wait until it is committed."""
        fut = asyncio.get_running_loop().create_future()
        self._handoff(fut)
        await fut

    # -- hand-over to the writer -------------------------------------------------------

    def _add(self, kind: int, row: tuple[Any, ...]) -> None:
        """Queue a row for the writer: hand over a full batch, or arm the flush timer."""
        self._pending.append((kind, row))
        self._kick()

    def _kick(self) -> None:
        """Rows were queued: hand over a full batch, or arm the flush timer."""
        if len(self._pending) >= self.batch_max:
            self._handoff()
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop: hand over at once
                self._handoff()
                return
            self._timer = loop.call_later(self.flush_interval, self._handoff)

    def _handoff(self, fut: asyncio.Future[None] | None = None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        ops, self._pending = self._pending, []
        retire = None
        if self._jfd is not None and self._jsize >= self.journal_max:
            retire = self._retire_journal()
            self._new_journal()
        if ops or retire or fut is not None:
            self._queue.put((_BATCH, ops, retire, fut))

    # -- journals ------------------------------------------------------------------------

    def _journals(self) -> list[Path]:
        found = []
        for p in self.path.parent.glob(self.path.name + ".journal.*"):
            suffix = p.name.rsplit(".", 1)[1]
            if suffix.isdigit():
                found.append((int(suffix), p))
        return [p for _n, p in sorted(found)]

    def _new_journal(self) -> None:
        self._jseq += 1
        self._jpath = self.path.with_name(f"{self.path.name}.journal.{self._jseq}")
        self._jfd = os.open(self._jpath, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC)
        self._jsize = 0

    def _retire_journal(self) -> Path | None:
        """Close the current journal; the writer deletes it once its rows are committed."""
        if self._jfd is None:
            return None
        self.write_journal()
        os.close(self._jfd)
        self._jfd = None
        return self._jpath

    def _replay(self) -> int:
        conn = self._conn
        assert conn is not None
        count = 0
        journals = self._journals()
        for path in journals:
            rows = []
            with open(path, "rb") as fh:
                for line in fh:
                    try:
                        rec = json.loads(line)
                        rid, model, client, device, t_in, t_out, status, size, att, blob = rec
                        t_in, t_out = _from_journal_time(t_in), _from_journal_time(t_out)
                    except ValueError:
                        continue  # a line cut short by the crash: it was never answered
                    payload = base64.b64decode(blob) if blob else None
                    rows.append(
                        (rid, model, client, device, t_in, t_out, status, size, att, payload)
                    )
            conn.execute("BEGIN")
            for row in rows:
                # keep a stored payload when the journal line has none
                conn.execute(_REPLAY, row)
            conn.execute("COMMIT")
            count += len(rows)
        for path in journals:
            path.unlink()
        return count

    # -- the writer thread --------------------------------------------------------------

    def _run(self) -> None:
        conn = self._conn
        assert conn is not None
        get = self._queue.get
        while True:
            item = get()
            if item[0] == _STOP:
                return
            _kind, ops, retire, fut = item
            try:
                if ops:
                    chunks, rest, updates = _merge_ops(ops, _CHUNK)
                    conn.execute("BEGIN")
                    _insert(conn, chunks, rest)
                    if updates:
                        conn.executemany(_UPDATE, updates)
                    conn.execute("COMMIT")
                    self.commits += 1
                    self.rows_written += len(ops)
                if retire is not None:
                    with contextlib.suppress(OSError):
                        retire.unlink()
            except BaseException as exc:  # keep going: the journal still has completions
                self.error = exc
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if fut is not None:
                    _resolve([fut], exc)
                continue
            if fut is not None:
                _resolve([fut], None)

    # -- the controller's decisions (issue 16): a table of their own, rarely written --------

    DECISIONS_SCHEMA = """
    CREATE TABLE IF NOT EXISTS decisions (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        time         REAL NOT NULL,     -- unix time, seconds
        node         TEXT NOT NULL,
        device       INTEGER NOT NULL,
        device_type  TEXT NOT NULL,     -- CPU or GPU
        model        TEXT NOT NULL,
        old          REAL NOT NULL,     -- quota before
        new          REAL NOT NULL,     -- quota asked for
        status       TEXT NOT NULL,     -- applied, failed (rolled back) or refused
        reason       TEXT NOT NULL,
        error        TEXT,
        metrics      TEXT NOT NULL      -- JSON: what the policy saw
    );
    """

    def record_decision(
        self,
        *,
        time: float,
        node: str,
        device: int,
        device_type: str,
        model: str,
        old: float,
        new: float,
        status: str,
        reason: str,
        error: str | None,
        metrics: dict[str, Any],
    ) -> None:
        """Store one controller decision (its own short transaction, on its own connection:
        call it off the event loop, the controller does)."""
        conn = connect(self.path)
        try:
            conn.executescript(self.DECISIONS_SCHEMA)
            conn.execute(
                "INSERT INTO decisions (time, node, device, device_type, model, old, new,"
                " status, reason, error, metrics) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    time,
                    node,
                    device,
                    device_type,
                    model,
                    old,
                    new,
                    status,
                    reason,
                    error,
                    json.dumps(metrics, sort_keys=True),
                ),
            )
        finally:
            conn.close()

    def decisions(self, limit: int = 100) -> list[dict[str, Any]]:
        """The last ``limit`` decisions, oldest first (``metrics`` parsed back)."""
        conn = connect(self.path)
        try:
            conn.executescript(self.DECISIONS_SCHEMA)
            cur = conn.execute(
                "SELECT time, node, device, device_type, model, old, new, status, reason,"
                " error, metrics FROM decisions ORDER BY id DESC LIMIT ?",
                (limit,),
            )
            names = [c[0] for c in cur.description]
            rows = [dict(zip(names, row, strict=True)) for row in cur]
        finally:
            conn.close()
        for row in rows:
            row["metrics"] = json.loads(row["metrics"])
        return rows[::-1]


def _insert(conn: sqlite3.Connection, chunks: list[tuple], rest: list[tuple]) -> None:
    """INSERT the rows :func:`merge_ops` made: :data:`_CHUNK` per statement, then the rest."""
    if chunks:
        conn.executemany(_INSERT_CHUNK, chunks)
    if rest:
        conn.executemany(_INSERT_ROW, rest)


def merge_ops(
    ops: list[tuple[int, tuple[Any, ...]]], chunk: int
) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """One hand-over as statements: a request that arrived and finished within it becomes
    one complete INSERT row (not an INSERT and an UPDATE); other arrivals are inserted queued,
    in arrival order; completions of earlier arrivals are UPDATEs.  Returns the INSERT rows
    ``chunk`` at a time, flattened (one tuple per many-row statement), the rows left over,
    and the UPDATEs.  (Compiled twin: ``wirekit._fast.servelane.merge_ops``.)"""
    rows: dict[str, tuple] = {}
    updates = []
    for kind, row in ops:
        if kind == _ARRIVAL:
            rows[row[0]] = (*row, None, None, QUEUED, 0)
        else:
            device, time_out, status, attempts, rid = row
            arrived = rows.get(rid)
            if arrived is not None:
                rows[rid] = (*arrived[:6], device, time_out, status, attempts)
            else:
                updates.append(row)
    inserts = list(rows.values())
    full = len(inserts) - len(inserts) % chunk
    chunks = [
        tuple(itertools.chain.from_iterable(inserts[i : i + chunk])) for i in range(0, full, chunk)
    ]
    return chunks, inserts[full:], updates


_merge_ops = merge_ops  # the compiled twin when built (bound at the end of the module)


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


def arrival_ops(
    requests: list[tuple[str, int, Any]], model: str, client: str, time_in: float, payloads: bool
) -> list[tuple[int, tuple[Any, ...]]]:
    """The arrival rows of :meth:`RequestStore.arrivals` (its compiled twin:
    ``wirekit._fast.servelane.arrival_ops``)."""
    if payloads:
        return [
            (_ARRIVAL, (rid, model, client, time_in, size, None if wire is None else bytes(wire)))
            for rid, size, wire in requests
        ]
    return [(_ARRIVAL, (rid, model, client, time_in, size, None)) for rid, size, _wire in requests]


def ok_records(
    answers: list[tuple[str, str, float, int, int, Any]],
    time_out: float,
    tout: str,
    names_of: Any,
    journal: bool,
    payloads: bool,
) -> tuple[list[str], int, list[tuple[int, tuple[Any, ...]]]]:
    """The journal lines (when ``journal``), their length and the completion rows of
    :meth:`RequestStore.completions_ok` (``tout``: the journal text of ``time_out``;
    ``names_of(device)``: the journal text of model, client and device).  Compiled twin:
    ``wirekit._fast.servelane.ok_records``, which writes the same lines
    (tests/test_serve_lane.py checks)."""
    lines: list[str] = []
    nbytes = 0
    if journal:
        names: dict[str, str] = {}
        last: Any = None
        tin = ""
        for rid, device, t_in, size, attempts, wire in answers:
            text = names.get(device)
            if text is None:
                text = names[device] = names_of(device)
            if t_in is not last:  # the requests of one read share their time
                last, tin = t_in, _json_time(t_in)
            line = _line_end(
                _line_head(rid, text, tin),
                tout,
                OK,
                size,
                attempts,
                _json_blob(wire if payloads else None),
            )
            nbytes += len(line)
            lines.append(line)
    ops = [
        (_COMPLETION, (device, time_out, OK, attempts, rid))
        for rid, device, _t, _size, attempts, _wire in answers
    ]
    return lines, nbytes, ops


# the compiled twins when built
_arrival_ops, _ok_records = arrival_ops, ok_records
_fast = load_fast("servelane")
if _fast is not None:
    _merge_ops = _fast.merge_ops
    _fast.bind_store(_json_time, _json_num, _json_blob)
    _arrival_ops, _ok_records = _fast.arrival_ops, _fast.ok_records
