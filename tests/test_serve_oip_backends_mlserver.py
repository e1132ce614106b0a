"""Issue 37: a real MLServer 1.7.1 process (tests/oip_servers.py: its own pinned virtualenv,
from PyPI) behind a real ``wirekit serve`` -- backend kind ``oip`` over REST and over gRPC.

Through wirekit's doors (OIP REST in JSON and binary, OIP gRPC, TF Serving REST) the answers
equal MLServer's own to the same request: the scikit-learn iris model trained at test time
and the echo model.  MLServer's REST API reads JSON only (no binary data extension): the
backend finds it out on its first request and speaks JSON to it from then on, while the
client of wirekit's door still speaks binary.  A request MLServer refuses reaches the client
with MLServer's message intact (400), not resubmitted.
"""

from __future__ import annotations

import http.client
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from oip_fixtures import mlserver  # noqa: F401  (a module-scoped fixture)
from oip_servers import IRIS_CLASSES, IRIS_ROWS, Server
from serve_support import TIMEOUT, DispatcherProcess, deployment

from wirekit import oip
from wirekit.oip.grpc import messages as pb
from wirekit.oip.grpc.convert import request_to_grpc, response_from_grpc

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("WIREKIT_PURE") == "1",
        reason="a real model server's process: the dispatcher's path to it has no compiled"
        " twin, the pure run has the same code",
    ),
]

HEADER = "Inference-Header-Content-Length"


def front_doc(directory: Path, http: int, grpc_port: int) -> dict[str, Any]:
    """wirekit in front of MLServer: ``iris`` and ``echo`` over REST, ``iris-grpc`` over
    gRPC (MLServer's ``iris``)."""
    models = {
        "iris": {"backend": "oip"},
        "echo": {"backend": "oip"},
        "iris-grpc": {"backend": "oip", "grpc": True, "server_model": "iris"},
    }
    models = {name: {"timeout": 30, "attempts": 1, **m} for name, m in models.items()}
    node = {
        "id": "mlserver",
        "devices": ["CPU"],
        "models": list(models),
        "quotas": [0.3, 0.3, 0.3],
        "ports": [http, http, grpc_port],
    }
    doc = deployment(directory / "front.db", models, [node], cache={"max_entries": 0})
    doc["listen"]["grpc_port"] = 0
    return doc


class Pair:
    """MLServer, and the ``wirekit serve`` in front of it."""

    def __init__(self, server: Any, front: DispatcherProcess) -> None:
        self.mlserver = server
        self.front = front

    def direct(self, path: str, doc: Any) -> tuple[int, Any]:
        answer = self.mlserver.request("POST", path, doc, timeout=TIMEOUT)
        try:
            return answer.status, json.loads(answer.body)
        except ValueError:  # MLServer's 500 is text
            return answer.status, answer.body

    def through(
        self, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.front.addresses["http"], timeout=60)
        try:
            conn.request("POST", path, body, headers or {"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def pair(mlserver: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:  # noqa: F811
    directory = tmp_path_factory.mktemp("mlserver-backend")
    doc = front_doc(directory, mlserver.ports["http"], mlserver.ports["grpc"])
    with DispatcherProcess.of(doc, directory) as front:
        yield Pair(mlserver, front)


def _outputs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """An answer's outputs as compared: name, datatype, shape, data."""
    keys = ("name", "datatype", "shape", "data")
    return [{k: out[k] for k in keys} for out in doc["outputs"]]


IRIS = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [4, 4], "data": IRIS_ROWS}]}


@pytest.mark.parametrize("model", ["iris", "iris-grpc"])
def test_iris_through_the_oip_rest_door(pair: Pair, model: str):
    status, direct = pair.direct("/v2/models/iris/infer", IRIS)
    assert status == 200, direct
    got, _headers, body = pair.through(f"/v2/models/{model}/infer", json.dumps(IRIS).encode())
    assert got == 200, body
    assert _outputs(json.loads(body)) == _outputs(direct)
    assert direct["outputs"][0]["data"] == IRIS_CLASSES


def test_echo_in_binary_through_a_json_only_server(pair: Pair):
    """The client speaks the binary extension to wirekit; MLServer gets JSON."""
    floats = struct.pack("<4f", 1.5, -2.0, 3.25, 4.0)
    doc = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [1, 4],
                "parameters": {"binary_data_size": 16},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    head = json.dumps(doc).encode()
    headers = {"Content-Type": "application/octet-stream", HEADER: str(len(head))}
    status, answer_headers, body = pair.through("/v2/models/echo/infer", head + floats, headers)
    assert status == 200, body
    size = int(answer_headers[HEADER])
    assert body[size:] == floats
    _status, direct = pair.direct(
        "/v2/models/echo/infer",
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.5, -2, 3.25, 4]}
            ]
        },
    )
    (out,) = json.loads(body[:size])["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == (
        direct["outputs"][0]["name"],
        direct["outputs"][0]["datatype"],
        direct["outputs"][0]["shape"],
    )


@pytest.mark.parametrize("model", ["iris", "iris-grpc"])
def test_iris_through_the_grpc_door(pair: Pair, model: str):
    _status, direct = pair.direct("/v2/models/iris/infer", IRIS)
    data = struct.pack(f"<{16}d", *[v for row in IRIS_ROWS for v in row])
    req = oip.InferRequest([oip.Tensor("x", "FP64", (4, 4), data)])
    with grpc.insecure_channel(f"127.0.0.1:{pair.front.addresses['grpc']}") as channel:
        call = channel.unary_unary(
            f"/{pb.SERVICE}/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        outputs, _ = response_from_grpc(
            call(request_to_grpc(pb.ModelInferRequest, model, req), timeout=60)
        )
    (out,) = outputs
    (expected,) = direct["outputs"]
    assert (out.name, out.datatype, list(out.shape)) == (
        expected["name"],
        expected["datatype"],
        expected["shape"],
    )
    assert list(struct.unpack("<4q", bytes(out.data))) == IRIS_CLASSES


@pytest.mark.parametrize("model", ["iris", "iris-grpc"])
def test_iris_through_the_tf_serving_door(pair: Pair, model: str):
    _status, direct = pair.direct("/v2/models/iris/infer", IRIS)
    rows = direct["outputs"][0]["shape"][1:] == [1]  # MLServer answers [N, 1]
    body = json.dumps({"instances": IRIS_ROWS}).encode()
    status, _headers, answer = pair.through(f"/v1/models/{model}:predict", body)
    assert status == 200, answer
    expected = [[c] for c in IRIS_CLASSES] if rows else IRIS_CLASSES
    assert json.loads(answer) == {"predictions": expected}


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("iris", "HTTP 500: Internal Server Error"),
        ("iris-grpc", "INTERNAL: X has 3 features, but LogisticRegression is expecting 4"),
    ],
)
def test_mlserver_s_model_failure_follows_the_status_table(pair: Pair, model: str, says: str):
    """MLServer answers a model's failure 500 (REST, without its message) or INTERNAL
    (gRPC, with it): the server's failure by the table -- resubmitted, and with one device
    and one attempt, ``failed`` (503) saying what MLServer said."""
    bad = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [2, 3], "data": [1] * 6}]}
    status, _direct = pair.direct("/v2/models/iris/infer", bad)
    assert status == 500
    got, _headers, body = pair.through(f"/v2/models/{model}/infer", json.dumps(bad).encode())
    assert got == 503, body
    message = json.loads(body)["error"]
    assert message.startswith(f"no device answered after 1 attempt(s): mlserver/0/{model}: ")
    assert says in message
