"""The journal record (``wirekit.serve.record.journal``): declared once, in ``RECORD``; its
reference writer (``encode``) and reader (``journal_row``) come from that table, and every
other writer -- the request path's forms, the batch forms and their compiled twins
(``wirekit._fast.journal``) -- writes the same bytes as ``encode``.  Also the writer thread's
statements of a hand-over (``wirekit.serve.record.writer.merge_ops``) against their compiled
twin (``wirekit._fast.storewriter``)."""

from __future__ import annotations

import base64
import importlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wirekit._impl import pure_requested
from wirekit.serve.record import journal, writer
from wirekit.serve.record.replay import read_journal
from wirekit.serve.record.storedb import REPLAY_COLUMNS


@pytest.fixture(scope="module", params=["fast", "pure"])
def twin(request):
    """The batch writers of each twin: ``wirekit._fast.journal`` (bound to the journal's
    field writers, as the module binds it) or ``wirekit.serve.record.journal``."""
    if request.param == "fast":
        if pure_requested():
            pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
        fast = importlib.import_module("wirekit._fast.journal")
        fast.bind(journal.json_time, journal.json_num, journal.json_blob)
        return fast
    return journal


# text as the request path meets it: quotes, backslashes, newlines, non-ASCII, lone
# surrogates and NULs (a reason is made storable before it is written; ids and names are not)
texts = st.text(max_size=8) | st.sampled_from(['c"1', "a\\b", "x\ny\r\u2028", "é😀", "\ud800", ""])
storable = st.text(max_size=8).filter(lambda t: "\x00" not in t)
times = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 5)
finite_times = st.floats(allow_nan=False, allow_infinity=False)
counts = st.integers(0, 1 << 40)
statuses = st.sampled_from(["ok", "error", "failed", "abandoned", "queued", 'we"ird'])
blobs = st.none() | st.binary(max_size=6)


def test_the_table_is_the_replayed_row():
    """The record's fields are the columns a replay fills, in their order."""
    assert tuple(f.name for f in journal.RECORD) == REPLAY_COLUMNS
    assert [f.name for f in journal.RECORD if f.optional] == ["reason"]


def test_a_record_as_written_on_disk():
    """The bytes of a journal line (specs/journal.md shows this one)."""
    record = {
        "id": "r-1",
        "model": "m",
        "client": 'c"1',
        "device": "n1/0/m",
        "time_in": 1763790000.5,
        "time_out": 1763790000.75,
        "status": "failed",
        "payload_size": 22,
        "attempts": 2,
        "payload": b"\x00\x01",
        "reason": "é\n",
    }
    line = journal.encode(record)
    assert line == (
        '["r-1","m","c\\"1","n1/0/m","0x1.a48532c200000p+30","0x1.a48532c300000p+30",'
        '"failed",22,2,"AAE=","\\u00e9\\n"]\n'
    )
    assert journal.journal_row(json.loads(line)) == tuple(record[c] for c in REPLAY_COLUMNS)
    arrival = {**record, "device": None, "time_out": None, "status": "queued", "attempts": 0}
    del arrival["reason"]
    line = journal.encode(arrival)
    assert line == ('["r-1","m","c\\"1",null,"0x1.a48532c200000p+30",null,"queued",22,0,"AAE="]\n')
    assert journal.journal_row(json.loads(line)) == (
        *(arrival[c] for c in REPLAY_COLUMNS[:-1]),
        None,
    )


def test_blank_lines_are_not_records(tmp_path):
    """A full disk's room probe (line ends written and cut back at once) left by a crash in
    between: the records around it are read, nothing is quarantined for it."""
    record = {
        "id": "r-1",
        "model": "m",
        "client": "c",
        "device": None,
        "time_in": 1.5,
        "time_out": None,
        "status": "queued",
        "payload_size": 0,
        "attempts": 0,
        "payload": None,
    }
    path = tmp_path / "s.db.journal.1"
    line = journal.encode(record)
    path.write_text(line + "\n" * 300 + line.replace("r-1", "r-2"))
    entries, bad = read_journal(path)
    assert [row[0] for *_, row in entries] == ["r-1", "r-2"]
    assert bad == []


@given(texts, texts, texts, st.none() | texts, times, times, statuses, counts, counts, blobs)
def test_the_request_path_writes_what_the_table_writes(
    rid, model, client, device, t_in, t_out, status, size, attempts, payload
):
    """``line_head`` + ``line_end`` (with and without a reason) and ``arrival_line``: the
    bytes of ``encode``, for any values."""
    names = journal.names_text(model, client, device)
    head = journal.line_head(rid, names, journal.json_time(t_in))
    record = {
        "id": rid,
        "model": model,
        "client": client,
        "device": device,
        "time_in": t_in,
        "time_out": t_out,
        "status": status,
        "payload_size": size,
        "attempts": attempts,
        "payload": payload,
    }
    for reason in (None, "", 'why "not"\n', "\u2028é"):
        line = journal.line_end(
            head,
            journal.json_time(t_out),
            status,
            size,
            attempts,
            journal.json_blob(payload),
            reason,
        )
        assert line == journal.encode({**record, "reason": reason})
    arrival = {**record, "device": None, "time_out": None, "status": "queued", "attempts": 0}
    line = journal.arrival_line(
        rid, journal.names_text(model, client, None), journal.json_time(t_in), size, payload
    )
    assert line == journal.encode(arrival)


