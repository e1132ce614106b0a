"""OIP over REST (wirekit.oip.rest, wirekit.oip.tensors): JSON and binary bodies, every
datatype, checked against tritonclient's own codec, and every bad body a DecodeError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oip_strategies import requests, tensors

from wirekit import oip
from wirekit.errors import DecodeError, EncodeError
from wirekit.oip import spec

ROOT = Path(__file__).resolve().parent.parent


def test_tritonclient_bodies_both_ways():
    """tritonclient.http builds requests (JSON and binary, every datatype) that decode to
    the exact bytes, and reads back the responses wirekit encodes (in a subprocess: gevent
    stays out of pytest)."""
    pytest.importorskip("tritonclient.http")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "oip_tritonclient_peer.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    checked = json.loads(done.stdout.splitlines()[-1])["checked"]
    assert len(checked) == 13 * 4 + 1  # BF16: binary only


def _decode_error(body: bytes, length: int | None = None) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        oip.decode_rest_request(body, length)
    return info.value


def _binary(head: dict, tail: bytes, extra: int = 0) -> tuple[bytes, int]:
    text = json.dumps(head).encode()
    return text + tail, len(text) + extra


def test_nested_and_flat_json_data_are_the_same_tensor():
    flat = oip.tensor_from_json("x", "INT32", [2, 2], [1, 2, 3, 4])
    nested = oip.tensor_from_json("x", "INT32", [2, 2], [[1, 2], [3, 4]])
    assert flat == nested
    assert oip.tensor_to_json_data(flat) == [1, 2, 3, 4]


def test_huge_shape_with_8_bytes_is_an_error_before_allocating():
    body, length = _binary(
        {
            "inputs": [
                {
                    "name": "big",
                    "datatype": "FP64",
                    "shape": [10**6, 10**6],
                    "parameters": {"binary_data_size": 8},
                }
            ]
        },
        b"\0" * 8,
    )
    err = _decode_error(body, length)
    assert err.field == "inputs[0].data" and err.offset == length
    assert 'tensor "big"' in str(err) and "needs 8000000000000" in str(err)
    bytes_body, bytes_length = _binary(
        {
            "inputs": [
                {
                    "name": "s",
                    "datatype": "BYTES",
                    "shape": [10**12],
                    "parameters": {"binary_data_size": 8},
                }
            ]
        },
        b"\x01\0\0\0a\0\0\0",
    )
    err = _decode_error(bytes_body, bytes_length)
    assert "BYTES element 1 of 1000000000000" in str(err)
    json_err = _decode_error(
        b'{"inputs":[{"name":"j","datatype":"FP32","shape":[1000000000000],"data":[1.0]}]}'
    )
    assert "1 elements of data, shape [1000000000000] needs 1000000000000" in str(json_err)


@pytest.mark.parametrize(
    ("extra", "tail", "expected"),
    [
        (30, b"\0" * 8, "is not within the body"),
        (0, b"\0" * 4, "binary_data_size 8 exceeds the 4 bytes left"),
        (0, b"\0" * 12, "4 bytes after the last binary tensor"),
        (-1, b"\0" * 8, "not a JSON document"),
    ],
)
def test_lying_header_length(extra, tail, expected):
    body, length = _binary(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [2],
                    "parameters": {"binary_data_size": 8},
                }
            ]
        },
        tail,
        extra,
    )
    assert expected in str(_decode_error(body, length))


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"datatype": "FP8", "shape": [1], "data": [1]}, "unknown datatype 'FP8'"),
        ({"datatype": "FP32", "shape": [-1], "data": [1]}, "negative dimension -1"),
        ({"datatype": "FP32", "shape": [2], "data": [1]}, "1 elements of data"),
        ({"datatype": "INT8", "shape": [1], "data": [128]}, "128 is out of range for INT8"),
        ({"datatype": "UINT8", "shape": [1], "data": [-1]}, "-1 is out of range for UINT8"),
        ({"datatype": "INT64", "shape": [1], "data": [1.5]}, "INT64 data must be integers"),
        ({"datatype": "UINT64", "shape": [2], "data": [2**64, 1]}, "is out of range"),
        ({"datatype": "BOOL", "shape": [1], "data": [1]}, "BOOL data must be true/false"),
        ({"datatype": "FP32", "shape": [1], "data": ["1"]}, "FP32 data must be numbers"),
        ({"datatype": "BYTES", "shape": [1], "data": [1]}, "BYTES data must be strings"),
        ({"datatype": "FP32", "shape": [2], "data": [[1], [2, 3]]}, "not a list of numbers"),
        ({"datatype": "FP32", "shape": [1]}, "no data and no binary_data_size"),
        ({"datatype": "FP32", "shape": "1", "data": [1]}, "shape must be a list of integers"),
    ],
)
def test_bad_json_tensor_names_it(entry, expected):
    body = json.dumps({"inputs": [{"name": "t0", **entry}]}).encode()
    err = _decode_error(body)
    assert expected in str(err)
    assert err.field.startswith("inputs[0]")
    assert 'tensor "t0"' in str(err) or err.field == "inputs[0].data"


def test_not_a_request():
    assert "not a JSON document" in str(_decode_error(b"{"))
    assert "must be an object" in str(_decode_error(b"[]"))
    assert "must be a list of tensors" in str(_decode_error(b"{}"))
    assert _decode_error(b'{"inputs":[],"id":5}').field == "id"
    assert _decode_error(b'{"inputs":[],"outputs":[{}]}').field == "outputs[0].name"


def test_header_length_as_the_header_text():
    req = oip.InferRequest([oip.Tensor("a", "INT8", (2,), b"\x01\x02")])
    body, length = oip.encode_rest_request(req, binary=True)
    assert oip.decode_rest_request(body, f" {length}") == oip.decode_rest_request(body, length)
    for bad in ("", "-1", "12a", "1e3", "\u0661"):
        assert "is not a byte count" in str(_decode_error(body, bad))


def test_binary_data_without_header_is_an_error():
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [1],
                    "parameters": {"binary_data_size": 4},
                }
            ]
        }
    ).encode()
    assert "without an Inference-Header-Content-Length" in str(_decode_error(body))


def test_binary_tensors_are_views_into_the_body():
    req = oip.InferRequest(
        [
            oip.Tensor("a", "FP32", (2,), b"\0\0\x80?\0\0\0@"),
            oip.Tensor("s", "BYTES", (1,), b"\x02\0\0\0hi", {"content_type": "str"}),
        ],
        id="9",
        parameters={"binary_data_output": True},
    )
    body, length = oip.encode_rest_request(req, binary=True)
    back = oip.decode_rest_request(body, length)
    assert all(isinstance(t.data, memoryview) and t.data.obj is body for t in back.inputs)
    assert back == req
    assert oip.binary_outputs(back)("anything") is True


def test_binary_outputs_rule():
    req = oip.InferRequest(
        [],
        outputs=[oip.RequestedOutput("a", {"binary_data": True}), oip.RequestedOutput("b")],
    )
    chosen = oip.binary_outputs(req)
    assert (chosen("a"), chosen("b"), chosen("c")) == (True, False, False)


def test_response_pieces_are_the_tensors_own_buffers():
    data = bytearray(b"\0" * 16)
    resp = oip.InferResponse("m", [oip.Tensor("y", "INT32", (4,), data)], "1", "r")
    pieces, length = oip.encode_rest_response(resp, binary=True)
    assert isinstance(pieces, list) and pieces[1] is data
    assert len(pieces[0]) == length
    back = oip.decode_rest_response(b"".join(pieces), length)
    assert back == resp
    text, none = oip.encode_rest_response(resp)
    assert none is None and json.loads(text)["outputs"][0]["data"] == [0, 0, 0, 0]


def test_bytes_not_utf8_cannot_be_json():
    t = oip.Tensor("b", "BYTES", (1,), b"\x01\0\0\0\xff")
    with pytest.raises(EncodeError, match="not UTF-8"):
        oip.tensor_to_json_data(t)


def test_bf16_and_fp16_json_round_to_nearest():
    t = oip.tensor_from_json("h", "BF16", [3], [1.0, 1.00390625, float("inf")])
    assert bytes(t.data) == b"\x80\x3f\x80\x3f\x80\x7f"  # 1.00390625 is a tie: to even
    assert oip.tensor_to_json_data(t) == [1.0, 1.0, float("inf")]
    f = oip.tensor_from_json("f", "FP16", [1], [0.1])
    assert oip.tensor_to_json_data(f) == [0.0999755859375]


def test_check_tensor():
    oip.check_tensor(oip.Tensor("s", "BYTES", (2,), b"\0\0\0\0\x01\0\0\0x"))
    with pytest.raises(DecodeError, match="1 bytes after the last of 2 BYTES elements"):
        oip.check_tensor(oip.Tensor("s", "BYTES", (2,), b"\0\0\0\0\x01\0\0\0xy"))
    with pytest.raises(DecodeError, match="unknown datatype"):
        oip.check_tensor(oip.Tensor("s", "STRING", (1,), b""))


# --- properties -------------------------------------------------------------------------------


@settings(max_examples=200)
@given(tensors(json_safe=True))
def test_json_data_round_trip_every_datatype(t):
    data = json.loads(json.dumps(oip.tensor_to_json_data(t)))
    back = oip.tensor_from_json(t.name, t.datatype, list(t.shape), data, t.parameters)
    assert back == t


@settings(max_examples=100)
@given(requests(json_safe=True), st.booleans())
def test_rest_request_round_trip(req, binary):
    body, length = oip.encode_rest_request(req, binary=binary)
    back = oip.decode_rest_request(body, length)
    assert (back.inputs, back.id, back.outputs, back.parameters) == (
        req.inputs,
        req.id,
        req.outputs,
        req.parameters,
    )
    if binary:
        sizes = [memoryview(t.data).nbytes for t in req.inputs]
        framed = spec.BINARY_BODY.parse(body, header_length=length, sizes=sizes)
        assert list(framed.tensors) == [bytes(t.data) for t in req.inputs]


def test_nan_and_infinities_travel_as_tritonclient_writes_them():
    """specs/oip.md, "Where the clients ... differ": the literals NaN, Infinity and
    -Infinity (what tritonclient's python-rapidjson writes and reads) are read as those
    floats and written back as those literals; a null in ``data`` is not a number: refused,
    naming the tensor."""
    body = (
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[3],"data":[NaN,Infinity,-Infinity]}]}'
    )
    (x,) = oip.decode_rest_request(body).inputs
    values = np.frombuffer(bytes(x.data), "<f4")
    assert np.isnan(values[0]) and values[1] == np.inf and values[2] == -np.inf
    answer, _ = oip.encode_rest_response(oip.InferResponse("m", [x]))
    assert b'"data":[NaN,Infinity,-Infinity]' in bytes(answer)
    with pytest.raises(DecodeError, match='tensor "x": FP32 data must be numbers'):
        oip.decode_rest_request(
            b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[1,null]}]}'
        )
