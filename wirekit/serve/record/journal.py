"""The journal: the request store's record of each arrival and each end, on local disk
before the request leaves or its answer goes back, and replayed into the store after a crash.

A journal file (``<store>.journal.<n>``) holds one record per line, a JSON array whose
fields are declared once, in :data:`RECORD` (specs/journal.md shows the layout):

=====  =============  =========  ==========================================================
index  field          kind       written as
=====  =============  =========  ==========================================================
0      id             text       a JSON string, ASCII only (``\\uXXXX`` escapes)
1      model          text       likewise
2      client         text       likewise
3      device         text       likewise, or null (an arrival record)
4      time_in        time       a finite float as its exact hex form in a JSON string
                                 (``"0x1.9a...p+30"``), read back with ``float.fromhex``;
                                 any other number as JSON
5      time_out       time       likewise, or null (an arrival record, status ``queued``)
6      status         text       ``queued`` (an arrival record), ``ok``, ``error``, ...
7      payload_size   count      a JSON integer from 0 to 2**63-1
8      attempts       count      a JSON integer from 0 to 2**31-1 (0: an arrival record)
9      payload        payload    base64 in a JSON string, or null (payloads not kept)
10     reason         text       optional: why a request did not end ``ok``
=====  =============  =========  ==========================================================

From the table come the reference writer (:func:`encode`) and the reader
(:func:`journal_row`, by field name).  The request path writes the same text through the
forms below that take pieces made once (:func:`names_text`, :func:`line_head` made while the
request is with its backend, :func:`line_end`, :func:`arrival_line`, and the batch forms
:func:`arrival_records` / :func:`ok_records`, whose compiled twins are in
``wirekit/_fast/journal.pyx``); tests/test_serve_journal.py checks every one of them against
:func:`encode`, byte for byte.

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
import math
import os
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wirekit._impl import load_fast

from ..logs import serve_logger
from .storedb import QUEUED, REPLAY_COLUMNS, StoreDB, StoreUnavailable, is_row_error

log = serve_logger()

#: the kinds of field: how each is written and read back
TEXT, TIME, COUNT, PAYLOAD = "text", "time", "count", "payload"

_INT64 = (1 << 63) - 1
_INT32 = (1 << 31) - 1


@dataclass(frozen=True, slots=True)
class Field:
    """One field of the journal record."""

    #: the store column it fills (:data:`~wirekit.serve.record.storedb.REPLAY_COLUMNS`)
    name: str
    #: :data:`TEXT`, :data:`TIME`, :data:`COUNT` or :data:`PAYLOAD`
    kind: str
    #: how the reader's messages name it
    label: str
    #: null is a value of it
    null: bool = False
    #: null is a value of it in a record of this status only
    null_when: str | None = None
    #: a count's largest value
    hi: int = 0
    #: it may be left out (the last field only), and is when empty
    optional: bool = False


#: The journal record, in its order: the one declaration of its fields.
RECORD: tuple[Field, ...] = (
    Field("id", TEXT, "id"),
    Field("model", TEXT, "model"),
    Field("client", TEXT, "client"),
    Field("device", TEXT, "device", null=True),
    Field("time_in", TIME, "time in"),
    Field("time_out", TIME, "time out", null_when=QUEUED),  # an arrival record has none
    Field("status", TEXT, "status"),
    Field("payload_size", COUNT, "size", hi=_INT64),
    Field("attempts", COUNT, "attempts", hi=_INT32),
    Field("payload", PAYLOAD, "payload", null=True),
    Field("reason", TEXT, "reason", null=True, optional=True),
)
_REQUIRED = sum(1 for f in RECORD if not f.optional)
_STATUS_AT = REPLAY_COLUMNS.index("status")  # in a row of journal_row

# -- the writer -----------------------------------------------------------------------------

json_str = json.encoder.encode_basestring_ascii  # '"..."', escaped, ASCII only
_STATUS_JSON = {v: json_str(v) for v in (QUEUED, "ok", "error", "failed", "abandoned")}


def json_num(value: Any) -> str:
    """JSON text of a number, as ``json.dumps`` writes it (a fast path for finite floats)."""
    cls = type(value)
    if cls is int or (cls is float and value - value == 0):
        return repr(value)
    return json.dumps(value)


def json_time(value: Any) -> str:
    """A :data:`TIME` field: a finite float as its exact hex form in a JSON string (several
    times cheaper to write than repr, and exact), anything else as JSON."""
    if type(value) is float and value - value == 0:
        return f'"{value.hex()}"'
    return json_num(value)


def json_blob(payload: Any) -> str:
    """A :data:`PAYLOAD` field: base64 in a JSON string, or null."""
    if payload is None:
        return "null"
    return '"' + base64.b64encode(payload).decode("ascii") + '"'


def json_text(value: str | None) -> str:
    """A :data:`TEXT` field: a JSON string (ASCII only), or null."""
    return "null" if value is None else json_str(value)


def json_count(value: Any) -> str:
    """A :data:`COUNT` field."""
    return repr(value) if type(value) is int else json_num(value)


_WRITERS: dict[str, Callable[[Any], str]] = {
    TEXT: json_text,
    TIME: json_time,
    COUNT: json_count,
    PAYLOAD: json_blob,
}


def encode(record: Mapping[str, Any]) -> str:
    """The journal line of ``record`` (field name -> value; a missing field is null; the
    optional reason is left out when empty): the reference writer, :data:`RECORD` in its
    order.  The request path's forms below write the same text from pieces made once."""
    texts = []
    for field in RECORD:
        value = record.get(field.name)
        if field.optional and not value:
            break
        texts.append(_WRITERS[field.kind](value))
    return f"[{','.join(texts)}]\n"


