"""``wirekit serve``'s OIP doors against real KServe and MLServer processes: server CPU per
request, ratios in one run (``bench_oip_peers.py`` has the load generator and wirekit's side,
``tests/oip_servers.py`` the peers and the namespace; its docstring says what is measured).

Rows (``who``), one group per protocol (``rest-json``, ``rest-binary``, ``grpc``, and
``v1-predict``: today's ``POST /v1/models/NAME:predict``):

* ``dispatcher``: the whole wirekit path (``wirekit serve`` + a ``wirekit mip serve`` echo
  backend, both processes' CPU) -- always measured;
* ``kserve``, ``mlserver`` (``parallel_workers=0``), ``mlserver-defaults``: only those named
  in ``WIREKIT_BENCH_PEERS`` (comma-separated, ``all``, or empty for none; unset: ``kserve``
  under CI, ``CI=true``, none elsewhere), because their virtualenvs are installed from PyPI
  on first use (a minute or two each, then cached under ``~/.cache/wirekit-peers``) and they
  need a network namespace (root, ``ip``); otherwise they skip, saying so;
* ``dispatcher-LABEL``: the same wirekit path from another tree, for each
  ``LABEL=DIRECTORY`` in ``WIREKIT_BENCH_BEFORE`` (a directory alone: label ``before``) --
  e.g. main's, to check that today's door does not regress.

``extra_info["server_cpu_us"]`` is the median over the rounds (``server_cpu_us_min`` the
least); ``ratios.py`` prints every row's ratio to ``dispatcher``.  In the quick mode (the
default ``--benchmark-max-time``, as CI runs) a round is 200 requests and there are 3; with
``--benchmark-max-time`` of 0.5 s or more, 2000 requests and 7 rounds.

The copies rows (group ``oip 4 MiB FP32 binary``): the door's codec path for a 4 MiB FP32
tensor in the binary extension, in this process -- the request body decoded, mapped onto the
MIP request, the echo reply decoded, mapped back and encoded as the binary answer's pieces --
with ``tracemalloc`` counting the bytes it allocates (``extra_info["copies"]``: allocated
bytes / tensor bytes, each step's peak summed), and its time against ``memcpy`` of 4 MiB (the
bound row).  Reading the body from the socket and writing the answer to it are not in it
(the kernel's copies, any server's); the ``whole path`` row adds them: the 4 MiB request
through the running dispatcher, its CPU per request.
"""

from __future__ import annotations

import os
import struct
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import bench_oip_peers as peers
import oip_servers
import pytest

from wirekit import mip, oip

PEERS_ENV_VAR = "WIREKIT_BENCH_PEERS"
BEFORE_ENV_VAR = "WIREKIT_BENCH_BEFORE"
ALL_PEERS = ("kserve", "mlserver", "mlserver-defaults")


def _asked_peers() -> list[str]:
    """The peers ``WIREKIT_BENCH_PEERS`` names; unset: KServe under CI (``CI=true``: its
    virtualenv, which scripts/test.sh installs, makes the rows cost seconds), none
    elsewhere (a peer's rows are an opt-in outside CI)."""
    value = os.environ.get(PEERS_ENV_VAR)
    if value is None:
        value = "kserve" if os.environ.get("CI") == "true" else ""
    value = value.strip()
    if value == "all":
        return list(ALL_PEERS)
    return [p.strip() for p in value.split(",") if p.strip()]


def _before_trees() -> dict[str, Path]:
    trees = {}
    for entry in filter(None, (e.strip() for e in os.environ.get(BEFORE_ENV_VAR, "").split(","))):
        label, sep, path = entry.partition("=")
        trees[label if sep else "before"] = Path(path if sep else entry)
    return trees


BEFORE = _before_trees()
WHO = ["dispatcher", *(f"dispatcher-{label}" for label in BEFORE), *ALL_PEERS]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Any]]:
    """The namespace (``None`` where none can be made), a work directory and the running
    servers: ``dispatcher`` always, the peers asked for, other trees' dispatchers."""
    asked = _asked_peers()
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wirekit-oip-")))
        ns, reason = oip_servers.open_namespace(stack)
        started: dict[str, oip_servers.Server] = {}
        skipped: dict[str, str] = {}
        try:
            started["dispatcher"] = peers.start_wirekit(ns, workdir)
            for label, tree in BEFORE.items():
                who = f"dispatcher-{label}"
                started[who] = peers.start_wirekit(ns, workdir, who=who, tree=tree)
            for who in ALL_PEERS:
                if who not in asked:
                    skipped[who] = f"a peer: set {PEERS_ENV_VAR}={who} (or all) to measure it"
                elif ns is None:
                    skipped[who] = f"peers run in a network namespace: {reason}"
                elif who == "kserve":
                    started[who] = peers.start_kserve(ns, workdir)
                else:
                    defaults = who == "mlserver-defaults"
                    started[who] = peers.start_mlserver(ns, workdir, defaults=defaults)
            yield {"ns": ns, "workdir": workdir, "servers": started, "skipped": skipped}
        finally:
            for server in started.values():
                server.stop()