@given(
    storable,
    storable,
    storable,
    st.none() | storable,
    finite_times,
    finite_times,
    statuses,
    counts,
    st.integers(0, (1 << 31) - 1),
    blobs,
    st.none() | storable,
)
def test_the_reader_gives_back_what_was_written(
    rid, model, client, device, t_in, t_out, status, size, attempts, payload, reason
):
    """``journal_row`` reads, by name, every value ``encode`` wrote (times exactly; an
    empty payload or reason reads as none)."""
    record = {
        "id": rid,
        "model": model,
        "client": client,
        "device": device,
        "time_in": t_in,
        "time_out": t_out,
        "status": status,
        "payload_size": size,
        "attempts": attempts,
        "payload": payload,
        "reason": reason,
    }
    row = journal.journal_row(json.loads(journal.encode(record)))
    expected = {**record, "payload": payload or None, "reason": reason or None}
    assert row == tuple(expected[c] for c in REPLAY_COLUMNS)


@pytest.mark.parametrize(
    "record, why",
    [
        ({"x": 1}, "not a journal record (a list of 10 or 11 fields)"),
        (["a"] * 9, "not a journal record (a list of 10 or 11 fields)"),
        ([1, "m", "c", None, 1.0, 2.0, "ok", 1, 1, 5], "payload is int, not base64 text"),
        ([1, "m", "c", None, 1.0, 2.0, "ok", 1, 1, "!"], "payload is not base64"),
        ([1, "m", "c", None, 1.0, 2.0, "ok", 1, 1, None], "id is int, not text"),
        (["\ud800", "m", "c", None, 1.0, 2.0, "ok", 1, 1, None],
         "id is not Unicode text (it holds a lone surrogate)"),
        (["i", "m\x00", "c", None, 1.0, 2.0, "ok", 1, 1, None], "model holds a NUL character"),
        (["i", "m", "c", 7, 1.0, 2.0, "ok", 1, 1, None], "device is int, not text"),
        (["i", "m", "c", None, "zz", 2.0, "ok", 1, 1, None], "time in is not a time"),
        (["i", "m", "c", None, True, 2.0, "ok", 1, 1, None], "time in is not a time"),
        (["i", "m", "c", None, 1.0, "inf", "ok", 1, 1, None], "time out is not a finite time"),
        (["i", "m", "c", None, 1.0, None, "ok", 1, 1, None], "time out is not a time"),
        (["i", "m", "c", None, 1.0, None, None, 1, 1, None], "time out is not a time"),
        (["i", "m", "c", None, 1.0, 2.0, None, 1, 1, None], "status is null, not text"),
        (["i", "m", "c", None, 1.0, 2.0, "ok", -1, 1, None],
         "size is not an integer from 0 to 9223372036854775807"),
        (["i", "m", "c", None, 1.0, 2.0, "ok", 1, 1 << 31, None],
         "attempts is not an integer from 0 to 2147483647"),
        (["i", "m", "c", None, 1.0, 2.0, "ok", 1, 1, None, 3], "reason is int, not text"),
    ],
)  # fmt: skip
def test_the_reader_says_which_field_is_wrong(record, why):
    """The quarantine's reasons, as they always were (the payload is checked first, then
    the fields in their order)."""
    with pytest.raises(ValueError) as caught:
        journal.journal_row(record)
    assert str(caught.value) == why


def test_an_arrival_record_reads_back_with_no_time_out():
    row = journal.journal_row(["i", "m", "c", None, 1.0, None, "queued", 1, 0, None])
    assert row == ("i", "m", "c", None, 1.0, None, "queued", 1, 0, None, None)


answers = st.lists(
    st.tuples(
        texts,
        st.sampled_from(["n/0/m", "cache", 'n/"1"/m']),
        times,
        counts,
        st.integers(0, 3),
        blobs,
    ),
    max_size=12,
)


def _names_of(device):
    return journal.names_text("m", 'c"1', device)


