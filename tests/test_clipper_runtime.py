"""Clipper container ↔ frontend over real ZeroMQ on loopback, with small D/TO.

Every socket has a timeout on every receive and is closed with linger 0; every container and
frontend is stopped by the fixtures.  No wall-clock thresholds: timing is asserted in
``test_clipper_session.py`` with a fake clock; here behaviour is asserted.
"""

from __future__ import annotations

import asyncio
import io
import signal
import struct
import subprocess
import sys
import threading
import time

import clipper_models as models  # tests/ is on sys.path (rootdir conftest)
import numpy as np
import pytest
import zmq
from clipper_support import GENS, WAIT, cli_env, clipper_process, frontend_process, stop_processes

from wirekit import clipper
from wirekit.clipper import (
    Heartbeat,
    HeartbeatReply,
    HeartbeatType,
    InputType,
    NewContainer,
    PredictRequest,
    PredictResponse,
)
from wirekit.clipper.container import ModelContainer
from wirekit.clipper.frontend import Frontend, query
from wirekit.clipper.session import PredictionError, VersionMismatch

D, TO = 0.05, 0.4  # heartbeat period and activity timeout used by these tests
# WAIT: the bound on any one step; ctx, raw and started are clipper_support's fixtures


@pytest.fixture
def stack(ctx, started):
    """Start frontends and containers (with this file's D and TO); stop them all at the
    end."""

    class Stack:
        def frontend(self, gen, listen="tcp://127.0.0.1:0", **kw):
            kw.setdefault("activity_timeout", TO)
            kw.setdefault("check_interval", D)
            fe = Frontend(listen, gen, context=ctx, **kw).start()
            started.append(fe)
            return fe

        def container(self, fn, gen, address, itype="doubles", name="m", **kw):
            kw.setdefault("poll_interval", D)
            kw.setdefault("activity_timeout", TO)
            c = ModelContainer(
                fn, name, "1", itype, address, generation=gen, context=ctx, **kw
            ).start()
            started.append(c)
            return c

    return Stack()


def model_for(gen):
    return models.total if gen == "2016" else models.describe


INPUTS = {
    InputType.BYTES: [b"\x01\x02", b"\xff"],
    InputType.INTS: [[1, -2, 3], [4]],
    InputType.FLOATS: [[0.5, 1.5], [2.5]],
    InputType.DOUBLES: [[1.0, 2.0], [3.0]],
    InputType.STRINGS: ["héllo", "x"],
}


def expected(gen, itype):
    inputs = INPUTS[itype]
    if gen == "2016":
        return [
            float(len(x))
            if isinstance(x, str)
            else float(np.sum(np.frombuffer(x, np.uint8)) if isinstance(x, bytes) else np.sum(x))
            for x in inputs
        ]
    dtype = {
        InputType.BYTES: "u1",
        InputType.INTS: "i4",
        InputType.FLOATS: "f4",
        InputType.DOUBLES: "f8",
    }.get(itype)
    if dtype is None:
        return [f"s:{x}" for x in inputs]
    return models.describe(
        [np.frombuffer(x, np.uint8) if isinstance(x, bytes) else np.array(x, dtype) for x in inputs]
    )


# --- every generation × every input type, several replicas ---


@pytest.mark.parametrize("gen", GENS)
@pytest.mark.parametrize("itype", list(InputType), ids=lambda t: t.name.lower())
def test_predict_every_generation_and_input_type(stack, gen, itype):
    fe = stack.frontend(gen, max_in_flight=2)
    containers = [stack.container(model_for(gen), gen, fe.endpoint, itype) for _ in range(3)]
    fe.wait_for("m", 3, WAIT)
    futures = [fe.submit("m", INPUTS[itype], WAIT) for _ in range(12)]
    results = [f.result(WAIT) for f in futures]
    want = expected(gen, itype)
    for out in results:
        assert list(out) == pytest.approx(want) if gen == "2016" else list(out) == want
    assert sum(c.served for c in containers) == 12
    assert sum(1 for c in containers if c.served) >= 2  # the load was spread


