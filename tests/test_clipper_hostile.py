"""Hostile peers against the Clipper runtimes, over real sockets (wirekit issue 13).

* a hostile Clipper (a bare ROUTER) against a :class:`ModelContainer`: garbage, truncated
  frames, announced sizes far past the bytes sent, other generations' messages; the container
  keeps its session, logs each, allocates no more than the bytes it got, answers afterwards;
* hostile queries against a :class:`Frontend`'s query socket: every one is answered;
* peers that never register: what the frontend keeps of them is bounded and holds no payload;
* a socket loop that crashes anyway (a bug, injected here): loud, and no caller hangs.

The container and frontend tests run with each twin of their lane (Cython and pure).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
import tracemalloc
import weakref

import numpy as np
import pytest
import zmq
from clipper_support import GENS, MS, WAIT, allocation_peak, cli_env, dropped
from procstat import memory

from wirekit import clipper
from wirekit._impl import pure_requested
from wirekit.clipper import (
    Generation,
    Heartbeat,
    HeartbeatReply,
    HeartbeatType,
    InputType,
    NewContainer,
    PredictRequest,
    PredictResponse,
)
from wirekit.clipper import container as container_module
from wirekit.clipper import frontend as frontend_module
from wirekit.clipper._lane import PureLane
from wirekit.clipper.container import ModelContainer, parse_input_type
from wirekit.clipper.frontend import Frontend, query
from wirekit.clipper.session import FrontendState, PredictionError, VersionMismatch

METADATA = HeartbeatReply(HeartbeatType.REQUEST_CONTAINER_METADATA)


def u32(v: int) -> bytes:
    return v.to_bytes(4, "little")


def u64(v: int) -> bytes:
    return v.to_bytes(8, "little")


def describe(inputs):
    return [
        f"{np.asarray(x).dtype.kind}:" + ",".join(map(repr, np.asarray(x).tolist())) for x in inputs
    ]


def total(inputs):  # 2016 outputs are float32
    return [float(np.sum(x)) for x in inputs]


def _fast_module(name: str):
    if pure_requested():
        pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
    import importlib

    return importlib.import_module(f"wirekit._fast.{name}")  # fails (not skips) if not built


@pytest.fixture(params=["fast", "pure"])
def container_lane(request, monkeypatch):
    """Containers made in this test serve with this twin of the lane."""
    lane = _fast_module("clippercontainer").Lane if request.param == "fast" else PureLane
    monkeypatch.setattr(container_module, "Lane", lane)
    return request.param


@pytest.fixture(params=["fast", "pure"])
def front_lane(request, monkeypatch):
    """Frontends started in this test use this twin of the per-message path."""
    fast = _fast_module("clipperfront") if request.param == "fast" else None
    monkeypatch.setattr(frontend_module, "_FAST", fast)
    monkeypatch.setattr(
        frontend_module, "_STATE", FrontendState if fast is None else fast.FrontendState
    )
    monkeypatch.setattr(
        frontend_module, "_CALLBACK", frontend_module.Callback if fast is None else fast.Callback
    )
    return request.param


# --- a hostile Clipper against a model container -----------------------------------------------


def _good(gen: str, msg_id: int) -> list[bytes]:
    return clipper.encode(PredictRequest(msg_id, InputType.DOUBLES, [[1.0, 2.0], [3.0, 4.0]]), gen)


def _with(frames: list[bytes], index: int, value: bytes) -> list[bytes]:
    out = list(frames)
    out[index] = value
    return out


def _huge_sizes(gen: str) -> list[list[bytes]]:
    """The good request with counts, sizes and offsets announcing far more than is sent."""
    good = _good(gen, 9)
    if gen == "v3":  # 5: header size; 6: [type, n, size...]
        h = good[6]
        return [
            _with(good, 5, u64(2**63)),
            _with(good, 6, h[:8] + u64(2**64 - 1) + h[16:]),
            _with(good, 6, h[:8] + u64(2**32) + h[16:]),
            _with(good, 6, h[:16] + u64(2**62) + h[24:]),
            _with(good, 6, h[:8] + u64(2**61) + u64(2**63) * 2),
        ]
    if gen == "2017":  # 4: header size; 5: [type, n, offsets...]; 6: content size
        h = good[5]
        return [
            _with(good, 4, u64(2**63)),
            _with(good, 6, u64(2**64 - 1)),
            _with(good, 5, h[:4] + u32(2**32 - 1) + h[8:]),
            _with(good, 5, h[:8] + u32(2**32 - 1)),
        ]
    h = good[3]  # 2016 -- 3: [type, n, offsets...]; 4: content
    return [
        _with(good, 3, h[:4] + u32(2**32 - 1) + h[8:]),
        _with(good, 3, h[:8] + u32(2**32 - 1)),
    ]


def _truncated(gen: str) -> list[list[bytes]]:
    good = _good(gen, 9)
    cut = [good[:k] for k in range(1, len(good))]
    cut += [_with(good, i, good[i][:-1]) for i in range(1, len(good)) if good[i]]
    return cut


def _other_generations(gen: str) -> list[list[bytes]]:
    """Well-formed messages of the other generations (after the peer spoke this one)."""
    out = []
    for other in GENS:
        if other == gen:
            continue
        out.append(_good(other, 9))
        if other != "2016":
            out.append(clipper.encode(METADATA, other))
    return out


def _garbage() -> list[list[bytes]]:
    return [
        [b""],
        [b"", b"\x07"],
        [b"\xff" * 100],
        [b"", b"\xff" * (1 << 20)],
        [b"", *[b"x"] * 1000],
        [b"", u32(3), u32(0), b"m", b"1", b"0" * 5000 + b"1", u32(3)],  # a registration
    ]


def _handshake(router, gen: str) -> bytes:
    """Play Clipper up to the container's registration; return its identity."""
    ident, *frames = router.recv_multipart()
    if gen != "2016":
        assert clipper.decode(frames, gen, "to_clipper") == Heartbeat()
        router.send_multipart([ident, *clipper.encode(METADATA, gen)])
        ident, *frames = router.recv_multipart()
    assert type(clipper.decode(frames, gen, "to_clipper")) is NewContainer
    return ident


