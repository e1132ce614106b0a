"""The requests store: one row per request, written in batches off the request path.

The rows go to a SQLite (WAL) file -- the embedded default -- or, with a ``postgresql://``
URL, to a PostgreSQL database that several ``wirekit serve`` replicas share (issue 17); the
database is behind :class:`~wirekit.serve.record.storedb.StoreDB`.  The request path never
touches the database.  Arrivals and completions are collected in a list on the event loop
and handed to the writer thread (:mod:`.writer`) every ``flush_interval`` seconds (or when
``batch_max`` rows wait); the writer writes each hand-over in one transaction.

Durability without the store on the request path: with ``journal`` on (the default) each
completion is also appended to a journal file (``<store>.journal.<n>``, one JSON line, one
``write`` system call; the record is declared in :mod:`.journal`) *before* the client is
answered, and each arrival *before* its request is sent to a backend (an arrival record: the
same line with no device, no time out, status ``queued``; the arrivals of one read or loop
pass in one ``write``).  A ``kill -9`` cannot take back what was written to the kernel, so
after a crash the next ``open()`` replays the journals into the database (by request id:
nothing counted twice; an arrival record only inserts a missing row, it never takes an
answer back): every answered request is in the store, and every request that reached a
backend without an answer journaled is ``lost`` (reason "the dispatcher stopped before
answering").  On a shared store the leader may have ended such a row ``lost`` already (the
replica's lease expired first): a journaled answer replaces that (one row, by id: nothing
counted twice), an arrival record leaves it.  Journals are deleted once the rows they hold
are committed; after a failed write (the database away), the journals open meanwhile are
replayed as soon as writes succeed again (:mod:`.writer`: the loop retires the journal open
then at the writer's word; :attr:`RequestStore.backlog` counts the rows waiting), and kept
for the next start if the process stops first.  The journals are local files even
when the rows go to PostgreSQL: a replica that restarts with the same ``path`` replays its
own.  (A power loss can still take back the last moments; that needs fsync.)  A record that
cannot be stored is quarantined (see :mod:`.replay`).

A full disk (or any failure to write the journal: ENOSPC, EDQUOT, EIO) is a refusal, not a
crash: :meth:`RequestStore.write_journal` writes its records whole or not at all -- a write
that fails part way is cut back (``ftruncate``) to where it started, so the next record never
lands on a torn one -- and raises :class:`JournalUnavailable`.  A request whose arrival it
could not journal is not sent anywhere: the dispatcher ends it ``failed`` at once (its row
goes to the store through the writer, without the journal) and the door answers 503 (see
:meth:`~wirekit.serve.dispatch.dispatcher.Dispatcher.journal_refused`).  A completion that
could not be journaled is answered all the same.  When the database cannot be written
either (it is on the same full disk), the writer keeps such rows -- in no journal -- in
memory and writes them once it can (:mod:`.writer`, "Rows in no journal").  Journaling
resumes by itself at the next write once there is room (specs/journal.md, "A full disk").

A failed or errored request's row records why (``reason``).

Statuses: ``queued`` (waiting or being processed), ``ok``, ``error`` (the backend answered
with an error), ``failed`` (no device answered within the attempts), ``abandoned`` (the
client went away before its answer -- recorded at once, ``Dispatcher.abandoned``), ``lost``
(the dispatcher stopped before answering: set at the next start of the same replica, or by
the leader of a shared store once the replica's lease expired).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sqlite3
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from .decisions import CONTROLLER, QUOTA, read_decisions, store_decision
from .journal import (
    ARRIVAL,
    COMPLETION,
    arrival_line,
    arrivals_writer,
    json_blob,
    json_time,
    line_end,
    line_head,
    names_text,
    ok_writer,
    storable_text,
)
from .replay import lock_journals, quarantine_path, replay_journals
from .storedb import (
    ABANDONED,
    ERROR,
    FAILED,
    LOST,
    OK,
    QUEUED,
    RequestRow,
    StoreDB,
    StoreUnavailable,
    as_db,
    connect_sqlite,
    open_db,
    redact,
)
from .writer import Writer

__all__ = [
    "ABANDONED",
    "ERROR",
    "FAILED",
    "LOST",
    "OK",
    "QUEUED",
    "JournalUnavailable",
    "RequestRow",
    "RequestStore",
    "StoreDB",
    "StoreUnavailable",
    "connect",
    "read_rows",
]

_CHUNK = 32  # rows per INSERT statement (one statement, many rows: a quarter cheaper)


class JournalUnavailable(StoreUnavailable):
    """The journal cannot be written now (a full disk, a quota, an I/O error): the records
    of that write were not written (none of them: the file was cut back to where the write
    started).  Raised by :meth:`RequestStore.write_journal` (and by the methods that write
    the journal at once); a request whose arrival was in that write must not be sent."""

    def __init__(self, path: Path | None, cause: OSError) -> None:
        self.path = path
        self.cause = cause
        #: why, for a client (no path): the system's words, e.g. "No space left on device"
        self.why = cause.strerror or type(cause).__name__
        super().__init__(f"the request journal {path} cannot be written: {self.why}")


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Any) -> None:
    """``callback`` on ``loop`` from another thread (nothing once the loop is closed)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)


