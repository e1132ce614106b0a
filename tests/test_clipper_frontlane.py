"""The frontend's per-message methods, ``FrontendState.try_send`` and
``FrontendState.complete``, of each twin (the reference in ``wirekit.clipper.session``, and
the compiled ``wirekit._fast.clipperfront.FrontendState`` with its ``Wire``): for any mix of
submissions, answers, heartbeats and junk, a frontend that tries them first sends the same
frames, completes the same callers with the same outputs and ends in the same state as one
that uses ``FrontendState``'s general path (``submit``/``dispatch``/``receive``) alone; and
what they do not take, they leave untouched.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wirekit import clipper
from wirekit._impl import pure_requested
from wirekit.clipper import (
    Generation,
    Heartbeat,
    InputType,
    NewContainer,
    PredictRequest,
    PredictResponse,
    frontend,
)
from wirekit.clipper._zio import recv_message, send_frames
from wirekit.clipper.session import Completed, FrontendState

NAMES = [b"\x00A", b"\x00B", b"\x00C"]


class PureWire:
    """What the frontend does without the compiled ``Wire``: pyzmq (through ``_zio``) moves
    the frames, every message takes ``FrontendState.receive``."""

    def __init__(self, sock, direct, later):
        self.sock = sock

    def send(self, message):
        send_frames(self.sock, message)

    def receive(self, state, block, spin):
        return recv_message(self.sock, block, spin)


@pytest.fixture(scope="module", params=["fast", "pure"])
def twin(request):
    """Each twin (the compiled one fails, not skips, when it is not built)."""
    if request.param == "fast":
        if pure_requested():
            pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
        fast = importlib.import_module("wirekit._fast.clipperfront")
        return SimpleNamespace(State=fast.FrontendState, Wire=fast.Wire, Callback=fast.Callback)
    return SimpleNamespace(State=FrontendState, Wire=PureWire, Callback=frontend.Callback)


class Direct:
    """A token completed at once (as ``submit_callback``'s and ``predict``'s are)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.outcome = None

    def set_result(self, value) -> None:
        assert self.outcome is None, "completed twice"
        self.outcome = ("ok", normal(value))


class Queued(Direct):
    """A token completed through the state's events (as a Future is)."""


def normal(outputs):
    return [float(x) if not isinstance(x, str) else x for x in outputs]


def registered(
    gen: Generation, itypes: list[InputType], max_in_flight: int, cls: type = FrontendState
) -> FrontendState:
    state = cls(gen, max_in_flight=max_in_flight)
    for name, itype in zip(NAMES, itypes, strict=False):
        rpc = 3 if gen is Generation.V3 else None
        frames = clipper.encode(NewContainer("m", "1", itype, rpc), gen)
        if gen is not Generation.G2016:
            state.receive(name, clipper.encode(Heartbeat(), gen), 0.0)
        state.receive(name, frames, 0.0)
        assert name in state.replicas
    return state


def frames_of(message):
    """A ROUTER message as frames (the compiled ``try_send`` may return an ArrayRequest)."""
    return message if type(message) is list else message.frames()


class World:
    """One frontend's sans-IO side: with ``twin``, ``try_send`` and ``complete`` of its
    state class tried first (as the frontend does); without, the general path alone."""

    def __init__(self, gen, itypes, max_in_flight, twin=None):
        self.state = registered(
            gen, itypes, max_in_flight, FrontendState if twin is None else twin.State
        )
        self.sent: list[list[bytes]] = []
        self.tokens: dict[int, Direct] = {}
        self.quick = twin is not None

    def submit(self, k, inputs, token_type, now):
        token = self.tokens[k] = token_type(k)
        state = self.state
        message = state.try_send("m", inputs, now + 100.0, token, None) if self.quick else None
        if message is None:
            state.submit("m", inputs, now + 100.0, token, None)
            self.sent.extend(state.dispatch(now))
        else:
            self.sent.append(frames_of(message))
        self.settle()

    def receive(self, identity, frames, now):
        state = self.state
        taken = self.complete(identity, frames, now) if self.quick else 0
        if not taken:
            self.sent.extend(state.receive(identity, frames, now))
        elif taken == 2:
            self.sent.extend(state.dispatch(now))
        self.settle()
        return taken

    def complete(self, identity, frames, now):
        """What the compiled Wire does with an answer it reads: ``state.complete``, then
        the caller; 2 when a batch of the model waits, 1, or 0 when not taken."""
        try:
            msg = clipper.decode(frames, self.state.generation, "to_clipper")
        except clipper.DecodeError:
            return 0
        if type(msg) is not PredictResponse:
            return 0
        batch = self.state.complete(identity, msg.msg_id, msg.outputs, now)
        if batch is None:
            return 0
        batch.token.set_result(msg.outputs)
        return 2 if self.state.pending.get(batch.model_name) else 1

    def settle(self):
        events, self.state.events = self.state.events, []
        for event in events:
            if type(event) is Completed:
                event.token.set_result(event.outputs)
            else:
                event.token.outcome = ("error", str(event.error))

    def snapshot(self):
        state = self.state
        return {
            "sent": [[bytes(f) for f in m] for m in self.sent],
            "tokens": {k: t.outcome for k, t in self.tokens.items()},
            "in_flight": sorted(state.in_flight),
            "held": {i: sorted(r.in_flight) for i, r in state.replicas.items()},
            "batches": {
                i: (b.msg_id, b.replica.identity, b.attempts, b.count, b.lost)
                for i, b in state.in_flight.items()
            },
            "pending": {m: [b.token.k for b in q] for m, q in state.pending.items() if q},
            "last_seen": {i: r.last_seen for i, r in state.replicas.items()},
            "next_id": state._next_id,
            "due": state._due,
        }


