"""The real OIP servers the issue-37 tests run behind ``wirekit serve`` (``oip_servers.py``):
MLServer 1.7.1 and KServe 0.21.0 processes from PyPI, each asked directly -- the iris model
answers the right classes over OIP REST and gRPC (and KServe's TF Serving REST
``:predict``), the repository extension loads and unloads, ``broken`` fails its load with its
message, a kill ends the whole process tree, KServe stays inside its namespace.

No wirekit code is under test here (the harness is): the compiled run has them; the pure
run skips them.
"""

from __future__ import annotations

import os
import struct
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from oip_fixtures import kserve, mlserver, require_peers  # noqa: F401
from oip_servers import (
    BROKEN_MESSAGE,
    IRIS_CLASSES,
    IRIS_ROWS,
    SLOW_LOAD_SECONDS,
    SLOW_PREDICT_SECONDS,
    Namespace,
    Server,
    descendants,
    http_call,
    start_mlserver,
)

pytestmark = pytest.mark.skipif(
    os.environ.get("WIREKIT_PURE") == "1",
    reason="real model servers' processes asked directly: no wirekit twin is under test, the"
    " compiled run has them",
)

SERVERS = ["mlserver", "kserve"]
IRIS_INPUT = {
    "name": "input-0",
    "shape": [len(IRIS_ROWS), 4],
    "datatype": "FP64",
    "data": [x for row in IRIS_ROWS for x in row],
}
ECHO_INPUT = {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [0.5, -1.0, 2.25]}


@pytest.fixture(params=SERVERS)
def server(request: pytest.FixtureRequest) -> Server:
    """Each of the module's servers in turn."""
    return request.getfixturevalue(request.param)


def _classes(answer: Any) -> list[int]:
    assert answer.status == 200, answer.body[:500]
    (output,) = answer.json()["outputs"]
    assert (output["name"], output["datatype"]) == ("predict", "INT64"), output
    return [int(v) for v in output["data"]]


def test_iris_over_rest(server):
    """The iris classifier trained at test time answers the known classes of a few rows."""
    assert _classes(server.infer("iris", [IRIS_INPUT])) == IRIS_CLASSES


def test_echo_over_rest(server):
    answer = server.infer("echo", [ECHO_INPUT])
    assert answer.status == 200, answer.body
    (output,) = answer.json()["outputs"]
    assert {k: output[k] for k in ECHO_INPUT} == ECHO_INPUT


def _grpc_infer(address: str, model: str, rows: list[list[float]]) -> list[int]:
    """``ModelInfer`` over gRPC (wirekit's own message classes, grpcio's channel): the
    classes of ``rows`` as the server answers them (typed or raw contents)."""
    import grpc

    from wirekit.oip.grpc import messages

    request = messages.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="input-0", datatype="FP64", shape=[len(rows), 4])
    tensor.contents.fp64_contents.extend(x for row in rows for x in row)
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            f"/{messages.SERVICE}/ModelInfer",
            request_serializer=messages.ModelInferRequest.SerializeToString,
            response_deserializer=messages.ModelInferResponse.FromString,
        )
        reply = call(request, timeout=30)
    (output,) = reply.outputs
    assert (output.name, output.datatype) == ("predict", "INT64"), output
    if reply.raw_output_contents:
        raw = reply.raw_output_contents[0]
        return list(struct.unpack(f"<{len(raw) // 8}q", raw))
    return list(output.contents.int64_contents)


def test_iris_over_grpc(server):
    """Over gRPC (KServe's through a relay into its namespace: ``local_port``)."""
    assert _grpc_infer(server.address("grpc"), "iris", IRIS_ROWS) == IRIS_CLASSES


def test_kserve_tfserving_predict(kserve):  # noqa: F811
    """KServe's TF Serving REST API: ``instances`` -> ``predictions``."""
    answer = kserve.request("POST", "/v1/models/iris:predict", {"instances": IRIS_ROWS})
    assert answer.status == 200, answer.body
    assert answer.json() == {"predictions": IRIS_CLASSES}