def names_text(model: str, client: str, device: str | None) -> str:
    """The model, client and device fields, each followed by a comma (they repeat: the
    store keeps this text per ``(model, client, device)``)."""
    return f"{json_str(model)},{json_str(client)},{json_text(device)},"


def line_head(rid: str, names: str, time_in: str) -> str:
    """The record's first fields, up to the time in (``names`` from :func:`names_text`,
    ``time_in`` from :func:`json_time`): made while the request is with its backend."""
    return f"[{json_str(rid)},{names}{time_in},"


def line_end(
    head: str,
    time_out: str,
    status: str,
    size: Any,
    attempts: Any,
    blob: str,
    reason: str | None = None,
) -> str:
    """The whole record from its :func:`line_head` (``time_out`` from :func:`json_time`,
    ``blob`` from :func:`json_blob`); ``reason`` when not empty."""
    if reason:  # the last field, after the payload
        blob = f"{blob},{json_str(reason)}"
    return (
        f"{head}{time_out},{_STATUS_JSON.get(status) or json_str(status)},"
        f"{size if type(size) is int else json_num(size)},"
        f"{attempts if type(attempts) is int else json_num(attempts)},{blob}]\n"
    )


def arrival_line(rid: str, names: str, time_in: str, size: Any, payload: Any) -> str:
    """An arrival record: no device (``names`` from :func:`names_text` with None), no time
    out, status ``queued``, 0 attempts.  Replayed, it only inserts a row that is missing: it
    never takes an answer back."""
    return (
        f"{line_head(rid, names, time_in)}null,{_STATUS_JSON[QUEUED]},"
        f"{size if type(size) is int else json_num(size)},0,{json_blob(payload)}]\n"
    )


#: the kinds of store row of a hand-over (see :mod:`.writer`)
ARRIVAL, COMPLETION = 0, 1


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
    """The arrival records (:func:`arrival_line`, when ``journal``), their length and the
    arrival rows of ``RequestStore.arrivals`` (``names``: :func:`names_text` of model,
    client and None; ``tin``: :func:`json_time` of ``time_in``).  Compiled twin:
    ``wirekit._fast.journal.arrival_records``."""
    ops = []
    lines: list[str] = []
    nbytes = 0
    for rid, size, wire in requests:
        blob = None if not payloads or wire is None else bytes(wire)
        if journal:
            line = arrival_line(rid, names, tin, size, blob)
            nbytes += len(line)
            lines.append(line)
        ops.append((ARRIVAL, (rid, model, client, time_in, size, blob)))
    return lines, nbytes, ops