def inputs_for(kind: str, rows: int):
    if kind == "f64":
        return np.arange(rows * 3, dtype=np.float64).reshape(rows, 3)
    if kind == "f32":
        return np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    if kind == "list":
        return [[float(r), 1.0] for r in range(rows)]
    if kind == "i32":
        return np.arange(rows * 3, dtype=np.int32).reshape(rows, 3)
    if kind == "strings":
        return [f"s{r}" for r in range(rows)]
    return []  # empty: refused


def answer_frames(gen, msg_id, count):
    return clipper.encode(PredictResponse(msg_id, answer_frames_outputs(gen, count)), gen)


OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.sampled_from(["f64", "f64", "list", "f32", "strings", "empty"]),
            st.integers(1, 3),
            st.booleans(),
        ),
        st.tuples(
            st.just("answer"),
            st.integers(0, 2),
            st.integers(0, 3),
            st.sampled_from(["good", "good", "good", "short", "unknown-id"]),
        ),
        st.tuples(st.just("heartbeat"), st.integers(0, 2)),
        st.tuples(st.just("junk"), st.integers(0, 2), st.integers(1, 4)),
    ),
    max_size=40,
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gen=st.sampled_from(list(Generation)),
    itypes=st.lists(
        st.sampled_from(
            [InputType.DOUBLES, InputType.DOUBLES, InputType.FLOATS, InputType.STRINGS]
        ),
        min_size=1,
        max_size=3,
    ),
    max_in_flight=st.integers(1, 3),
    ops=OPS,
)
def test_try_send_and_complete_do_what_the_state_alone_does(twin, gen, itypes, max_in_flight, ops):
    plain = World(gen, itypes, max_in_flight)
    laned = World(gen, itypes, max_in_flight, twin)  # try_send and complete first
    now = 1.0
    for k, op in enumerate(ops):
        now += 0.01
        if op[0] == "submit":
            _, kind, rows, direct = op
            token_type = Direct if direct else Queued
            for world in (plain, laned):
                world.submit(k, inputs_for(kind, rows), token_type, now)
        elif op[0] == "answer":
            _, who, pick, how = op
            identity = NAMES[who % len(itypes)]
            held = sorted(plain.state.replicas[identity].in_flight)
            if held:
                msg_id = held[pick % len(held)]
                batch = plain.state.in_flight[msg_id]
                count = batch.count - 1 if how == "short" else batch.count
                count = count or 2  # one short of one: answer two instead
                if how == "unknown-id":
                    msg_id += 1000
            else:
                msg_id, count = 77, 1
            frames = answer_frames(gen, msg_id, count)
            taken = [world.receive(identity, frames, now) for world in (plain, laned)]
            assert taken[0] == 0
        elif op[0] == "heartbeat":
            identity = NAMES[op[1] % len(itypes)]
            hb = clipper.encode(Heartbeat(), Generation.V3)  # 2016 has none: junk there
            assert [w.receive(identity, hb, now) for w in (plain, laned)] == [0, 0]
        else:
            identity = NAMES[op[1] % len(itypes)]
            junk = [b"", b"\x01\x00\x00\x00", b"\xff" * op[2]][: 1 + op[2] % 3]
            assert [w.receive(identity, junk, now) for w in (plain, laned)] == [0, 0]
        assert laned.snapshot() == plain.snapshot(), op


