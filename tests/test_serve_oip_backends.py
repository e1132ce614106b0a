"""Issue 37: model servers behind ``wirekit serve`` -- the backend kinds ``oip`` (REST, and
gRPC with ``grpc: true``) and ``tfserving``.

wirekit is itself a real OIP server (its OIP REST, OIP gRPC and TF Serving doors), so the
servers here are a second ``wirekit serve`` process (the "server", its models on wirekit's
MIP echo backends and on one that answers an OIP error), and the front ``wirekit serve``
process forwards to it.  Through every front door -- OIP REST in JSON and binary, OIP
gRPC, TF Serving REST, a MIP client sending OIP items -- the answer equals the server's
own answer to the same request; a model's error reaches the client with its message
intact; a device whose server is gone is backed off and its requests resubmitted to the
other device; plain MIP items are refused, naming the backend kind.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from oip_handlers import MODEL_ERROR_MESSAGE
from oip_servers import Response, http_call
from serve_support import TIMEOUT, BackendProcess, DispatcherProcess, deployment
from support.ports import free_port
from support.rows import select

from wirekit import mip, oip
from wirekit.mip import ErrorCode, ErrorReply, Inference, Item
from wirekit.mip.client import Client
from wirekit.oip.grpc import messages as pb
from wirekit.oip.grpc.convert import request_to_grpc, response_from_grpc

HEADER = "Inference-Header-Content-Length"


@dataclass
class Servers:
    """The server process and the front process (which forwards to it)."""

    server: DispatcherProcess
    front: DispatcherProcess
    store: Path  #: the front's store

    def rows(
        self, model: str, count: int = 0, reason: str | None = None
    ) -> list[tuple[str, str | None, str | None]]:
        """``(status, reason, device)`` of the front's rows of ``model`` ended so far (with
        ``reason``: those ended for it), waiting (bounded) until there are ``count`` of
        them (the store writes a little after the answer)."""
        query = (
            "SELECT status, reason, device FROM requests WHERE model = ? AND status IN"
            " ('ok', 'error', 'failed', 'lost', 'abandoned') ORDER BY time_in"
        )
        deadline = time.monotonic() + TIMEOUT
        while True:
            rows = [r for r in select(self.store, query, (model,)) if reason in (None, r[1])]
            if len(rows) >= count or time.monotonic() > deadline:
                return rows
            time.sleep(0.02)


def server_doc(directory: Path, echo: int, failing: int) -> dict[str, Any]:
    """The OIP server: ``echo`` and ``rows`` on the MIP echo backend, ``failing`` on the
    backend that answers an OIP error; HTTP and gRPC doors."""
    models = {"echo": {}, "failing": {"attempts": 1}}
    nodes = [
        {"id": "e", "devices": ["CPU"], "models": ["echo"], "quotas": [1], "ports": [echo]},
        {"id": "f", "devices": ["CPU"], "models": ["failing"], "quotas": [1], "ports": [failing]},
    ]
    doc = deployment(directory / "server.db", models, nodes)
    doc["listen"]["grpc_port"] = 0
    return doc


def front_doc(directory: Path, http: int, grpc_port: int, dead: int) -> dict[str, Any]:
    """The front: each model on the server's doors (``server_model`` ``echo`` or
    ``failing``); ``echo`` on two devices, one of them a port nothing listens on."""
    models = {
        "echo": {"backend": "oip", "attempts": 3},
        "rows": {"backend": "oip", "server_model": "echo", "tensors": "rows"},
        "viagrpc": {"backend": "oip", "server_model": "echo", "grpc": True},
        "tf": {"backend": "tfserving", "server_model": "echo"},
        "failing": {"backend": "oip", "attempts": 1},
        "failing-grpc": {"backend": "oip", "server_model": "failing", "grpc": True},
    }
    models = {name: {"timeout": 10, **m} for name, m in models.items()}
    nodes = [
        {"id": "d", "devices": ["CPU", "CPU"], "models": ["echo"], "quotas": [0.5, 0.5]},
        {"id": "s", "devices": ["CPU"], "models": list(models)[1:], "quotas": [0.2] * 5},
    ]
    nodes[0]["ports"] = [dead, http]
    nodes[1]["ports"] = [http, grpc_port, http, http, grpc_port]
    doc = deployment(
        directory / "front.db",
        models,
        nodes,
        store={"path": str(directory / "front.db"), "flush_interval": 0.01},
    )
    doc["listen"]["grpc_port"] = 0
    return doc


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    directory = tmp_path_factory.mktemp("oip-backends")
    with (
        BackendProcess("wirekit.mip.runtime:echo") as echo,
        BackendProcess("oip_handlers:model_error") as failing,
        DispatcherProcess.of(server_doc(directory, echo.port, failing.port), directory) as server,
    ):
        front_dir = directory / "front"
        front_dir.mkdir()
        doc = front_doc(front_dir, server.addresses["http"], server.addresses["grpc"], free_port())
        with DispatcherProcess.of(doc, front_dir) as front:
            yield Servers(server, front, front_dir / "front.db")


# ---------------------------------------------------------------------- clients


def post(process: DispatcherProcess, path: str, body: bytes, headers: dict[str, str]) -> Response:
    return http_call("127.0.0.1", process.addresses["http"], "POST", path, body, headers, TIMEOUT)


def post_json(process: DispatcherProcess, path: str, doc: Any) -> Response:
    return http_call("127.0.0.1", process.addresses["http"], "POST", path, doc, None, TIMEOUT)


def without_id(doc: dict[str, Any]) -> dict[str, Any]:
    """An OIP answer without what differs between two servers answering the same request:
    the model's name (the front's and the server's differ), its version."""
    return {k: v for k, v in doc.items() if k not in ("model_name", "model_version", "id")}