def _ask(router, ident: bytes, gen: str, msg_id: int) -> PredictResponse:
    router.send_multipart([ident, *_good(gen, msg_id)])
    while True:  # heartbeats may come first
        who, *frames = router.recv_multipart()
        assert who == ident
        msg = clipper.decode(frames, gen, "to_clipper")
        if type(msg) is PredictResponse:
            return msg


@pytest.mark.parametrize("gen", GENS)
def test_a_container_survives_a_hostile_clipper(
    ctx, clipper_side, started, container_lane, gen, caplog
):
    router, address = clipper_side
    c = ModelContainer(
        total if gen == "2016" else describe,
        "m",
        "1",
        "doubles",
        address,
        generation=gen,
        context=ctx,
        poll_interval=1.0,
        activity_timeout=60.0,
    ).start()
    started.append(c)
    ident = _handshake(router, gen)
    expected = ["f:1.0,2.0", "f:3.0,4.0"] if gen != "2016" else [3.0, 7.0]
    assert list(_ask(router, ident, gen, 1).outputs) == expected
    hostile = _garbage() + _truncated(gen) + _huge_sizes(gen) + _other_generations(gen)
    sent = sum(len(f) for frames in hostile for f in frames)
    caplog.clear()
    with allocation_peak() as peak, caplog.at_level(logging.WARNING, "wirekit.clipper"):
        for frames in hostile:
            router.send_multipart([ident, *frames])
        answer = _ask(router, ident, gen, 2)
    assert answer.msg_id == 2 and list(answer.outputs) == expected
    assert c.error is None and c.sessions == 1 and c.served == 2 and c.failures == 0
    lines = dropped(caplog.records, "container")
    assert len(lines) == len(hostile)
    assert all("clipper: " in text and " at frame " in text for text in lines)
    # What the messages announce (up to 2**64 - 1 inputs) was never allocated: at most a
    # few copies of the bytes that came.
    assert peak.bytes < 3 * sent + (1 << 20), (peak.bytes, sent)


@pytest.mark.parametrize(("mine", "theirs"), [("v3", "2017"), ("2017", "v3"), ("2016", "v3")])
def test_a_peer_of_another_generation_from_the_start_is_a_version_mismatch(
    ctx, clipper_side, started, container_lane, mine, theirs
):
    """The one input that ends a container, on purpose and loudly: a peer whose first
    messages are of another generation (a misconfiguration, reported as such)."""
    router, address = clipper_side
    c = ModelContainer(
        describe,
        "m",
        "1",
        "doubles",
        address,
        generation=mine,
        context=ctx,
        poll_interval=1.0,
        activity_timeout=60.0,
    ).start()
    started.append(c)
    ident, *_ = router.recv_multipart()
    router.send_multipart([ident, *_good(theirs, 1)])
    assert c.wait(WAIT)  # the mismatch ends the container
    assert isinstance(c.error, VersionMismatch)
    assert f"the peer speaks Clipper RPC {theirs}" in str(c.error)


