"""The sans-IO MIP connection (``wirekit.mip.connection``), against both twins (the compiled
``Connection`` on the compiled codec, ``PyConnection`` on the pure one: the ``mip_conn``
fixture).

No sockets: bytes in, events out, replies out.  The properties: any chunking of a stream
gives the same events and the same replies; any byte string gives events (a peer's error is
a ``Rejected`` event with its reply), never another exception.
"""

from __future__ import annotations

import struct
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wirekit import mip
from wirekit.errors import DecodeError
from wirekit.mip import ErrorCode, ErrorReply, Inference, Item, Ping
from wirekit.mip.connection import (
    Answered,
    LocalProtocolError,
    Rejected,
    Request,
    Slot,
    error_reply,
)
from wirekit.mip.limits import BufferBudget, Limits

HEADER = struct.Struct(">BBBBI")
PING = mip.encode(Ping(False))
PONG = mip.encode(Ping(True))


def request(text: str) -> bytes:
    return mip.encode(Inference.request([[Item.text(text)]]))


def answer_for(frame: bytes) -> bytes:
    """The reply a test runtime gives a request: the request's bytes, kind byte turned into
    a response (distinct per request, and checkable)."""
    return frame[:2] + b"\x01" + frame[3:]


def drive(conn: Any, chunks, now: float = 0.0) -> tuple[list, bytes]:
    """Feed ``chunks`` and take every event, answering each request at once; return the
    events (as comparable tuples) and the bytes the connection sent."""
    events: list = []
    out = bytearray()
    for chunk in chunks:
        conn.receive_data(chunk, now)
        while (event := conn.next_event()) is not None:
            events.append(summary(event))
            if type(event) is Request:
                conn.reply(answer_for(event.frame))
        out += conn.send(now)
    return events, bytes(out)


def summary(event) -> tuple:
    if type(event) is Request:
        return ("request", event.frame)
    if type(event) is Rejected:
        return ("rejected", event.code, event.error.field, event.closing)
    assert type(event) is Answered
    return ("answered", event.message)


# A stream of whole, well-framed messages: requests, pings, and bad ones the stream survives.
_MESSAGE = st.one_of(
    st.text(alphabet="abcxyz", max_size=20).map(request),
    st.just(PING),
    st.just(HEADER.pack(0, 9, 0, 0, 3) + b"abc"),  # unknown kind: METHOD, skipped
    st.just(HEADER.pack(0, 1, 0, 0, 2) + b"xx"),  # ping with a payload: SHAPE
    st.just(HEADER.pack(0, 0, 0, 0, 0)),  # an error-kind "request": METHOD
    st.just(mip.encode(Inference.reply([[Item.text("r")]]))),  # a response: SUBTYPE
    st.just(HEADER.pack(0, 2, 0, 0, 12) + b"\x01\x00\x00\x01" + struct.pack(">II", 1, 50)),
)


@st.composite
def chunked(draw, stream: bytes):
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    edges = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in pairwise(edges) if b > a]


@given(
    st.lists(_MESSAGE, max_size=10)
    .map(b"".join)
    .flatmap(lambda s: st.tuples(st.just(s), chunked(s)))
)
def test_any_chunking_of_a_stream_gives_the_same_events_and_replies(mip_conn, case):
    stream, chunks = case
    whole_events, whole_out = drive(mip_conn(), [stream] if stream else [])
    events, out = drive(mip_conn(), chunks)
    assert events == whole_events
    assert out == whole_out
    # and the replies are the ones each message asks for, in order
    assert out.count(PONG) >= sum(1 for e in events if e == ("answered", Ping(False)))


@given(st.binary(max_size=200), st.data())
def test_any_bytes_give_events_or_a_protocol_error_never_another_exception(mip_conn, data, draw):
    limits = Limits(max_message_size=64, max_items=4, max_buffered=128)
    conn = mip_conn(limits)
    chunks = draw.draw(chunked(data))
    try:
        events, out = drive(conn, chunks)
    except DecodeError as exc:  # pragma: no cover - the property under test
        pytest.fail(f"a peer's bytes raised {exc!r}")
    for kind, *rest in events:
        if kind == "rejected":
            code = rest[0]
            assert error_reply(code) in out
    if any(e[0] == "rejected" and e[3] for e in events):
        assert conn.closing and conn.broken and conn.done  # the error went out, then close


