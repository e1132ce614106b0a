"""Clipper round trips: wirekit container ↔ wirekit frontend vs a bare pyzmq ROUTER/DEALER.

Both contenders cross the same process boundary over TCP on 127.0.0.1 with the same frames:
the frontend's caller and ROUTER in this process, the container (or a bare DEALER that
answers with pre-encoded frames carrying the request's id) in a child process; the bare
ROUTER puts a fresh id in every request and matches every answer by id, the least a Clipper
frontend must do.  Each round is ``ROUND`` round trips with 1 or 16 requests in flight,
inputs 1 × 10 or 32 × 10 doubles.
"fast" is wirekit; "baseline" the bare pair written the usual pyzmq way
(``send_multipart``/``recv_multipart``); "baseline-plain" the same bare pair moving frames with
the pure-Python twin of ``wirekit.clipper._zio`` (pyzmq's backend socket calls with plain int
flags: the fastest we know in plain Python); "baseline-lean" the same bare pair moving frames
with the multipart send/receive wirekit's runtimes use (``_zio``: with its Cython twin, whole
messages straight on pyzmq's libzmq), the fastest bare pair we know how to write.
ratios.py's share column is wirekit's share of each.  With 1 request in flight, "fast" calls
the blocking ``predict`` and "fast-nospin" does so with ``Frontend(spin=0)``: the caller
sleeps at once instead of looking for its answer for up to 200 µs first (the default).
With 16 in flight, "fast" keeps them going with ``submit_callback`` (each answer's callback
submits the next) and "fast-futures" with ``submit`` (a ``concurrent.futures.Future`` and a
done-callback per request): the price of the Future.
Latencies (median, p99, µs) go to ``extra_info``; ``python benchmarks/ratios.py bench.json``
prints them.  Timings are never asserted.
"""

from __future__ import annotations

import functools
import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from wirekit import clipper
from wirekit.clipper import _zio
from wirekit.clipper.frontend import DEFAULT_SPIN, Frontend

#: Round trips vary a lot from round to round on a shared virtual machine, and a pair that has
#: been idle takes a while to reach its pace: this file always measures as full mode does
#: (a warm-up of up to 0.5 s, then at least 20 rounds and up to 0.5 s), also in CI's quick
#: mode (3 cold rounds there gave shares from a third to three times these).
pytestmark = pytest.mark.benchmark(min_rounds=20, warmup=True, max_time=0.5)

HERE = Path(__file__).resolve().parent
GEN = "v3"
ROUND = 64
SHAPES = {"1x10": np.arange(10.0).reshape(1, 10), "32x10": np.arange(320.0).reshape(32, 10)}


def _child(args):
    env = dict(os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL)


def _end(proc):
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def wirekit_pair():
    fe = Frontend("tcp://127.0.0.1:0", GEN, max_in_flight=16).start()
    proc = _child(
        [
            "-m",
            "wirekit.cli",
            "clipper",
            "container",
            "--handler",
            "bench_clipper_peers:ok",
            "--name",
            "m",
            "--model-version",
            "1",
            "--address",
            fe.endpoint,
            "--generation",
            GEN,
        ]
    )
    try:
        fe.wait_for("m", 1, 30)
        yield fe
    finally:
        _end(proc)
        fe.stop()


def _bare_pair(io: str):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVTIMEO, 30000)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    proc = _child(
        [str(HERE / "bench_clipper_peers.py"), "echo", f"tcp://127.0.0.1:{port}", GEN, io]
    )
    try:
        ident, _, _ = router.recv_multipart()
        yield router, ident, io
    finally:
        router.send_multipart([ident, b"", b"stop"])
        _end(proc)
        router.close(0)
        ctx.term()


@pytest.fixture(scope="module")
def bare_pair():
    yield from _bare_pair("usual")


@pytest.fixture(scope="module")
def bare_plain_pair():
    yield from _bare_pair("plain")


@pytest.fixture(scope="module")
def bare_lean_pair():
    yield from _bare_pair("lean")


def wirekit_round(fe, inputs, in_flight, latencies):
    """``ROUND`` predictions: blocking ``predict`` calls with 1 in flight, else
    ``submit_callback`` with ``in_flight`` outstanding (each answer submits the next)."""
    n = len(inputs)
    if in_flight == 1:
        for _ in range(ROUND):
            t0 = time.perf_counter()
            out = fe.predict("m", inputs, 10.0)
            latencies.append(time.perf_counter() - t0)
        return len(out) == n
    done = threading.Event()
    issued = itertools.count(in_flight)  # next() is atomic: callbacks may run on two threads
    answered = itertools.count(1)
    wrong = []
    clock, submit = time.perf_counter, fe.submit_callback

    def issue():
        t0 = clock()

        def finished(outputs, error):
            latencies.append(clock() - t0)
            if error is not None or len(outputs) != n:
                wrong.append(error)
            if next(issued) < ROUND:
                issue()
            if next(answered) == ROUND:
                done.set()

        submit("m", inputs, finished, 10.0)

    for _ in range(in_flight):
        issue()
    assert done.wait(30)
    return not wrong