# --- a hostile replica against a frontend -------------------------------------------------------


def _hostile_answers(good: list[bytes]) -> list[list[bytes]]:
    """Malformed v3 answers built from ``good`` ([, 1, msg_id, H, header, outputs...])."""
    h = good[4]
    cut = [good[:k] for k in range(1, len(good))]
    cut += [_with(good, i, good[i][:-1]) for i in range(1, len(good)) if good[i]]
    huge = [
        _with(good, 3, u64(2**63)),
        _with(good, 4, u64(2**64 - 1) + h[8:]),
        _with(good, 4, u64(2**32) + h[8:]),
        _with(good, 4, h[:8] + u64(2**62) + h[16:]),
        [*good[:3], u64(16), u64(1) + u64(2**40), b"x"],
    ]
    other = [
        clipper.encode(PredictResponse(1, ["a", "b"]), "2017"),
        clipper.encode(PredictResponse(1, [1.0, 2.0]), "2016"),
    ]
    return _garbage()[:4] + cut + huge + other + [_with(good, 5, b"\xff\xfe")]


def test_a_frontend_survives_a_hostile_replica(ctx, raw, started, front_lane, caplog):
    fe = Frontend("tcp://127.0.0.1:0", "v3", context=ctx).start()
    started.append(fe)
    peer, _ = raw(zmq.DEALER, fe.endpoint)
    peer.send_multipart(clipper.encode(Heartbeat(), "v3"))
    assert clipper.decode(peer.recv_multipart(), "v3", "to_container") == METADATA
    peer.send_multipart(clipper.encode(NewContainer("m", "1", InputType.DOUBLES, 3), "v3"))
    fe.wait_for("m", 1, WAIT)
    future = fe.submit("m", [[1.0], [2.0]], timeout=WAIT)
    request = clipper.decode(peer.recv_multipart(), "v3", "to_container")
    good = clipper.encode(PredictResponse(request.msg_id, ["a", "b"]), "v3")
    hostile = _hostile_answers(good)
    sent = sum(len(f) for frames in hostile for f in frames)
    caplog.clear()
    with allocation_peak() as peak, caplog.at_level(logging.WARNING, "wirekit.clipper"):
        for frames in hostile:
            peer.send_multipart(frames)
        peer.send_multipart(good)
        outputs = future.result(WAIT)
    assert outputs == ["a", "b"]
    assert [r.model_name for r in fe.replicas()] == ["m"] and fe.state.rejected == {}
    lines = dropped(caplog.records, "frontend")
    assert len(lines) == len(hostile)
    assert all("clipper: " in text and " at frame " in text for text in lines)
    assert peak.bytes < 3 * sent + (1 << 20), (peak.bytes, sent)
    assert fe.error is None


# --- hostile queries against a frontend ---------------------------------------------------------


HOSTILE_QUERIES = [
    (b"[" * 100000, "nested too deeply"),  # issue 13: RecursionError stopped the socket loop
    (b'{"a":' * 100000, "nested too deeply"),
    (b"\xff\xfe", "bad query"),
    (b"", "bad query"),
    (b"[1, 2]", "expected a JSON object, got list"),
    (b'"model"', "expected a JSON object, got str"),
    (b'{"inputs": [[1]]}', "missing 'model'"),
    (b'{"model": 1, "inputs": [[1]]}', "model must be a string"),
    (b'{"model": "m", "inputs": [[1]], "timeout": ' + b"9" * 400 + b"}", "too large"),
    (b'{"model": "m", "inputs": [[1]], "timeout": 1e999}', "finite"),
    (b'{"model": "m", "inputs": [[1]], "timeout": NaN}', "finite"),
    (b'{"model": "m", "inputs": [[1]], "timeout": -1}', "finite"),
    (b'{"model": "m", "inputs": [[1]], "timeout": "soon"}', "bad query"),
    (b'{"model": "m", "inputs": [' + b"1" * 5000 + b"]}", "bad query"),
    (
        b'{"model": "m", "inputs": [[1]], "input_type": "' + b"0" * 5000 + b'9"}',
        "unknown input type",
    ),
    (b'{"model": "m", "inputs": [[1]], "input_type": ["doubles"]}', "unknown input type"),
    (b'{"model": "m", "inputs": ["zz"], "input_type": "bytes"}', "bad query"),
    (b'{"model": "m", "inputs": [1], "input_type": "bytes"}', "bad query"),
]


