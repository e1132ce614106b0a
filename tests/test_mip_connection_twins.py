"""The compiled MIP server ``Connection`` against the pure one (``PyConnection``), step by step.

Hypothesis writes what a runtime does -- reads split at random points (valid, malformed,
oversize and partial frames, one-call reads), taking events, answering at once or owing,
filling slots, sending, write pauses, end of input, shutdown, release, timers, a lane taking
frames -- and both twins run it (``fuzz/differential.py``, the fuzz target
``mip_connection`` runs the same check): every event, every byte sent and the state after
every step (reading, paused, closing, owed, buffered, the guard's bytes and times, the
server's budget) must be the same.
"""

from __future__ import annotations

import itertools
import struct
from itertools import pairwise

import differential
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wirekit import mip
from wirekit._impl import pure_requested
from wirekit.errors import DecodeError
from wirekit.mip import Inference, Item, Ping
from wirekit.mip import connection as connection_module
from wirekit.mip.connection import LocalProtocolError, PyConnection

HEADER = struct.Struct(">BBBBI")

pytestmark = pytest.mark.skipif(
    pure_requested(), reason="WIREKIT_PURE=1: the Cython twin is deliberately not used"
)


def request(text: str, n: int = 1) -> bytes:
    return mip.encode(Inference.request([[Item.text(text)] for _ in range(n)]))


_REQUEST = st.builds(request, st.text(alphabet="abcxyz", max_size=20), st.integers(0, 4))
_SURVIVED = st.sampled_from(  # malformed, but the stream goes on
    [
        mip.encode(Ping(True)),  # a response: SUBTYPE
        HEADER.pack(0, 9, 0, 0, 3) + b"abc",  # unknown kind: METHOD, skipped
        HEADER.pack(0, 1, 0, 0, 2) + b"xx",  # ping with a payload: SHAPE, skipped
        HEADER.pack(0, 0, 0, 0, 0),  # an error-kind "request": METHOD
        HEADER.pack(0, 0, 3, 0, 0),  # an error reply: SUBTYPE
        HEADER.pack(0, 2, 0, 0, 12) + b"\x01\x00\x00\x01" + struct.pack(">II", 1, 50),
        HEADER.pack(0, 2, 0, 0, 2) + b"\x01\x00",  # truncated inference header: SHAPE
        request("many", 9),  # over max_items of the smaller limits: MEMORY
        HEADER.pack(0, 7, 0, 0, 1 << 30),  # unknown kind announcing 1 GiB: skipped
    ]
)
_BREAKING = st.one_of(  # the stream cannot be trusted after these
    st.sampled_from(
        [
            HEADER.pack(1, 1, 0, 0, 0),  # bad version: PROTOCOL
            HEADER.pack(0, 1, 0, 7, 0),  # reserved byte: PROTOCOL
            HEADER.pack(0, 2, 0, 0, 5000),  # over the smaller limits: MEMORY
        ]
    ),
    st.binary(max_size=24),  # anything
)
_MESSAGE = st.one_of(
    _REQUEST, _REQUEST, _REQUEST, _REQUEST, st.just(mip.encode(Ping(False))), _SURVIVED, _BREAKING
)


@st.composite
def programs(draw):
    messages = draw(st.lists(_MESSAGE, max_size=12))
    stream = b"".join(messages)
    if draw(st.booleans()):  # reads of whole messages (one or more), as a runtime mostly gets
        ends = list(itertools.accumulate(len(m) for m in messages))
        keep = draw(st.lists(st.sampled_from([True, True, False]), min_size=len(ends)))
        cuts = [e for e, cut in zip(ends, keep, strict=False) if cut]
    else:  # reads split anywhere
        cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    edges = [0, *cuts, len(stream)]
    dt = st.sampled_from([0.0, 0.25, 1.0, 2.5])
    other = st.one_of(
        st.just(("events",)),
        st.tuples(st.just("fill"), st.integers(0, 7)),
        st.tuples(st.just("send"), dt, st.booleans()),
        st.tuples(st.just("writing"), st.booleans(), dt),
        st.just(("eoi",)),
        st.just(("shutdown",)),
        st.just(("release",)),
        st.tuples(st.just("expired"), st.sampled_from([0.0, 1.0, 3.0, 12.0])),
        st.just(("timer",)),
        st.tuples(st.just("take"), st.integers(1, 4)),
    )
    program = []
    for a, b in pairwise(edges):
        if b > a:
            program.append(("data", stream[a:b], draw(st.booleans()), draw(dt)))
        steps = draw(st.lists(other, max_size=3))
        if draw(st.booleans()):  # a runtime's usual pass: take the events, send the answers
            steps += [("events",), ("send", 0.0, False)]
        program += steps
    program += [("events",), ("send", 0.0, False)]
    return program


