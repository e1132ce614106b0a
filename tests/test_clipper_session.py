"""The sans-IO Clipper state machines, driven with a fake clock (no sockets)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from wirekit import clipper
from wirekit.clipper import (
    Generation,
    Heartbeat,
    HeartbeatReply,
    HeartbeatType,
    InputType,
    NewContainer,
    PredictRequest,
    PredictResponse,
    session,
)
from wirekit.clipper.session import (
    Completed,
    ContainerSession,
    Failed,
    FrontendState,
    OutputError,
    Predict,
    PredictionError,
    Reconnect,
    Send,
    VersionMismatch,
    check_outputs,
)

HEARTBEATING = [Generation.G2017, Generation.V3]
D, TO = 1.0, 5.0


def reg(gen, itype=InputType.DOUBLES, name="m"):
    return NewContainer(name, "1", itype, 3 if gen is Generation.V3 else None)


def new_session(gen: Generation) -> ContainerSession:
    """A container session of ``gen`` registering model "m" (D, TO), not started."""
    return ContainerSession(gen, reg(gen), poll_interval=D, activity_timeout=TO)


def started_session(gen: Generation) -> ContainerSession:
    """The same, started at time 0 (what it sent then dropped)."""
    s = new_session(gen)
    s.start(0.0)
    return s


def to_container(msg, gen):
    return clipper.encode(msg, gen)


def sent(actions, gen):
    return [clipper.decode(a.frames, gen, "to_clipper") for a in actions if type(a) is Send]


# --- container session ---


def test_2016_registers_at_once_and_never_heartbeats():
    s = new_session(Generation.G2016)
    assert sent(s.start(0.0), Generation.G2016) == [reg(Generation.G2016)]
    assert s.deadline() == float("inf")
    assert s.tick(1000.0) == []


@pytest.mark.parametrize("gen", HEARTBEATING)
def test_heartbeats_every_d_while_waiting_then_reconnects_after_to(gen):
    s = new_session(gen)
    assert sent(s.start(0.0), gen) == [Heartbeat()]
    beats = 0
    t = 0.0
    while True:
        t = s.deadline()
        actions = s.tick(t)
        if actions and type(actions[0]) is Reconnect:
            break
        assert sent(actions, gen) == [Heartbeat()]
        beats += 1
    assert t == TO and beats == int(TO / D) - 1
    assert s.state == "closed" and s.tick(t + 100) == []


@pytest.mark.parametrize("gen", HEARTBEATING)
def test_registration_handshake_and_keepalive(gen):
    s = started_session(gen)
    meta = to_container(HeartbeatReply(HeartbeatType.REQUEST_CONTAINER_METADATA), gen)
    assert sent(s.receive(meta, 0.1), gen) == [reg(gen)]
    assert s.state == "registering"
    keep = to_container(HeartbeatReply(HeartbeatType.KEEPALIVE), gen)
    assert s.receive(keep, 0.2) == [] and s.state == "registered"
    # a metadata request once registered: the peer forgot us -> new socket
    (action,) = s.receive(meta, 0.3)
    assert type(action) is Reconnect and "metadata" in action.reason


@pytest.mark.parametrize("gen", HEARTBEATING)
def test_any_message_refreshes_activity_and_requests_become_predictions(gen):
    s = started_session(gen)
    req = PredictRequest(7, InputType.DOUBLES, [[1.0, 2.0]])
    (action,) = s.receive(to_container(req, gen), TO - 0.5)
    assert type(action) is Predict and action.request == req
    assert s.tick(TO + 0.1) == [] or all(type(a) is Send for a in s.tick(TO + 0.1))
    assert s.deadline() <= TO - 0.5 + TO
    (resp,) = s.respond(action.request, ["3.0"], TO)
    assert clipper.decode(resp.frames, gen, "to_clipper") == PredictResponse(7, ["3.0"])


@pytest.mark.parametrize("gen", HEARTBEATING)
def test_heartbeat_while_the_model_runs_counts_from_the_last_send(gen):
    s = started_session(gen)
    s.receive(to_container(PredictRequest(1, InputType.DOUBLES, [[1.0]]), gen), 0.5)
    # no answer yet from the model: a heartbeat still goes out D after the last send
    assert sent(s.tick(D), gen) == [Heartbeat()]


def test_malformed_message_is_dropped_and_does_not_count_as_activity(caplog):
    s = started_session(Generation.V3)
    assert s.receive([b"", b"\x03\x00\x00\x00", b"\x09\x00\x00\x00"], 1.0) == []
    assert s.last_received == 0.0
    assert "malformed" in caplog.text


def test_version_mismatch_is_raised_with_both_generations_named():
    s = started_session(Generation.V3)
    frames = clipper.encode(HeartbeatReply(HeartbeatType.REQUEST_CONTAINER_METADATA), "2017")
    with pytest.raises(VersionMismatch) as info:
        s.receive(frames, 0.1)
    assert info.value.found == [Generation.G2017]
    assert "2017" in str(info.value) and "v3" in str(info.value)


@pytest.mark.parametrize(
    ("gen", "outputs", "text"),
    [
        ("v3", ["a"], "returned 1 outputs for 2 inputs"),
        ("v3", [1, 2], "output 0 is int"),
        ("2017", np.array([1.0, 2.0]), "float64 array"),
        ("v3", None, "returned None"),
        ("2016", ["a", "b"], "float32"),
        ("v3", 5, "returned int"),
    ],
)
def test_bad_outputs_are_refused_before_sending(gen, outputs, text):
    with pytest.raises(OutputError, match=text):
        check_outputs(outputs, 2, Generation(gen))


def test_good_outputs_pass():
    assert check_outputs(np.array(["a", "b"]), 2, Generation.V3) == [b"a", b"b"]
    assert check_outputs([1, 2.5], 2, Generation.G2016).dtype == np.float32
    outputs = ["a", b"b"]
    assert check_outputs(outputs, 2, Generation.V3, normalize=False) is outputs
    assert check_outputs(("a", "b"), 2, Generation.G2017, normalize=False) == ("a", "b")


def test_a_bad_output_after_good_ones_is_named():
    with pytest.raises(OutputError, match="output 2 is float"):
        check_outputs(["a", b"b", 1.5], 3, Generation.V3, normalize=False)


@pytest.mark.parametrize(
    ("make", "cls", "values"),
    [
        (session._new_send, Send, ([b"", b"x"],)),
        (session._new_predict, Predict, (PredictRequest(3, InputType.INTS, [[1, 2]]),)),
        (session._new_completed, Completed, ("token", ["out"])),
        (session._new_request, PredictRequest, (7, InputType.DOUBLES, [[1.0]], 0)),
        (session._new_response, PredictResponse, (7, ["a"])),
    ],
)
def test_quick_constructors_build_the_same_frozen_objects(make, cls, values):
    quick, usual = make(*values), cls(*values)
    assert type(quick) is cls and quick == usual and repr(quick) == repr(usual)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(quick, cls.__slots__[0], None)


def test_quick_constructors_refuse_other_field_counts():
    with pytest.raises(TypeError, match="3 fields"):
        session._quick_new(
            dataclasses.make_dataclass("Three", ["a", "b", "c"], frozen=True, slots=True)
        )


# --- frontend state ---


def register(fe, ident, gen, now=0.0, itype=InputType.DOUBLES, name="m"):
    out = fe.receive(ident, clipper.encode(reg(gen, itype, name), gen), now)
    assert ident in fe.replicas
    return out


def decode_out(msgs, gen):
    return [(m[0], clipper.decode(m[1:], gen, "to_container")) for m in msgs]


@pytest.mark.parametrize("gen", HEARTBEATING)
def test_frontend_answers_heartbeats_as_clipper(gen):
    fe = FrontendState(gen, activity_timeout=TO)
    hb = clipper.encode(Heartbeat(), gen)
    assert decode_out(fe.receive(b"A", hb, 0.0), gen) == [
        (b"A", HeartbeatReply(HeartbeatType.REQUEST_CONTAINER_METADATA))
    ]
    register(fe, b"A", gen)
    assert decode_out(fe.receive(b"A", hb, 0.1), gen) == [
        (b"A", HeartbeatReply(HeartbeatType.KEEPALIVE))
    ]


@pytest.mark.parametrize("gen", list(Generation))
def test_least_outstanding_replica_and_responses_matched_by_id(gen):
    fe = FrontendState(gen, activity_timeout=TO, max_in_flight=2)
    register(fe, b"A", gen)
    register(fe, b"B", gen)
    for k in range(4):
        fe.submit("m", [[float(k)]], 10.0, k)
    out = decode_out(fe.dispatch(0.0), gen)
    assert [i for i, _ in out] == [b"A", b"B", b"A", b"B"]
    assert [m.msg_id for _, m in out] == [0, 1, 2, 3]
    fe.submit("m", [[9.0]], 10.0, 9)
    assert fe.dispatch(0.0) == []  # both full
    value = (lambda k: [float(k)]) if gen is Generation.G2016 else (lambda k: [str(k)])
    resp = clipper.encode(PredictResponse(1, value(1)), gen)
    again = decode_out(fe.receive(b"B", resp, 0.5), gen)
    assert [i for i, _ in again] == [b"B"]  # the freed slot takes the queued batch
    (event,) = fe.events
    assert type(event) is Completed and event.token == 1
    assert list(event.outputs) == value(1)


@pytest.mark.parametrize("gen", HEARTBEATING)
def test_silent_container_expires_and_its_batch_moves(gen):
    fe = FrontendState(gen, activity_timeout=TO, check_interval=1.0)
    register(fe, b"A", gen, now=0.0)
    fe.submit("m", [[1.0]], 100.0, "t")
    assert [i for i, _ in decode_out(fe.dispatch(0.0), gen)] == [b"A"]
    register(fe, b"B", gen, now=0.0)
    fe.receive(b"B", clipper.encode(Heartbeat(), gen), TO)  # B stays alive
    assert fe.tick(TO) == []  # A silent for exactly TO: not yet
    out = decode_out(fe.tick(TO + 1.0), gen)
    assert b"A" not in fe.replicas
    assert [i for i, _ in out] == [b"B"]
    # A's late answer is dropped, B's completes the batch
    late = clipper.encode(PredictResponse(0, ["x"]), gen)
    fe.receive(b"A", late, TO + 1.1)
    assert fe.events == []
    fe.receive(b"B", clipper.encode(PredictResponse(out[0][1].msg_id, ["y"]), gen), TO + 1.2)
    assert [(type(e), e.outputs) for e in fe.events] == [(Completed, ["y"])]


def test_lost_batch_fails_clearly_when_no_replica_is_left():
    fe = FrontendState("v3", activity_timeout=TO)
    register(fe, b"A", Generation.V3)
    fe.submit("m", [[1.0]], 2.0, "t")
    fe.dispatch(0.0)
    fe.remove(b"A", "disconnected", 0.5)
    fe.tick(2.0)
    (event,) = fe.events
    assert type(event) is Failed and isinstance(event.error, PredictionError)
    assert "replica 0 was lost (disconnected)" in str(event.error)
    assert "no other replica" in str(event.error)


def test_input_type_is_checked_against_the_container():
    fe = FrontendState("v3")
    register(fe, b"A", Generation.V3, itype=InputType.DOUBLES)
    fe.submit("m", ["text"], 5.0, "t")
    (event,) = fe.events
    assert "takes doubles inputs; these inputs are strings" in str(event.error)
    fe.events.clear()
    fe.submit("m", np.zeros((2, 3), np.float32), 5.0, "u")
    assert "these inputs are floats" in str(fe.events[0].error)


def test_no_replica_before_the_timeout():
    fe = FrontendState("2017")
    fe.submit("nobody", [[1.0]], 1.0, "t")
    assert fe.tick(0.0) == [] and fe.deadline() == 1.0
    fe.tick(1.0)
    assert "no live replica registered" in str(fe.events[0].error)


def test_deadline_is_never_late_and_exact_after_a_tick():
    fe = FrontendState("2017", activity_timeout=30.0)
    register(fe, b"A", Generation.G2017)
    fe.tick(0.0)  # the first expiry check: next one at 10 s
    assert fe.deadline() == 10.0
    fe.submit("m", [[1.0]], 4.0, "early")
    fe.submit("m", [[2.0]], 7.0, "late")
    assert fe.deadline() == 4.0  # the soonest batch, without a tick
    ((_, msg),) = decode_out(fe.dispatch(1.0), Generation.G2017)
    fe.receive(b"A", clipper.encode(PredictResponse(msg.msg_id, ["x"]), "2017"), 1.0)
    assert [e.token for e in fe.events] == ["early"]
    assert fe.deadline() <= 7.0  # a lower bound while the late batch waits
    fe.tick(2.0)
    assert fe.deadline() == 7.0  # made exact: the answered batch no longer counts
    fe.tick(7.0)
    assert fe.events[-1].token == "late" and "no answer" in str(fe.events[-1].error)
    assert fe.deadline() == 10.0


def test_frontend_logs_malformed_and_out_of_order_messages(caplog):
    fe = FrontendState("v3")
    assert fe.receive(b"A", [b"", b"\xff"], 0.0) == []
    assert fe.receive(b"A", clipper.encode(PredictResponse(5, ["x"]), "v3"), 0.0) == []
    register(fe, b"A", Generation.V3)
    assert fe.receive(b"A", clipper.encode(PredictResponse(5, ["x"]), "v3"), 0.0) == []
    assert fe.receive(b"A", clipper.encode(reg(Generation.V3), "v3"), 0.0) == []
    text = caplog.text
    assert "malformed" in text and "unregistered" in text and "unknown or expired" in text
    assert fe.events == [] and list(fe.replicas) == [b"A"]


def test_frontend_names_a_version_mismatch(caplog):
    fe = FrontendState("v3")
    frames = clipper.encode(reg(Generation.G2017), "2017")
    assert fe.receive(b"A", frames, 0.0) == []
    assert b"A" not in fe.replicas
    assert "version mismatch" in caplog.text and "2017" in caplog.text
    assert fe.rejected[b"A"].found == [Generation.G2017]