@given(answers, times, st.booleans(), st.booleans())
def test_the_batch_writers_write_what_the_table_writes(twin, done, t_out, on, payloads):
    """``ok_records`` and ``arrival_records`` (``RequestStore.completions_ok`` /
    ``arrivals``), both twins: the lines of ``encode`` and the store rows of the pure
    writer; each line reads back as what was answered."""
    tout = journal.json_time(t_out)
    result = twin.ok_records(done, t_out, tout, _names_of, on, payloads)
    assert result == journal.ok_records(done, t_out, tout, _names_of, on, payloads)
    lines, nbytes, ops = result
    assert nbytes == sum(map(len, lines)) and len(lines) == (len(done) if on else 0)
    assert ops == [(1, (d, t_out, "ok", a, rid)) for rid, d, _t, _s, a, _w in done]
    for line, (rid, device, t_in, size, attempts, wire) in zip(lines, done, strict=False):
        assert line == journal.encode(
            {
                "id": rid,
                "model": "m",
                "client": 'c"1',
                "device": device,
                "time_in": t_in,
                "time_out": t_out,
                "status": "ok",
                "payload_size": size,
                "attempts": attempts,
                "payload": wire if payloads else None,
            }
        )
    requests = [(rid, size, wire) for rid, _d, _t, size, _a, wire in done]
    names = _names_of(None)
    args = (requests, "m", 'c"1', t_out, names, tout, on, payloads)
    lines, nbytes, ops = twin.arrival_records(*args)
    assert (lines, nbytes, ops) == journal.arrival_records(*args)
    assert nbytes == sum(map(len, lines)) and len(lines) == (len(requests) if on else 0)
    for line, (rid, size, wire) in zip(lines, requests, strict=False):
        blob = wire if payloads else None
        assert line == journal.encode(
            {
                "id": rid,
                "model": "m",
                "client": 'c"1',
                "time_in": t_out,
                "status": "queued",
                "payload_size": size,
                "attempts": 0,
                "payload": blob,
            }
        )
        if blob:
            assert base64.b64decode(json.loads(line)[9]) == blob
    assert ops == [
        (0, (rid, "m", 'c"1', t_out, size, None if wire is None or not payloads else wire))
        for rid, size, wire in requests
    ]


def test_the_store_uses_the_compiled_batch_writers_unless_pure():
    fast = not pure_requested()
    assert (journal.arrivals_writer is not journal.arrival_records) is fast
    assert (journal.ok_writer is not journal.ok_records) is fast
    assert (writer._merge_ops is not writer.merge_ops) is fast


ids = st.sampled_from([f"r{k}" for k in range(12)])
arrivals = st.tuples(
    ids,
    st.just("m"),
    st.just("c"),
    st.floats(0, 10),
    st.integers(0, 99),
    st.none() | st.binary(max_size=3),
).map(lambda row: (0, row))
completions = st.tuples(
    st.none() | st.just("n/0/m"),
    st.floats(0, 10),
    st.sampled_from(["ok", "error", "failed"]),
    st.integers(0, 3),
    ids,
).map(lambda row: (1, row))


@given(st.lists(arrivals | completions, max_size=40), st.sampled_from([1, 3, 32]))
def test_compiled_merge_of_store_rows_agrees(ops, chunk):
    if pure_requested():
        pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
    from wirekit._fast import storewriter

    pure = writer.merge_ops(ops, chunk)
    assert storewriter.merge_ops(ops, chunk) == pure
    chunks, rest, updates = pure
    assert all(len(c) == 10 * chunk for c in chunks) and len(rest) < chunk
    seen: set = set()
    late = []  # completions of requests that arrived in an earlier hand-over
    for kind, row in ops:
        if kind == 0:
            seen.add(row[0])
        elif row[4] not in seen:
            late.append(row)
    assert len(chunks) * chunk + len(rest) == len(seen)
    assert updates == late


def test_an_answer_whose_time_in_is_none_is_written_null(twin):
    """A first answer with no time in still writes the field (``null``), the line stays
    JSON (a ``None`` time in once matched the writers' "no time yet" mark: an empty field)."""
    done = [("r1", "n/0/m", None, 3, 1, None), ("r2", "n/0/m", 1.5, 3, 1, None)]
    tout = journal.json_time(2.0)
    lines, _, _ = twin.ok_records(done, 2.0, tout, _names_of, True, False)
    assert [json.loads(line)[4] for line in lines] == [None, journal.json_time(1.5)[1:-1]]


@pytest.mark.parametrize("chunk", [0, -3])
def test_merge_refuses_a_chunk_below_one(chunk):
    """Both twins refuse a chunk below 1 with the same ValueError (the compiled one divided
    by it: SIGFPE at 0, rows kept back below 0)."""
    ops = [(0, (f"r{k}", "m", "c", 1.0, 1, None)) for k in range(5)]
    merges = [writer.merge_ops]
    if not pure_requested():
        from wirekit._fast import storewriter

        merges.append(storewriter.merge_ops)
    for merge in merges:
        with pytest.raises(ValueError, match=f"chunk must be at least 1, not {chunk}"):
            merge(ops, chunk)