def connect(path: str | Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection to a SQLite store file (created and migrated to the newest schema
    unless ``readonly``)."""
    return connect_sqlite(path, readonly=readonly)


def read_rows(conn: sqlite3.Connection | StoreDB) -> Iterator[RequestRow]:
    """Every row of the store, oldest first."""
    return as_db(conn).rows()


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
        self._pending: list[tuple[int, tuple[Any, ...]]] = []
        self._reasons: list[tuple[str, str]] = []  # (why, id) of failed rows
        self._timer: asyncio.TimerHandle | None = None
        #: the writer thread, and what it has done
        self.writer = Writer(self.path, lambda: self._jseq, journal=journal)
        self._db: StoreDB | None = None
        self._lockfd: int | None = None
        self._jfd: int | None = None
        self._jpath: Path | None = None
        self._jsize = 0
        self._jseq = 0
        self._jbuf: list[str] = []  # journal records not written yet (deferred)
        #: journal writes that failed so far (:class:`JournalUnavailable`): a request whose
        #: arrival was recorded when this had another value may not have it journaled
        self.journal_failures = 0
        #: the failure of the last journal write, None once one succeeds (readiness)
        self.journal_failing: JournalUnavailable | None = None
        self._jtorn = False  # a failed write could not be cut back: a new journal next
        self._jdropped = False  # a journal write failed since the last hand-over
        self._jneed = 1  # the size of the last write that failed
        self._hex_of: float | None = None  # the last time written, and its text
        self._hex = ""
        self._jmemo: dict[tuple[str, str, str | None], str] = {}
        #: rows a previous run of this replica left queued, ended ``lost`` by ``open()``
        self.lost_at_open = 0
        self.lost_by_model: dict[str, int] = {}  #: the same per model
        self.replayed_at_open = 0  #: completions recovered from journals by ``open()``
        #: on a shared store, the controller's lead (a LeaderLock): decisions are stored
        #: through it, fenced by its term (set by the service)
        self.leader: Any = None
        #: on a shared store, this replica's lease (a ReplicaLease, set by the service):
        #: taken by ``open()`` before the journals are replayed, so that every row this
        #: replica writes has a lease that either lives or is adopted by the leader
        self.lease: Any = None

    @property
    def kind(self) -> str:
        """``"postgresql"`` for a shared store, ``"sqlite"`` for the embedded one."""
        return "postgresql" if self.url else "sqlite"

    @property
    def target(self) -> str:
        """Where the rows go, for messages (a URL without its password)."""
        return redact(self.url) if self.url else str(self.path)

    @property
    def commits(self) -> int:
        """Write transactions so far."""
        return self.writer.commits

    @property
    def rows_written(self) -> int:
        """Inserts + updates so far."""
        return self.writer.rows_written

    @property
    def healed(self) -> int:
        """Completions replayed from journals after a failed write."""
        return self.writer.healed

    @property
    def error(self) -> BaseException | None:
        """The last failure to write (a row or the journal), if any."""
        return self.writer.error

    @error.setter
    def error(self, exc: BaseException | None) -> None:
        self.writer.error = exc

    @property
    def backlog(self) -> int:
        """Requests journaled but not yet in the store: the rows of failed writes (the
        database away), until the journal that holds them is replayed (0 without a
        journal: nothing is waiting then, what failed is gone)."""
        return self.writer.backlog

    @property
    def failing(self) -> BaseException | None:
        """The failure of the last write, None once a write succeeds (readiness)."""
        return self.writer.failing

    # -- life cycle ---------------------------------------------------------------------

    def open(self) -> None:
        """Open the database (migrated to the newest schema), take the :attr:`lease` (if
        any), replay the journals a crash left, end the rows a previous run of this replica
        left queued as ``lost``, and start the writer."""
        if self.url:  # one replica per journal name
            self._lockfd = lock_journals(self.path)
        self._db = db = self._open_db()
        try:
            db.migrate()
            if self.lease is not None:
                self.lease.renew()
            self.replayed_at_open, kept = replay_journals(db, self.path)
            self._jseq = max(self._jseq, kept)
            self.lost_by_model = db.end_lost(time.time())
            self.lost_at_open = sum(self.lost_by_model.values())
        except BaseException:
            self.close()
            raise
        if self.journal:
            self._new_journal()
            with contextlib.suppress(RuntimeError):  # no loop: retired at the next hand-over
                loop = asyncio.get_running_loop()
                self.writer.wake = partial(_call_soon, loop, self._handoff)
        self.writer.start(db)

    def _open_db(self) -> StoreDB:
        return open_db(self.url or self.path, replica=self.replica, chunk=_CHUNK)

    def write_problem(self) -> str | None:
        """Why rows cannot be written now (not open, the writer stopped, the last write
        failed, the journal cannot be written), or None: what ``/readyz`` says of the
        store."""
        if self._db is None or not self.writer.running:
            return "the request store is not open"
        if not self.writer.is_alive():
            return "the request store's writer stopped"
        failing = self.failing
        if failing is not None:
            return f"the last write to the request store failed: {failing}"
        journal = self.journal_failing
        if journal is not None and not self._journal_writable():
            return f"{journal} (new requests are refused)"
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
        if self.writer.running:
            ops, self._pending = self._pending, []
            reasons, self._reasons = self._reasons, []
            retired = self._retire_journal()
            self.writer.hand_over(ops, reasons, retired, None, self._unjournaled())
            self.writer.stop(timeout)
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
            line = arrival_line(
                rid, self._device_names(model, client, None), self._time(time_in), size, blob
            )
            self._jsize += len(line)
            self._jbuf.append(line)
        self._add(ARRIVAL, (rid, model, client, time_in, size, blob))
        if not defer:  # the row is queued either way: the caller ends it if this raises
            self.write_journal()

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
            rid, model, client, device, time_in, time_out, status, size, attempts, payload,
            defer, reason
        )  # fmt: skip

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
            if reason:
                reason = storable_text(reason)
            line = line_end(
                line_head(rid, names, self._time(time_in)),
                self._time(time_out),
                status,
                size,
                attempts,
                json_blob(payload if self.payloads else None),
                reason,
            )
            self._jsize += len(line)
            self._jbuf.append(line)
        if reason:
            self._reasons.append((reason, rid))
        self._add(COMPLETION, (device, time_out, status, attempts, rid))
        if not defer:  # the row goes to the store even when this raises
            self.write_journal()

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
        return line_head(rid, names, self._time(time_in))

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
        if reason:
            reason = storable_text(reason)
            self._reasons.append((reason, rid))
        line = line_end(head, self._time(time_out), status, size, attempts, "null", reason)
        self._jsize += len(line)
        self._jbuf.append(line)
        self._add(COMPLETION, (device, time_out, status, attempts, rid))

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
        lines, nbytes, ops = arrivals_writer(
            requests,
            model,
            client,
            time_in,
            self._device_names(model, client, None) if journal else "",
            self._time(time_in) if journal else "",
            journal,
            self.payloads,
        )
        self._pending.extend(ops)  # queued either way: the caller ends them if this raises
        self._kick()
        if journal:
            self._jsize += nbytes
            self._jbuf.extend(lines)
            self.write_journal()

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
        lines, nbytes, ops = ok_writer(
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
        """:func:`~.journal.json_time`, remembering the last time (the requests of one read,
        and the answers of one flush, share theirs)."""
        if value is not self._hex_of:
            self._hex_of, self._hex = value, json_time(value)
        return self._hex

    def _names(self, key: tuple[str, str, str | None]) -> str:
        """:func:`~.journal.names_text` of model, client and device (memoised: they
        repeat)."""
        text = names_text(*key)
        memo = self._jmemo
        if len(memo) < 4096:
            memo[key] = text
        return text

    def write_journal(self) -> None:
        """Write the deferred journal records (one system call); a no-op when none wait.

        Whole or not at all: when the write fails (ENOSPC, EDQUOT, EIO, a short write that
        cannot complete) the file is cut back to its size before the write, the records
        are dropped, and :class:`JournalUnavailable` is raised (:attr:`journal_failures`
        counts it).  The next write tries again (on a new journal file when the old one
        could not be cut back)."""
        buf = self._jbuf
        if not buf or self._jfd is None:
            return
        data = memoryview(("".join(buf) if len(buf) > 1 else buf[0]).encode("ascii"))
        buf.clear()
        start = self._jsize - len(data)  # the file's size before this write
        if self._jtorn:  # the last failed write could not be cut back: a new journal
            self._jsize = start
            retired = self._next_journal()
            start, self._jsize = 0, len(data)
            ops, self._pending = self._pending, []
            reasons, self._reasons = self._reasons, []
            self.writer.hand_over(ops, reasons, retired, None, True)  # before this write
        try:
            while data:
                data = data[os.write(self._jfd, data) :]
        except OSError as exc:
            self._jneed = self._jsize - start  # what did not fit: for the probe
            self._journal_failed(start, exc)
        self.journal_failing = None

    def _journal_failed(self, start: int, exc: OSError) -> None:
        """A journal write failed: cut the file back to ``start`` bytes, raise
        :class:`JournalUnavailable`."""
        self.journal_failures += 1
        self._jdropped = True
        self._jsize = start
        try:
            os.ftruncate(self._jfd, start)  # type: ignore[arg-type]
        except OSError:
            self._jtorn = True  # a torn tail: the next write goes to a new journal
        self.journal_failing = failure = JournalUnavailable(self._jpath, exc)
        raise failure from None

    def _journal_writable(self) -> bool:
        """After a failed journal write, whether there is room again for it: as many
        bytes written at the end of the journal and cut back at once (so that readiness
        comes back with the space, before any request comes)."""
        fd = self._jfd
        if fd is None or self._jbuf or self._jtorn:
            return False
        try:
            size = os.fstat(fd).st_size
        except OSError:
            return False
        try:
            room = os.write(fd, b"\n" * self._jneed) == self._jneed
        except OSError:
            room = False
        try:
            os.ftruncate(fd, size)
        except OSError:
            self._jtorn = True  # the next write goes to a new journal
            return False
        if room:
            self.journal_failing = None
        return room

    def _next_journal(self) -> Path | None:
        """Go on in a new journal file; return the old one, closed, for the writer to retire
        (its torn last line, if any, is skipped as a crash's).  :class:`JournalUnavailable`
        when the new one cannot be made: the old one stays open, to be tried again."""
        seq = self._jseq + 1
        path = self.path.with_name(f"{self.path.name}.journal.{seq}")
        try:
            # rw-r--r-- (less what the umask takes), as SQLite creates the store file
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
        except OSError as exc:
            self.journal_failures += 1
            self.journal_failing = failure = JournalUnavailable(path, exc)
            raise failure from None
        old, old_fd = self._jpath, self._jfd
        self._jseq, self._jpath, self._jfd, self._jsize, self._jtorn = seq, path, fd, 0, False
        if old_fd is not None:
            os.close(old_fd)
        return old

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
        if self._jfd is not None and (
            self._jsize >= self.journal_max or self.writer.wants_rotation(self._jseq)
        ):  # full, or holding rows a failed write lost while writes succeed again
            with contextlib.suppress(JournalUnavailable):  # dropped: the rows are in ops
                self.write_journal()
            with contextlib.suppress(JournalUnavailable):  # tried again at the next one
                retire = self._next_journal()
        if ops or retire or fut is not None:
            self.writer.hand_over(ops, reasons, retire, fut, self._unjournaled())

    def _unjournaled(self) -> bool:
        """Whether rows about to be handed over may be in no journal: a journal write failed
        since the last hand-over (its records were dropped), or records wait unwritten (a
        write that may fail).  The writer keeps such a hand-over in memory if its write
        fails too (:class:`~.writer.Writer`, "Rows in no journal")."""
        dropped, self._jdropped = self._jdropped, False
        return dropped or bool(self._jbuf)

    # -- journals ------------------------------------------------------------------------

    def _new_journal(self) -> None:
        try:
            self._next_journal()
        except JournalUnavailable as exc:
            raise exc.cause from None  # at open: the start fails, as before

    def _retire_journal(self) -> Path | None:
        """Close the current journal; the writer deletes it once its rows are committed."""
        if self._jfd is None:
            return None
        with contextlib.suppress(JournalUnavailable):  # dropped: their rows are handed over
            self.write_journal()
        os.close(self._jfd)
        self._jfd = None
        return self._jpath

    @property
    def quarantine_path(self) -> Path:
        """Where the journal records that cannot be stored are kept
        (``<store>.journal.quarantine``)."""
        return quarantine_path(self.path)

    # -- the decisions (issues 16, 38): a table of their own, rarely written ---------------

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
        by: str = CONTROLLER,
        kind: str = QUOTA,
        before: Any = None,
        after: Any = None,
        fenced: bool = True,
    ) -> None:
        """Store one decision, the controller's or an operator's (its own short transaction,
        on its own connection: call it off the event loop, the controller does; the columns
        are :mod:`~wirekit.serve.record.decisions`').  On a shared store with a
        :attr:`leader` lock, a ``fenced`` decision (the controller's own) goes through the
        lock, fenced by its term: raises :class:`~wirekit.serve.record.pgsync.NotLeader`,
        storing nothing, without the lead.  An operator's decision (``fenced=False``) is
        stored from any replica."""
        if kind == QUOTA and before is None and after is None:  # a quota: old -> new
            before, after = old, new
        decision = {
            "time": time,
            "node": node,
            "device": device,
            "device_type": device_type,
            "model": model,
            "old": old,
            "new": new,
            "status": status,
            "reason": reason,
            "error": error,
            "metrics": metrics,
            "replica": self.replica,
            "by": by,
            "kind": kind,
            "before": before,
            "after": after,
        }
        leader = self.leader if fenced else None
        store_decision(decision, open_db=self._open_db, leader=leader)

    def decisions(self, limit: int = 100) -> list[dict[str, Any]]:
        """The last ``limit`` decisions, oldest first (``metrics``, ``before`` and ``after``
        parsed back)."""
        return read_decisions(self._open_db, limit)
