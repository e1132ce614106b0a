"""The container's per-message lane: the Cython twin and the pure twin serve alike.

Each case sends the same messages from a real ROUTER (inproc) to a DEALER served by a lane of
each twin, then compares what came back (frames, byte for byte), what the model was given,
and the counters.  The reference for every answer is the codec: ``encode(PredictResponse)``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import clipper_inputs

from wirekit import clipper
from wirekit._impl import pure_requested
from wirekit.clipper import (
    Generation,
    HeartbeatReply,
    HeartbeatType,
    InputType,
    PredictRequest,
    PredictResponse,
)
from wirekit.clipper._lane import END, IDLE, PureLane
from wirekit.clipper._zio import send_frames
from wirekit.clipper.container import ModelContainer
from wirekit.clipper.session import ContainerSession

LONG = 600.0  # D and TO far away: these cases never tick
_endpoints = itertools.count()


def lane_class(impl: str) -> type:
    if impl == "pure":
        return PureLane
    if pure_requested():
        pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
    from wirekit._fast.clippercontainer import Lane

    return Lane


@pytest.fixture(scope="module")
def pair():
    """A ROUTER and the DEALER it talks to (identity ``b"lane"``), over inproc."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"inproc://lane-{next(_endpoints)}"
    router.bind(endpoint)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IDENTITY, b"lane")
    dealer.connect(endpoint)
    yield router, dealer
    router.close(0)
    dealer.close(0)
    ctx.term()


class Recorder:
    """A model that keeps what it was given and answers with ``answer(inputs)``."""

    def __init__(self, answer):
        self.answer = answer
        self.seen = []

    def __call__(self, inputs):
        self.seen.append(inputs)
        return self.answer(inputs)


def serve(pair, impl, gen, answer, messages, *, threaded=True, itype="doubles"):
    """Send ``messages`` to a lane of ``impl``; return what was answered and observed."""
    router, dealer = pair
    model = Recorder(answer)
    container = ModelContainer(
        model,
        "m",
        "1",
        itype,
        "inproc://unused",
        generation=gen,
        poll_interval=LONG,
        activity_timeout=LONG,
        threaded=threaded,
    )
    container._sock_lock.acquire()  # as the socket thread holds it in run()
    session = ContainerSession(
        gen, container.registration, poll_interval=LONG, activity_timeout=LONG, now=time.monotonic()
    )
    lane = lane_class(impl)(container, dealer, session, functools.partial(send_frames, dealer))
    for frames in messages:
        router.send_multipart([b"lane", *frames])
    outcome = None
    try:
        while True:  # until the lane has waited FAST_WAIT without a message
            outcome = lane.run()
            if outcome in (IDLE, END):
                break
    except Exception as exc:  # VersionMismatch: the same from both twins
        outcome = type(exc).__name__
    while dealer.poll(0):  # what a session that ended left unread
        dealer.recv_multipart()
    answers = []
    while router.poll(0):
        answers.append(router.recv_multipart()[1:])
    return {
        "answers": answers,
        "seen": model.seen,
        "outcome": outcome,
        "served": container.served,
        "failures": container.failures,
        "requests": session.requests,
        "state": session.state,
    }


