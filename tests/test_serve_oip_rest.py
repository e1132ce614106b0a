"""Issue 36: the Open Inference Protocol over REST at ``wirekit serve``'s HTTP door.

The real clients from PyPI, unchanged -- ``tritonclient.http`` (JSON and the binary tensor
data extension) and the ``kserve`` client's ``InferenceRESTClient`` (v2) -- against a running
``wirekit serve`` process on loopback whose models are served by MIP echo backends (wirekit's
``wirekit.mip.runtime:echo``, another process): every datatype round-trips bit-exact, the
metadata and readiness answer what the config says.  Then the bad inputs, each a regression
test, sent as raw HTTP: each gets a clear ``{"error": ...}`` with its status and nothing else
(a request refused at the door never reaches a backend: no row in the store).

The server runs the twin of the test run (``WIREKIT_PURE`` is passed on to it).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as triton
from oip_handlers import MODEL_ERROR_MESSAGE
from prometheus_client.parser import text_string_to_metric_families
from serve_support import TIMEOUT, BackendProcess, DispatcherProcess, deployment
from support.ports import free_port
from support.rows import select
from tritonclient.utils import InferenceServerException

#: every OIP datatype
DATATYPES = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "BYTES",
)  # fmt: skip
#: numpy's dtype of each datatype (tritonclient's own choice)
NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16, "BYTES": np.object_,
}  # fmt: skip
#: the HTTP body limit and the MIP message limit of the service (small: the 413 tests)
MAX_BODY = 3 * 1024 * 1024
MAX_MESSAGE = 2 * 1024 * 1024
HEADER = "Inference-Header-Content-Length"

#: the declared tensors of the model ``typed``
TYPED_INPUTS = [
    {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]},
    {"name": "TEXT", "datatype": "BYTES", "shape": [-1]},
]
TYPED_OUTPUTS = [
    {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]},
    {"name": "TEXT", "datatype": "BYTES", "shape": [-1]},
]


@dataclass
class Served:
    """The service under test: its process, HTTP address and store file."""

    process: DispatcherProcess
    store: Path

    @property
    def url(self) -> str:
        """``host:port`` of the HTTP door (as tritonclient takes it)."""
        return f"127.0.0.1:{self.process.addresses['http']}"

    def rows(self, model: str) -> list[tuple[str, str | None]]:
        """``(status, reason)`` of every stored row of ``model``."""
        query = "SELECT status, reason FROM requests WHERE model = ? ORDER BY time_in"
        return select(self.store, query, (model,))


def service_doc(directory: Path, echo: int, failing: int, dead: int) -> dict[str, Any]:
    """The deployment: models on the echo backend (port ``echo``), one on the backend that
    answers the OIP ERROR item (``failing``), one on a port nothing listens on (``dead``)."""
    on_echo = {
        "echo": {},
        "typed": {
            "inputs": TYPED_INPUTS,
            "outputs": TYPED_OUTPUTS,
            "versions": [1, 2],
            "platform": "wirekit-echo",
        },
        "strict": {"inputs": TYPED_INPUTS},
        "rows": {"tensors": "rows"},
        # adaptive batching: requests waiting in one loop pass go out as one MIP batch
        "batched": {"max_batch": 64},
        "batched-rows": {"tensors": "rows", "max_batch": 64},
        "doomed": {},
    }
    models: dict[str, dict[str, Any]] = {name: {**m, "timeout": 10} for name, m in on_echo.items()}
    models["failing"] = {"timeout": 10, "attempts": 1}
    models["dead"] = {"timeout": 1, "attempts": 1}
    ports = {**dict.fromkeys(on_echo, echo), "failing": failing, "dead": dead}
    nodes = [
        {"id": f"n-{name}", "devices": ["CPU"], "models": [name], "quotas": [1], "ports": [port]}
        for name, port in ports.items()
    ]
    return deployment(
        directory / "requests.db",
        models,
        nodes,
        store={"path": str(directory / "requests.db"), "flush_interval": 0.01},
        mip={"max_message_size": MAX_MESSAGE},
        http={"max_body_size": MAX_BODY},
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One ``wirekit serve`` for the module, with its backends (see :func:`service_doc`)."""
    directory = tmp_path_factory.mktemp("oip-rest")
    with (
        BackendProcess("wirekit.mip.runtime:echo") as echo,
        BackendProcess("oip_handlers:model_error") as failing,
    ):
        doc = service_doc(directory, echo.port, failing.port, free_port())
        with DispatcherProcess.of(doc, directory) as process:
            yield Served(process, directory / "requests.db")


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(served.url, network_timeout=TIMEOUT) as c:
        yield c