def _ask_raw(sock, body: bytes) -> dict:
    sock.send_multipart([b"", body])
    assert sock.poll(MS), "the frontend did not answer"
    return json.loads(sock.recv_multipart()[-1])


def test_every_hostile_query_is_answered_and_the_frontend_keeps_serving(
    ctx, started, front_lane, container_lane
):
    fe = Frontend("tcp://127.0.0.1:0", "v3", context=ctx, query="tcp://127.0.0.1:0").start()
    started.append(fe)
    asker = ctx.socket(zmq.DEALER)
    asker.setsockopt(zmq.LINGER, 0)
    asker.connect(fe.query_endpoint)
    try:
        for body, text in HOSTILE_QUERIES:
            reply = _ask_raw(asker, body)
            assert "bad query" in reply["error"] and text in reply["error"], (body[:40], reply)
            assert len(reply["error"]) < 300
        started.append(
            ModelContainer(describe, "m", "1", "doubles", fe.endpoint, context=ctx).start()
        )
        fe.wait_for("m", 1, WAIT)
        # Queries that parse but cannot be sent: answered too, by the state.
        nested = b'{"model": "m", "inputs": ' + b"[" * 900 + b"]" * 900 + b"}"
        for body in (
            nested,
            b'{"model": "m", "inputs": [[1, "a"]]}',
            b'{"model": "m", "inputs": [{"a": 1}]}',
            b'{"model": "m", "inputs": [[99999999999999999999999999]]}',
        ):
            assert "cannot send these inputs" in _ask_raw(asker, body)["error"]
    finally:
        asker.close(0)
    assert query(fe.query_endpoint, "m", [[1.0], [2.0, 3.0]], timeout=WAIT, context=ctx) == [
        "f:1.0",
        "f:2.0,3.0",
    ]
    assert fe.error is None and not fe.wait(0)


def test_a_registration_of_thousands_of_digits_does_not_stop_the_frontend(
    ctx, raw, started, front_lane, container_lane
):
    """Issue 13: with the pure codec, int() of the input type raised ValueError."""
    fe = Frontend("tcp://127.0.0.1:0", "v3", context=ctx).start()
    started.append(fe)
    bad, _ = raw(zmq.DEALER, fe.endpoint)
    bad.send_multipart([b"", u32(0), b"odd", b"1", b"0" * 4301 + b"7", u32(3)])
    bad.send_multipart([b"", u32(0), b"zeros", b"1", b"0" * 4301 + b"1", u32(3)])
    bad.send_multipart(clipper.encode(Heartbeat(), "v3"))
    reply = clipper.decode(bad.recv_multipart(), "v3", "to_container")
    assert reply == HeartbeatReply(HeartbeatType.KEEPALIVE)  # "zeros" registered
    assert [(r.model_name, r.input_type) for r in fe.replicas()] == [("zeros", InputType.INTS)]
    started.append(ModelContainer(describe, "m", "1", "doubles", fe.endpoint, context=ctx).start())
    fe.wait_for("m", 1, WAIT)
    assert fe.predict("m", [[5.0]], WAIT) == ["f:5.0"]


# --- peers that never register: bounded, no payload kept ----------------------------------------


def _foreign_registration(name) -> list:
    """A 2017 registration: a v3 frontend rejects its sender as a version mismatch."""
    return [b"", u32(0), name, b"1", b"3"]


def test_a_rejected_peer_keeps_no_reference_to_its_message():
    fe = FrontendState("v3")
    payload = np.full(1 << 20, ord("a"), np.uint8)  # a frame that can be weakly referenced
    gone = weakref.ref(payload)
    frames = _foreign_registration(payload)
    assert fe.receive(b"peer", frames, 0.0) == []
    mismatch = fe.rejected[b"peer"]
    assert mismatch.found == [Generation.G2017]
    assert mismatch.error.__traceback__ is None and mismatch.error.__context__ is None
    del frames, payload
    gc.collect()
    assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]