def test_asyncio_predict(stack):
    fe = stack.frontend("v3", max_in_flight=4)
    stack.container(models.describe, "v3", fe.endpoint)
    fe.wait_for("m", 1, WAIT)

    async def many():
        return await asyncio.gather(*(fe.apredict("m", [[float(k)]], WAIT) for k in range(8)))

    assert asyncio.run(many()) == [[f"f8:{float(k)!r}"] for k in range(8)]


def test_submit_callback_chains_work_and_survives_a_raising_callback(stack, caplog):
    """Each answer's callback submits the next request (on the socket thread, straight to
    the state); every callback is called once with the right outputs; a callback that raises
    is logged and the frontend keeps serving; errors come as ``(None, error)``."""
    fe = stack.frontend("v3", max_in_flight=4)
    for _ in range(2):
        stack.container(models.describe, "v3", fe.endpoint)
    fe.wait_for("m", 2, WAIT)
    total, lanes = 40, 4
    answers: dict[int, tuple] = {}
    issued = iter(range(total))
    all_done = threading.Event()
    lock = threading.Lock()

    def issue():
        k = next(issued, None)
        if k is None:
            return

        def finished(outputs, error):
            with lock:
                assert k not in answers  # exactly once
                answers[k] = (outputs, error)
                if len(answers) == total:
                    all_done.set()
            issue()
            if k == 7:
                raise RuntimeError("a buggy callback")

        fe.submit_callback("m", [[float(k)]], finished, WAIT)

    for _ in range(lanes):
        issue()
    assert all_done.wait(WAIT)
    assert answers == {k: ([f"f8:{float(k)!r}"], None) for k in range(total)}
    assert "submit_callback callback raised" in caplog.text
    # Still serving after the raising callback; a failure comes as (None, error).
    assert fe.predict("m", [[1.5]], WAIT) == ["f8:1.5"]
    failed = []
    got = threading.Event()
    fe.submit_callback(
        "nobody", [[1.0]], lambda out, err: (failed.append((out, err)), got.set()), 0.2
    )
    assert got.wait(WAIT)
    assert failed[0][0] is None and isinstance(failed[0][1], PredictionError)


def test_submit_callback_on_a_stopped_frontend_calls_back_at_once(stack):
    fe = stack.frontend("v3")
    fe.stop()
    seen = []
    fe.submit_callback("m", [[1.0]], lambda out, err: seen.append((out, err)))
    assert len(seen) == 1 and seen[0][0] is None
    assert "not running" in str(seen[0][1])


@pytest.mark.parametrize("spin", [0.0, 0.0002, 0.05])
def test_blocking_callers_on_many_threads(stack, spin):
    """Blocking callers move the frames themselves; concurrent ones share the sockets (one
    drives, the others' batches go out with it or are handed to the socket thread); the
    driver may look for answers a while before sleeping (``spin``), or not at all."""
    fe = stack.frontend("v3", max_in_flight=4, spin=spin)
    for _ in range(2):
        stack.container(models.describe, "v3", fe.endpoint)
    fe.wait_for("m", 2, WAIT)
    results: dict[int, list] = {}

    def caller(k):
        for j in range(10):
            x = float(k * 100 + j)
            if j % 3 == 2:  # mix in futures from the same threads
                results[k * 100 + j] = fe.submit("m", [[x]], WAIT).result(WAIT)
            else:
                results[k * 100 + j] = fe.predict("m", [[x]], WAIT)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 2)
    assert not any(t.is_alive() for t in threads)
    assert results == {n: [f"f8:{float(n)!r}"] for n in results}
    assert len(results) == 60


