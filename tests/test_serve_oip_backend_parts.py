"""The pieces of the ``oip``/``tfserving`` backends (:mod:`wirekit.serve.backends.oip`):
the status table, the error message read from a body, TF Serving's bodies both ways, the
refusal of plain MIP items; and, in the test's own process, the dispatcher's general path
with them -- the MIP lane never takes them, a server that does not answer within the
model's timeout is resubmitted to the other device and backed off, the answer cached."""

from __future__ import annotations

import asyncio
import json
import struct

import pytest
from serve_support import run
from support.service import running_service, start_backend

from wirekit import mip, oip
from wirekit.serve.backends.oip import (
    ModelError,
    OipGrpcBackend,
    OipRestBackend,
    TfServingBackend,
    error_message,
    predict_body,
    predict_outputs,
    status_outcome,
)
from wirekit.serve.backends.remote import BackendUnavailable, BadRequest
from wirekit.serve.backends.servers import ServerAddress
from wirekit.serve.config import ModelConfig
from wirekit.serve.dispatch.payload import Payload
from wirekit.serve.doors.tfserving import BadBody, infer_datatype


@pytest.mark.parametrize("status", [400, 401, 403, 409, 413, 415, 422, 499])
def test_a_4xx_is_the_model_s_error(status: int):
    outcome = status_outcome(status, "bad input", "http://h:1/x")
    assert isinstance(outcome, ModelError) and outcome.message == "bad input"


@pytest.mark.parametrize("status", [404, 408, 429, 500, 502, 503, 504, 301])
def test_the_rest_is_the_server_s(status: int):
    outcome = status_outcome(status, "gone", "http://h:1/x")
    assert isinstance(outcome, BackendUnavailable)
    assert str(outcome) == f"http://h:1/x: HTTP {status}: gone"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": "x \\u00e9 y"}', "x é y"),
        (b'{"error": 3}', '{"error": 3}'),
        (b"  Internal Server Error \n", "Internal Server Error"),
        (b"", "(no message)"),
        (b"\xff" * 600, "\ufffd" * 500),
    ],
)
def test_error_message(body: bytes, message: str):
    assert error_message(body) == message