def test_rejected_peers_are_bounded_and_forgotten_oldest_first(caplog):
    fe = FrontendState("v3", max_rejected=3)
    for i in range(5):
        fe.receive(b"p%d" % i, _foreign_registration(b"m"), 0.0)
    assert list(fe.rejected) == [b"p2", b"p3", b"p4"]
    fe.receive(b"p2", _foreign_registration(b"m"), 0.0)  # seen again: now the newest
    fe.receive(b"p5", _foreign_registration(b"m"), 0.0)
    assert list(fe.rejected) == [b"p4", b"p2", b"p5"]
    assert FrontendState("v3", max_rejected=0).rejected == {}
    with pytest.raises(ValueError, match="max_rejected"):
        FrontendState("v3", max_rejected=-1)


def test_garbage_from_many_peers_leaves_bounded_memory(caplog):
    caplog.set_level(logging.CRITICAL, "wirekit.clipper")  # no records holding messages
    fe = FrontendState("v3", max_rejected=16)
    chunk = 64 << 10

    def one_peer(i: int) -> None:
        fe.receive(b"peer-%d" % i, _foreign_registration(b"a" * chunk), 0.0)
        fe.receive(b"junk-%d" % i, [b"", b"\xff" * chunk], 0.0)

    one_peer(-1)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(300):  # 300 peers x 128 KiB
            one_peer(i)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(fe.rejected) == 16 and fe.replicas == {}
    assert kept < 256 << 10, kept  # 37.5 MiB came; 16 summaries are kept


def test_a_live_frontend_keeps_no_payload_of_peers_that_never_register(
    ctx, started, front_lane, caplog
):
    caplog.set_level(logging.CRITICAL, "wirekit.clipper")
    fe = Frontend("tcp://127.0.0.1:0", "v3", context=ctx, max_rejected=4).start()
    started.append(fe)
    body = b"a" * (1 << 20)
    heartbeat = clipper.encode(Heartbeat(), "v3")

    def peers_that_never_register(count: int) -> None:
        peers = []
        try:
            for _ in range(count):
                peer = ctx.socket(zmq.DEALER)
                peers.append(peer)
                peer.setsockopt(zmq.LINGER, 0)
                peer.setsockopt(zmq.RCVTIMEO, MS)
                peer.connect(fe.endpoint)
                peer.send_multipart(_foreign_registration(body))
                peer.send_multipart(heartbeat)
            for peer in peers:  # answered: the message before it was handled
                assert clipper.decode(peer.recv_multipart(), "v3", "to_container") == METADATA
        finally:
            for peer in peers:
                peer.close(0)

    peers_that_never_register(2)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        peers_that_never_register(20)  # 20 MiB
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(fe.state.rejected) == 4
    assert kept < 3 << 20, kept  # at most the message the socket thread last held


# --- a socket loop that crashes anyway ----------------------------------------------------------


def _broken(*args):
    raise RuntimeError("injected bug")


def test_a_crashed_socket_loop_fails_every_prediction(ctx, front_lane, monkeypatch, caplog):
    fe = Frontend("tcp://127.0.0.1:0", "v3", context=ctx).start()
    try:
        waiting = fe.submit("absent", [[1.0]], timeout=WAIT)  # no replica: queued
        monkeypatch.setattr(fe.state, "dispatch", _broken)
        crashing = fe.submit("absent", [[2.0]], timeout=WAIT)  # its dispatch raises
        assert fe.wait(WAIT)
        assert isinstance(fe.error, RuntimeError)
        for future in (waiting, crashing):
            with pytest.raises(PredictionError, match=r"socket loop crashed .*injected bug"):
                future.result(WAIT)
        with pytest.raises(PredictionError, match="socket loop crashed"):
            fe.predict("absent", [[3.0]], timeout=WAIT)  # at once
        assert any(r.exc_info and r.exc_info[1] is fe.error for r in caplog.records)
    finally:
        fe.stop()


def test_a_caller_driving_the_sockets_into_a_bug_gets_a_prediction_error(
    ctx, front_lane, monkeypatch
):
    fe = Frontend("tcp://127.0.0.1:0", "v3", context=ctx).start()
    try:
        monkeypatch.setattr(fe.state, "dispatch", _broken)
        with pytest.raises(PredictionError, match=r"socket loop crashed .*injected bug"):
            fe.predict("absent", [[1.0]], timeout=WAIT)
        assert fe.wait(WAIT) and isinstance(fe.error, RuntimeError)
    finally:
        fe.stop()