@given(st.integers(0, len(differential.CONNECTION_LIMITS) - 1), st.integers(1, 5), programs())
def test_both_twins_do_the_same_for_any_program(limits, in_flight, program):
    differential.connection_check(limits, in_flight, program)


def test_the_check_catches_a_difference(monkeypatch):
    """The check is not vacuous: a twin that answers pings differently is caught."""
    _fast_cls, pure_cls = differential.connection_twins()
    program = [("data", mip.encode(Ping(False)), False, 0.0), ("events",), ("send", 0.0, False)]
    differential.connection_check(0, 1, program)

    class Other(pure_cls):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def send(self, now, collect=None):
            return super().send(now, collect) + b"!"

    monkeypatch.setattr(differential, "connection_twins", lambda: (Other, pure_cls))
    with pytest.raises(differential.Disagreement):
        differential.connection_check(0, 1, program)


def test_connection_is_the_compiled_twin_unless_pure():
    """The one selection (wirekit._impl): the servers construct the compiled twin."""
    from wirekit._fast import mipconn
    from wirekit.mip import server
    from wirekit.serve.doors import mipfront

    assert connection_module.IMPLEMENTATION == "fast"
    assert connection_module.Connection is mipconn.Connection
    assert server.Connection is mipfront.Connection is mipconn.Connection
    assert connection_module.PyConnection is not mipconn.Connection


def test_same_public_api():
    """Every public method and property of the pure class is on the compiled one."""
    from wirekit._fast.mipconn import Connection

    public = {n for n in dir(PyConnection) if not n.startswith("_")}
    assert public <= set(dir(Connection)), public - set(dir(Connection))


@pytest.mark.parametrize("bad", [-1, 10**30, 3.0, None, 99])
def test_a_lane_returning_a_position_outside_its_bytes_is_refused_by_both(bad):
    """A lane's ``take`` must return a position in ``pos..end``: anything else is a
    ValueError from both twins (the compiled one indexes with it) and nothing is taken."""
    wire = request("a") + request("b")
    messages = []
    for cls in differential.connection_twins():
        conn = cls()
        conn.receive_data(wire, 0.0)
        with pytest.raises(ValueError) as info:
            conn.take_frames(lambda buf, pos, end: bad)
        messages.append(str(info.value))
        assert conn.buffered == len(wire)
        assert conn.next_event().frame == request("a")  # the stream is unharmed
    assert messages[0] == messages[1]


def test_misuse_is_the_same_local_error():
    texts = []
    for cls in differential.connection_twins():
        conn = cls()
        conn.receive_data(request("a") + request("b"), 0.0)
        conn.next_event()
        for call in (conn.next_event, lambda c=conn: c.receive_data(b"x", 0.0)):
            with pytest.raises(LocalProtocolError) as info:
                call()
            texts.append(str(info.value))
        with pytest.raises(LocalProtocolError):
            conn.take_frames(lambda buf, pos, end: pos)
    assert texts[:2] == texts[2:]


# --------------------------------------------------------------------------- memory budget
# Programs under budgets a few requests fill (a request costs its bytes, 320 B an item and
# 1 KiB: wirekit.mip.limits), with the runtime owing every answer (a handler in a thread),
# reporting what its transport holds unsent, and a second connection sharing the budget:
# both twins must charge, park, refuse and resume the same way.

_BUDGET_LIMITS = (
    {"max_message_size": 2048, "memory_budget": 4096, "max_items": 8},
    {"max_message_size": 4096, "memory_budget": 16384, "max_items": 8, "request_timeout": 2.0},
    {"max_message_size": 1024, "memory_budget": 1024, "write_stall_timeout": 1.0},
)
_BUDGET_MESSAGE = st.one_of(
    _REQUEST,
    st.builds(request, st.text(alphabet="ab", min_size=200, max_size=900), st.integers(1, 2)),
    st.just(mip.encode(Ping(False))),
    _SURVIVED,
)