def test_inputs_handed_to_the_model_are_never_overwritten(stack):
    kept = []

    def keep(inputs):
        kept.append(inputs)
        return ["ok"] * len(inputs)

    fe = stack.frontend("v3")
    stack.container(keep, "v3", fe.endpoint)
    fe.wait_for("m", 1, WAIT)
    for k in range(5):
        fe.predict("m", np.full((2, 4), float(k)), WAIT)
    assert [float(np.asarray(x).mean()) for x in kept] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_model_failures_are_logged_and_the_container_keeps_serving(stack, caplog):
    def flaky(inputs):
        first = float(np.asarray(inputs[0])[0])
        if first == 1.0:
            raise RuntimeError("boom")
        if first == 2.0:
            return ["only one"]  # wrong count for two inputs
        return ["a"] * len(inputs)

    fe = stack.frontend("v3")
    c = stack.container(flaky, "v3", fe.endpoint)
    fe.wait_for("m", 1, WAIT)
    ident = fe.replicas("m")[0].identity.hex()
    for bad in (1.0, 2.0):
        with pytest.raises(PredictionError, match="no answer") as failed:
            fe.predict("m", [[bad], [0.0]], timeout=0.3)
        # the error names the silent container and why it can be silent
        assert f"container {ident}, m:1" in str(failed.value)
        assert "no error response" in str(failed.value)
    assert fe.predict("m", [[3.0], [0.0]], WAIT) == ["a", "a"]
    assert c.failures == 2 and c.error is None
    assert "model failed on message 0: RuntimeError('boom')" in caplog.text
    assert "message 1: the model returned 1 outputs for 2 inputs" in caplog.text


def test_input_type_mismatch_is_a_clear_error(stack):
    fe = stack.frontend("v3")
    stack.container(models.describe, "v3", fe.endpoint, "ints")
    fe.wait_for("m", 1, WAIT)
    with pytest.raises(PredictionError, match="takes ints inputs; these inputs are strings"):
        fe.predict("m", ["a"], WAIT)


# --- faults ---


@pytest.mark.parametrize("gen", GENS)
def test_frontend_restarted_on_the_same_port(stack, gen):
    fe = stack.frontend(gen)
    port = int(fe.endpoint.rsplit(":", 1)[1])
    c = stack.container(model_for(gen), gen, fe.endpoint)
    fe.wait_for("m", 1, WAIT)
    fe.predict("m", [[1.0]], WAIT)
    before = c.sessions
    fe.stop()
    deadline = time.monotonic() + WAIT
    while True:  # the old socket's port is released by ZeroMQ's I/O thread, shortly
        try:
            fe2 = stack.frontend(gen, f"tcp://127.0.0.1:{port}")
            break
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    fe2.wait_for("m", 1, WAIT)
    out = fe2.predict("m", [[2.0]], WAIT)
    assert list(out) == ([2.0] if gen == "2016" else ["f8:2.0"])
    assert c.sessions > before  # it came back on a new socket