# ---------------------------------------------------------------------- raw HTTP


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> str:
        doc = self.json()
        assert set(doc) == {"error"}, doc
        return doc["error"]


def call(
    served: Served,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | dict[str, bytes] | None = None,
) -> Answer:
    """One request on its own connection; the answer whatever its status."""
    conn = http.client.HTTPConnection(
        "127.0.0.1", served.process.addresses["http"], timeout=TIMEOUT
    )
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Answer(resp.status, dict(resp.getheaders()), resp.read())
    finally:
        conn.close()


def announce(served: Served, path: str, length: int, headers: dict[str, str]) -> Answer:
    """A POST announcing a body of ``length`` bytes, answered before any of it is sent."""
    conn = http.client.HTTPConnection(
        "127.0.0.1", served.process.addresses["http"], timeout=TIMEOUT
    )
    try:
        conn.putrequest("POST", path)
        for name, value in {**headers, "Content-Length": str(length)}.items():
            conn.putheader(name, value)
        conn.endheaders()
        resp = conn.getresponse()
        return Answer(resp.status, dict(resp.getheaders()), resp.read())
    finally:
        conn.close()


def infer_json(served: Served, model: str, doc: dict[str, Any], suffix: str = "") -> Answer:
    body = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json"}
    return call(served, "POST", f"/v2/models/{model}{suffix}/infer", body, headers)


def binary_body(doc: dict[str, Any], *tensors: bytes) -> tuple[bytes, int]:
    """A binary extension body: ``doc`` as JSON then ``tensors``; and its JSON length."""
    head = json.dumps(doc).encode()
    return head + b"".join(tensors), len(head)