def _cli_with_a_bug(cls: str, method: str, *args: str) -> subprocess.CompletedProcess:
    """``wirekit clipper ARGS...`` in a process where ``cls.method`` of
    ``wirekit.clipper.session`` raises ``RuntimeError("injected bug")``."""
    script = textwrap.dedent(f"""
        import sys
        from wirekit.clipper.session import {cls}
        def broken(self, now):
            raise RuntimeError("injected bug")
        {cls}.{method} = broken
        from wirekit.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    return subprocess.run(
        [sys.executable, "-c", script, "clipper", *args],
        capture_output=True,
        text=True,
        timeout=3 * WAIT,
        env=cli_env(),
    )


def test_the_frontend_command_exits_non_zero_when_its_socket_loop_crashes():
    # the loop ticks at once
    proc = _cli_with_a_bug(
        "FrontendState", "tick", "frontend", "--listen", "tcp://127.0.0.1:0", "--query", ""
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" in proc.stderr and "RuntimeError: injected bug" in proc.stderr
    assert "wirekit clipper frontend: the socket loop crashed" in proc.stderr


def test_the_container_command_exits_non_zero_with_the_traceback_of_a_crash(clipper_side):
    _, address = clipper_side
    # start: the first thing a session does
    proc = _cli_with_a_bug(
        "ContainerSession", "start", "container", "--model", "clipper_models:describe",
        "--name", "m", "--model-version", "1", "--address", address,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" in proc.stderr and "RuntimeError: injected bug" in proc.stderr


def test_input_type_names_from_a_peer_are_not_converted_with_int():
    assert parse_input_type("0" * 5000 + "3") is InputType.DOUBLES
    with pytest.raises(ValueError, match=r"unknown input type '9999") as info:
        parse_input_type("9" * 5000)
    assert len(str(info.value)) < 120


@pytest.mark.parametrize(
    ("flag", "text"),
    [
        ("--max-rejected", "max_rejected must be at least 0"),
        ("--max-in-flight", "max_in_flight must be"),
    ],
)
def test_the_frontend_command_refuses_negative_limits(flag, text):
    import io

    from wirekit.cli import main

    err = io.StringIO()
    code = main(
        ["clipper", "frontend", "--listen", "tcp://127.0.0.1:0", "--query", "", flag, "-1"],
        out=io.StringIO(),
        err=err,
    )
    assert code == 2 and text in err.getvalue()


# --- frames larger than the runtime accepts ---------------------------------------------------


def _disconnected(sock, monitor) -> bool:
    """True once ``sock``'s monitor reports its connection dropped (within WAIT)."""
    from zmq.utils.monitor import recv_monitor_message

    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if monitor.poll(100) and (recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED):
            return True
    return False


def test_a_frame_over_the_frontends_limit_drops_only_that_peer(ctx, started, front_lane):
    limit = 64 * 1024
    fe = Frontend("tcp://127.0.0.1:0", "v3", context=ctx, max_frame_size=limit).start()
    started.append(fe)
    c = ModelContainer(describe, "m", "1", "doubles", fe.endpoint, context=ctx).start()
    started.append(c)
    fe.wait_for("m", 1, WAIT)
    hostile = ctx.socket(zmq.DEALER)
    hostile.setsockopt(zmq.LINGER, 0)
    monitor = hostile.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        hostile.connect(fe.endpoint)
        hostile.send_multipart([b"", b"\x00" * (limit + 1)])
        assert _disconnected(hostile, monitor)  # libzmq refused the frame from its header
    finally:
        hostile.disable_monitor()
        monitor.close(0)
        hostile.close(0)
    assert fe.predict("m", [[1.0, 2.0]], timeout=WAIT) == ["f:1.0,2.0"]
    assert fe.error is None


def test_a_frame_over_the_containers_limit_is_refused_and_the_container_goes_on(
    ctx, clipper_side, started, container_lane
):
    router, address = clipper_side
    limit = 64 * 1024
    c = ModelContainer(
        describe,
        "m",
        "1",
        "doubles",
        address,
        context=ctx,
        poll_interval=0.2,
        activity_timeout=1.0,
        max_frame_size=limit,
    ).start()
    started.append(c)
    ident = _handshake(router, "v3")
    monitor = router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        router.send_multipart([ident, *_good("v3", 1)[:-1], b"\x00" * (limit + 1)])
        assert _disconnected(router, monitor)
    finally:
        router.disable_monitor()
        monitor.close(0)
    # libzmq ends a connection that broke the protocol for good (no reconnect): the container
    # hears nothing for TO, starts over on a new socket, registers again and serves.
    ident = _handshake(router, "v3")
    assert list(_ask(router, ident, "v3", 2).outputs) == ["f:1.0,2.0", "f:3.0,4.0"]
    assert c.error is None


def test_max_frame_size_is_checked_and_zero_means_no_limit():
    from wirekit.clipper.session import zmq_max_frame_size

    assert zmq_max_frame_size(None) == zmq_max_frame_size(0) == -1
    assert zmq_max_frame_size(1 << 20) == 1 << 20
    with pytest.raises(ValueError, match="max_frame_size must be at least 0"):
        Frontend("tcp://127.0.0.1:0", max_frame_size=-1)


# --- the query port's limits, through a `wirekit clipper frontend` process (issue 25) ----------


@pytest.fixture
def asker(ctx):
    """``asker()``: a DEALER connected to ``address`` (closed at the end)."""
    opened: list[zmq.Socket] = []

    def make(address: str) -> zmq.Socket:
        sock = ctx.socket(zmq.DEALER)
        opened.append(sock)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        return sock

    yield make
    for sock in opened:
        sock.close(0)


@pytest.fixture
def frontend_cli():
    """``frontend_cli(*flags)``: a ``wirekit clipper frontend`` process, stopped at the end;
    returns ``(process, containers' address, query address)``."""
    from clipper_support import frontend_process, stop_processes

    procs = []

    def start(*flags: str):
        found = frontend_process(*flags)
        procs.append(found[0])
        return found

    yield start
    stop_processes(*procs)


def _answer(sock, wait_ms: int = MS) -> dict:
    assert sock.poll(wait_ms), "the frontend did not answer"
    frames = sock.recv_multipart()
    assert frames[0] == b"" and len(frames) == 2, frames[:3]
    return json.loads(frames[1])


def _rows_query(model: str, mib: float, timeout: float) -> bytes:
    row = [1.25] * 1000
    rows = int(mib * (1 << 20)) // len(json.dumps(row))
    return json.dumps({"model": model, "inputs": [row] * rows, "timeout": timeout}).encode()


def test_a_pile_up_of_queries_is_capped_and_every_query_is_answered(frontend_cli, asker):
    """Issue 25: 100 queries of 2 MiB for a model with no container piled up (+1.8 GB) and
    were never answered; now the default caps take a few (they expire at their timeout)
    and answer the others with an error at once."""
    proc, _, address = frontend_cli()
    before = memory(proc.pid) >> 20
    body = _rows_query("nobody", 2, timeout=2.0)
    socks = [asker(address) for _ in range(100)]
    for sock in socks:
        sock.send_multipart([b"", body])
    errors = [_answer(sock)["error"] for sock in socks]  # each within WAIT of the last
    refused = [e for e in errors if e.startswith("too many query")]
    expired = [e for e in errors if "no live replica registered before the timeout" in e]
    assert len(refused) + len(expired) == 100, errors
    assert refused and expired
    assert all("--max-pending-query-bytes" in e for e in refused)
    assert (memory(proc.pid) >> 20) - before < 512  # it grew 1.8 GB


def test_the_pending_query_count_is_capped(frontend_cli, asker):
    _, _, address = frontend_cli("--max-pending-queries", "3")
    socks = [asker(address) for _ in range(4)]
    for sock in socks:  # they wait for a model that never comes: three are taken
        sock.send_multipart([b"", b'{"model": "nobody", "inputs": [[1]], "timeout": 60}'])
    # Queries from four connections reach the frontend in no set order: whichever comes
    # fourth is refused at once, and the three taken get nothing (yet).
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    answered = dict(poller.poll(WAIT * 1000))
    assert len(answered) == 1, "exactly one query is refused"
    (refused,) = answered
    error = _answer(refused)["error"]
    assert "too many queries: 3 are waiting" in error and "--max-pending-queries" in error
    assert not any(sock.poll(100) for sock in socks if sock is not refused)


def test_a_timeout_past_the_cap_is_refused_and_queries_expire(frontend_cli, asker):
    """Issue 25: a timeout of 1e300 was taken and the query never expired."""
    _, _, address = frontend_cli()
    sock = asker(address)
    sock.send_multipart([b"", b'{"model": "nobody", "inputs": [[1]], "timeout": 1e300}'])
    error = _answer(sock)["error"]
    assert "bad query" in error and "from 0 to 300" in error and "--max-query-timeout" in error
    sock.send_multipart([b"", b'{"model": "nobody", "inputs": [[1]], "timeout": 0.2}'])
    assert "no live replica registered before the timeout" in _answer(sock)["error"]
    _, _, address = frontend_cli("--max-query-timeout", "1")
    sock = asker(address)
    sock.send_multipart([b"", b'{"model": "nobody", "inputs": [[1]], "timeout": 1.5}'])
    assert "from 0 to 1 " in _answer(sock)["error"]


def test_a_query_over_the_size_limit_is_refused_unread(frontend_cli, asker, ctx, started):
    """Issue 25: a 60 MiB query held the socket thread 7-17 s; now it is answered with an
    error from its size alone, and another client is served."""
    _, listen, address = frontend_cli()
    started.append(ModelContainer(describe, "m", "1", "doubles", listen, context=ctx).start())
    big = b'{"model": "m", "inputs": [' + b"[1.0]," * (10 << 20) + b"[1.0]]}"
    hog, other = asker(address), asker(address)
    hog.send_multipart([b"", big])
    error = _answer(hog)["error"]
    assert error.startswith(f"query too large: {len(big)} bytes, the limit is {8 << 20}")
    other.send_multipart([b"", b'{"model": "m", "inputs": [[2.0]], "timeout": 8}'])
    assert _answer(other) == {"outputs": ["f:2.0"]}


def _stderr_line(proc, wanted: bytes) -> bytes:
    """Read ``proc``'s stderr until a line holding ``wanted`` (b"" after WAIT)."""
    import selectors

    buffered = b""
    end = time.monotonic() + WAIT
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr.fileno(), selectors.EVENT_READ)
        while time.monotonic() < end:
            if not sel.select(end - time.monotonic()):
                break
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                break
            buffered += chunk
            for line in buffered.splitlines():
                if wanted in line:
                    return line
    return b""