FLOATS = [[1.5, -2.25, 3.0], [4.0, 5.5, -6.125]]
REQUEST = {
    "id": "r1",
    "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [2, 3], "data": FLOATS},
        {"name": "t", "datatype": "BYTES", "shape": [2], "data": ["héllo", "wörld"]},
        {"name": "n", "datatype": "INT64", "shape": [2, 1], "data": [[-(1 << 62)], [7]]},
    ],
}


# ---------------------------------------------------------------------- OIP REST


@pytest.mark.parametrize("model", ["echo", "rows", "viagrpc"])
def test_oip_rest_json_equals_the_server_s_answer(servers: Servers, model: str):
    direct = post_json(servers.server, "/v2/models/echo/infer", REQUEST)
    through = post_json(servers.front, f"/v2/models/{model}/infer", REQUEST)
    assert (direct.status, through.status) == (200, 200), through.body
    assert without_id(through.json()) == without_id(direct.json())
    assert through.json()["model_name"] == model
    assert through.json()["id"] == "r1"


def binary_request() -> tuple[bytes, int, bytes]:
    floats = struct.pack("<6f", *[v for row in FLOATS for v in row])
    doc = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [2, 3],
                "parameters": {"binary_data_size": 24},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    head = json.dumps(doc).encode()
    return head + floats, len(head), floats


def test_oip_rest_binary_equals_the_server_s_answer(servers: Servers):
    body, length, floats = binary_request()
    headers = {"Content-Type": "application/octet-stream", HEADER: str(length)}
    direct = post(servers.server, "/v2/models/echo/infer", body, headers)
    through = post(servers.front, "/v2/models/echo/infer", body, headers)
    assert (direct.status, through.status) == (200, 200), through.body
    size = int(through.headers[HEADER.lower()])
    assert through.body[size:] == direct.body[int(direct.headers[HEADER.lower()]) :] == floats
    assert without_id(json.loads(through.body[:size])) == without_id(
        json.loads(direct.body[: int(direct.headers[HEADER.lower()])])
    )


# ---------------------------------------------------------------------- OIP gRPC