def wirekit_round_futures(fe, inputs, in_flight, latencies):
    """The same with ``submit``: a ``concurrent.futures.Future`` and a done-callback each."""
    n = len(inputs)
    done = threading.Event()
    state = {"sent": 0, "got": 0, "ok": True}
    lock = threading.Lock()

    def issue():
        t0 = time.perf_counter()
        fe.submit("m", inputs, 10.0).add_done_callback(lambda f: finished(f, t0))

    def finished(future, t0):
        latencies.append(time.perf_counter() - t0)
        with lock:
            state["ok"] &= len(future.result()) == n
            state["got"] += 1
            more = state["sent"] < ROUND
            if more:
                state["sent"] += 1
            elif state["got"] == ROUND:
                done.set()
        if more:
            issue()

    with lock:
        state["sent"] = in_flight
    for _ in range(in_flight):
        issue()
    assert done.wait(30)
    return state["ok"]


#: Where the message id sits in a v3 request and response, as the ROUTER sees them.
REQ_ID_AT, RESP_ID_AT = 4, 3


#: How each bare pair moves frames: pyzmq's usual calls, the pure-Python ``_zio`` twin, or
#: the ``_zio`` wirekit's runtimes use (the Cython twin where it is built).
BARE_IO = {
    "usual": (zmq.Socket.send_multipart, zmq.Socket.recv_multipart),
    "plain": (_zio._send_frames, _zio._recv_frames),
    "lean": (_zio.send_frames, _zio.recv_frames),
}


def bare_round(router, ident, io, frames, in_flight, latencies):
    """The minimal per-message work of a Clipper frontend: a fresh id in every request,
    every response matched to its request by id."""
    send_on, recv_on = BARE_IO[io]
    send = functools.partial(send_on, router)
    recv = functools.partial(recv_on, router)
    msg = [ident, *frames]
    waiting: dict[bytes, float] = {}
    ok = True

    def issue(k):
        msg[REQ_ID_AT] = msg_id = k.to_bytes(4, "little")
        waiting[msg_id] = time.perf_counter()
        send(msg)

    def collect():
        reply = recv()
        t0 = waiting.pop(reply[RESP_ID_AT], None)
        latencies.append(time.perf_counter() - t0)
        return t0 is not None and len(reply) > 3

    for k in range(min(in_flight, ROUND)):
        issue(k)
    for k in range(ROUND):
        ok &= collect()
        if k + in_flight < ROUND:
            issue(k + in_flight)
    return ok and not waiting


def _record(benchmark, latencies):
    lat = np.array(latencies) * 1e6
    benchmark.extra_info["latency_median_us"] = float(np.median(lat))
    benchmark.extra_info["latency_p99_us"] = float(np.percentile(lat, 99))
    benchmark.extra_info["round_trips"] = ROUND


#: The contenders of each load: wirekit's ways of keeping requests in flight, then the bare
#: pairs.
CONTENDERS = {
    1: ["fast", "fast-nospin", "baseline", "baseline-plain", "baseline-lean"],
    16: ["fast", "fast-futures", "baseline", "baseline-plain", "baseline-lean"],
}


@pytest.mark.parametrize(
    ("in_flight", "who"), [(n, who) for n, names in CONTENDERS.items() for who in names]
)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_clipper_round_trips(benchmark, request, who, in_flight, shape):
    benchmark.group = f"clipper rt {GEN} {shape} doubles, {in_flight} in flight"
    inputs = SHAPES[shape]
    latencies: list[float] = []
    if who.startswith("fast"):
        fe = request.getfixturevalue("wirekit_pair")
        fe.spin = 0.0 if who == "fast-nospin" else DEFAULT_SPIN
        run = wirekit_round_futures if who == "fast-futures" else wirekit_round
        try:
            ok = benchmark(run, fe, inputs, in_flight, latencies)
        finally:
            fe.spin = DEFAULT_SPIN
    else:
        pair = request.getfixturevalue(
            {
                "baseline": "bare_pair",
                "baseline-plain": "bare_plain_pair",
                "baseline-lean": "bare_lean_pair",
            }[who]
        )
        frames = clipper.encode(clipper.PredictRequest(0, clipper.InputType.DOUBLES, inputs), GEN)
        ok = benchmark(bare_round, *pair, frames, in_flight, latencies)
    assert ok
    _record(benchmark, latencies)