def same_inputs(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            type(a) is type(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_inputs(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def assert_twins_agree(fast, pure):
    seen_fast, seen_pure = fast.pop("seen"), pure.pop("seen")
    assert fast == pure
    assert len(seen_fast) == len(seen_pure)
    assert all(same_inputs(a, b) for a, b in zip(seen_fast, seen_pure, strict=True))


def both(pair, *args, **kwargs):
    """Serve with the pure twin, then (unless WIREKIT_PURE=1) with the Cython twin, and
    check they agree; the pure result is returned."""
    pure = serve(pair, "pure", *args, **kwargs)
    if not pure_requested():
        fast = serve(pair, "fast", *args, **kwargs)
        assert_twins_agree(fast, dict(pure))
    return pure


def request(gen, msg_id, itype, inputs):
    return clipper.encode(PredictRequest(msg_id, itype, inputs), gen)


def strings(inputs):
    return [f"n{len(inputs)}-{i}" for i in range(len(inputs))]


GENS = ["2016", "2017", "v3"]
NUMERIC_INPUTS = {
    InputType.BYTES: np.arange(12, dtype=np.uint8).reshape(3, 4),
    InputType.INTS: np.arange(-4, 4, dtype=np.int32).reshape(2, 4),
    InputType.FLOATS: np.linspace(0, 1, 5, dtype=np.float32).reshape(1, 5),
    InputType.DOUBLES: np.arange(10.0).reshape(1, 10),
}


@pytest.mark.parametrize("gen", GENS)
@pytest.mark.parametrize("itype", list(InputType))
def test_requests_of_every_type_are_answered_as_the_codec_encodes(pair, gen, itype):
    inputs = NUMERIC_INPUTS.get(itype, ["a", "bé", ""])
    answer = models_answer(gen)
    result = both(pair, gen, answer, [request(gen, 7, itype, inputs)] * 3, itype=itype.name.lower())
    expected = clipper.encode(PredictResponse(7, answer(inputs)), gen)
    assert result["answers"] == [expected] * 3
    assert result["served"] == result["requests"] == 3
    assert result["state"] == "registered"
    assert result["outcome"] == IDLE
    if itype != InputType.STRINGS:
        assert np.array_equal(np.asarray(result["seen"][0]), inputs)


def models_answer(gen):
    if gen == "2016":
        return lambda inputs: [float(i) for i in range(len(inputs))]
    return strings


def test_inputs_are_fresh_arrays_per_request(pair):
    msgs = [request("v3", k, InputType.DOUBLES, np.full((2, 3), float(k))) for k in range(4)]
    result = both(pair, "v3", strings, msgs)
    assert [float(x.mean()) for x in result["seen"]] == [0.0, 1.0, 2.0, 3.0]
    assert all(x.flags.writeable and x.flags.owndata for x in result["seen"])


@pytest.mark.parametrize("gen", ["2017", "v3"])
@pytest.mark.parametrize(
    "outputs",
    [
        pytest.param(lambda x: np.array(["a"] * len(x)), id="str-array"),
        pytest.param(lambda x: tuple("t" for _ in x), id="tuple"),
        pytest.param(lambda x: [type("Text", (str,), {})("sub")] * len(x), id="str-subclass"),
        pytest.param(lambda x: [""] * len(x), id="empty-strings"),
        pytest.param(lambda x: [f"long output {i} " * 40 for i in range(len(x))], id="long"),
    ],
)
def test_other_output_forms_are_answered_as_the_codec_encodes(pair, gen, outputs):
    inputs = np.arange(40.0).reshape(20, 2)  # 20 outputs: more than the lane gathers in place
    result = both(pair, gen, outputs, [request(gen, 3, InputType.DOUBLES, inputs)])
    expected_outputs = outputs(inputs)
    if isinstance(expected_outputs, np.ndarray):
        expected_outputs = expected_outputs.tolist()
    assert result["answers"] == [clipper.encode(PredictResponse(3, expected_outputs), gen)]
    assert result["served"] == 1 and result["failures"] == 0


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda x: ["one"] * (len(x) + 1), id="count"),
        pytest.param(lambda x: [1.5] * len(x), id="numbers"),
        pytest.param(lambda x: ["ok", 3], id="one-not-str"),
        pytest.param(lambda x: None, id="none"),
        pytest.param(lambda x: ["\ud800", "x"], id="surrogate"),
        pytest.param(lambda x: [b"raw"] * len(x), id="bytes"),
        pytest.param(lambda x: 1 / 0, id="raises"),
    ],
)
def test_bad_outputs_send_nothing_and_the_lane_keeps_serving(pair, bad, caplog):
    inputs = np.zeros((2, 3))

    def answer(x):
        return strings(x) if x[0, 0] == 1.0 else bad(x)

    msgs = [
        request("v3", 11, InputType.DOUBLES, inputs),
        request("v3", 12, InputType.DOUBLES, inputs + 1),
    ]
    with caplog.at_level(logging.ERROR, "wirekit.clipper.container"):
        result = both(pair, "v3", answer, msgs)
    assert result["answers"] == [clipper.encode(PredictResponse(12, strings(inputs)), "v3")]
    assert result["served"] == 1 and result["failures"] == 1
    assert "message 11" in caplog.text


