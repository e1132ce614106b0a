"""The journal files of the request store: read back, replayed into the store at the start
(and after a failed write), and shown to ``wirekit serve stats``.  Each line is a record of
:mod:`.journal` (specs/journal.md).

A journal record that cannot be stored -- not JSON, not the shape of a record, text that is
not Unicode (a lone surrogate), a number out of range -- never stops a replay: it is
*quarantined*, appended to ``<store>.journal.quarantine`` (one JSON object per line: the
journal's name, the record's line number and byte offset, why, and the record itself), and
reported in one log line per journal; the other records are replayed.  (A last line cut
short by a crash is not a record: it was never answered, and is skipped.)  A journal that
cannot be read at all is left where it is, reported, and the start goes on.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..logs import serve_logger
from .journal import journal_row
from .storedb import QUEUED, REPLAY_COLUMNS, StoreDB, StoreUnavailable, is_row_error

log = serve_logger()

_STATUS_AT = REPLAY_COLUMNS.index("status")  # in a row of journal_row


#: a journal record that cannot be stored: (line number, byte offset, the line, its row
#: when it was read but the database refused it -- else None --, why)
BadRecord = tuple[int, int, bytes, tuple | None, str]
#: a journal record read: (line number, byte offset, the line, its row)
Entry = tuple[int, int, bytes, tuple]


def read_journal(path: Path) -> tuple[list[Entry], list[BadRecord]]:
    """The records of a journal file, each with its position (line number, byte offset)
    and row (:func:`journal_row`), and the records that cannot be stored, with why.  A last
    line cut short by a crash (no line end) that does not parse is skipped: it was never
    answered.  Blank lines are not records (a full disk's room probe writes line ends and
    cuts them back at once; a crash in between leaves them): skipped too."""
    entries: list[Entry] = []
    bad: list[BadRecord] = []
    offset = 0
    with open(path, "rb") as fh:
        for line_no, line in enumerate(fh, 1):
            start, offset = offset, offset + len(line)
            if not line.strip():  # the room probe of a full disk, cut short by a crash
                continue
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


def completions(rows: Iterable[tuple | None]) -> int:
    """How many of the journal ``rows`` are completions (not arrival records)."""
    return sum(1 for row in rows if row is not None and row[_STATUS_AT] != QUEUED)


# -- the files ------------------------------------------------------------------------------


def journal_files(store: Path) -> list[Path]:
    """The journal files of the store file ``store`` (``<store>.journal.<n>``), oldest
    first."""
    found = []
    for p in store.parent.glob(store.name + ".journal.*"):
        suffix = p.name.rsplit(".", 1)[1]
        if suffix.isdigit():
            found.append((int(suffix), p))
    return [p for _n, p in sorted(found)]


def journal_number(path: Path) -> int:
    """The ``<n>`` of a journal file ``<store>.journal.<n>``."""
    return int(path.name.rsplit(".", 1)[1])


def lock_journals(store: Path) -> int:
    """One replica per journal name: a second one with the same store path would replay
    (and delete) the first one's journals.  An exclusive lock on ``<store>.lock``, held
    while its file descriptor (returned) is open; the kernel drops it when the process
    dies.  :class:`~.storedb.StoreUnavailable` when another process holds it."""
    fd = os.open(store.with_name(store.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StoreUnavailable(
            f"another wirekit serve replica uses the journal {store} "
            "(give each replica its own store.path)"
        ) from None
    return fd


def quarantine_path(store: Path) -> Path:
    """Where the journal records of the store file ``store`` that cannot be stored are kept
    (``<store>.journal.quarantine``)."""
    return store.with_name(f"{store.name}.journal.quarantine")


def quarantine(journal: Path, bad: list[BadRecord], to: Path) -> None:
    """Keep the records of ``journal`` that cannot be stored in ``to`` (appended, one JSON
    line each) and report them in one log line."""
    if not bad:
        return
    bad.sort(key=lambda b: b[0])
    with open(to, "ab") as fh:
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
        to,
        shown,
        more,
    )


# -- replay ---------------------------------------------------------------------------------


def replay_entries(db: StoreDB, entries: list[Entry]) -> list[BadRecord]:
    """Replay ``entries`` in one transaction; if the database refuses one of them (a value
    it cannot hold: :func:`~wirekit.serve.record.storedb.is_row_error`), one by one, and
    return those it refuses, with why.  A database that is away raises."""
    if not entries:
        return []
    try:
        db.replay([e[3] for e in entries])
        return []
    except Exception as exc:
        if not is_row_error(exc):
            raise
    refused: list[BadRecord] = []
    for line_no, offset, raw, row in entries:
        try:
            db.replay([row])
        except Exception as exc:
            if not is_row_error(exc):
                raise
            refused.append((line_no, offset, raw, row, f"the store refused it: {exc}"))
    return refused


def replay_journal(db: StoreDB, path: Path, store: Path) -> int:
    """Replay the journal file ``path`` of the store file ``store`` into ``db`` (by id: a
    journal replayed twice counts nothing twice; a stored payload is kept when the record
    has none), quarantining what cannot be stored; how many completions it stored.
    OSError when it cannot be read; a database that is away raises."""
    entries, bad = read_journal(path)
    refused = replay_entries(db, entries)
    quarantine(path, bad + refused, quarantine_path(store))
    return completions(e[3] for e in entries) - completions(b[3] for b in refused)


def replay_journals(db: StoreDB, store: Path) -> tuple[int, int]:
    """Replay every journal of the store file ``store`` into ``db`` at the start and delete
    them; one that cannot be read is left in place, reported, and the start goes on.
    Returns how many completions were stored and the highest number of a journal left."""
    count = kept = 0
    replayed = []
    for path in journal_files(store):
        try:
            count += replay_journal(db, path, store)
        except OSError as exc:  # left where it is: the start goes on
            log.warning(
                "wirekit serve: journal %s cannot be read, left in place: %s",
                path,
                exc.strerror or exc,
            )
            kept = max(kept, journal_number(path))
            continue
        replayed.append(path)
    for path in replayed:
        path.unlink()
    return count, kept


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
            entries.extend(e[3] for e in read_journal(path)[0])
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
