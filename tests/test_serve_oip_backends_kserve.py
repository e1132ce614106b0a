"""Issue 37: a real KServe 0.21.0 ``ModelServer`` (tests/oip_servers.py: its own pinned
virtualenv, from PyPI) behind a real ``wirekit serve`` -- backend kinds ``tfserving`` (its
TF Serving REST API, KServe's v1 protocol) and ``oip`` (REST with the binary data
extension, and gRPC).

KServe binds 0.0.0.0 whatever it is told, so it runs inside a network namespace of the
test's own with only loopback up, and ``wirekit serve`` runs in that namespace too; the test
talks to both from a thread that entered it.  Through wirekit's doors the answers equal
KServe's own to the same request (the iris model trained at test time, the echo model).
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from oip_fixtures import kserve  # noqa: F401  (a module-scoped fixture)
from oip_servers import IRIS_CLASSES, IRIS_ROWS, Namespace, Server, http_call
from serve_support import _is_ready, deployment
from support.process import ServerProcess

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("WIREKIT_PURE") == "1",
        reason="a real model server's process: the dispatcher's path to it has no compiled"
        " twin, the pure run has the same code",
    ),
]

HEADER = "Inference-Header-Content-Length"


def front_doc(directory: Path, http: int, grpc: int) -> dict[str, Any]:
    """wirekit in front of KServe: ``iris-tf`` through its TF Serving REST API, ``iris``
    and ``echo`` through OIP REST, ``iris-grpc`` through OIP gRPC."""
    models = {
        "iris-tf": {"backend": "tfserving", "server_model": "iris"},
        "iris": {"backend": "oip"},
        "echo": {"backend": "oip"},
        "iris-grpc": {"backend": "oip", "grpc": True, "server_model": "iris"},
    }
    models = {name: {"timeout": 30, "attempts": 1, **m} for name, m in models.items()}
    node = {
        "id": "kserve",
        "devices": ["CPU"],
        "models": list(models),
        "quotas": [0.25] * 4,
        "ports": [http, http, http, grpc],
    }
    return deployment(directory / "front.db", models, [node], cache={"max_entries": 0})


class Pair:
    """KServe, and the ``wirekit serve`` in front of it, both in ``ns``."""

    def __init__(self, ns: Namespace, server: Any, front: ServerProcess) -> None:
        self.ns = ns
        self.kserve = server
        self.front = front
        self.front_http = json.loads(front.first_line)["http"]

    def direct(self, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
        return self.kserve.request("POST", path, body, headers)

    def through(self, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
        args = ("127.0.0.1", self.front_http, "POST", path, body, headers, 60.0)
        return self.ns.run(http_call, *args, timeout=70)


@pytest.fixture(scope="module")
def pair(kserve: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:  # noqa: F811
    """``wirekit serve`` inside KServe's namespace, in front of it."""
    directory = tmp_path_factory.mktemp("kserve-backend")
    assert kserve.ns is not None
    config = directory / "front.json"
    config.write_text(json.dumps(front_doc(directory, kserve.ports["http"], kserve.ports["grpc"])))
    argv = [sys.executable, "-m", "wirekit.cli", "serve", "--config", str(config)]
    with ServerProcess(kserve.ns.command(argv), ready=_is_ready) as front:
        yield Pair(kserve.ns, kserve, front)


def test_tf_serving_rest_to_kserve_s_v1(pair: Pair):
    body = {"instances": IRIS_ROWS}
    direct = pair.direct("/v1/models/iris:predict", body)
    through = pair.through("/v1/models/iris-tf:predict", body)
    assert (direct.status, through.status) == (200, 200), through.body
    assert through.json() == direct.json() == {"predictions": IRIS_CLASSES}


IRIS = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [4, 4], "data": IRIS_ROWS}]}


@pytest.mark.parametrize("model", ["iris", "iris-grpc"])
def test_oip_rest_to_kserve(pair: Pair, model: str):
    direct = pair.direct("/v2/models/iris/infer", IRIS)
    through = pair.through(f"/v2/models/{model}/infer", IRIS)
    assert (direct.status, through.status) == (200, 200), through.body
    keys = ("name", "datatype", "shape", "data")
    outputs = [{k: o[k] for k in keys} for o in through.json()["outputs"]]
    assert outputs == [{k: o[k] for k in keys} for o in direct.json()["outputs"]]
    assert outputs[0]["data"] == IRIS_CLASSES


@pytest.mark.parametrize("model", ["iris-tf", "iris", "iris-grpc"])
def test_every_backend_kind_through_the_tf_serving_door(pair: Pair, model: str):
    through = pair.through(f"/v1/models/{model}:predict", {"instances": IRIS_ROWS})
    assert through.status == 200, through.body
    assert through.json() == {"predictions": IRIS_CLASSES}


def test_echo_in_binary_to_kserve(pair: Pair):
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
    direct = pair.direct("/v2/models/echo/infer", head + floats, headers)
    through = pair.through("/v2/models/echo/infer", head + floats, headers)
    assert (direct.status, through.status) == (200, 200), through.body
    size = int(through.headers[HEADER.lower()])
    assert through.body[size:] == floats == direct.body[int(direct.headers[HEADER.lower()]) :]