@pytest.mark.parametrize("threaded", [True, False])
def test_without_the_standby_thread_the_lane_serves_the_same(pair, threaded):
    msgs = [request("v3", k, InputType.DOUBLES, np.full((1, 2), k)) for k in range(3)]
    result = both(pair, "v3", strings, msgs, threaded=threaded)
    assert [a[2] for a in result["answers"]] == [k.to_bytes(4, "little") for k in range(3)]


def test_unequal_lengths_strings_and_heartbeats_go_the_reference_way(pair):
    ragged = [np.arange(3.0), np.arange(5.0)]
    keepalive = clipper.encode(HeartbeatReply(HeartbeatType.KEEPALIVE), "v3")
    msgs = [
        request("v3", 1, InputType.DOUBLES, ragged),
        keepalive,
        request("v3", 2, InputType.DOUBLES, np.ones((2, 2))),
    ]
    result = both(pair, "v3", strings, msgs)
    assert len(result["answers"]) == 2 and result["requests"] == 2
    assert isinstance(result["seen"][0], list) and isinstance(result["seen"][1], np.ndarray)


def test_metadata_request_after_registration_ends_the_session(pair):
    again = clipper.encode(HeartbeatReply(HeartbeatType.REQUEST_CONTAINER_METADATA), "v3")
    msgs = [request("v3", 1, InputType.DOUBLES, np.ones((1, 2))), again]
    result = both(pair, "v3", strings, msgs)
    assert result["outcome"] == END and result["state"] == "closed"
    assert len(result["answers"]) == 1


def test_malformed_and_foreign_frames_are_dropped_or_rejected_alike(pair, caplog):
    good = request("v3", 5, InputType.DOUBLES, np.ones((2, 2)))
    short_header = list(good)
    short_header[6] = short_header[6][:-8]
    bad_rpc = list(good)
    bad_rpc[1] = (9).to_bytes(4, "little")
    with caplog.at_level(logging.WARNING, "wirekit.clipper"):
        result = both(pair, "v3", strings, [short_header, bad_rpc, [b"", b"x"], good])
    assert result["answers"] == [clipper.encode(PredictResponse(5, ["n2-0", "n2-1"]), "v3")]
    assert "dropped a malformed message" in caplog.text
    result = both(pair, "v3", strings, [request("2017", 5, InputType.DOUBLES, [[1.0]])])
    assert result["outcome"] == "VersionMismatch"


# --- properties ------------------------------------------------------------------------------


_mutations = st.one_of(
    st.none(),
    st.tuples(st.just("flip"), st.integers(0, 30), st.integers(0, 200), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 30), st.integers(0, 16)),
    st.tuples(st.just("drop"), st.integers(0, 30)),
)


def _mutate(frames, mutation):
    frames = [bytes(f) for f in frames]
    if mutation is None:
        return frames
    kind, at = mutation[0], mutation[1] % len(frames)
    if kind == "flip" and frames[at]:
        data = bytearray(frames[at])
        data[mutation[2] % len(data)] ^= mutation[3]
        frames[at] = bytes(data)
    elif kind == "cut":
        frames[at] = frames[at][: max(0, len(frames[at]) - mutation[2])]
    elif kind == "drop" and len(frames) > 1:
        del frames[at]
    return frames


@st.composite
def _v3_requests(draw):
    itype = draw(st.sampled_from([t for t in InputType if t != InputType.STRINGS]))
    inputs = draw(clipper_inputs(itype, Generation.V3))
    return request("v3", draw(st.integers(0, 2**32 - 1)), itype, inputs), itype


def _listed(inputs):
    """One output per input showing its values (no arithmetic: no warnings on inf)."""
    return [repr(np.asarray(v).tolist()) for v in inputs]


@settings(max_examples=40)
@given(requests=st.lists(st.tuples(_v3_requests(), _mutations), min_size=1, max_size=3))
def test_property_v3_requests_whole_or_damaged_are_served_alike(pair, requests):
    msgs = [_mutate(frames, mutation) for (frames, _), mutation in requests]
    result = both(pair, "v3", _listed, msgs)
    # every undamaged request was answered, as the codec encodes the answer
    for (frames, _), mutation in requests:
        if mutation is None:
            msg = clipper.decode(frames, "v3", "to_container")
            answer = clipper.encode(PredictResponse(msg.msg_id, _listed(msg.inputs)), "v3")
            assert answer in result["answers"]