def test_repository_unload_then_load(server):
    """Unload: the model is no longer ready nor served; load: served again."""
    assert server.model_ready("iris")
    assert server.unload("iris").status == 200
    assert not server.model_ready("iris")
    assert server.infer("iris", [IRIS_INPUT]).status != 200
    answer = server.load("iris")
    assert answer.status == 200, answer.body
    assert server.model_ready("iris")
    assert _classes(server.infer("iris", [IRIS_INPUT])) == IRIS_CLASSES


def test_slow_load_and_answers(server):
    """The slow echo takes its time to load, then to answer, and unloads."""
    assert not server.model_ready("slow")
    started = time.monotonic()
    assert server.load("slow").status == 200
    assert time.monotonic() - started >= SLOW_LOAD_SECONDS
    started = time.monotonic()
    answer = server.infer("slow", [ECHO_INPUT])
    assert time.monotonic() - started >= SLOW_PREDICT_SECONDS
    assert answer.status == 200 and answer.json()["outputs"][0]["data"] == ECHO_INPUT["data"]
    assert server.unload("slow").status == 200
    assert not server.model_ready("slow")


def test_broken_load_fails_with_its_message(server):
    """The broken model's load fails, its message in the answer; the server serves on."""
    for _ in range(2):
        answer = server.load("broken")
        assert answer.status >= 400
        assert BROKEN_MESSAGE in answer.json()["error"], answer.body
    assert not server.model_ready("broken")
    assert _classes(server.infer("iris", [IRIS_INPUT])) == IRIS_CLASSES


def test_kserve_stays_in_its_namespace(kserve):  # noqa: F811
    """KServe listens on 0.0.0.0 -- of a namespace whose only interface is loopback."""
    assert kserve.ns is not None
    links = kserve.ns.check(["ip", "-o", "link", "show"]).splitlines()
    assert [line.split(":")[1].strip() for line in links] == ["lo"]
    listening = kserve.ns.listening()
    assert any(a.endswith(f":{kserve.ports['http']}") for a in listening), listening


def test_relay_into_the_namespace(kserve):  # noqa: F811
    """``local_port``: clients of this namespace reach KServe through the relay, several at
    once, a large body whole both ways."""
    big = {"name": "x", "shape": [1, 50000], "datatype": "FP32", "data": [0.5] * 50000}
    port = kserve.local_port("http")
    assert kserve.address("http") == f"127.0.0.1:{port}"
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda _: http_call(
                    "127.0.0.1", port, "POST", "/v2/models/echo/infer", {"inputs": [big]}
                ),
                range(8),
            )
        )
    for answer in answers:
        assert answer.status == 200, answer.body[:300]
        assert answer.json()["outputs"][0]["data"] == big["data"]


def test_namespace_cleaned_up():
    """A namespace is gone after its ``with``, relays and threads included."""
    require_peers("kserve")
    with Namespace() as ns:
        assert ns.path.exists()
        ns.forward(9)
        assert ns.run(lambda: 7) == 7
    assert not ns.path.exists()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert ns.name not in names


def test_kill_ends_the_whole_tree():
    """``kill`` SIGKILLs the server and its inference worker at once (MLServer's default
    of one worker process), as a test killing a server mid-load needs."""
    require_peers("mlserver")
    with tempfile.TemporaryDirectory(prefix="wirekit-kill-") as tmp:
        server = start_mlserver(Path(tmp), models=("echo",), parallel_workers=None)
        try:
            tree = descendants(server.pids)
            assert len(tree) >= 2, tree  # the server and its worker
            server.kill()
            assert server.procs[0].returncode == -9
            end = time.monotonic() + 10
            while descendants(list(tree)) and time.monotonic() < end:
                time.sleep(0.05)
            assert not descendants(list(tree))
        finally:
            server.stop()