def test_bad_header_then_a_valid_request_in_one_read(mip_conn):
    conn = mip_conn()
    valid = request("valid")
    events, out = drive(conn, [bytes.fromhex("0009000000000000") + valid])
    assert events == [("rejected", ErrorCode.METHOD, "kind", False), ("request", valid)]
    assert out == error_reply(ErrorCode.METHOD) + answer_for(valid)
    events, out = drive(conn, [HEADER.pack(0, 1, 0, 0, 2) + b"xx" + valid])  # ping + payload
    assert events == [("rejected", ErrorCode.SHAPE, "remaining", False), ("request", valid)]
    assert out == error_reply(ErrorCode.SHAPE) + answer_for(valid)
    assert conn.reading and not conn.closing


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (HEADER.pack(1, 1, 0, 0, 0), ErrorCode.PROTOCOL),  # bad version
        (HEADER.pack(0, 1, 0, 9, 0), ErrorCode.PROTOCOL),  # reserved byte
        (HEADER.pack(0, 2, 0, 0, 1 << 20), ErrorCode.MEMORY),  # over max_message_size
    ],
)
def test_a_broken_stream_is_answered_then_closed_and_later_bytes_ignored(mip_conn, wire, code):
    conn = mip_conn(Limits(max_message_size=1024))
    valid = request("later")
    events, out = drive(conn, [request("first") + wire, valid])
    assert [e[0] for e in events] == ["request", "rejected"]
    assert events[1][1] == code and events[1][3] is True
    assert out == answer_for(request("first")) + error_reply(code)
    assert conn.done and conn.broken and not conn.reading


def test_answers_go_out_in_request_order_and_reading_pauses_at_max_in_flight(mip_conn):
    conn = mip_conn(max_in_flight=2)
    frames = [request(f"r{k}") for k in range(5)]
    conn.receive_data(b"".join(frames), 0.0)
    slots = []
    while (event := conn.next_event()) is not None:
        slot = Slot()
        conn.owe(slot)
        slots.append((slot, event.frame))
    assert len(slots) == 2 and not conn.reading and conn.paused  # three wait in the buffer
    slots[1][0].wire = b"second"
    assert conn.send(1.0) == b""  # the first is not ready: nothing may go out
    slots[0][0].wire = b"first"
    assert conn.send(1.0) == b"firstsecond"
    assert conn.reading  # owed is down to half: reading resumes
    taken = []
    while (event := conn.next_event()) is not None:
        conn.reply(b"<" + event.frame[-2:] + b">")
        taken.append(event.frame)
    # answers ready at once while nothing is owed do not count against max_in_flight
    assert taken == frames[2:]
    assert conn.send(1.0) == b"<r2><r3><r4>"
    assert conn.next_event() is None and conn.reading


def test_misusing_the_api_is_a_local_error_not_the_peers(mip_conn):
    conn = mip_conn()
    conn.receive_data(request("a") + request("b"), 0.0)
    assert type(conn.next_event()) is Request
    with pytest.raises(LocalProtocolError):
        conn.next_event()  # the first request has no place in the reply order yet
    with pytest.raises(LocalProtocolError):
        conn.receive_data(PING, 0.0)
    conn.reply(b"a")
    assert type(conn.next_event()) is Request


def test_receive_request_is_the_one_call_common_case(mip_conn):
    conn = mip_conn()
    valid = request("x")
    got = conn.receive_request(valid, 0.0)
    assert got == Request(mip.decode(valid), valid)
    conn.reply(b"ok")
    assert conn.send(0.0) == b"ok"
    assert conn.receive_request(PING, 0.0) is None  # a ping: answered, reported as an event
    assert conn.next_event() == Answered(Ping(False))
    assert conn.next_event() is None
    assert conn.send(0.0) == PONG
    assert conn.receive_request(valid[:5], 0.0) is None  # partial: buffered as usual
    assert conn.receive_request(valid[5:], 0.0) is None  # (something is buffered)
    assert conn.next_event().frame == valid


def test_buffer_budget_over_the_server_limit_is_memory_then_close(mip_conn):
    budget = BufferBudget(100)
    limits = Limits(max_message_size=100, max_buffered=100)
    a = mip_conn(limits, budget)
    b = mip_conn(limits, budget)
    partial = request("x" * 60)[:70]
    assert drive(a, [partial]) == ([], b"")
    assert budget.total == 70
    events, out = drive(b, [partial])
    assert events == [("rejected", ErrorCode.MEMORY, "buffer", True)]
    assert out == error_reply(ErrorCode.MEMORY) and b.done
    assert budget.total == 70  # b holds nothing
    a.release()
    assert budget.total == 0


def test_request_timeout_runs_from_the_first_byte(mip_conn):
    conn = mip_conn(Limits(request_timeout=3.0, idle_timeout=60.0), now=0.0)
    conn.receive_data(request("slow")[:4], 1.0)
    assert conn.next_event() is None
    assert conn.timer_wanted() and not conn.timer_wanted()  # once per started request
    assert conn.expired(3.9) is None
    assert conn.expired(4.0) == "request incomplete 3.0 s after its first byte"


def test_shutdown_hands_out_what_is_complete_then_closes(mip_conn):
    conn = mip_conn(max_in_flight=1)
    conn.receive_data(request("a") + request("b") + request("c")[:3], 0.0)
    first = conn.next_event()
    conn.owe(Slot())
    assert conn.next_event() is None and conn.paused
    conn.shutdown()
    assert conn.next_event().frame == request("b")  # no in-flight limit while closing
    conn.reply(b"b")
    assert conn.next_event() is None and not conn.done
    conn.owed[0].wire = b"a"
    assert conn.send(0.0) == b"ab" and conn.done
    assert first.frame == request("a")