def bytes_tensor(*elements: bytes) -> bytes:
    """BYTES elements in the binary form: each a u32-LE length and its bytes."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def strict_rows_stay(served: Served, answer: Answer) -> None:
    """``answer`` was refused at the door: the request never reached the dispatcher (a
    good request after it is stored; no row of the refused one is)."""
    before = len(served.rows("strict"))
    good = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
            {"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["ok"]},
        ]
    }
    assert infer_json(served, "strict", good).status == 200
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:  # the good request's row, ended (not just arrived)
        after = served.rows("strict")[before:]
        if after and all(status != "queued" for status, _ in after):
            break
        time.sleep(0.02)
    time.sleep(0.1)  # a row of the refused request would have been written before
    assert [status for status, _ in served.rows("strict")[before:]] == ["ok"]


# ---------------------------------------------------------------------- tensors


def sample(datatype: str, binary: bool, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    """A tensor of ``datatype``: any bit pattern where the binary form carries it (NaNs,
    infinities, subnormals), values JSON can hold otherwise."""
    rng = np.random.default_rng(sum(map(ord, datatype)))
    count = int(np.prod(shape))
    if datatype == "BYTES":
        pool = [b"", b"a", "\u00e9t\u00e9 \u2603".encode(), b"x" * 300]
        if binary:
            pool += [b"\x00\xff\xfe", bytes(range(256))]
        values = [pool[i % len(pool)] for i in range(count)]
        return np.array(values, dtype=np.object_).reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(np.bool_)
    dtype = np.dtype(NUMPY[datatype])
    if binary:
        raw = rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8).tobytes()
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        edges = [int(info.min), int(info.max), 0, 1]
        drawn = rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8).tobytes()
        values = np.frombuffer(drawn, dtype=dtype).copy()
        values[:4] = edges[: min(4, count)]
        return values.reshape(shape)
    values = rng.standard_normal(count).astype(dtype)
    values[:1] = -0.0
    return values.reshape(shape)


def same_bytes(got: np.ndarray, sent: np.ndarray) -> None:
    """``got`` is ``sent``, bit for bit (BYTES: element by element, str read as UTF-8)."""
    assert got.shape == sent.shape
    if sent.dtype == np.object_:
        as_bytes = [v.encode() if isinstance(v, str) else bytes(v) for v in got.flatten()]
        assert as_bytes == list(sent.flatten())
        return
    assert got.dtype == sent.dtype
    assert got.tobytes() == sent.tobytes()


# ---------------------------------------------------------------------- tritonclient


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_every_datatype_round_trips_bit_exact(client, binary):
    """One request holding a tensor of every datatype, echoed back: each output is its
    input, bit for bit (BF16 only binary: tritonclient refuses to send it as JSON)."""
    types = [d for d in DATATYPES if binary or d != "BF16"]
    sent = {f"T_{d}": sample(d, binary) for d in types}
    inputs = []
    for (name, array), datatype in zip(sent.items(), types, strict=True):
        tensor = triton.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in sent]
    result = client.infer("echo", inputs, outputs=outputs, request_id=f"every-{binary}")
    response = result.get_response()
    assert response["model_name"] == "echo"
    assert response["id"] == f"every-{binary}"
    assert [o["name"] for o in response["outputs"]] == list(sent)
    for output, datatype in zip(response["outputs"], types, strict=True):
        assert output["datatype"] == datatype
        assert ("binary_data_size" in output.get("parameters", {})) is binary
    for name, array in sent.items():
        same_bytes(result.as_numpy(name), array)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1, 1, 1, 2)], ids=str)
def test_tritonclient_shapes_round_trip(client, shape, binary):
    """A scalar, empty tensors and many dimensions come back with their shape."""
    array = sample("INT32", binary, shape) if shape else np.array(7, dtype=np.int32)
    words = sample("BYTES", binary, shape) if shape else np.array(b"w", dtype=np.object_)
    inputs = [
        triton.InferInput("n", list(shape), "INT32").set_data_from_numpy(array, binary),
        triton.InferInput("w", list(shape), "BYTES").set_data_from_numpy(words, binary),
    ]
    outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in ("n", "w")]
    result = client.infer("echo", inputs, outputs=outputs)
    for output in result.get_response()["outputs"]:
        assert output["shape"] == list(shape)
    same_bytes(result.as_numpy("n"), array)
    same_bytes(result.as_numpy("w"), words)


def test_tritonclient_binary_answer_when_no_output_is_named(client):
    """No ``outputs``: tritonclient asks every output binary (``binary_data_output``)."""
    array = sample("FP32", True, (4, 5))
    tensor = triton.InferInput("x", [4, 5], "FP32").set_data_from_numpy(array)
    result = client.infer("echo", [tensor])
    assert "binary_data_size" in result.get_output("x")["parameters"]
    same_bytes(result.as_numpy("x"), array)


def test_tritonclient_a_large_binary_tensor_round_trips(client):
    """An answer large enough to be written piece by piece (``oiprest.STREAM_FROM``)."""
    array = sample("FP32", True, (384, 1024))  # 1.5 MiB
    tensor = triton.InferInput("big", list(array.shape), "FP32").set_data_from_numpy(array)
    result = client.infer("echo", [tensor], request_id="large")
    assert result.get_response()["id"] == "large"
    same_bytes(result.as_numpy("big"), array)


def test_tritonclient_outputs_asked_for_are_the_ones_answered(client):
    """Of two echoed tensors, only the one named in ``outputs`` comes back, in the form it
    was asked (JSON here while the other input went binary)."""
    a = triton.InferInput("a", [3], "INT32").set_data_from_numpy(np.arange(3, dtype=np.int32))
    b = triton.InferInput("b", [2], "FP64").set_data_from_numpy(np.ones(2))
    result = client.infer(
        "echo", [a, b], outputs=[triton.InferRequestedOutput("b", binary_data=False)]
    )
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == ["b"]
    assert response["outputs"][0]["data"] == [1.0, 1.0]


def test_tritonclient_parameters_and_ids_round_trip(client):
    """Request parameters come back as the echo's response parameters; the same request
    twice (the second a cache hit) answers each with its own id."""
    tensor = triton.InferInput("x", [2], "INT64").set_data_from_numpy(np.array([7, -7]))
    params = {"temperature": 0.5, "tag": "cat", "n": 3, "flag": True}
    first = client.infer("echo", [tensor], request_id="first", parameters=params)
    second = client.infer("echo", [tensor], request_id="second", parameters=params)
    for result, rid in ((first, "first"), (second, "second")):
        response = result.get_response()
        assert response["id"] == rid
        assert {k: response["parameters"][k] for k in params} == params
        same_bytes(result.as_numpy("x"), np.array([7, -7]))


def test_tritonclient_with_a_version_in_the_path(client):
    array = sample("FP32", True, (2, 4))
    tensors = [
        triton.InferInput("INPUT0", [2, 4], "FP32").set_data_from_numpy(array),
        triton.InferInput("TEXT", [1], "BYTES").set_data_from_numpy(
            np.array([b"hi"], dtype=np.object_)
        ),
    ]
    result = client.infer("typed", tensors, model_version="2")
    assert result.get_response()["model_version"] == "2"
    same_bytes(result.as_numpy("INPUT0"), array)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("typed", tensors, model_version="3")
    assert refused.value.status() == "404"
    assert refused.value.message() == "unknown version '3' of model 'typed'"


def test_bytes_that_are_not_utf8_asked_for_as_json_are_a_400(client):
    """JSON cannot carry them: the answer says to ask for the output as binary data."""
    words = np.array([b"ok", b"\xff\xfe"], dtype=np.object_)
    tensor = triton.InferInput("w", [2], "BYTES").set_data_from_numpy(words)
    as_json = [triton.InferRequestedOutput("w", binary_data=False)]
    with pytest.raises(InferenceServerException) as refused:
        client.infer("echo", [tensor], outputs=as_json)
    assert refused.value.status() == "400"
    assert "not UTF-8" in refused.value.message()
    same_bytes(client.infer("echo", [tensor]).as_numpy("w"), words)


def test_rows_model_round_trips_a_batch(client, served):
    """A ``tensors = "rows"`` model: every row is a MIP sample of its own, and the batch
    comes back whole."""
    array = sample("INT16", True, (5, 3))
    tensor = triton.InferInput("x", [5, 3], "INT16").set_data_from_numpy(array)
    same_bytes(client.infer("rows", [tensor]).as_numpy("x"), array)


def test_the_requests_count_on_the_oip_rest_door(client, served):
    tensor = triton.InferInput("x", [1], "INT8").set_data_from_numpy(np.array([3], np.int8))
    client.infer("rows", [tensor])
    text = call(served, "GET", "/metrics").body.decode()
    counted = {
        sample.labels["door"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "wirekit_serve_requests_total" and sample.labels["model"] == "rows"
    }
    assert set(counted) == {"oip-rest"}
    assert counted["oip-rest"] >= 1


def test_tritonclient_metadata_is_the_config(client):
    server = client.get_server_metadata()
    assert server["name"] == "wirekit"
    assert "binary_tensor_data" in server["extensions"]
    typed = client.get_model_metadata("typed")
    assert typed["name"] == "typed"
    assert typed["versions"] == ["1", "2"]
    assert typed["platform"] == "wirekit-echo"
    assert typed["inputs"] == TYPED_INPUTS
    assert typed["outputs"] == TYPED_OUTPUTS
    assert client.get_model_metadata("typed", "2") == typed
    echo = client.get_model_metadata("echo")
    assert (echo["versions"], echo["inputs"], echo["outputs"]) == (["1"], [], [])
    with pytest.raises(InferenceServerException) as refused:
        client.get_model_metadata("nope")
    assert refused.value.status() == "404"


def test_tritonclient_readiness_is_the_readyz_truth(client, served):
    assert client.is_server_live()
    assert client.is_model_ready("echo")
    assert client.is_model_ready("typed", "2")
    assert not client.is_model_ready("dead")  # nothing listens on its port
    assert not client.is_model_ready("typed", "3")
    readyz = call(served, "GET", "/readyz")
    assert client.is_server_ready() is (readyz.status == 200) is False  # "dead" is not
    for model in ("echo", "dead"):
        one = call(served, "GET", f"/readyz?model={model}")
        ready = call(served, "GET", f"/v2/models/{model}/ready")
        assert ready.status == one.status
        assert ready.json()["ready"] is one.json()["ready"]


def test_a_models_error_message_reaches_the_client_intact(client, served):
    """The backend answers the OIP ERROR item: the client reads its message, the store
    records the request as an error with that message."""
    tensor = triton.InferInput("x", [1], "UINT8").set_data_from_numpy(np.array([1], np.uint8))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("failing", [tensor])
    assert refused.value.message() == MODEL_ERROR_MESSAGE
    assert refused.value.status() == "400"
    deadline = time.monotonic() + TIMEOUT
    # its row: first as arrived (queued), then as ended
    while served.rows("failing") in ([], [("queued", None)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert served.rows("failing") == [("error", MODEL_ERROR_MESSAGE)]


def test_an_unreachable_model_is_a_503(client):
    tensor = triton.InferInput("x", [1], "UINT8").set_data_from_numpy(np.array([1], np.uint8))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("dead", [tensor])
    assert refused.value.status() == "503"


# ---------------------------------------------------------------------- kserve


def test_kserve_rest_v2_client(served):
    """``kserve``'s ``InferenceRESTClient`` (v2): liveness, readiness, inference with JSON
    data and with binary data."""
    from httpx import HTTPStatusError
    from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

    base = f"http://{served.url}"

    async def scenario() -> None:
        client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=TIMEOUT))
        try:
            assert await client.is_server_live(base) is True
            assert await client.is_model_ready(base, "echo") is True
            assert await client.is_model_ready(base, "dead") is False
            for binary in (False, True):
                floats = sample("FP32", binary, (2, 2))
                words = np.array([b"un", b"deux"], dtype=np.object_)
                x = InferInput("x", [2, 2], "FP32")
                x.set_data_from_numpy(floats, binary_data=binary)
                w = InferInput("w", [2], "BYTES")
                w.set_data_from_numpy(words, binary_data=binary)
                request = InferRequest("echo", [x, w], request_id=f"k-{binary}")
                response = await client.infer(base, request, model_name="echo")
                assert response.id == f"k-{binary}"
                got = {o.name: o.as_numpy() for o in response.outputs}
                same_bytes(got["x"], floats)
                same_bytes(got["w"], words)
            unknown = InferRequest("nope", [x], request_id="k-nope")
            with pytest.raises(HTTPStatusError, match=r"unknown model 'nope'.*404"):
                await client.infer(base, unknown, model_name="nope")
        finally:
            await client.close()

    asyncio.run(scenario())


# ---------------------------------------------------------------------- bad input


def test_wrong_datatype_is_a_400_naming_the_tensor_never_sent(served):
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]},
            {"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a"]},
        ]
    }
    answer = infer_json(served, "strict", doc)
    assert answer.status == 400
    assert "INPUT0" in answer.error and "INT32" in answer.error
    strict_rows_stay(served, answer)


def test_wrong_shape_is_a_400_naming_the_tensor_never_sent(served):
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [2, 3], "data": [0.0] * 6},
            {"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a"]},
        ]
    }
    answer = infer_json(served, "strict", doc)
    assert answer.status == 400
    assert "INPUT0" in answer.error and "shape" in answer.error
    strict_rows_stay(served, answer)


@pytest.mark.parametrize("lie", ["99999", "-1", "12abc", "", "0x10", "1.5", "\u00b2"])
def test_a_binary_header_length_that_lies_is_a_400(served, lie):
    doc = {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [4],
                       "parameters": {"binary_data_size": 4}}]}  # fmt: skip
    body, _ = binary_body(doc, b"\x01\x02\x03\x04")
    sent = {HEADER: lie.encode()}  # UTF-8: "\u00b2" is a digit, but not an ASCII one
    answer = call(served, "POST", "/v2/models/echo/infer", body, sent)
    assert answer.status == 400, answer.body
    if lie == "99999":
        said = f"{HEADER} is 99999: more than the {len(body)} bytes of the body"
    else:
        said = f"{HEADER} must be a number of bytes (0 or more), got {lie!r}"
    assert answer.error == said


def test_binary_sizes_that_do_not_add_up_are_a_400(served):
    doc = {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [4],
                       "parameters": {"binary_data_size": 8}}]}  # fmt: skip
    body, length = binary_body(doc, b"\x01\x02\x03\x04")
    answer = call(served, "POST", "/v2/models/echo/infer", body, {HEADER: str(length)})
    assert answer.status == 400
    assert answer.error


def test_broken_bytes_framing_is_a_400(served):
    broken = bytes_tensor(b"ok") + struct.pack("<I", 50) + b"short"
    doc = {"inputs": [{"name": "s", "datatype": "BYTES", "shape": [2],
                       "parameters": {"binary_data_size": len(broken)}}]}  # fmt: skip
    body, length = binary_body(doc, broken)
    answer = call(served, "POST", "/v2/models/echo/infer", body, {HEADER: str(length)})
    assert answer.status == 400
    assert "s" in answer.error


def test_json_data_not_matching_the_shape_is_a_400(served):
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3]}]}
    answer = infer_json(served, "echo", doc)
    assert answer.status == 400
    assert "x" in answer.error


def test_a_tensor_over_the_limits_is_a_413(served):
    """A tensor over ``mip.max_message_size`` (the body within ``http.max_body_size``), and
    a body over ``http.max_body_size``: 413 both."""
    big = bytes(MAX_MESSAGE + 1)
    doc = {"inputs": [{"name": "big", "datatype": "UINT8", "shape": [len(big)],
                       "parameters": {"binary_data_size": len(big)}}]}  # fmt: skip
    body, length = binary_body(doc, big)
    answer = call(served, "POST", "/v2/models/echo/infer", body, {HEADER: str(length)})
    assert answer.status == 413
    assert "big" in answer.error and "mip.max_message_size" in answer.error
    answer = announce(served, "/v2/models/echo/infer", MAX_BODY + 1, {HEADER: str(length)})
    assert answer.status == 413
    assert "http.max_body_size" in answer.error


def test_unknown_model_or_version_is_a_404_and_a_removed_model_a_410(served):
    doc = {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], "data": [1]}]}
    answer = infer_json(served, "nope", doc)
    assert (answer.status, answer.error) == (404, "unknown model 'nope'")
    assert answer.headers["Content-Type"] == "application/json"  # no charset: KServe's test
    answer = infer_json(served, "echo", doc, "/versions/2")
    assert (answer.status, answer.error) == (404, "unknown version '2' of model 'echo'")
    answer = infer_json(served, "echo", doc, "/versions/one")
    assert (answer.status, answer.error) == (404, "unknown version 'one' of model 'echo'")
    answer = infer_json(served, "echo", doc, "/versions/%C2%B9")  # a digit, not ASCII
    assert (answer.status, answer.error) == (404, "unknown version '\u00b9' of model 'echo'")
    assert infer_json(served, "echo", doc, "/versions/01").json()["model_version"] == "1"
    assert call(served, "GET", "/v2/models/nope").status == 404
    assert call(served, "GET", "/v2/models/nope/ready").status == 404
    removed = call(served, "DELETE", "/admin/models/doomed", headers=served.process.admin_headers)
    assert removed.status == 200, removed.body
    answer = infer_json(served, "doomed", doc)
    assert (answer.status, answer.error) == (410, "model 'doomed' was removed")
    assert call(served, "GET", "/v2/models/doomed").status == 410


def test_rows_of_unequal_batches_are_a_400(served):
    doc = {
        "inputs": [
            {"name": "a", "datatype": "INT8", "shape": [2], "data": [1, 2]},
            {"name": "b", "datatype": "INT8", "shape": [3], "data": [1, 2, 3]},
        ]
    }
    answer = infer_json(served, "rows", doc)
    assert answer.status == 400
    assert '"b"' in answer.error and "rows" in answer.error


def test_other_v2_paths_are_a_readable_404(client, served):
    """Triton's extensions this server does not implement answer a JSON 404."""
    with pytest.raises(InferenceServerException) as refused:
        client.get_model_config("echo")
    assert refused.value.status() == "404"
    assert "not an endpoint this server serves" in refused.value.message()
    assert call(served, "GET", "/v2/health/live").json() == {"live": True}