def _spawn_container(address, gen, fn, delay=None):
    extra = {} if delay is None else {"WIREKIT_TEST_DELAY": str(delay)}
    return clipper_process(
        "container",
        "--model",
        f"clipper_models:{fn}",
        "--name",
        "m",
        "--model-version",
        "1",
        "--address",
        address,
        "--generation",
        gen,
        "--poll-interval",
        str(D),
        "--activity-timeout",
        str(TO),
        env=cli_env(**extra),
        stdout=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("gen", GENS)
def test_container_killed_with_a_batch_in_flight(stack, gen):
    fe = stack.frontend(gen)
    slow = "slow_total" if gen == "2016" else "slow_describe"
    proc = _spawn_container(fe.endpoint, gen, slow, delay=30)
    try:
        fe.wait_for("m", 1, WAIT)
        future = fe.submit("m", [[5.0]], WAIT)
        deadline = time.monotonic() + WAIT
        while not fe.state.in_flight and time.monotonic() < deadline:
            time.sleep(0.005)
        assert fe.state.in_flight  # the batch went to the slow replica
        stack.container(model_for(gen), gen, fe.endpoint)
        fe.wait_for("m", 2, WAIT)
        proc.send_signal(signal.SIGKILL)
        out = future.result(WAIT)
        assert list(out) == ([5.0] if gen == "2016" else ["f8:5.0"])
    finally:
        proc.kill()
        proc.wait(WAIT)
        proc.stderr.close()


@pytest.mark.parametrize("gen", ["2017", "v3"])
def test_silent_peer_expires_and_its_batch_completes_elsewhere(stack, raw, gen):
    """A peer that registers and then goes quiet without closing: expiry after TO."""
    fe = stack.frontend(gen)
    zombie, _ = raw(zmq.DEALER, fe.endpoint)
    zombie.send_multipart(
        clipper.encode(NewContainer("m", "1", InputType.DOUBLES, 3 if gen == "v3" else None), gen)
    )
    fe.wait_for("m", 1, WAIT)
    future = fe.submit("m", [[7.0]], WAIT)
    request = clipper.decode(zombie.recv_multipart(), gen, "to_container")
    assert type(request) is PredictRequest
    stack.container(models.describe, gen, fe.endpoint)
    assert future.result(WAIT) == ["f8:7.0"]
    assert all(r.identity != b"" for r in fe.replicas("m")) and len(fe.replicas("m")) == 1
    zombie.close(0)


def test_requests_arriving_while_a_slow_model_runs_are_all_served(stack):
    """The standby thread holds the socket while the model runs; what it receives then is
    served, in order, once the model returns."""
    seen = []

    def slow(inputs):
        seen.append(float(inputs[0][0]))
        time.sleep(4 * D)
        return [f"{x[0]}" for x in inputs]

    fe = stack.frontend("v3", max_in_flight=3)
    c = stack.container(slow, "v3", fe.endpoint)
    fe.wait_for("m", 1, WAIT)
    futures = [fe.submit("m", [[float(k)]], WAIT) for k in range(3)]
    assert [f.result(WAIT) for f in futures] == [["0.0"], ["1.0"], ["2.0"]]
    assert seen == [0.0, 1.0, 2.0] and c.sessions == 1 and c.served == 3


@pytest.mark.parametrize("gen", ["2017", "v3"])
def test_model_slower_than_the_activity_timeout(stack, gen):
    def slow(inputs):
        time.sleep(3 * TO)
        return ["done"] * len(inputs)

    fe = stack.frontend(gen)
    c = stack.container(slow, gen, fe.endpoint)
    (replica,) = fe.wait_for("m", 1, WAIT)
    assert fe.predict("m", [[1.0]], WAIT) == ["done"]
    assert fe.replicas("m") == [replica]  # never expired
    assert c.sessions == 1


@pytest.mark.parametrize("gen", GENS)
def test_frontend_survives_malformed_and_out_of_order_frames(stack, raw, gen, caplog):
    fe = stack.frontend(gen)
    bad, _ = raw(zmq.DEALER, fe.endpoint)
    bad.send_multipart([b"", b"\xff\xff"])  # garbage
    bad.send_multipart([b"garbage without delimiter"])
    bad.send_multipart(
        clipper.encode(PredictResponse(99, [1.0] if gen == "2016" else ["x"]), gen)[:2]
    )  # truncated
    if gen != "2016":
        bad.send_multipart(clipper.encode(PredictResponse(99, ["x"]), gen))  # before registering
    stack.container(model_for(gen), gen, fe.endpoint)
    fe.wait_for("m", 1, WAIT)
    assert list(fe.predict("m", [[4.0]], WAIT)) == ([4.0] if gen == "2016" else ["f8:4.0"])
    assert "malformed" in caplog.text
    bad.close(0)


@pytest.mark.parametrize("gen", ["2017", "v3"])
def test_container_survives_malformed_and_out_of_order_frames(stack, raw, gen, caplog):
    router, address = raw(zmq.ROUTER)
    c = stack.container(models.describe, gen, address)
    ident, *first = router.recv_multipart()
    assert clipper.decode(first, gen, "to_clipper") == Heartbeat()
    router.send_multipart([ident, b"", b"\x07"])  # garbage
    router.send_multipart([ident, b"", b"\x03\x00\x00\x00", b"\x01\x00\x00\x00"])  # truncated
    keep = clipper.encode(HeartbeatReply(HeartbeatType.KEEPALIVE), gen)
    router.send_multipart([ident, *keep])  # keep-alive before registering: out of order
    meta = clipper.encode(HeartbeatReply(HeartbeatType.REQUEST_CONTAINER_METADATA), gen)
    router.send_multipart([ident, *meta])
    req = clipper.encode(PredictRequest(41, InputType.DOUBLES, [[1.5]]), gen)
    router.send_multipart([ident, *req])
    seen = []
    while not any(type(m) is PredictResponse for m in seen):
        i, *frames = router.recv_multipart()
        assert i == ident
        seen.append(clipper.decode(frames, gen, "to_clipper"))
    assert PredictResponse(41, ["f8:1.5"]) in seen
    assert any(type(m) is NewContainer for m in seen)
    assert c.sessions == 1 and c.error is None
    assert "malformed" in caplog.text


@pytest.mark.parametrize(("mine", "theirs"), [("v3", "2017"), ("2017", "v3")])
def test_version_mismatch_is_a_clear_error(stack, mine, theirs, caplog):
    fe = stack.frontend(theirs)
    c = stack.container(models.describe, mine, fe.endpoint)
    assert c.wait(WAIT)  # the mismatch ends the container
    assert isinstance(c.error, VersionMismatch)
    assert f"peer speaks Clipper RPC {theirs}, this end speaks {mine}" in str(c.error)
    assert fe.replicas() == []
    assert "version mismatch" in caplog.text


# --- golden vectors from the reference, through real sockets ---

LE = struct.Struct
D3 = struct.pack("<3d", 1.0, 2.0, 3.0)
GOLDEN_REQUESTS = {  # msg id 0, doubles [1, 2], [3] as the container receives them
    "2016": [b"", b"\0\0\0\0", b"\0\0\0\0", struct.pack("<3I", 3, 2, 2), D3],
    "2017": [
        b"",
        struct.pack("<i", 1),
        b"\0\0\0\0",
        b"\0\0\0\0",
        struct.pack("<q", 12),
        struct.pack("<3I", 3, 2, 2),
        struct.pack("<q", 24),
        D3,
    ],
    "v3": [
        b"",
        struct.pack("<I", 3),
        struct.pack("<I", 1),
        b"\0\0\0\0",
        b"\0\0\0\0",
        struct.pack("<q", 32),
        struct.pack("<4Q", 3, 2, 16, 8),
        D3[:16],
        D3[16:],
    ],
}
GOLDEN_STRINGS = {  # "ab", "c"
    "2016": [b"", b"\0\0\0\0", b"\0\0\0\0", struct.pack("<3I", 4, 2, 1), b"ab\0c\0"],
    "2017": [
        b"",
        struct.pack("<i", 1),
        b"\0\0\0\0",
        b"\0\0\0\0",
        struct.pack("<q", 12),
        struct.pack("<3I", 4, 2, 1),
        struct.pack("<q", 5),
        b"ab\0c\0",
    ],
    "v3": [
        b"",
        struct.pack("<I", 3),
        struct.pack("<I", 1),
        b"\0\0\0\0",
        b"\0\0\0\0",
        struct.pack("<q", 32),
        struct.pack("<4Q", 4, 2, 2, 1),
        b"ab",
        b"c",
    ],
}


def golden_response(gen, outputs):
    if gen == "2016":
        return [b"", b"\0\0\0\0", np.array(outputs, "<f4").tobytes()]
    enc = [o.encode() for o in outputs]
    if gen == "2017":
        payload = struct.pack(f"<{len(enc) + 1}I", len(enc), *map(len, enc)) + b"".join(enc)
        return [b"", struct.pack("<I", 1), b"\0\0\0\0", payload]
    header = struct.pack(f"<{len(enc) + 1}Q", len(enc), *map(len, enc))
    return [b"", struct.pack("<I", 1), b"\0\0\0\0", struct.pack("<Q", len(header)), header, *enc]


def golden_registration(gen, itype):
    if gen == "2016":
        return [b"", b"m", b"1", str(int(itype)).encode()]
    frames = [b"", b"\0\0\0\0", b"m", b"1", str(int(itype)).encode()]
    return [*frames, struct.pack("<I", 3)] if gen == "v3" else frames


@pytest.mark.parametrize("gen", GENS)
@pytest.mark.parametrize("kind", ["doubles", "strings"])
def test_golden_vectors_frontend_to_raw_container(stack, raw, gen, kind):
    """The frontend sends exactly the reference bytes; it accepts the reference answer."""
    fe = stack.frontend(gen)
    dealer, _ = raw(zmq.DEALER, fe.endpoint)
    itype = InputType.DOUBLES if kind == "doubles" else InputType.STRINGS
    if gen != "2016":
        dealer.send_multipart([b"", struct.pack("<I", 2)])
        assert dealer.recv_multipart() == (
            [b"", b"\x03\0\0\0", b"\x02\0\0\0", b"\x01\0\0\0"]
            if gen == "v3"
            else [b"", b"\x02\0\0\0", b"\x01\0\0\0"]
        )
    dealer.send_multipart(golden_registration(gen, itype))
    fe.wait_for("m", 1, WAIT)
    inputs = [[1.0, 2.0], [3.0]] if kind == "doubles" else ["ab", "c"]
    future = fe.submit("m", inputs, WAIT)
    want = GOLDEN_REQUESTS[gen] if kind == "doubles" else GOLDEN_STRINGS[gen]
    assert dealer.recv_multipart() == want
    outs = [0.5, 1.5] if gen == "2016" else ["yes", "n"]
    dealer.send_multipart(golden_response(gen, outs))
    assert list(future.result(WAIT)) == outs
    dealer.close(0)


@pytest.mark.parametrize("gen", GENS)
@pytest.mark.parametrize("kind", ["doubles", "strings"])
def test_golden_vectors_raw_clipper_to_container(stack, raw, gen, kind):
    """The container decodes the reference bytes and answers with the reference bytes."""
    router, address = raw(zmq.ROUTER)
    itype = InputType.DOUBLES if kind == "doubles" else InputType.STRINGS
    got = []

    def model(inputs):
        got.append([x if isinstance(x, str) else list(np.asarray(x)) for x in inputs])
        return [0.5, 1.5] if gen == "2016" else ["yes", "n"]

    stack.container(model, gen, address, itype)
    ident, *frames = router.recv_multipart()
    if gen != "2016":
        assert frames == [b"", struct.pack("<I", 2)]
        reply = [b"", b"\x02\0\0\0", b"\x01\0\0\0"]
        router.send_multipart(
            [ident, *([b"", b"\x03\0\0\0", *reply[1:]] if gen == "v3" else reply)]
        )
        ident2, *frames = router.recv_multipart()
        while frames == [b"", struct.pack("<I", 2)]:  # a heartbeat crossed the reply
            ident2, *frames = router.recv_multipart()
        assert ident2 == ident
    assert frames == golden_registration(gen, itype)
    request = GOLDEN_REQUESTS[gen] if kind == "doubles" else GOLDEN_STRINGS[gen]
    router.send_multipart([ident, *request])
    while True:
        _, *frames = router.recv_multipart()
        if frames != [b"", struct.pack("<I", 2)]:
            break
    assert frames == golden_response(gen, [0.5, 1.5] if gen == "2016" else ["yes", "n"])
    assert got == ([[[1.0, 2.0], [3.0]]] if kind == "doubles" else [["ab", "c"]])


# --- the command line ---


def _port(address):
    return address.rsplit(":", 1)[1]


def test_cli_frontend_container_predict():
    from wirekit.cli import main

    fe, rpc, q = frontend_process("--activity-timeout", "5")
    env = cli_env(
        CLIPPER_MODEL_NAME="m",
        CLIPPER_MODEL_VERSION="7",
        CLIPPER_PORT=_port(rpc),
        CLIPPER_INPUT_TYPE="doubles",
    )
    con = clipper_process(
        "container", "--model", "clipper_models:describe", "--poll-interval", "0.1", env=env
    )
    try:
        deadline = time.monotonic() + WAIT
        while True:
            out, err = io.StringIO(), io.StringIO()
            code = main(
                [
                    "clipper",
                    "predict",
                    "--model",
                    "m",
                    "--frontend",
                    q,
                    "--doubles",
                    "1,2",
                    "--doubles",
                    "3",
                    "--timeout",
                    "2",
                ],
                out=out,
                err=err,
            )
            if code == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert code == 0, err.getvalue()
        assert out.getvalue().splitlines() == ["f8:1.0,2.0", "f8:3.0"]
        out, err = io.StringIO(), io.StringIO()
        code = main(
            [
                "clipper",
                "predict",
                q,  # the address as positional, as in `wirekit mip`
                "--model",
                "m",
                "--strings",
                "x",
                "--timeout",
                "1",
            ],
            out=out,
            err=err,
        )
        assert code == 1 and "takes doubles inputs" in err.getvalue()
    finally:
        stop_processes(con, fe)
    assert con.returncode == 0 and fe.returncode == 0


def test_cli_container_needs_a_model_name(monkeypatch):

    from wirekit.cli import main

    monkeypatch.delenv("CLIPPER_MODEL_NAME", raising=False)
    err = io.StringIO()
    code = main(
        ["clipper", "container", "--model", "clipper_models:describe", "--model-version", "1"],
        out=io.StringIO(),
        err=err,
    )
    assert code == 2 and "CLIPPER_MODEL_NAME is not set" in err.getvalue()


def test_threads_do_not_leak(stack):
    before = threading.active_count()
    fe = stack.frontend("v3")
    c = stack.container(models.describe, "v3", fe.endpoint)
    fe.wait_for("m", 1, WAIT)
    assert c.wait(0) is False  # running
    c.stop()
    assert c.wait(0) is True  # stop() joined the thread
    fe.stop()
    assert threading.active_count() <= before


# --- the command line, every process real (issue 15) ---


def _cli_predict(q, *args):
    """``wirekit clipper predict`` in its own process, waiting WAIT seconds for the answer:
    (exit status, stdout, stderr)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "wirekit.cli",
            "clipper",
            "predict",
            "--model",
            "m",
            "--frontend",
            q,
            "--timeout",
            str(WAIT),
            *args,
        ],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=3 * WAIT,  # the process's start, then its own timeout
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("gen", GENS)
def test_cli_predict_through_frontend_and_container_processes(gen):
    """``wirekit clipper frontend`` + ``container`` + ``predict``, each its own process:
    every query is dispatched when it comes, not at the frontend's next check (queries that
    waited for the next tick took 1-5 s with the default 10 s check, or failed with "no
    replica had room").  The check here comes every 200 s (TO/3), far beyond any query's
    timeout (WAIT), so a query that waited for it fails."""
    fe, rpc, q = frontend_process("--generation", gen, "--activity-timeout", "600")
    con = clipper_process(
        "container",
        "--generation",
        gen,
        "--model",
        f"clipper_models:{model_for(gen).__name__}",
        "--name",
        "m",
        "--model-version",
        "1",
        "--address",
        rpc,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 2 * WAIT
        while True:  # until the container has registered (each try has a 1 s timeout)
            try:
                first = query(q, "m", [[1.0]], "doubles", timeout=1.0)
                break
            except PredictionError:
                if time.monotonic() > deadline or fe.poll() is not None:
                    raise
        assert list(first) == ([1.0] if gen == "2016" else ["f8:1.0"])
        for i in range(8):  # the same query socket from this process
            out = query(q, "m", [[float(i)]], "doubles", timeout=WAIT)
            assert list(out) == ([float(i)] if gen == "2016" else [f"f8:{float(i)!r}"])
        for values in ("-1.5,2", "-0.25", "3,-4e2"):
            code, out, err = _cli_predict(q, "--doubles", values, "--doubles", "1")
            assert code == 0, err
            numbers = [float(x) for x in values.split(",")]
            if gen == "2016":
                assert out.splitlines() == [repr(float(sum(numbers))), "1.0"]
            else:
                assert out.splitlines() == ["f8:" + ",".join(repr(x) for x in numbers), "f8:1.0"]
    finally:
        stop_processes(con, fe)
    assert fe.returncode == 0 and con.returncode == 0


def test_cli_negative_numbers_in_every_numeric_option(stack, capsys):
    from wirekit.cli import build_parser, main

    parser = build_parser()
    args = parser.parse_args(
        [
            "clipper",
            "predict",
            "--model",
            "m",
            "--ints",
            "-5,3",
            "--ints",
            "-1",
            "--timeout",
            "-1e3",
        ]
    )
    assert args.ints == ["-5,3", "-1"] and args.timeout == -1000.0
    args = parser.parse_args(
        [
            "clipper",
            "predict",
            "--model",
            "m",
            "--doubles",
            "-1e-3,-2",
            "--floats",
            "-.5",
            "--strings",
            "-x",
        ]
    )
    assert (args.doubles, args.floats, args.strings) == (["-1e-3,-2"], ["-.5"], ["-x"])
    args = parser.parse_args(
        [
            "clipper",
            "container",
            "--model",
            "a:b",
            "--port",
            "-5",
            "--poll-interval",
            "-1e3",
            "--activity-timeout",
            "-2",
        ]
    )
    assert (args.port, args.poll_interval, args.activity_timeout) == (-5, -1000.0, -2.0)
    args = parser.parse_args(
        [
            "clipper",
            "frontend",
            "--activity-timeout",
            "-1e1",
            "--max-in-flight",
            "-2",
            "--max-rejected",
            "-3",
        ]
    )
    assert (args.activity_timeout, args.max_in_flight, args.max_rejected) == (-10.0, -2, -3)
    # ... and the commands refuse the ones that make no sense, as usage errors
    for argv, message in [
        (["predict", "--model", "m", "--ints", "1", "--timeout", "-1"], "--timeout must be"),
        (
            [
                "predict",
                "tcp://127.0.0.1:1",
                "--frontend",
                "tcp://127.0.0.1:2",
                "--model",
                "m",
                "--ints",
                "1",
            ],
            "differ",
        ),
        (
            [
                "container",
                "--model",
                "clipper_models:describe",
                "--name",
                "m",
                "--model-version",
                "1",
                "--port",
                "-5",
            ],
            "CLIPPER_PORT must be a TCP port",
        ),
        (
            [
                "container",
                "--model",
                "clipper_models:describe",
                "--name",
                "m",
                "--model-version",
                "1",
                "--poll-interval",
                "-1e3",
            ],
            "poll_interval must be",
        ),
        (
            [
                "container",
                "--model",
                "clipper_models:describe",
                "--name",
                "m",
                "--model-version",
                "1",
                "--activity-timeout",
                "-2",
            ],
            "activity_timeout must be",
        ),
        (["frontend", "--activity-timeout", "-1e1"], "activity_timeout must be"),
    ]:
        out, err = io.StringIO(), io.StringIO()
        assert main(["clipper", *argv], out=out, err=err) == 2, argv
        assert message in err.getvalue()
    # negative inputs reach the model
    fe = stack.frontend("v3", query="tcp://127.0.0.1:0")
    stack.container(models.describe, "v3", fe.endpoint, itype="ints")
    fe.wait_for("m", 1, WAIT)
    out, err = io.StringIO(), io.StringIO()
    code = main(
        [
            "clipper",
            "predict",
            "--model",
            "m",
            "--frontend",
            fe.query_endpoint,
            "--ints",
            "-5,3",
            "--ints",
            "-1",
            "--timeout",
            str(WAIT),
        ],
        out=out,
        err=err,
    )
    assert code == 0, err.getvalue()
    assert out.getvalue().splitlines() == ["i4:-5,3", "i4:-1"]


@pytest.mark.parametrize("gen", GENS)
def test_frontend_rebound_at_once_in_the_same_process(ctx, gen):
    """Stopping a frontend releases its addresses before ``stop`` returns: a new one binds
    them at once, also when a peer was connected (it failed about half the time).  Its
    inproc wake-up endpoint was named after ``id(frontend)``, which the next frontend could
    get while ZeroMQ still held the old name: "Address already in use" in 3 runs of 25."""
    rpc = q = "tcp://127.0.0.1:0"  # the first frontend's ports, then the same again
    for _ in range(12):
        fe = Frontend(rpc, gen, context=ctx, query=q).start()  # no retry: it must bind now
        rpc, q = fe.endpoint, fe.query_endpoint
        try:
            peer = ctx.socket(zmq.DEALER)
            peer.setsockopt(zmq.LINGER, 0)
            peer.setsockopt(zmq.RCVTIMEO, int(WAIT * 1000))
            asker = ctx.socket(zmq.DEALER)
            asker.setsockopt(zmq.LINGER, 0)
            asker.setsockopt(zmq.RCVTIMEO, int(WAIT * 1000))
            try:
                peer.connect(fe.endpoint)
                asker.connect(fe.query_endpoint)
                asker.send_multipart([b"", b"not json"])
                assert b"bad query" in asker.recv_multipart()[-1]  # both are connected
                if gen == "2016":
                    peer.send_multipart(
                        clipper.encode(NewContainer("m", "1", InputType.DOUBLES, None), gen)
                    )
                    fe.wait_for("m", 1, WAIT)
                else:
                    peer.send_multipart(clipper.encode(Heartbeat(), gen))
                    peer.recv_multipart()
            finally:
                peer.close(0)
                asker.close(0)
        finally:
            fe.stop()