def test_error_kind_request_gets_method_and_responses_subtype(mip_conn):
    conn = mip_conn()
    events, out = drive(conn, [mip.encode(ErrorReply(0)), mip.encode(ErrorReply(3)), PONG])
    assert [e[1] for e in events] == [ErrorCode.METHOD, ErrorCode.SUBTYPE, ErrorCode.SUBTYPE]
    assert out == b"".join(
        error_reply(c) for c in (ErrorCode.METHOD, ErrorCode.SUBTYPE, ErrorCode.SUBTYPE)
    )


def test_no_request_is_taken_while_the_runtime_cannot_write(mip_conn):
    conn = mip_conn()
    conn.writing(True, 0.0)
    conn.receive_data(request("a") + request("b"), 0.0)
    assert conn.next_event() is None and not conn.reading and not conn.paused
    conn.writing(False, 1.0)
    assert conn.reading
    assert [conn.next_event().frame, conn.reply(b"a")][0] == request("a")
    assert conn.next_event().frame == request("b")


# --------------------------------------------------------------------------- memory budget


def empty_items(n: int) -> bytes:
    body = struct.pack(">II", 1, 0) * n
    return HEADER.pack(0, 2, 0, 0, 4 + len(body)) + bytes([1, 0]) + n.to_bytes(2, "big") + body


def test_a_request_in_flight_is_charged_its_decoded_cost_and_given_back_when_answered(mip_conn):
    """Bytes read, then the request at its cost while it is owed, then nothing."""
    from wirekit.mip.limits import ITEM_COST, REQUEST_COST, request_cost

    budget = BufferBudget(1 << 30)
    conn = mip_conn(Limits(), budget)
    wire = empty_items(1000)
    assert request_cost(wire) == len(wire) + 1000 * ITEM_COST + REQUEST_COST
    conn.receive_data(wire[:100], 0.0)
    assert conn.next_event() is None and budget.total == 100  # a partial request: its bytes
    conn.receive_data(wire[100:], 0.0)
    assert conn.next_event().frame == wire
    conn.owe(Slot())
    assert conn.next_event() is None
    assert budget.total == conn.held == request_cost(wire)  # 1000 empty items: 321 KiB
    conn.owed[0].wire = b"answer"
    assert conn.send(0.0) == b"answer" and budget.total == 0


def test_a_connection_that_owes_answers_waits_for_room_in_the_budget(mip_conn):
    """A request that does not fit waits (reading paused) until this connection's answers
    go out; then it is taken."""
    from wirekit.mip.limits import request_cost

    first, second = empty_items(100), empty_items(200)
    budget = BufferBudget(request_cost(first) + len(second) + 100)
    limits = Limits(max_message_size=4096, memory_budget=budget.limit)
    conn = mip_conn(limits, budget)
    conn.receive_data(first + second, 0.0)
    assert conn.next_event().frame == first
    conn.owe(Slot())
    assert conn.next_event() is None  # no room for the second one's items: it waits
    assert conn.paused and not conn.reading and conn.buffered == len(second)
    conn.owed[0].wire = b"a"
    assert conn.send(1.0) == b"a" and conn.reading  # the first answer went out
    assert conn.next_event().frame == second


def test_a_big_request_the_budget_cannot_hold_is_answered_memory_a_small_one_is_served(
    mip_conn,
):
    """A connection that holds nothing cannot wait for itself: a request whose decoded cost
    does not fit is refused (MEMORY, the stream goes on), a small one is served anyway."""
    budget = BufferBudget(64 * 1024)
    budget.force(0, budget.limit)  # other connections hold it all
    conn = mip_conn(Limits(max_message_size=64 * 1024, memory_budget=budget.limit), budget)
    big, small = empty_items(4000), request("small")
    events, out = drive(conn, [big + small])
    assert events == [("rejected", ErrorCode.MEMORY, "memory_budget", False), ("request", small)]
    assert out == error_reply(ErrorCode.MEMORY) + answer_for(small)


def test_replies_unsent_are_charged_and_a_client_that_does_not_read_is_dropped(mip_conn):
    """What the transport holds unsent counts; with no progress writing it for
    write_stall_timeout, the connection is dropped."""
    budget = BufferBudget(1 << 30)
    conn = mip_conn(Limits(write_stall_timeout=5.0, idle_timeout=None), budget, now=0.0)
    conn.writing(True, 1.0, 70_000)
    assert budget.total == 70_000 and not conn.reading
    assert conn.timer_wanted()  # the runtime arms its timer: the stall clock runs
    assert conn.guard.next_check(1.0) == 6.0
    conn.written(60_000, 4.0)  # the client read some: progress
    assert conn.expired(8.9) is None
    conn.written(60_000, 8.9)
    assert conn.expired(9.0) == "no progress writing replies for 5.0 s (60000 bytes unsent)"
    conn.writing(False, 9.0)
    assert budget.total == 0 and conn.expired(100.0) is None
