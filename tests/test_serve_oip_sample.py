"""The README's MLServer sample, as a reader runs it: ``samples/mlserver/`` (MLServer's
settings and the iris model's folder, the model trained by ``samples/mlserver/train_iris.py``
in MLServer's own virtualenv) served by a real MLServer 1.7.1 process that loads nothing
itself, and ``samples/mlserver-deployment.json`` in front of it: ``wirekit serve`` loads
``iris`` on it through the repository extension at start, then answers TF Serving's REST
API, OIP REST and OIP gRPC (``iris-grpc``: the same model over MLServer's gRPC port) with
MLServer's answers.

Only the ports differ from the sample's (free ones: the suite runs beside other servers).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import peer_venvs
import pytest
from oip_fixtures import require_peers
from oip_servers import (
    IRIS_CLASSES,
    IRIS_ROWS,
    Server,
    free_ports,
    http_call,
    peer_env,
    spawn,
    train_iris,
)
from serve_support import DispatcherProcess

pytestmark = pytest.mark.skipif(
    os.environ.get("WIREKIT_PURE") == "1",
    reason="a real model server's process: the dispatcher's path to it has no compiled twin,"
    " the pure run has the same code",
)

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, DispatcherProcess]]:
    require_peers("mlserver")
    work = tmp_path_factory.mktemp("mlserver-sample")
    folder = Path(shutil.copytree(SAMPLES / "mlserver", work / "mlserver"))
    python = peer_venvs.ensure_venv(peer_venvs.MLSERVER)
    train_iris(python, folder / "iris" / "model.joblib")
    settings = json.loads((folder / "settings.json").read_text())
    assert settings["load_models_at_startup"] is False  # wirekit serve loads it
    http, grpc, metrics = free_ports(3)
    settings.update(http_port=http, grpc_port=grpc, metrics_port=metrics)
    (folder / "settings.json").write_text(json.dumps(settings))
    proc = spawn(
        [str(python.parent / "mlserver"), "start", str(folder)],
        work / "mlserver.log",
        ns=None,
        env=peer_env(),
        cwd=work,
    )
    server = Server(
        "mlserver-sample", [proc], {"http": http, "grpc": grpc}, [work / "mlserver.log"]
    )
    try:
        server.wait_ready()
        assert not server.model_ready("iris")  # nothing loaded until wirekit asks
        doc = json.loads((SAMPLES / "mlserver-deployment.json").read_text())
        doc["listen"].update(http_port=0, grpc_port=0)
        doc["store"]["path"] = str(work / "requests.db")
        for model in doc["models"].values():
            model["port"] = 0
        (node,) = doc["nodes"]
        node["ports"] = [http, http]
        node["grpc_ports"] = [None, grpc]
        with DispatcherProcess.of(doc, work) as front:
            yield server, front
    finally:
        server.stop()


def _post(front: DispatcherProcess, path: str, doc: Any) -> tuple[int, Any]:
    answer = http_call("127.0.0.1", front.addresses["http"], "POST", path, json.dumps(doc).encode())
    return answer.status, answer.json()


def test_iris_is_loaded_by_wirekit_serve_at_start(sample: tuple[Server, DispatcherProcess]):
    server, front = sample
    assert server.model_ready("iris")
    ready = http_call("127.0.0.1", front.addresses["http"], "GET", "/readyz")
    assert ready.status == 200, ready.body
    assert ready.json()["models"]["iris"]["devices"] == {"mlserver/0": "reachable"}


def test_tf_serving_rows_are_classified(sample: tuple[Server, DispatcherProcess]):
    _server, front = sample
    status, doc = _post(front, "/v1/models/iris:predict", {"instances": IRIS_ROWS})
    assert status == 200, doc
    assert doc == {"predictions": [[c] for c in IRIS_CLASSES]}


@pytest.mark.parametrize("model", ["iris", "iris-grpc"])
def test_oip_answers_are_mlservers(sample: tuple[Server, DispatcherProcess], model: str):
    server, front = sample
    request = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4, 4], "data": IRIS_ROWS}]}
    direct = server.request("POST", "/v2/models/iris/infer", request)
    assert direct.status == 200, direct.body
    status, doc = _post(front, f"/v2/models/{model}/infer", request)
    assert status == 200, doc
    keys = ("name", "datatype", "shape", "data")
    assert [{k: o[k] for k in keys} for o in doc["outputs"]] == [
        {k: o[k] for k in keys} for o in direct.json()["outputs"]
    ]
    assert doc["outputs"][0]["data"] == IRIS_CLASSES