def test_a_big_query_being_decoded_does_not_hold_up_other_clients(
    frontend_cli, asker, ctx, started
):
    """Issue 25: one big query stopped the frontend while it was read.  Now, while a query
    of millions of inputs is being decoded (its thread says so in the log, at DEBUG), another
    client gets its answer -- before the big one's."""
    proc, listen, address = frontend_cli("--max-query-size", str(64 << 20), "--log-level", "debug")
    started.append(ModelContainer(describe, "m", "1", "doubles", listen, context=ctx).start())
    hog, other = asker(address), asker(address)
    other.send_multipart([b"", b'{"model": "m", "inputs": [[1.0]], "timeout": 8}'])
    assert _answer(other) == {"outputs": ["f:1.0"]}  # the container is registered
    big = b'{"model": "nobody", "timeout": 0, "inputs": [' + b"[1.0]," * (4 << 20) + b"[1]]}"
    hog.send_multipart([b"", big])
    assert _stderr_line(proc, b"decoding a query of %d bytes" % len(big))
    other.send_multipart([b"", b'{"model": "m", "inputs": [[2.0]], "timeout": 8}'])
    assert _answer(other) == {"outputs": ["f:2.0"]}
    assert not hog.poll(0), "the big query was answered first"
    assert "too many query bytes" in _answer(hog, 3 * MS)["error"]  # 4M inputs: ~670 MB


@pytest.mark.parametrize(
    ("frames", "text"),
    [
        ([b"", b'{"model": "m", "inputs": [[1]]}', b"{}"], "expected one JSON body frame"),
        ([b""], "no body frame after the delimiter"),
        ([b'{"model": "m", "inputs": [[1]]}'], "delimiter at frame 0"),
        ([b"x", b"", b"{}"], "delimiter at frame 0"),
        ([b"", b""], "body at frame 1, byte 0: Expecting value"),
        ([b"", b"\x00" * 1000], "bad query"),
        ([b"", b'{"model": "m", "inputs": [[1]]} trailing'], "Extra data"),
    ],
)
def test_every_query_shape_gets_an_error_answer(frontend_cli, asker, frames, text):
    """Issue 25: a query with two body frames got no answer at all."""
    _, _, address = frontend_cli()
    sock = asker(address)
    sock.send_multipart(frames)
    error = _answer(sock)["error"]
    assert error.startswith("bad query: clipper-query: ") and text in error, error
    sock.send_multipart([b"", b'{"model": "nobody", "inputs": [[1]], "timeout": 0}'])
    assert "no live replica" in _answer(sock)["error"]  # the loop goes on