def test_a_body_that_is_not_an_oip_request_is_a_400(served):
    for body in (b"not json", b"[1, 2]", b'{"inputs": 3}', b"{}"):
        answer = call(served, "POST", "/v2/models/echo/infer", body)
        assert answer.status == 400, body
        assert answer.error


def _batches_sent(served: Served, model: str) -> float:
    """``wirekit_serve_batches_total`` of ``model`` (every device), from ``/metrics``."""
    text = call(served, "GET", "/metrics").body.decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "wirekit_serve_batches_total" and sample.labels["model"] == model
    )


@pytest.mark.parametrize("model", ["batched", "batched-rows"])
def test_joined_batches_give_each_request_its_own_whole_tensors(served, model):
    """Adaptive batching joins concurrent OIP requests into one MIP batch (``sample``: one
    MIP sample a request; ``rows``: one a row, so a request of 3 rows is 3 samples of the
    batch) and splits the reply back: every request gets exactly its own tensors -- its
    rows, its shape, its bytes -- never a neighbour's.  Rounds of 24 concurrent requests of
    1-4 rows each until the service has sent at least one joined batch."""

    def one(k: int) -> tuple[int, Answer]:
        rows = 1 + k % 4
        data = np.arange(rows * 3, dtype=np.float32) + 1000 * k
        doc = {
            "id": f"r{k}",
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [rows, 3], "data": data.tolist()}
            ],
        }
        return k, infer_json(served, model, doc)

    from concurrent.futures import ThreadPoolExecutor

    for round_ in range(10):
        with ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(one, range(24 * round_, 24 * (round_ + 1))))
        for k, answer in answers:
            assert answer.status == 200, answer.body
            doc = answer.json()
            rows = 1 + k % 4
            assert doc["id"] == f"r{k}"
            (out,) = doc["outputs"]
            assert out["shape"] == [rows, 3]
            assert out["data"] == (np.arange(rows * 3, dtype=np.float32) + 1000 * k).tolist()
        if _batches_sent(served, model) >= 1:
            break
    assert _batches_sent(served, model) >= 1, "no joined batch in 10 rounds of 24 requests"