def ok_records(
    answers: list[tuple[str, str, float, int, int, Any]],
    time_out: float,
    tout: str,
    names_of: Callable[[str], str],
    journal: bool,
    payloads: bool,
) -> tuple[list[str], int, list[tuple[int, tuple[Any, ...]]]]:
    """The records (when ``journal``), their length and the completion rows of
    ``RequestStore.completions_ok`` (``tout``: :func:`json_time` of ``time_out``;
    ``names_of(device)``: :func:`names_text` of model, client and device).  Compiled twin:
    ``wirekit._fast.journal.ok_records``."""
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
                last, tin = t_in, json_time(t_in)
            line = line_end(
                line_head(rid, text, tin),
                tout,
                "ok",
                size,
                attempts,
                json_blob(wire if payloads else None),
            )
            nbytes += len(line)
            lines.append(line)
    ops = [
        (COMPLETION, (device, time_out, "ok", attempts, rid))
        for rid, device, _t, _size, attempts, _wire in answers
    ]
    return lines, nbytes, ops


# -- the reader -----------------------------------------------------------------------------


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


def _read_text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is {_kind_of(value)}, not text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not Unicode text (it holds a lone surrogate)") from None
    if "\x00" in value:
        raise ValueError(f"{what} holds a NUL character")
    return value


def _read_time(value: Any, what: str) -> float:
    try:
        value = float.fromhex(value) if isinstance(value, str) else value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what} is not a time") from None
    if not math.isfinite(value):
        raise ValueError(f"{what} is not a finite time")
    return value


def _read_payload(value: Any, what: str) -> bytes | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{what} is {_kind_of(value)}, not base64 text")
    try:
        return base64.b64decode(value, validate=True) if value else None
    except ValueError:
        raise ValueError(f"{what} is not base64") from None


def _reader(field: Field) -> Callable[[Any], Any]:
    """The check of one field as the databases need it: its value, or ValueError saying
    what is wrong."""
    label = field.label
    if field.kind == COUNT:
        hi = field.hi

        def read_count(value: Any) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
                raise ValueError(f"{label} is not an integer from 0 to {hi}")
            return value

        return read_count
    read = {TEXT: _read_text, TIME: _read_time, PAYLOAD: _read_payload}[field.kind]
    if field.null:
        return lambda value: None if value is None else read(value, label)
    return lambda value: read(value, label)


#: (field, its place in a line, its check), in the order they are checked: the payload
#: first, then the rest in their order (which error a record with two bad fields reports is
#: part of the quarantine's contract)
_READERS = sorted(
    ((f, i, _reader(f)) for i, f in enumerate(RECORD)), key=lambda r: r[0].kind != PAYLOAD
)
_STATUS_INDEX = next(i for i, f in enumerate(RECORD) if f.name == "status")


def journal_row(rec: Any) -> tuple:
    """One journal record (a parsed line) as a
    :data:`~wirekit.serve.record.storedb.REPLAY_COLUMNS` row, every field checked as the
    databases need it (by :data:`RECORD`); ValueError saying which field is wrong
    otherwise."""
    if not isinstance(rec, list) or not _REQUIRED <= len(rec) <= len(RECORD):
        raise ValueError(f"not a journal record (a list of {_REQUIRED} or {len(RECORD)} fields)")
    fields: dict[str, Any] = {}
    for field, i, read in _READERS:
        value = rec[i] if i < len(rec) else None  # an optional field left out is null
        when = field.null_when
        if value is None and when is not None and rec[_STATUS_INDEX] == when:
            fields[field.name] = None  # null in a record of that status
        else:
            fields[field.name] = read(value)
    return tuple(fields[name] for name in REPLAY_COLUMNS)


#: a journal record that cannot be stored: (line number, byte offset, the line, its row
#: when it was read but the database refused it -- else None --, why)
BadRecord = tuple[int, int, bytes, tuple | None, str]
#: a journal record read: (line number, byte offset, the line, its row)
Entry = tuple[int, int, bytes, tuple]


def read_journal(path: Path) -> tuple[list[Entry], list[BadRecord]]:
    """The records of a journal file, each with its position (line number, byte offset)
    and row (:func:`journal_row`), and the records that cannot be stored, with why.  A last
    line cut short by a crash (no line end) that does not parse is skipped: it was never
    answered."""
    entries: list[Entry] = []
    bad: list[BadRecord] = []
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


#: the batch forms the store uses: the compiled twins when built
arrivals_writer, ok_writer = arrival_records, ok_records
_fast = load_fast("journal")
if _fast is not None:
    _fast.bind(json_time, json_num, json_blob)
    arrivals_writer, ok_writer = _fast.arrival_records, _fast.ok_records
