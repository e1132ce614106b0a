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
:func:`encode`, byte for byte.  The files -- reading them back, the replay, the quarantine --
are :mod:`.replay`'s.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from wirekit._impl import load_fast

from .storedb import QUEUED, REPLAY_COLUMNS

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


#: the time in of no answer yet (None is a time in that must still be written: ``null``)
_NO_TIME = object()


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
        last: Any = _NO_TIME
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


#: the batch forms the store uses: the compiled twins when built
arrivals_writer, ok_writer = arrival_records, ok_records
_fast = load_fast("journal")
if _fast is not None:
    _fast.bind(json_time, json_num, json_blob)
    arrivals_writer, ok_writer = _fast.arrival_records, _fast.ok_records