def grpc_infer(process: DispatcherProcess, model: str, req: oip.InferRequest) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{process.addresses['grpc']}") as channel:
        call = channel.unary_unary(
            f"/{pb.SERVICE}/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        return call(request_to_grpc(pb.ModelInferRequest, model, req), timeout=TIMEOUT)


def oip_request() -> oip.InferRequest:
    floats = struct.pack("<6f", *[v for row in FLOATS for v in row])
    text = b"".join(struct.pack("<I", len(s)) + s for s in (b"a", b"\xff\x00bytes"))
    return oip.InferRequest(
        [oip.Tensor("x", "FP32", (2, 3), floats), oip.Tensor("t", "BYTES", (2,), text)],
        id="g1",
    )


@pytest.mark.parametrize("model", ["echo", "rows", "viagrpc"])
def test_oip_grpc_equals_the_server_s_answer(servers: Servers, model: str):
    direct = response_from_grpc(grpc_infer(servers.server, "echo", oip_request()))
    through = response_from_grpc(grpc_infer(servers.front, model, oip_request()))
    assert through == direct
    assert [bytes(t.data) for t in through[0]] == [bytes(t.data) for t in oip_request().inputs]


# ---------------------------------------------------------------------- TF Serving REST


@pytest.mark.parametrize(
    "body",
    [
        {"instances": [[1.5, 2.0], [3.25, -4.0]]},
        {"instances": [{"a": [1, 2], "b": "x"}, {"a": [3, 4], "b": "y"}]},
        {"inputs": {"a": [[1, 2], [3, 4]], "b": ["x", "y"]}},
        {"inputs": [True, False]},
    ],
)
@pytest.mark.parametrize("model", ["echo", "tf"])
def test_tf_serving_answers_what_the_server_answers(servers: Servers, model: str, body):
    """The front's TF Serving door builds OIP tensors for a server-backed model (no inputs
    declared: datatypes from the JSON); the answer is what the body asks for."""
    through = post_json(servers.front, f"/v1/models/{model}:predict", body)
    assert through.status == 200, through.body
    if "instances" in body:
        assert through.json() == {"predictions": body["instances"]}
    else:
        assert through.json() == {"outputs": body["inputs"]}


# ---------------------------------------------------------------------- MIP client


def test_a_mip_client_sending_oip_items(servers: Servers):
    req = oip_request()
    with Client(servers.front.mip_address("echo"), timeout=TIMEOUT) as front:
        reply = front.request(mip.decode(oip.request_to_mip(req)))
    with Client(servers.server.mip_address("echo"), timeout=TIMEOUT) as server:
        direct = server.request(mip.decode(oip.request_to_mip(req)))
    assert oip.response_from_mip(reply) == oip.response_from_mip(direct)


def test_plain_mip_items_are_refused_naming_the_backend_kind(servers: Servers):
    with Client(servers.front.mip_address("echo"), timeout=TIMEOUT) as front:
        reply = front.request(Inference.request([[Item.text("hello")]]))
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.SHAPE
    reason = (
        "model 'echo' is served by oip backends, which take OIP tensors: items[0]: item"
        " type 0x1 is not one of an OIP request"
    )
    # Clipper's query frontend answers Clipper's way: the default output, and why
    answer = post_json(servers.front, "/echo/predict", {"input": "hello"})
    assert answer.status == 200, answer.body
    assert answer.json()["default_explanation"] == reason
    rows = servers.rows("echo", count=2, reason=reason)
    assert [(s, r) for s, r, _d in rows] == [("error", reason)] * 2


# ---------------------------------------------------------------------- the status table


@pytest.mark.parametrize("model", ["failing", "failing-grpc"])
def test_a_model_error_reaches_the_client_intact(servers: Servers, model: str):
    answer = post_json(servers.front, f"/v2/models/{model}/infer", REQUEST)
    assert answer.status == 400
    assert answer.json() == {"error": MODEL_ERROR_MESSAGE}
    with grpc.insecure_channel(f"127.0.0.1:{servers.front.addresses['grpc']}") as channel:
        call = channel.unary_unary(
            f"/{pb.SERVICE}/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as info:
            call(request_to_grpc(pb.ModelInferRequest, model, oip_request()), timeout=TIMEOUT)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == MODEL_ERROR_MESSAGE
    rows = servers.rows(model, count=2)
    assert len(rows) == 2 and all(r[:2] == ("error", MODEL_ERROR_MESSAGE) for r in rows)


def test_a_dead_server_s_requests_are_resubmitted(servers: Servers):
    """``echo``'s device 0 is a port nothing listens on: every request still ends ``ok``,
    answered by device 1; those that tried device 0 first were resubmitted."""
    for k in range(12):
        request = {"inputs": [{"name": "k", "datatype": "INT32", "shape": [1], "data": [k]}]}
        answer = post_json(servers.front, "/v2/models/echo/infer", request)
        assert answer.status == 200, answer.body
        assert answer.json()["outputs"][0]["data"] == [k]
    rows = [r for r in servers.rows("echo", count=12 + 1) if r[2] not in (None, "cache")]
    assert {row for row in rows if row[0] == "ok"} == {("ok", None, "d/1/echo")}
    assert len(rows) >= 12
    assert servers.front.count("d/0/echo") >= 1
