"""The frontend's query port (``wirekit.clipper.queries``, issue 25): the desk's caps, the
decoder that reads ``inputs`` one element at a time (the same values and errors as
``json.loads``), the memory estimate; and both twins of the frontend's path answering
every shape and cap through the same public methods (``Frontend(...)`` keywords)."""

from __future__ import annotations

import json
import tracemalloc

import pytest
import zmq
from clipper_support import MS, WAIT
from hypothesis import given, settings
from hypothesis import strategies as st
from test_clipper_hostile import describe, front_lane  # noqa: F401 (a fixture)

from wirekit.clipper.container import ModelContainer
from wirekit.clipper.frontend import Frontend
from wirekit.clipper.queries import (
    QueryDesk,
    Ticket,
    _load_object,
    decode_query,
    held_bytes,
)
from wirekit.errors import DecodeError

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def _outcome(load, text):
    try:
        return ("ok", load(text))
    except json.JSONDecodeError as exc:
        return ("error", exc.msg, exc.pos)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["inputs", "model", "x"]), json_values, max_size=4),
    st.sampled_from([None, 0, 2]),
    st.integers(0, 10),
)
def test_the_element_by_element_reader_reads_what_json_loads_reads(doc, indent, cut):
    text = json.dumps(doc, indent=indent)
    for variant in (text, text[: len(text) - cut], text + " x", text.replace(",", ", ,", 1)):
        expected = _outcome(json.loads, variant)
        if expected[0] == "ok" and not isinstance(expected[1], dict):
            continue
        assert _outcome(_load_object, variant) == expected, variant


def test_decode_errors_name_the_field_and_offset():
    with pytest.raises(DecodeError) as caught:
        decode_query(b'{"model": "m", "inputs": [1,]}')
    assert str(caught.value) == "clipper-query: body at frame 1, byte 28: Expecting value"
    with pytest.raises(DecodeError, match=r"from 0 to 2 .*got 3"):
        decode_query(b'{"model": "m", "inputs": [[1]], "timeout": 3}', max_timeout=2)
    assert decode_query(b'{"model": "m", "inputs": [[1]], "timeout": 2}', 2).timeout == 2.0


@pytest.mark.parametrize(
    "inputs",
    [
        [[1.25] * 1000] * 50,
        [[1.0]] * 20000,
        [[]] * 20000,
        ["ab"] * 20000,
        [[[1.0] * 10] * 10] * 300,
    ],
)
def test_held_bytes_is_no_less_than_what_decoding_took(inputs):
    body = json.dumps(inputs).encode()
    tracemalloc.start()
    try:
        decoded = json.loads(body)
        took = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert took <= held_bytes(decoded) <= 6 * took + 4096


def _ticket_of(desk, body=b'{"model": "m", "inputs": [[1]]}'):
    taken = desk.take([b"id", b"", body], 1.0)
    assert isinstance(taken, Ticket)
    return taken


def test_the_desk_counts_queries_and_bytes_until_answered():
    desk = QueryDesk(max_query_size=100, max_pending=2, max_pending_bytes=10_000)
    refused = desk.take([b"id", b"", b"x" * 101], 1.0)
    assert refused[:2] == [b"id", b""] and b"query too large: 101 bytes" in refused[2]
    first, second = _ticket_of(desk), _ticket_of(desk)
    assert (desk.pending, desk.pending_bytes) == (2, 2 * first.charged)
    assert b"too many queries: 2 are waiting" in desk.take([b"id", b"", b"{}"], 1.0)[2]
    query = desk.decode(first)
    assert first.body == b"" and query.held == held_bytes(json.loads("[[1]]"))
    assert desk.admit(first, query) is None and desk.pending_bytes == query.held + second.charged
    desk.answered(first)
    desk.answered(second)
    assert (desk.pending, desk.pending_bytes) == (0, 0)
    small = QueryDesk(max_pending_bytes=200)
    ticket = _ticket_of(small, b'{"model": "m", "inputs": [' + b"[1]," * 20 + b"[1]]}")
    refused = small.admit(ticket, small.decode(ticket))
    assert b"once decoded" in refused[2] and (small.pending, small.pending_bytes) == (0, 0)


@pytest.mark.parametrize(
    "kwargs",
    [{"max_query_size": 0}, {"max_pending_queries": 0}, {"max_query_timeout": float("nan")}],
)
def test_the_frontend_refuses_bad_limits(kwargs):
    with pytest.raises(ValueError, match="must be a finite number at least"):
        Frontend("tcp://127.0.0.1:0", query="tcp://127.0.0.1:0", **kwargs)


def test_both_twins_answer_every_shape_and_cap(ctx, started, front_lane):  # noqa: F811
    fe = Frontend(
        "tcp://127.0.0.1:0",
        "v3",
        context=ctx,
        query="tcp://127.0.0.1:0",
        max_query_size=1 << 20,
        max_pending_queries=2,
        max_query_timeout=5,
    ).start()
    started.append(fe)
    started.append(ModelContainer(describe, "m", "1", "doubles", fe.endpoint, context=ctx).start())
    fe.wait_for("m", 1, WAIT)
    socks = []
    try:

        def ask(*frames: bytes) -> dict:
            sock = ctx.socket(zmq.DEALER)
            socks.append(sock)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(fe.query_endpoint)
            sock.send_multipart(list(frames))
            assert sock.poll(MS), "no answer"
            return json.loads(sock.recv_multipart()[-1])

        assert "expected one JSON body frame" in ask(b"", b"{}", b"{}")["error"]
        assert "no body frame" in ask(b"")["error"]
        assert "query too large" in ask(b"", b" " * ((1 << 20) + 1))["error"]
        assert "from 0 to 5" in ask(b"", b'{"model": "m", "inputs": [[1]], "timeout": 6}')["error"]
        # A query over 64 KiB goes to the decoding thread; answered all the same.
        rows = json.dumps({"model": "m", "inputs": [[1.5] * 100] * 200, "timeout": 5})
        assert len(ask(b"", rows.encode())["outputs"]) == 200
        assert ask(b"", b'{"model": "m", "inputs": [[1]], "timeout": 5}') == {"outputs": ["f:1.0"]}
        assert (fe.queries.pending, fe.queries.pending_bytes) == (0, 0)
    finally:
        for sock in socks:
            sock.close(0)
    assert fe.error is None