@pytest.mark.parametrize("gen", list(Generation))
def test_the_common_case_is_taken_whole(twin, gen):
    """A response to a held batch is ``complete``'s; a submission with room is
    ``try_send``'s: the state's general path is not needed for a steady stream of work."""
    world = World(gen, [InputType.DOUBLES], 2, twin)
    state = world.state
    inputs = np.ones((2, 3))
    tokens = [Direct(k) for k in range(3)]
    for token in tokens[:2]:
        world.sent.append(frames_of(state.try_send("m", inputs, 100.0, token, None)))
    assert state.try_send("m", inputs, 100.0, tokens[2], None) is None  # no room
    world.state.submit("m", inputs, 100.0, tokens[2], None)
    assert len(world.sent) == 2
    (identity, *request) = world.sent[0]
    sent = clipper.decode(request, gen, "to_container")
    assert sent.input_type is InputType.DOUBLES and np.array_equal(sent.inputs, inputs)
    assert state.complete(b"\x00?", sent.msg_id, ["a", "b"], 1.0) is None  # not a replica
    assert state.complete(identity, sent.msg_id, ["a"], 1.0) is None  # a wrong count
    assert state.complete(identity, sent.msg_id + 7, ["a", "b"], 1.0) is None  # not held
    assert sent.msg_id in world.state.in_flight  # ... and nothing changed
    assert world.receive(identity, answer_frames(gen, sent.msg_id, 2), 1.0) == 2
    assert tokens[0].outcome == ("ok", normal(answer_frames_outputs(gen, 2)))
    assert tokens[1].outcome is None and tokens[2].outcome is None
    assert world.state.replicas[identity].last_seen == 1.0
    assert sent.msg_id not in world.state.in_flight
    assert world.state.events == []
    # 2 says "a batch waits": the world dispatched it to the freed replica.
    assert [m[0] for m in world.sent[2:]] == [identity]


@pytest.mark.parametrize("gen", list(Generation))
def test_a_callback_token_is_called_once_and_a_raising_callback_is_logged(twin, gen, caplog):
    world = World(gen, [InputType.DOUBLES], 4, twin)
    calls = []

    def fn(outputs, error):
        calls.append((normal(outputs), error))
        raise RuntimeError("buggy")

    token = twin.Callback(fn)
    assert not token.done()
    world.submit(0, [[1.0], [2.0]], lambda k: token, 1.0)
    (identity, *request) = world.sent[0]
    msg_id = clipper.decode(request, gen, "to_container").msg_id
    assert world.receive(identity, answer_frames(gen, msg_id, 2), 1.0) == 1
    assert calls == [(normal(answer_frames_outputs(gen, 2)), None)]
    assert token.done() and "submit_callback callback raised" in caplog.text
    token.set_exception(RuntimeError("late"))  # already done: not called again
    failing = twin.Callback(lambda out, err: calls.append((out, str(err))))
    failing.set_exception(RuntimeError("no replica"))
    assert calls[1:] == [(None, "no replica")]


def answer_frames_outputs(gen, count):
    return [1.5] * count if gen is Generation.G2016 else [f"o{i}" for i in range(count)]


# --- over a real ROUTER: the compiled twin's own receive and send paths ---


class WireWorld(World):
    """The twin's state and wire over a real ROUTER (inproc), with one DEALER per replica:
    answers go in through the socket, requests come out of it."""

    def __init__(self, gen, itypes, max_in_flight, twin, ctx, tag):
        self.state = twin.State(gen, max_in_flight=max_in_flight)
        self.later = []
        self.sent = []
        self.tokens = {}
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.RCVTIMEO, 5000)
        self.router.bind(f"inproc://frontlane-{tag}")
        self.dealers = {}
        for name in NAMES[: len(itypes)]:
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.ROUTING_ID, name)
            dealer.setsockopt(zmq.RCVTIMEO, 5000)
            dealer.connect(f"inproc://frontlane-{tag}")
            self.dealers[name] = dealer
        self.wire = twin.Wire(self.router, (Direct,), self.later)
        for name, itype in zip(NAMES, itypes, strict=False):  # register over the wire
            rpc = 3 if gen is Generation.V3 else None
            if gen is not Generation.G2016:
                self.receive(name, clipper.encode(Heartbeat(), gen), 0.0)
            self.receive(name, clipper.encode(NewContainer("m", "1", itype, rpc), gen), 0.0)
            assert name in self.state.replicas
        self.collect()  # the heartbeat replies
        self.sent.clear()

    def send_out(self, messages):
        for m in messages:
            send_frames(self.router, m)

    def submit(self, k, inputs, token_type, now):
        token = self.tokens[k] = token_type(k)
        message = self.state.try_send("m", inputs, now + 100.0, token, None)
        if message is None:
            self.state.submit("m", inputs, now + 100.0, token, None)
            self.send_out(self.state.dispatch(now))
        else:
            self.wire.send(message)
        self.settle()

    def settle(self):
        while self.later:
            token, outputs = self.later.pop(0)
            token.set_result(outputs)
        super().settle()

    def receive(self, identity, frames, now):
        send_frames(self.dealers[identity], frames)
        got = self.wire.receive(self.state, True, 0.0)
        assert got is not None, "the message did not arrive"
        if type(got) is tuple:
            (identity, *rest), _ = got
            self.send_out(self.state.receive(identity, rest, now))
            got = 0
        elif got == 2:
            self.send_out(self.state.dispatch(now))
        self.settle()
        return got

    def collect(self):
        """What the ROUTER sent, per replica, as ROUTER messages."""
        for name, dealer in self.dealers.items():
            while dealer.poll(0):
                self.sent.append([name, *dealer.recv_multipart()])

    def snapshot(self):
        self.collect()
        snap = super().snapshot()
        del snap["last_seen"]  # the Wire stamps answers with the real clock
        snap["sent"] = sorted(snap["sent"], key=lambda m: m[0])  # in order per replica
        return snap

    def close(self):
        for dealer in self.dealers.values():
            dealer.close(0)
        self.router.close(0)


@settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    gen=st.sampled_from([Generation.V3, Generation.V3, Generation.G2017, Generation.G2016]),
    itypes=st.lists(
        st.sampled_from([InputType.DOUBLES, InputType.DOUBLES, InputType.INTS, InputType.STRINGS]),
        min_size=1,
        max_size=3,
    ),
    max_in_flight=st.integers(1, 3),
    ops=OPS,
)
def test_over_a_router_the_wire_and_state_do_what_the_state_alone_does(
    twin, zmq_ctx, gen, itypes, max_in_flight, ops
):
    plain = World(gen, itypes, max_in_flight)
    wire = WireWorld(gen, itypes, max_in_flight, twin, zmq_ctx, next(TAGS))
    try:
        now = 1.0
        for k, op in enumerate(ops):
            now += 0.01
            if op[0] == "submit":
                _, kind, rows, direct = op
                inputs = inputs_for("i32" if kind == "f32" else kind, rows)
                for world in (plain, wire):
                    world.submit(k, inputs, Direct if direct else Queued, now)
            elif op[0] == "answer":
                _, who, pick, how = op
                identity = NAMES[who % len(itypes)]
                held = sorted(plain.state.replicas[identity].in_flight)
                msg_id, count = 77, 1
                if held:
                    msg_id = held[pick % len(held)]
                    count = plain.state.in_flight[msg_id].count - (how == "short") or 2
                    msg_id += 1000 if how == "unknown-id" else 0
                for world in (plain, wire):
                    world.receive(identity, answer_frames(gen, msg_id, count), now)
            else:
                identity = NAMES[op[1] % len(itypes)]
                frames = (
                    clipper.encode(Heartbeat(), Generation.V3)
                    if op[0] == "heartbeat"
                    else [b"", b"\x01\x00\x00\x00", b"\xff" * op[2]][: 1 + op[2] % 3]
                )
                for world in (plain, wire):
                    world.receive(identity, frames, now)
            want = plain.snapshot()
            del want["last_seen"]
            want["sent"] = sorted(want["sent"], key=lambda m: m[0])
            assert wire.snapshot() == want, op
    finally:
        wire.close()


def test_v3_requests_sent_from_the_array_are_the_codecs_frames(twin, zmq_ctx):
    """Every numeric input type, several shapes: the parts written from the array are the
    bytes ``clipper.encode`` makes for the same request."""
    for k, (itype, dtype) in enumerate(
        [
            (InputType.BYTES, np.uint8),
            (InputType.INTS, np.int32),
            (InputType.FLOATS, np.float32),
            (InputType.DOUBLES, np.float64),
        ]
    ):
        wire = WireWorld(Generation.V3, [itype], 8, twin, zmq_ctx, next(TAGS))
        try:
            for rows, width in [(1, 1), (3, 10), (32, 10), (2, 0)]:
                inputs = (np.arange(rows * width) % 200).astype(dtype).reshape(rows, width)
                token = Direct(k)
                wire.wire.send(wire.state.try_send("m", inputs, 100.0, token, None))
                frames = wire.dealers[NAMES[0]].recv_multipart()
                msg_id = max(wire.state.replicas[NAMES[0]].in_flight)
                want = clipper.encode(PredictRequest(msg_id, itype, inputs), Generation.V3)
                assert frames == want
                # The answer comes back through the wire.
                send_frames(wire.dealers[NAMES[0]], answer_frames(Generation.V3, msg_id, rows))
                got = wire.wire.receive(wire.state, True, 0.0)
                if type(got) is tuple:  # the pure twin: the state's general path
                    (identity, *rest), _ = got
                    assert wire.state.receive(identity, rest, 1.0) == []
                    wire.settle()
                else:
                    assert got == 1
                assert token.outcome == ("ok", answer_frames_outputs(Generation.V3, rows))
        finally:
            wire.close()


TAGS = iter(range(10**9))


@pytest.fixture
def zmq_ctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)