def _sizes(config: pytest.Config) -> tuple[int, int]:
    """(requests a round, rounds): quick unless a measurement run was asked for."""
    max_time = config.getoption("benchmark_max_time", 0.02) or 0.02
    return (2000, 7) if float(max_time) >= 0.5 else (200, 3)


def _measure(benchmark: Any, load: peers.LoadGenerator, requests: int, rounds: int) -> None:
    """``rounds`` rounds of ``requests`` requests; their CPU per request in extra_info."""
    results: list[dict[str, Any]] = []
    benchmark.pedantic(lambda: results.append(load.round(requests)), rounds=rounds, iterations=1)
    cpu = sorted(r["cpu_us"] for r in results)
    rates = sorted(requests / r["elapsed_s"] for r in results)
    benchmark.extra_info.update(
        server_cpu_us=round(cpu[len(cpu) // 2], 2),
        server_cpu_us_min=round(cpu[0], 2),
        requests_per_s=round(rates[len(rates) // 2], 1),
        p50_us=sorted(r["p50_us"] for r in results)[len(results) // 2],
        p99_us=sorted(r["p99_us"] for r in results)[len(results) // 2],
        # per process tree, the median round's (wirekit: the dispatcher's, the backend's)
        server_cpu_us_by_process=next(
            r["cpu_us_by_process"] for r in results if r["cpu_us"] == cpu[len(cpu) // 2]
        ),
    )


def _server_for(servers: dict[str, Any], who: str, protocol: str) -> oip_servers.Server:
    """The running server of ``who`` over ``protocol``, or skip saying why not."""
    if who in servers["skipped"]:
        pytest.skip(servers["skipped"][who])
    speaks = peers.speaks(who)
    if protocol not in speaks:
        pytest.skip(f"{who} does not serve {protocol}")
    server: oip_servers.Server = servers["servers"][who]
    if who.startswith("dispatcher"):
        tree = BEFORE.get(who.removeprefix("dispatcher-")) if who != "dispatcher" else None
        missing = peers.door_missing(protocol, server, tree)
        if missing:
            pytest.skip(missing)
    return server


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("protocol", peers.PROTOCOLS)
def test_oip_server_cpu(benchmark, pytestconfig, servers, protocol, who):
    """A [1,16] FP32 tensor echoed, 32 requests in flight: the server's CPU per request."""
    benchmark.group = f"oip {protocol} [1,16] FP32, 32 in flight (server CPU per request)"
    server = _server_for(servers, who, protocol)
    requests, rounds = _sizes(pytestconfig)
    work = peers.Workload.for_server(protocol, who)
    load = peers.LoadGenerator(servers["ns"], servers["workdir"], server, work)
    try:
        _measure(benchmark, load, requests, rounds)
    finally:
        load.close()


# --- copies of a 4 MiB tensor -------------------------------------------------------------------

TENSOR_BYTES = 4 << 20
BIG_IN_FLIGHT = 8
BIG_SHAPE = (1, TENSOR_BYTES // 4)
BIG_RAW = struct.pack("<f", 0.5) * (TENSOR_BYTES // 4)


def _echo_reply(wire: bytes) -> bytes:
    """The MIP reply wirekit's echo backend gives to request ``wire`` (made outside the
    measured path: it is the backend's work)."""
    request = mip.decode(wire)
    assert isinstance(request, mip.Inference)
    samples = [
        request.items[k * request.n_input : (k + 1) * request.n_input]
        for k in range(request.batch_size)
    ]
    return mip.encode(mip.Inference.reply(samples, request.n_input))


def door_codec_steps(body: bytes, json_length: int) -> list[tuple[str, Callable[[Any], Any]]]:
    """The door's steps between the body read and the answer's pieces, each a function of
    the previous step's result."""

    def backend(wire: bytes) -> bytes:
        return reply

    reply = _echo_reply(oip.request_to_mip(oip.decode_rest_request(body, json_length)))
    request: list[oip.InferRequest] = []

    def decode(_: Any) -> oip.InferRequest:
        request.append(oip.decode_rest_request(body, json_length))
        return request[0]

    def answer(msg: Any) -> Any:
        outputs, parameters = oip.response_from_mip(msg)
        outputs = oip.select_outputs(outputs, request[0].outputs)
        response = oip.InferResponse(peers.MODEL, outputs, "1", request[0].id, parameters)
        return oip.encode_rest_response(response, binary=oip.binary_outputs(request[0]))

    return [
        ("decode_rest_request", decode),
        ("request_to_mip", lambda req: oip.request_to_mip(req)),
        ("(the backend)", backend),
        ("mip.decode (the reply)", lambda wire: mip.decode(wire)),
        ("response_from_mip + encode_rest_response", answer),
    ]


def count_copies(body: bytes, json_length: int) -> tuple[float, dict[str, int], Any]:
    """Run the door's codec path once under ``tracemalloc``: the tensor copies it makes
    (bytes allocated, each step's peak summed, / tensor bytes), the bytes per step, and the
    answer."""
    steps = door_codec_steps(body, json_length)
    per_step: dict[str, int] = {}
    value: Any = None
    kept = []
    tracemalloc.start()
    try:
        for name, step in steps:
            current, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            value = step(value)
            kept.append(value)  # every result alive to the end: nothing freed is counted twice
            _, peak = tracemalloc.get_traced_memory()
            if name != "(the backend)":
                per_step[name] = peak - current
    finally:
        tracemalloc.stop()
    return sum(per_step.values()) / TENSOR_BYTES, per_step, value


@pytest.mark.benchmark(group="oip 4 MiB FP32 binary: the door's codec path vs memcpy")
@pytest.mark.parametrize("who", ["dispatcher", "memcpy"])
def test_oip_tensor_copies(benchmark, who):
    """``dispatcher``: the codec path (time per request; ``copies`` in extra_info, the
    issue's bound is 2); ``memcpy``: copying 4 MiB once (the bound row)."""
    body, json_length = peers.oip_binary_body(BIG_RAW, BIG_SHAPE)
    if who == "memcpy":
        target = bytearray(TENSOR_BYTES)
        view = memoryview(target)

        def copy() -> None:
            view[:] = BIG_RAW

        benchmark(copy)
        assert target == BIG_RAW
        return
    copies, per_step, (pieces, length) = count_copies(body, json_length)
    answer = pieces if isinstance(pieces, bytes) else b"".join(pieces)
    assert answer[length:] == BIG_RAW
    steps = door_codec_steps(body, json_length)

    def path() -> Any:
        value: Any = None
        for _, step in steps:
            value = step(value)
        return value

    benchmark(path)
    benchmark.extra_info["copies"] = round(copies, 3)
    benchmark.extra_info["bytes_per_step"] = per_step
    assert copies <= 2, f"the door's codec path copies the tensor {copies:.2f} times: {per_step}"


@pytest.mark.parametrize("who", ["dispatcher"])
def test_oip_tensor_whole_path(benchmark, servers, who):
    """The 4 MiB FP32 tensor through the whole path over the binary extension (the kernel's
    socket copies included), 8 requests in flight: the server's CPU per request, against
    memcpy's time for 4 MiB (``memcpy_us`` in extra_info)."""
    benchmark.group = "oip rest-binary 4 MiB FP32, 8 in flight (server CPU per request)"
    server = _server_for(servers, who, peers.REST_BINARY)
    work = peers.Workload.for_server(peers.REST_BINARY, who, BIG_RAW, BIG_SHAPE)
    # 8 in flight: 32 tensors of 4 MiB held at once overrun the dispatcher's memory budget
    # (256 MiB by default), which answers 503 "try again" then, as it should
    load = peers.LoadGenerator(
        servers["ns"], servers["workdir"], server, work, warmup=16, in_flight=BIG_IN_FLIGHT
    )
    requests, rounds = (64, 3)
    try:
        _measure(benchmark, load, requests, rounds)
    finally:
        load.close()
    target = bytearray(TENSOR_BYTES)
    start = time.perf_counter()
    for _ in range(50):
        memoryview(target)[:] = BIG_RAW
    benchmark.extra_info["memcpy_us"] = round((time.perf_counter() - start) / 50 * 1e6, 1)
