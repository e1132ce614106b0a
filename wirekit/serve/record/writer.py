"""The request store's writer thread: the rows handed over by the event loop, written to the
database in one transaction per hand-over, off the request path.

A hand-over is a list of store rows (:data:`~.journal.ARRIVAL` and
:data:`~.journal.COMPLETION` rows), the reasons of the failed ones, and maybe a retired
journal: once the hand-over is committed, the journal is deleted -- replayed first when a
write failed while it was open (the database was away), so that what was answered meanwhile
reaches the store once the database is back.

Catching up after an outage (issue 38): a failed write leaves its rows in the journals only
(:attr:`Writer.backlog` counts them).  As soon as a write succeeds again -- the next
hand-over's, or, with nothing handed over, a try every :data:`RETRY_INTERVAL` seconds -- the
writer replays the journals held since (oldest first, before the rows handed over next), and
asks the event loop (:attr:`Writer.wake`) to retire the journal open now: the loop's next
hand-over carries it (:meth:`Writer.wants_rotation`), and its replay follows.  Only retired
journals are replayed: every row they hold was handed over before, so a later hand-over
never inserts a row a replay inserted.

Rows in no journal: a hand-over made while the journal could not be written (a full disk
that holds the database too) may hold rows whose journal records were dropped.  Such a
hand-over is marked ``keep``: when its write fails, the writer keeps its rows in memory
(up to :data:`KEPT_MAX` rows; the journals cannot bring them back) and writes them -- by id,
as a replay does: nothing counted twice -- as soon as a write succeeds again, before any
row handed over later (which, meanwhile, is kept behind them).  Rows still kept when the
process stops are gone; :attr:`Writer.kept_dropped` counts them, and what was dropped
beyond the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wirekit._impl import load_fast

from .journal import ARRIVAL
from .replay import journal_number, replay_journal
from .storedb import QUEUED, StoreDB

_BATCH, _STOP = 2, 3

#: seconds between two tries of a writer that holds a backlog and is handed nothing: the
#: database may be back without a request to tell
RETRY_INTERVAL = 1.0

#: rows kept in memory, at most, after failed writes of rows that are in no journal (a
#: full disk under both the journal and the database); about 200 bytes each
KEPT_MAX = 100_000


class Writer:
    """The writer thread of one store, and what it has done (``commits``, ``rows_written``,
    ``healed``, the last ``error``; ``failing``: the failure of the last write, None once a
    write succeeds; ``backlog``: rows in the journals only)."""

    def __init__(
        self, store: Path, journal_seq: Callable[[], int], *, journal: bool = True
    ) -> None:
        #: the store file (its journals' base name)
        self.store = store
        #: the store journals its rows (without, what a failed write held is gone)
        self.journal = journal
        self._journal_seq = journal_seq  # the number of the journal open now
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._db: StoreDB | None = None
        self.commits = 0  #: write transactions so far
        self.rows_written = 0  #: inserts + updates so far
        self.error: BaseException | None = None  #: the last write failure, if any
        #: the failure of the last write, None once a write succeeds (readiness)
        self.failing: BaseException | None = None
        self.healed = 0  #: completions replayed from journals after a failed write
        self._dirty_upto = 0  # journals up to this number hold rows a failed write lost
        self._held: list[Path] = []  # retired journals not replayed yet
        # rows of failed hand-overs by the number of the journal open then (forgotten once
        # that journal is replayed), and their sum
        self._unstored: dict[int, int] = {}
        self._backlog = 0
        self._woken_for = 0  # the dirty journal the loop was last asked to retire
        # rows of failed hand-overs that may be in no journal, oldest first (written by id
        # once writes succeed), with the reasons of their failed rows; their requests
        self._kept: list[tuple[int, tuple[Any, ...]]] = []
        self._kept_reasons: list[tuple[str, str]] = []
        self._kept_ids: set[str] = set()
        #: kept rows given up: beyond :data:`KEPT_MAX`, or still kept when the writer stopped
        self.kept_dropped = 0
        #: called (from this thread) once writes succeed again while the journal open
        #: holds rows a failed write lost: the store sets it to ask its event loop for a
        #: hand-over (thread-safe), which then retires that journal (:meth:`wants_rotation`)
        self.wake: Callable[[], None] | None = None

    @property
    def backlog(self) -> int:
        """Requests whose rows are not in the store yet: the rows of the failed hand-overs
        (each request once), until the journal that holds them is replayed -- or, for rows
        kept in memory (in no journal), until they are written."""
        return self._backlog + len(self._kept_ids)

    def wants_rotation(self, seq: int) -> bool:
        """Whether the journal numbered ``seq`` (open now) should be retired at the next
        hand-over: a write failed while it was open and writes succeed again, so that its
        replay brings what it holds to the store."""
        return seq <= self._dirty_upto and self.failing is None and self._backlog > 0

    def start(self, db: StoreDB) -> None:
        """Start writing to ``db``."""
        self._db = db
        self._thread = threading.Thread(target=self._run, name="wirekit-store", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Started and not stopped."""
        return self._thread is not None

    def is_alive(self) -> bool:
        """The thread runs (it stops only when told to, or when it breaks)."""
        return self._thread is not None and self._thread.is_alive()

    def hand_over(
        self,
        ops: list[tuple[int, tuple[Any, ...]]],
        reasons: list[tuple[str, str]],
        retire: Path | None,
        fut: asyncio.Future[None] | None,
        keep: bool = False,
    ) -> None:
        """Write ``ops`` and ``reasons`` (``(why, id)``) in one transaction, then settle the
        retired journal ``retire``, then resolve ``fut`` (with the write's failure, if any).
        ``keep``: some of these rows may be in no journal (a journal write failed, or had
        not been made yet): if the write fails, keep them in memory to write later."""
        self._queue.put((_BATCH, ops, reasons, retire, fut, keep))

    def stop(self, timeout: float) -> None:
        """Write what was handed over, then stop (waiting up to ``timeout`` seconds); rows
        still kept then (the database away) are counted in :attr:`kept_dropped`."""
        if self._thread is not None:
            self._queue.put((_STOP,))
            self._thread.join(timeout)
            self._thread = None

    @property
    def kept(self) -> int:
        """Rows kept in memory now: failed writes of rows that may be in no journal."""
        return len(self._kept)

    def _run(self) -> None:
        db = self._db
        assert db is not None
        get = self._queue.get
        while True:
            try:
                item = get(timeout=RETRY_INTERVAL) if self.backlog else get()
            except queue.Empty:  # idle with a backlog: is the database back?
                self._try_again(db)
                continue
            if item[0] == _STOP:
                self.kept_dropped += len(self._kept)
                return
            _kind, ops, reasons, retire, fut, keep = item
            if self._held and (self.failing is None or self._reachable(db)):
                self._settle_held(db)  # the oldest first: what a failed write left, then these
            failed: BaseException | None = None
            if self._kept and not self._write_kept(db):
                if ops or reasons:  # behind the kept rows: they must not be written first
                    failed = self.failing
                    self._failed(failed, ops, reasons, keep=True)
            elif ops or reasons:
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
                    failed = exc
                    self._failed(exc, ops, reasons, keep)
            if retire is not None:
                self._held.append(retire)
            if failed is None:
                if self._held:
                    self._settle_held(db)
                self._ask_rotation()
            if fut is not None:
                _resolve([fut], failed)

    def _failed(
        self,
        exc: BaseException | None,
        ops: list[tuple[int, tuple[Any, ...]]],
        reasons: list[tuple[str, str]],
        keep: bool,
    ) -> None:
        """A hand-over could not be written: its rows are in the journals only -- or, when
        ``keep``, maybe in none: then they are kept in memory too (up to :data:`KEPT_MAX`)."""
        self.error = self.failing = exc
        if not self.journal:
            return
        # the journals open until now hold completions that are not stored
        seq = self._dirty_upto = self._journal_seq()
        ids = {row[0] if kind == ARRIVAL else row[-1] for kind, row in ops}
        if keep and len(self._kept) + len(ops) <= KEPT_MAX:
            self._kept.extend(ops)
            self._kept_reasons.extend(reasons)
            self._kept_ids.update(ids)
            return
        if keep:
            self.kept_dropped += len(ops)
        self._unstored[seq] = self._unstored.get(seq, 0) + len(ids)
        self._backlog += len(ids)

    def _write_kept(self, db: StoreDB) -> bool:
        """Write the kept rows by id (a row a replay stored meanwhile is not inserted twice;
        an arrival never takes an answer back), then forget them; False (kept) when the
        database is still away."""
        if self.failing is not None and not self._reachable(db):
            return False
        chunks, rest, updates = _merge_ops(self._kept, 1 << 30)
        assert not chunks  # one chunk as large as that: every INSERT row is in ``rest``
        # an INSERT row (INSERT_COLUMNS) as a replayed journal row (REPLAY_COLUMNS)
        rows = [(r[0], r[1], r[2], r[6], r[3], r[7], r[8], r[4], r[9], r[5], None) for r in rest]
        try:
            db.replay(rows)
            db.write([], [], updates, self._kept_reasons)
        except Exception as exc:
            self.error = self.failing = exc
            return False
        self.commits += 1
        self.rows_written += len(self._kept)
        self._kept, self._kept_reasons, self._kept_ids = [], [], set()
        return True

    def _ask_rotation(self, again: bool = False) -> None:
        """Writes succeed: ask the loop to retire the journal open now if it holds rows a
        failed write lost -- once per journal after a hand-over (the loop's next hand-over
        looks by itself), each time when ``again`` (an idle retry: the loop may have looked
        while a write was failing)."""
        seq = self._journal_seq()
        if self.wake is None or not self.wants_rotation(seq):
            return
        if again or self._woken_for < seq:
            self._woken_for = seq
            with contextlib.suppress(Exception):  # a closed loop: nobody to retire it
                self.wake()

    def _try_again(self, db: StoreDB) -> None:
        """Idle with a backlog: once the database answers, replay the journals held and ask
        the loop to retire the journal open now."""
        if not self._reachable(db) or not self._settle_held(db):
            return
        if self._kept and not self._write_kept(db):
            return
        self._ask_rotation(again=True)

    def _reachable(self, db: StoreDB) -> bool:
        """Whether the database takes a write (an empty transaction; a broken connection
        reopened): tried before a held journal is read again, so that an outage costs no
        journal parsing per hand-over.  Sets or clears :attr:`failing`."""
        try:
            try:
                db.write([], [], [], [])
            except Exception:  # once more: a connection broken meanwhile is reopened
                db.write([], [], [], [])
        except Exception as exc:
            self.error = self.failing = exc
            return False
        self.failing = None
        return True

    def _settle_held(self, db: StoreDB) -> bool:
        """The retired journals whose rows are committed, oldest first: delete each.  When
        a write failed while it was open (the database was away), replay it first (by id:
        idempotent), so that what was answered meanwhile reaches the store once the
        database is back.  A journal whose replay fails is held (with those after it), and
        tried again at the next hand-over (or replayed by the next start); False then.  Its
        records that cannot be stored are quarantined, as at the start."""
        while self._held:
            held = self._held[0]
            number = journal_number(held)
            try:
                if number <= self._dirty_upto:
                    self.healed += replay_journal(db, held, self.store)
                held.unlink()
            except FileNotFoundError:
                pass
            except Exception as exc:
                self.error = exc
                if not isinstance(exc, OSError):  # the database, not the file: away
                    self.failing = exc
                return False
            self._held.pop(0)
            for seq in [n for n in self._unstored if n <= number]:
                self._backlog -= self._unstored.pop(seq)
        return True


def merge_ops(
    ops: list[tuple[int, tuple[Any, ...]]], chunk: int
) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """One hand-over as statements: a request that arrived and finished within it becomes
    one complete INSERT row (not an INSERT and an UPDATE); other arrivals are inserted queued,
    in arrival order; completions of earlier arrivals are UPDATEs.  Returns the INSERT rows
    ``chunk`` at a time, flattened (one tuple per many-row statement), the rows left over,
    and the UPDATEs.  (Compiled twin: ``wirekit._fast.storewriter.merge_ops``.)
    :class:`ValueError` when ``chunk`` is below 1."""
    if chunk < 1:
        raise ValueError(f"merge_ops: chunk must be at least 1, not {chunk}")
    rows: dict[str, tuple] = {}
    updates = []
    for kind, row in ops:
        if kind == ARRIVAL:
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


_merge_ops = merge_ops  # the compiled twin when built
_fast = load_fast("storewriter")
if _fast is not None:
    _merge_ops = _fast.merge_ops