@st.composite
def budget_programs(draw):
    messages = draw(st.lists(_BUDGET_MESSAGE, max_size=10))
    stream = b"".join(messages)
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    edges = [0, *cuts, len(stream)]
    dt = st.sampled_from([0.0, 0.5, 1.5])
    other = st.one_of(
        st.just(("events",)),
        st.tuples(st.just("fill"), st.integers(0, 7)),
        st.tuples(st.just("send"), dt),
        st.tuples(st.just("writing"), st.booleans(), st.integers(0, 5000), dt),
        st.tuples(st.just("written"), st.integers(0, 5000), dt),
        st.tuples(st.just("other"), st.integers(0, 3000)),
        st.tuples(st.just("expired"), st.sampled_from([0.0, 1.0, 3.0])),
        st.just(("timer",)),
        st.tuples(st.just("take"), st.integers(1, 3)),
        st.just(("shutdown",)),
    )
    program = []
    for a, b in pairwise(edges):
        if b > a:
            program.append(("data", stream[a:b], draw(st.booleans()), draw(dt)))
        program += draw(st.lists(other, max_size=4))
        program += [("events",), ("send", 0.0)]
    program += [("fill", 0)] * 8 + [("events",), ("send", 0.0), ("release",)]
    return program


def _budget_event(event):
    from wirekit.mip.connection import Answered, Rejected, Request

    if type(event) is Request:
        return ("request", event.frame)
    if type(event) is Rejected:
        return ("rejected", int(event.code), event.error.field, str(event.error), event.closing)
    if type(event) is Answered:
        return ("answered",)
    return ("other", repr(event))


def _budget_trace(cls, limits: int, in_flight: int, program: list) -> list:
    from wirekit.mip.connection import LocalProtocolError, Request, Slot
    from wirekit.mip.limits import Limits, MemoryBudget

    lim = Limits(**_BUDGET_LIMITS[limits])
    budget = MemoryBudget(lim.memory_budget)
    now = 0.0
    conn = cls(lim, budget, now, max_in_flight=in_flight)
    other = cls(lim, budget, now)  # another connection of the process, holding a partial read
    slots: list = []
    trace: list = []

    def place(event):
        if type(event) is Request:
            slot = Slot()
            slots.append((slot, event.frame[:2] + b"\x01" + event.frame[3:]))
            conn.owe(slot)

    def take(buf, pos, end, owed, limit):
        for _ in range(limit):
            size = mip.frame_size(buf, pos) if end - pos >= 8 else None
            if size is None or pos + size > end or buf[pos + 1] != 2 or buf[pos + 2] != 0:
                break
            owed.append(bytes(buf[pos : pos + size]))
            pos += size
        return pos

    for step in program:
        op = step[0]
        try:
            if op == "data":
                _, chunk, one_call, dt = step
                now += dt
                if one_call:
                    event = conn.receive_request(chunk, now)
                    trace.append(("one", None if event is None else _budget_event(event)))
                    place(event)
                else:
                    conn.receive_data(chunk, now)
            elif op == "events":
                while (event := conn.next_event()) is not None:
                    trace.append(_budget_event(event))
                    place(event)
            elif op == "fill":
                waiting = [s for s in slots if s[0].wire is None]
                if waiting:
                    slot, wire = waiting[step[1] % len(waiting)]
                    slot.wire = wire
            elif op == "send":
                now += step[1]
                trace.append(("sent", conn.send(now)))
            elif op == "writing":
                now += step[3]
                conn.writing(step[1], now, step[2])
            elif op == "written":
                now += step[2]
                conn.written(step[1], now)
            elif op == "other":  # the other connection's partial request grows or shrinks
                other.receive_data(HEADER.pack(0, 2, 0, 0, 1 << 20)[: 1 + step[1] % 7], now)
                trace.append(("other", _budget_event(other.next_event())))
            elif op == "expired":
                now += step[1]
                trace.append(("expired", conn.expired(now)))
            elif op == "timer":
                trace.append(("timer", conn.timer_wanted()))
            elif op == "take":
                trace.append(("took", conn.take_frames(take, conn.owed, step[1])))
            elif op == "shutdown":
                conn.shutdown()
            elif op == "release":
                conn.release()
        except (LocalProtocolError, DecodeError) as exc:
            trace.append(("error", type(exc).__name__, str(exc)))
        g = conn.guard
        trace.append(
            (
                conn.reading,
                conn.paused,
                conn.write_paused,
                conn.closing,
                conn.done,
                conn.pending,
                conn.buffered,
                conn.held,
                len(conn.owed),
                len(conn.ready),
                g.held,
                g.started,
                g.last,
                g.stalled,
                g.unsent,
                budget.total,
            )
        )
    other.release()
    conn.release()
    trace.append(("after release", budget.total))
    return trace


@given(st.integers(0, len(_BUDGET_LIMITS) - 1), st.integers(1, 4), budget_programs())
def test_both_twins_charge_the_memory_budget_the_same_way(limits, in_flight, program):
    fast_cls, pure_cls = differential.connection_twins()
    fast = _budget_trace(fast_cls, limits, in_flight, program)
    pure = _budget_trace(pure_cls, limits, in_flight, program)
    assert fast == pure
    assert fast[-1] == ("after release", 0)  # everything charged is given back