def _floats(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def test_a_tf_serving_body_in_row_format():
    req = oip.InferRequest(
        [oip.Tensor("x", "FP32", (2, 2), _floats(1, 2, 3, 4))],
        parameters={"signature_name": "s"},
    )
    form, body = predict_body(req)
    assert form == "instances"
    assert json.loads(body) == {"signature_name": "s", "instances": [[1.0, 2.0], [3.0, 4.0]]}
    text = b"".join(struct.pack("<I", len(s)) + s for s in (b"a", b"b"))
    two = oip.InferRequest([*req.inputs, oip.Tensor("t", "BYTES", (2,), text)])
    assert json.loads(predict_body(two)[1]) == {
        "instances": [{"x": [1.0, 2.0], "t": "a"}, {"x": [3.0, 4.0], "t": "b"}]
    }


def test_a_tf_serving_body_in_columnar_format():
    req = oip.InferRequest(
        [
            oip.Tensor("x", "FP32", (2,), _floats(1, 2)),
            oip.Tensor("y", "INT64", (3,), struct.pack("<3q", 1, 2, 3)),
        ]
    )
    assert predict_body(req) == ("inputs", b'{"inputs":{"x":[1.0,2.0],"y":[1,2,3]}}')
    scalar = oip.InferRequest([oip.Tensor("x", "INT64", (), struct.pack("<q", 5))])
    assert predict_body(scalar) == ("inputs", b'{"inputs":5}')


def test_tf_serving_answers_become_tensors():
    (out,) = predict_outputs(b'{"predictions": [[1, 2], [3, 4]]}', "instances")
    assert (out.name, out.datatype, out.shape) == ("predictions", "INT64", (2, 2))
    assert bytes(out.data) == struct.pack("<4q", 1, 2, 3, 4)
    declared = (oip.metadata.TensorSpec("y", "FP32", (-1, 2)),)
    (out,) = predict_outputs(b'{"predictions": [[1, 2], [3, 4]]}', "instances", declared)
    assert (out.name, out.datatype, bytes(out.data)) == ("y", "FP32", _floats(1, 2, 3, 4))
    rows = b'{"predictions": [{"a": 1.5, "b": "x"}, {"a": 2, "b": "y"}]}'
    a, b = predict_outputs(rows, "instances")
    assert (a.name, a.datatype, a.shape, b.name, b.datatype) == ("a", "FP64", (2,), "b", "BYTES")
    (out,) = predict_outputs(b'{"outputs": [true, false]}', "inputs")
    assert (out.name, out.datatype, bytes(out.data)) == ("outputs", "BOOL", b"\x01\x00")
    a, b = predict_outputs(b'{"outputs": {"a": 1, "b": [{"b64": "AAE="}]}}', "inputs")
    assert (a.shape, b.datatype, bytes(b.data)) == ((), "BYTES", b"\x02\x00\x00\x00\x00\x01")


@pytest.mark.parametrize(
    "body", [b"not json", b'{"outputs": []}', b'{"predictions": [[1], "x"]}', b"[]"]
)
def test_what_is_not_a_tf_serving_answer(body: bytes):
    with pytest.raises(ValueError):
        predict_outputs(body, "instances")


def test_infer_datatype():
    assert infer_datatype([True, False], "x") == "BOOL"
    assert infer_datatype([1, 2], "x") == "INT64"
    assert infer_datatype([1, 2.5], "x") == "FP64"
    assert infer_datatype(["a", "b"], "x") == "BYTES"
    assert infer_datatype([], "x") == "FP64"
    with pytest.raises(BadBody, match="x: mixes BYTES and INT64 values"):
        infer_datatype([1, "a"], "x")


ADDRESS = ServerAddress("oip", "127.0.0.1", 9, 9, "m")


@pytest.mark.parametrize("kind", [OipRestBackend, OipGrpcBackend, TfServingBackend])
def test_plain_mip_items_are_refused(kind):
    model = ModelConfig(name="m", backend="oip")
    extra = {} if kind is OipGrpcBackend else {"connections": 1}
    backend = kind(ADDRESS, model, timeout=1, **extra)
    request = Payload(None, mip.Inference.request([[mip.Item.text("hi")]]))
    with pytest.raises(BadRequest) as info:
        run(backend.infer(request))
    assert str(info.value) == (
        "model 'm' is served by oip backends, which take OIP tensors: items[0]: item type"
        " 0x1 is not one of an OIP request"
    )
    assert backend.in_flight == 0 and not backend.batchable
    assert not hasattr(backend, "lane_client") and not hasattr(backend, "send_nowait")


# ------------------------------------------------------------- in the dispatcher, in process


def _doc(models: dict, nodes: list) -> dict:
    return {
        "listen": {"host": "127.0.0.1", "http_port": 0},
        "store": {"path": ":memory:"},
        "models": models,
        "nodes": nodes,
    }


async def _silent_server(held: list) -> tuple[asyncio.Server, int]:
    """A server that takes connections (kept in ``held``) and never answers."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _timeout_resubmitted(tmp_path) -> None:
    echo = {"echo": {"port": 0}}
    server_doc = _doc(
        echo,
        [{"id": "n", "devices": ["CPU"], "models": ["echo"], "quotas": [1], "ports": [1]}],
    )
    server_doc["store"] = {"path": str(tmp_path / "server.db")}
    mip_echo, port = await start_backend(mip.runtime.echo)
    server_doc["nodes"][0]["ports"] = [port]
    held: list[asyncio.StreamWriter] = []
    silent, silent_port = await _silent_server(held)
    try:
        async with running_service(server_doc, backends=[mip_echo]) as server:
            http = server.addresses()["http"]
            front_doc = _doc(
                {"m": {"backend": "oip", "server_model": "echo", "timeout": 0.5, "port": 0}},
                [
                    {
                        "id": "f",
                        "devices": ["CPU", "CPU"],
                        "models": ["m"],
                        "quotas": [0.5, 0.5],
                        "ports": [silent_port, http],
                    }
                ],
            )
            front_doc["store"] = {"path": str(tmp_path / "front.db")}
            async with running_service(front_doc) as front:
                d = front.dispatcher
                assert d.lane_route("m") is None
                # device 0 is drawn half the time: until it is, each request a new value
                for k in range(40):
                    req = oip.InferRequest([oip.Tensor("x", "FP32", (1,), _floats(k))])
                    outcome = await d.submit("m", Payload(oip.request_to_mip(req)), "t")
                    assert outcome.ok and outcome.device == "f/1/m", outcome.detail
                    outputs, _ = oip.response_from_mip(outcome.response.message)
                    assert bytes(outputs[0].data) == _floats(k)
                    if outcome.attempts == 2:
                        break
                assert outcome.attempts == 2 and d.resubmissions == 1
                again = await d.submit("m", Payload(oip.request_to_mip(req)), "t")
                assert again.ok and again.device == "cache"
    finally:
        silent.close()
        for writer in held:
            writer.close()
        await silent.wait_closed()


def test_a_server_that_does_not_answer_in_time_is_resubmitted(tmp_path):
    run(_timeout_resubmitted(tmp_path))


@pytest.mark.parametrize("kind", ["oip", "tfserving"])
def test_with_backends_does_not_start_model_servers(kind: str):
    from wirekit.serve.backends.local import plan
    from wirekit.serve.config import ConfigError, parse_config

    doc = _doc(
        {"m": {"backend": kind}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [9000]}],
    )
    with pytest.raises(ConfigError) as info:
        plan(parse_config(doc))
    assert str(info.value) == (
        f"n/0/m: --with-backends starts MIP backends; a {kind} device is a model server of"
        " your own (MLServer, KServe, TF Serving), started apart"
    )


def test_k8s_does_not_make_model_servers():
    from wirekit.serve.config import ConfigError
    from wirekit.serve.control.k8s import manifests

    doc = _doc(
        {"m": {"backend": "oip", "port": None}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [9000]}],
    )
    doc["listen"]["http_port"] = 8080
    doc["store"] = {"path": "/data/requests.db"}
    with pytest.raises(ConfigError) as info:
        manifests(doc)
    assert str(info.value) == (
        "models.m: the oip backend is a model server of your own (MLServer, KServe, TF"
        " Serving): wirekit serve k8s makes MIP and Clipper backends only"
    )


def test_rows_answered_must_be_rows_asked():
    """With the ``rows`` rule, an answer of another number of rows is not an answer."""
    from wirekit.serve.backends.oip import ServerBackend

    class ThreeRows(ServerBackend):
        where = "test"

        async def call(self, req):
            return [oip.Tensor("y", "FP32", (3,), _floats(1, 2, 3))], {}

    model = ModelConfig(name="m", backend="oip", tensors="rows")
    backend = ThreeRows(ADDRESS, model, timeout=1)
    req = oip.InferRequest([oip.Tensor("x", "FP32", (2,), _floats(1, 2))])
    with pytest.raises(BackendUnavailable) as info:
        run(backend.infer(Payload(oip.request_to_mip(req, rows=True))))
    assert str(info.value) == "test: 3 rows answered for 2 asked (tensors: rows)"
