"""The requests store: one row per request, written in batches off the request path.

The rows go to a SQLite (WAL) file -- the embedded default -- or, with a ``postgresql://``
URL, to a PostgreSQL database that several ``wirekit serve`` replicas share (issue 17); the
database is behind :class:`~wirekit.serve.record.storedb.StoreDB`.  The request path never touches
the database.  Arrivals and completions are collected in a list on
the event loop and handed to a writer thread every ``flush_interval`` seconds (or when
``batch_max`` rows wait); the writer writes each hand-over in one transaction.

Durability without the store on the request path: with ``journal`` on (the default) each
completion is also appended to a journal file (``<store>.journal.<n>``, one JSON line, one
``write`` system call) *before* the client is answered, and each arrival *before* its
request is sent to a backend (an arrival record: the same line with no device, no time
out, status ``queued``; the arrivals of one read or loop pass in one ``write``).  A ``kill
-9`` cannot take back what was written to the kernel, so after a crash the next ``open()``
replays the journals into the database (by request id: nothing counted twice; an arrival
record only inserts a missing row, it never takes an answer back): every answered request
is in the store, and every request that reached a backend without an answer journaled is
``lost`` (reason "the dispatcher stopped before answering").  On a shared store the leader
may have ended such a row ``lost`` already (the replica's lease expired first): a journaled
answer replaces that (one row, by id: nothing counted twice), an arrival record leaves it.
Journals are deleted once the rows they hold are committed; after a failed write (the
database away), each journal is replayed when it is retired, and kept for the next start if
that fails too.  The journals are local files even when the rows go to
PostgreSQL: a replica that restarts with the same ``path`` replays its own.  (A power loss
can still take back the last moments; that needs fsync.)

A journal record that cannot be stored -- not JSON, not the shape of a journal line, text
that is not Unicode (a lone surrogate), a number out of range -- never stops ``open()``: it
is *quarantined*, appended to ``<store>.journal.quarantine`` (one JSON object per line: the
journal's name, the record's line number and byte offset, why, and the record itself), and
reported in one log line per journal; the other records are replayed.  (A last line cut
short by a crash is not a record: it was never answered, and is skipped.)  A journal that
cannot be read at all is left where it is, reported, and the start goes on.

A failed or errored request's row records why (``reason``).

Statuses: ``queued`` (waiting or being processed), ``ok``, ``error`` (the backend answered
with an error), ``failed`` (no device answered within the attempts), ``abandoned`` (the
client went away before its answer -- recorded at once, ``Dispatcher.abandoned``), ``lost``
(the dispatcher stopped before answering: set at the next start of the same replica, or by
the leader of a shared store once the replica's lease expired).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import itertools
import json
import math
import os
import queue
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from wirekit._impl import load_fast

from ..logs import serve_logger
from .storedb import (
    ABANDONED,
    DECISION_COLUMNS,
    ERROR,
    FAILED,
    LOST,
    OK,
    QUEUED,
    REPLAY_COLUMNS,
    RequestRow,
    StoreDB,
    StoreUnavailable,
    as_db,
    connect_sqlite,
    is_row_error,
    open_db,
    redact,
)

log = serve_logger()

__all__ = [
    "ABANDONED",
    "ERROR",
    "FAILED",
    "LOST",
    "OK",
    "QUEUED",
    "RequestRow",
    "RequestStore",
    "StoreDB",
    "StoreUnavailable",
    "connect",
    "read_rows",
]

_CHUNK = 32  # rows per INSERT statement (one statement, many rows: a quarter cheaper)
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


def _arrival_line(rid: str, names: str, time_in: str, size: Any, payload: Any) -> str:
    """An arrival's journal line: the completion line's shape with no device, no time out,
    status ``queued`` and 0 attempts (``names``: model, client and a null device, as
    :meth:`RequestStore._names` writes them).  Replayed, it only inserts a row that is
    missing: it never takes an answer back
    (:data:`~wirekit.serve.record.storedb.REPLAY_COLUMNS`)."""
    return (
        f"{_line_head(rid, names, time_in)}null,{_STATUS_JSON[QUEUED]},"
        f"{size if type(size) is int else _json_num(size)},0,{_json_blob(payload)}]\n"
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
    """A connection to a SQLite store file (created and migrated to the newest schema
    unless ``readonly``)."""
    return connect_sqlite(path, readonly=readonly)


def read_rows(conn: sqlite3.Connection | StoreDB) -> Iterator[RequestRow]:
    """Every row of the store, oldest first."""
    return as_db(conn).rows()


def journal_files(store: Path) -> list[Path]:
    """The journal files of the store file ``store`` (``<store>.journal.<n>``), oldest
    first."""
    found = []
    for p in store.parent.glob(store.name + ".journal.*"):
        suffix = p.name.rsplit(".", 1)[1]
        if suffix.isdigit():
            found.append((int(suffix), p))
    return [p for _n, p in sorted(found)]


#: the columns of a store row the readers of :func:`with_journals` see
_VIEW_COLUMNS = ", ".join(
    ("id", "model", "client", "device", "time_in", "time_out", "status", "payload_size",
     "attempts", "reason")
)  # fmt: skip


def with_journals(conn: sqlite3.Connection, store: Path) -> int:
    """Make ``conn`` -- a connection to the store file ``store``, read-only is enough --
    see the requests of the store's journals too, as the next start will replay them: the
    answers a dispatcher journaled but had not yet written when it was killed.  Nothing is
    written, to the file or to the journals: a temporary ``requests`` view joins the file's
    rows and the journals' (by id, as the replay does: a completion replaces the stored row,
    an arrival only fills in a missing one).  Returns how many answered requests the
    journals add or change; a journal that cannot be read is skipped (OSError)."""
    entries: list[tuple] = []
    for path in journal_files(store):
        with contextlib.suppress(OSError):
            entries.extend(e[3] for e in _read_journal(path)[0])
    if not entries:
        return 0
    columns = ", ".join(REPLAY_COLUMNS)
    conn.execute(f"CREATE TEMP TABLE journaled ({columns}, PRIMARY KEY (id))")
    conn.executemany(
        f"INSERT INTO journaled ({columns}) VALUES ({', '.join('?' * len(REPLAY_COLUMNS))})"
        " ON CONFLICT (id) DO UPDATE SET device = excluded.device,"
        " time_out = excluded.time_out, status = excluded.status,"
        " attempts = excluded.attempts, reason = COALESCE(excluded.reason, journaled.reason)"
        f" WHERE excluded.status <> '{QUEUED}'",
        entries,
    )
    answered = f"SELECT id FROM journaled WHERE status <> '{QUEUED}'"
    conn.execute(
        f"CREATE TEMP VIEW requests AS"
        f" SELECT {_VIEW_COLUMNS} FROM main.requests WHERE id NOT IN ({answered})"
        f" UNION ALL SELECT {_VIEW_COLUMNS} FROM journaled"
        f" WHERE status <> '{QUEUED}' OR id NOT IN (SELECT id FROM main.requests)"
    )
    (changed,) = conn.execute(
        "SELECT COUNT(*) FROM journaled j LEFT JOIN main.requests r ON r.id = j.id"
        f" WHERE j.status <> '{QUEUED}' AND (r.id IS NULL OR r.status IS NOT j.status)"
    ).fetchone()
    return int(changed)


class RequestStore:
    """The store with its writer thread.  ``open()`` before use, ``close()`` at the end.

    ``arrival`` and ``completion`` are meant to be called from one thread (the event loop's);
    they only append to a list (and, for a completion, to the journal).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        url: str | None = None,
        replica: str = "",
        payloads: bool = False,
        batch_max: int = 1024,
        journal: bool = True,
        flush_interval: float = 0.05,
        journal_max: int = 4 << 20,
    ) -> None:
        #: the SQLite file; with ``url``, the base name of this replica's local journals
        self.path = Path(path)
        #: a ``postgresql://`` URL: the rows go to that shared store instead of the file
        self.url = url
        #: this replica's name in the rows it writes (a restart abandons only its own
        #: unanswered rows); default ``<host>:<absolute path>``
        self.replica = replica or f"{socket.gethostname()}:{self.path.resolve()}"
        self.payloads = payloads
        self.batch_max = batch_max
        self.journal = journal
        self.flush_interval = flush_interval
        self.journal_max = journal_max
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._pending: list[tuple[int, tuple[Any, ...]]] = []
        self._reasons: list[tuple[str, str]] = []  # (why, id) of failed rows
        self._timer: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._db: StoreDB | None = None
        self._lockfd: int | None = None
        self._jfd: int | None = None
        self._jpath: Path | None = None
        self._jsize = 0
        self._jseq = 0
        self._jbuf: list[str] = []  # journal records not written yet (deferred)
        self._hex_of: float | None = None  # the last time written, and its text
        self._hex = ""
        self._jmemo: dict[tuple[str, str, str | None], str] = {}
        #: rows a previous run of this replica left queued, ended ``lost`` by ``open()``
        self.lost_at_open = 0
        self.lost_by_model: dict[str, int] = {}  #: the same per model
        self.replayed_at_open = 0  #: completions recovered from journals by ``open()``
        self.commits = 0  #: write transactions so far
        self.rows_written = 0  #: inserts + updates so far
        self.error: BaseException | None = None  #: the last write failure, if any
        #: the failure of the last write, None once a write succeeds (readiness)
        self.failing: BaseException | None = None
        #: on a shared store, the controller's lead (a LeaderLock): decisions are stored on
        #: its session (set by the service)
        self.leader: Any = None
        #: on a shared store, this replica's lease (a ReplicaLease, set by the service):
        #: taken by ``open()`` before the journals are replayed, so that every row this
        #: replica writes has a lease that either lives or is adopted by the leader
        self.lease: Any = None
        self.healed = 0  #: completions replayed from journals after a failed write
        self._dirty_upto = 0  # journals up to this number hold rows a failed write lost
        self._held: list[Path] = []  # retired journals not replayed yet (the writer's)

    @property
    def kind(self) -> str:
        """``"postgresql"`` for a shared store, ``"sqlite"`` for the embedded one."""
        return "postgresql" if self.url else "sqlite"

    @property
    def target(self) -> str:
        """Where the rows go, for messages (a URL without its password)."""
        return redact(self.url) if self.url else str(self.path)

    # -- life cycle ---------------------------------------------------------------------

    def open(self) -> None:
        """Open the database (migrated to the newest schema), take the :attr:`lease` (if
        any), replay the journals a crash left, end the rows a previous run of this replica
        left queued as ``lost``, and start the writer."""
        if self.url:
            self._lock_journals()
        self._db = db = self._open_db()
        try:
            db.migrate()
            if self.lease is not None:
                self.lease.renew()
            self.replayed_at_open = self._replay()
            self.lost_by_model = db.end_lost(time.time())
            self.lost_at_open = sum(self.lost_by_model.values())
        except BaseException:
            self.close()
            raise
        if self.journal:
            self._new_journal()
        self._thread = threading.Thread(target=self._run, name="wirekit-store", daemon=True)
        self._thread.start()

    def _open_db(self) -> StoreDB:
        return open_db(self.url or self.path, replica=self.replica, chunk=_CHUNK)

    def _lock_journals(self) -> None:
        """One replica per journal name: a second one with the same ``path`` would replay
        (and delete) the first one's journals.  An exclusive lock on ``<path>.lock``, held
        while open; the kernel drops it when the process dies."""
        lock = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreUnavailable(
                f"another wirekit serve replica uses the journal {self.path} "
                "(give each replica its own store.path)"
            ) from None
        self._lockfd = fd

    def write_problem(self) -> str | None:
        """Why rows cannot be written now (not open, the writer stopped, the last write
        failed), or None: what ``/readyz`` says of the store."""
        if self._db is None or self._thread is None:
            return "the request store is not open"
        if not self._thread.is_alive():
            return "the request store's writer stopped"
        failing = self.failing
        if failing is not None:
            return f"the last write to the request store failed: {failing}"
        return None

    def reader(self) -> StoreDB:
        """A separate connection for reading (the metrics' queries; WAL lets SQLite read
        while the writer writes).  The caller closes it."""
        return self._open_db()

    def close(self, timeout: float = 10.0) -> None:
        """Write what is waiting, stop the writer, remove the journal, close the database."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._thread is not None:
            ops, self._pending = self._pending, []
            reasons, self._reasons = self._reasons, []
            self._queue.put((_BATCH, ops, reasons, self._retire_journal(), None))
            self._queue.put((_STOP,))
            self._thread.join(timeout)
            self._thread = None
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._lockfd is not None:
            os.close(self._lockfd)
            self._lockfd = None

    # -- the request path: list appends and one journal write -----------------------------

    def arrival(
        self,
        rid: str,
        model: str,
        client: str,
        time_in: float,
        size: int,
        payload: Any = None,
        defer: bool = False,
    ) -> None:
        """Record a new request (status ``queued``).  With the journal on, this returns
        once its arrival record is written to the journal file: call it *before* the
        request leaves for a backend, so that after a ``kill -9`` the next start has its
        row -- unless ``defer``: then the caller calls :meth:`write_journal` before it
        sends (one system call for the arrivals of one loop pass)."""
        blob = bytes(payload) if self.payloads and payload is not None else None
        if self._jfd is not None:
            line = _arrival_line(
                rid, self._device_names(model, client, None), self._time(time_in), size, blob
            )
            self._jsize += len(line)
            self._jbuf.append(line)
            if not defer:
                self.write_journal()
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
        reason: str | None = None,
    ) -> None:
        """Record how a request ended (``reason``: why, when it did not end ``ok``).  With
        the journal on, this returns once the record is written to the journal file (safe
        from a crash of this process) -- unless
        ``defer``: then the record waits in memory, and the caller must call
        :meth:`write_journal` before it answers the client (so that the completions of one
        loop pass go out in one system call)."""
        self.complete(
            rid,
            model,
            client,
            device,
            time_in,
            time_out,
            status,
            size,
            attempts,
            payload,
            defer,
            reason,
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
        reason: str | None = None,
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
            if reason:
                reason = storable_text(reason)
                line = _with_reason(line, reason)
            self._jsize += len(line)
            self._jbuf.append(line)
            if not defer:
                self.write_journal()
        if reason:
            self._reasons.append((reason, rid))
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
        reason: str | None = None,
    ) -> None:
        """:meth:`complete` (deferred) with the journal line started by :meth:`line_head`
        (same id, device, size; the journal still on)."""
        line = _line_end(head, self._time(time_out), status, size, attempts, "null")
        if reason:
            reason = storable_text(reason)
            line = _with_reason(line, reason)
            self._reasons.append((reason, rid))
        self._jsize += len(line)
        self._jbuf.append(line)
        self._add(_COMPLETION, (device, time_out, status, attempts, rid))

    # -- the batch forms (the dispatcher's MIP lane: the requests of one read, the answers
    # -- of one flush) ------------------------------------------------------------------

    def arrivals(
        self, model: str, client: str, time_in: float, requests: list[tuple[str, int, Any]]
    ) -> None:
        """:meth:`arrival` of requests of ``model`` from ``client`` that arrived together at
        ``time_in``, each ``(id, size, request bytes)``.  With the journal on, their arrival
        records are written to it in one system call before this returns: call it before
        they are sent."""
        journal = self._jfd is not None
        lines, nbytes, ops = _arrival_records(
            requests,
            model,
            client,
            time_in,
            self._device_names(model, client, None) if journal else "",
            self._time(time_in) if journal else "",
            journal,
            self.payloads,
        )
        if journal:
            self._jsize += nbytes
            self._jbuf.extend(lines)
            self.write_journal()
        self._pending.extend(ops)
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
        reasons, self._reasons = self._reasons, []
        retire = None
        if self._jfd is not None and self._jsize >= self.journal_max:
            retire = self._retire_journal()
            self._new_journal()
        if ops or retire or fut is not None:
            self._queue.put((_BATCH, ops, reasons, retire, fut))

    # -- journals ------------------------------------------------------------------------

    def _journals(self) -> list[Path]:
        return journal_files(self.path)

    def _new_journal(self) -> None:
        self._jseq += 1
        self._jpath = self.path.with_name(f"{self.path.name}.journal.{self._jseq}")
        # rw-r--r-- (less what the umask takes), as SQLite creates the store file
        self._jfd = os.open(self._jpath, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
        self._jsize = 0

    def _retire_journal(self) -> Path | None:
        """Close the current journal; the writer deletes it once its rows are committed."""
        if self._jfd is None:
            return None
        self.write_journal()
        os.close(self._jfd)
        self._jfd = None
        return self._jpath

    @property
    def quarantine_path(self) -> Path:
        """Where the journal records that cannot be stored are kept
        (``<store>.journal.quarantine``)."""
        return self.path.with_name(f"{self.path.name}.journal.quarantine")

    def _replay(self) -> int:
        db = self._db
        assert db is not None
        count = 0
        replayed = []
        for path in self._journals():
            try:
                entries, bad = _read_journal(path)
            except OSError as exc:  # left where it is: the start goes on
                log.warning(
                    "wirekit serve: journal %s cannot be read, left in place: %s",
                    path,
                    exc.strerror or exc,
                )
                self._jseq = max(self._jseq, int(path.name.rsplit(".", 1)[1]))
                continue
            # keep a stored payload when the journal line has none; by id: a journal
            # replayed twice (a crash during the replay) counts nothing twice
            refused = _replay_entries(db, entries)
            self._quarantine(path, bad + refused)
            count += _completions(e[3] for e in entries) - _completions(b[3] for b in refused)
            replayed.append(path)
        for path in replayed:
            path.unlink()
        return count

    def _quarantine(self, journal: Path, bad: list[_BadRecord]) -> None:
        """Keep the records of ``journal`` that cannot be stored in :attr:`quarantine_path`
        (appended, one JSON line each) and report them in one log line."""
        if not bad:
            return
        bad.sort(key=lambda b: b[0])
        with open(self.quarantine_path, "ab") as fh:
            for line_no, offset, line, _row, why in bad:
                raw = line[:-1] if line.endswith(b"\n") else line  # the record, as written
                entry: dict[str, Any] = {
                    "journal": journal.name,
                    "line": line_no,
                    "offset": offset,
                    "error": why,
                    "record": raw.decode("utf-8", "backslashreplace"),
                }
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:  # the exact bytes too
                    entry["record_b64"] = base64.b64encode(raw).decode("ascii")
                fh.write(json.dumps(entry).encode("ascii") + b"\n")
        shown = "; ".join(f"line {b[0]} (byte {b[1]}): {b[4]}" for b in bad[:5])
        more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
        log.warning(
            "wirekit serve: journal %s: %d record(s) cannot be stored, quarantined to %s: %s%s",
            journal,
            len(bad),
            self.quarantine_path,
            shown,
            more,
        )

    def _settle_journal(self, db: StoreDB, path: Path) -> None:
        """A retired journal whose rows are committed: delete it.  When a write failed
        while it was open (the database was away), replay it first (by id: idempotent), so
        that what was answered meanwhile reaches the store once the database is back.  A
        journal whose replay fails too is held, and tried again at the next retirement
        (or replayed by the next start).  Its records that cannot be stored are
        quarantined, as at the start."""
        self._held.append(path)
        while self._held:
            held = self._held[0]
            try:
                if int(held.name.rsplit(".", 1)[1]) <= self._dirty_upto:
                    entries, bad = _read_journal(held)
                    refused = _replay_entries(db, entries)
                    self._quarantine(held, bad + refused)
                    self.healed += _completions(e[3] for e in entries) - _completions(
                        b[3] for b in refused
                    )
                held.unlink()
            except FileNotFoundError:
                pass
            except Exception as exc:
                self.error = exc
                return
            self._held.pop(0)

    # -- the writer thread --------------------------------------------------------------

    def _run(self) -> None:
        db = self._db
        assert db is not None
        get = self._queue.get
        while True:
            item = get()
            if item[0] == _STOP:
                return
            _kind, ops, reasons, retire, fut = item
            failed: BaseException | None = None
            if ops or reasons:
                chunks, rest, updates = _merge_ops(ops, db.chunk)
                try:
                    try:
                        db.write(chunks, rest, updates, reasons)
                    except Exception:  # once more: a shared store's connection may be reset
                        db.write(chunks, rest, updates, reasons)
                    self.commits += 1
                    self.rows_written += len(ops)
                    self.failing = None
                except BaseException as exc:  # keep going: the journal has the completions
                    self.error = self.failing = failed = exc
                    # the journals open until now hold completions that are not stored
                    self._dirty_upto = self._jseq
            if retire is not None:
                self._settle_journal(db, retire)
            if fut is not None:
                _resolve([fut], failed)

    # -- the controller's decisions (issue 16): a table of their own, rarely written --------

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
        fenced: bool = True,
    ) -> None:
        """Store one controller decision (its own short transaction, on its own connection:
        call it off the event loop, the controller does).  On a shared store with a
        :attr:`leader` lock, a ``fenced`` decision (the controller's own) goes on the lock's
        session: raises :class:`~wirekit.serve.record.pgsync.NotLeader`, storing nothing, without
        the lead.  An operator's decision (``fenced=False``) is stored from any replica."""
        values = (
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
            self.replica,
        )
        if fenced and self.leader is not None:
            marks = ", ".join(["%s"] * len(DECISION_COLUMNS))
            self.leader.execute(
                f"INSERT INTO decisions ({', '.join(DECISION_COLUMNS)}) VALUES ({marks})", values
            )
            return
        db = self._open_db()
        try:
            db.record_decision(values)
        finally:
            db.close()

    def decisions(self, limit: int = 100) -> list[dict[str, Any]]:
        """The last ``limit`` decisions, oldest first (``metrics`` parsed back)."""
        db = self._open_db()
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


#: a journal record that cannot be stored: (line number, byte offset, the line, its row
#: when it was read but the database refused it -- else None --, why)
_BadRecord = tuple[int, int, bytes, tuple | None, str]
#: a journal record read: (line number, byte offset, the line, its row)
_Entry = tuple[int, int, bytes, tuple]

_INT64 = (1 << 63) - 1
_INT32 = (1 << 31) - 1


def storable_text(text: str) -> str:
    """``text`` as every store can hold it: a character that is not a Unicode scalar value
    (a lone surrogate) or a NUL (PostgreSQL's text refuses it) written as its escape."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\x00") if "\x00" in text else text


def _kind_of(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _text_field(value: Any, what: str, *, null: bool = False) -> str | None:
    """A text field of a journal record, checked as the databases need it."""
    if value is None and null:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} is {_kind_of(value)}, not text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not Unicode text (it holds a lone surrogate)") from None
    if "\x00" in value:
        raise ValueError(f"{what} holds a NUL character")
    return value


def _time_field(value: Any, what: str) -> float:
    try:
        value = _from_journal_time(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what} is not a time") from None
    if not math.isfinite(value):
        raise ValueError(f"{what} is not a finite time")
    return value


def _count_field(value: Any, what: str, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise ValueError(f"{what} is not an integer from 0 to {hi}")
    return value


def journal_row(rec: Any) -> tuple:
    """One journal record (a parsed line) as a :data:`~wirekit.serve.record.storedb.REPLAY_COLUMNS`
    row, every field checked as the databases need it; ValueError saying which field is
    wrong otherwise."""
    if not isinstance(rec, list) or len(rec) not in (10, 11):
        raise ValueError("not a journal record (a list of 10 or 11 fields)")
    blob = rec[9]
    if blob is not None and not isinstance(blob, str):
        raise ValueError(f"payload is {_kind_of(blob)}, not base64 text")
    try:
        payload = base64.b64decode(blob, validate=True) if blob else None
    except ValueError:
        raise ValueError("payload is not base64") from None
    return (
        _text_field(rec[0], "id"),
        _text_field(rec[1], "model"),
        _text_field(rec[2], "client"),
        _text_field(rec[3], "device", null=True),
        _time_field(rec[4], "time in"),
        # an arrival record (status queued) has no time out
        None if rec[5] is None and rec[6] == QUEUED else _time_field(rec[5], "time out"),
        _text_field(rec[6], "status"),
        _count_field(rec[7], "size", _INT64),
        _count_field(rec[8], "attempts", _INT32),
        payload,
        _text_field(rec[10], "reason", null=True) if len(rec) > 10 else None,
    )


def _read_journal(path: Path) -> tuple[list[_Entry], list[_BadRecord]]:
    """The completions of a journal file, each with its position (line number, byte
    offset) and row (:func:`journal_row`), and the records that cannot be stored, with
    why.  A last line cut short by a crash (no line end) that does not parse is skipped:
    it was never answered."""
    entries: list[_Entry] = []
    bad: list[_BadRecord] = []
    offset = 0
    with open(path, "rb") as fh:
        for line_no, line in enumerate(fh, 1):
            start, offset = offset, offset + len(line)
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError) as exc:
                if not line.endswith(b"\n"):
                    continue  # torn by a crash
                why = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else "not JSON"
                bad.append((line_no, start, line, None, why))
                continue
            try:
                row = journal_row(rec)
            except ValueError as exc:
                bad.append((line_no, start, line, None, str(exc)))
                continue
            entries.append((line_no, start, line, row))
    return entries, bad


def _completions(rows: Iterator[tuple | None]) -> int:
    """How many of the journal ``rows`` are completions (not arrival records)."""
    return sum(1 for row in rows if row is not None and row[6] != QUEUED)


def _replay_entries(db: StoreDB, entries: list[_Entry]) -> list[_BadRecord]:
    """Replay ``entries`` in one transaction; if the database refuses one of them (a value
    it cannot hold: :func:`~wirekit.serve.record.storedb.is_row_error`), one by one, and return
    those it refuses, with why.  A database that is away raises."""
    if not entries:
        return []
    try:
        db.replay([e[3] for e in entries])
        return []
    except Exception as exc:
        if not is_row_error(exc):
            raise
    refused: list[_BadRecord] = []
    for line_no, offset, raw, row in entries:
        try:
            db.replay([row])
        except Exception as exc:
            if not is_row_error(exc):
                raise
            refused.append((line_no, offset, raw, row, f"the store refused it: {exc}"))
    return refused


def _with_reason(line: str, reason: str) -> str:
    """A journal line (``[...]\n``) with ``reason`` as its 11th field."""
    return f"{line[:-2]},{_encode_json_str(reason)}]\n"


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


def arrival_records(
    requests: list[tuple[str, int, Any]],
    model: str,
    client: str,
    time_in: float,
    names: str,
    tin: str,
    journal: bool,
    payloads: bool,
) -> tuple[list[str], int, list[tuple[int, tuple[Any, ...]]]]:
    """The journal lines (when ``journal``; :func:`_arrival_line`), their length and the
    arrival rows of :meth:`RequestStore.arrivals` (``names``: the journal text of model,
    client and a null device; ``tin``: that of ``time_in``).  Compiled twin:
    ``wirekit._fast.servelane.arrival_records``, which writes the same lines
    (tests/test_serve_lane.py checks)."""
    ops = []
    lines: list[str] = []
    nbytes = 0
    for rid, size, wire in requests:
        blob = None if not payloads or wire is None else bytes(wire)
        if journal:
            line = _arrival_line(rid, names, tin, size, blob)
            nbytes += len(line)
            lines.append(line)
        ops.append((_ARRIVAL, (rid, model, client, time_in, size, blob)))
    return lines, nbytes, ops


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
_arrival_records, _ok_records = arrival_records, ok_records
_fast = load_fast("servelane")
if _fast is not None:
    _merge_ops = _fast.merge_ops
    _fast.bind_store(_json_time, _json_num, _json_blob)
    _arrival_records, _ok_records = _fast.arrival_records, _fast.ok_records
