"""The golden vectors of specs/vectors/oip/: each .bin is what its .json describes, built and
read by both twins (and, for the mapping's items, by the construct spec)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from twins import IMPLEMENTATIONS, load_codec

from wirekit import mip, oip
from wirekit.errors import DecodeError
from wirekit.oip import spec

VECTORS = Path(__file__).resolve().parent.parent / "specs" / "vectors" / "oip"
GOLDEN = sorted(VECTORS.glob("*.bin"))


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def oip_twin(request):
    return load_codec("oip", request.param)


def _request(document: dict) -> oip.InferRequest:
    return oip.decode_rest_request(json.dumps(document).encode())


def _tensors(entries: list[dict]) -> list[oip.Tensor]:
    return [
        oip.tensor_from_json(e["name"], e["datatype"], e["shape"], e["data"], e.get("parameters"))
        for e in entries
    ]


def test_golden_vectors_exist():
    assert len(GOLDEN) >= 12
    assert {json.loads(p.with_suffix(".json").read_text())["kind"] for p in GOLDEN} == {
        "request",
        "echo",
        "reply",
        "error",
        "rest",
    }


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_vector(oip_twin, path):
    data = path.read_bytes()
    meta = json.loads(path.with_suffix(".json").read_text())
    rows = meta.get("rule") == "rows"
    kind = meta["kind"]
    if "error" in meta:
        err = meta["error"]
        with pytest.raises(DecodeError) as info:
            if kind == "rest":
                oip.decode_rest_request(data, meta["header_length"])
            else:
                oip_twin.response_from_mip(mip.decode(data), rows=rows)
        assert (info.value.field, info.value.offset, info.value.reason) == (
            err["field"],
            err["offset"],
            err["message"],
        )
        return
    if kind == "request":
        req = _request(meta["request"])
        assert oip_twin.request_to_mip(req, rows=rows) == data == spec.request_wire(req, rows)
        back = oip.mip_to_request(mip.decode(data), rows=rows)
        assert (back.inputs, back.parameters, back.outputs) == (
            req.inputs,
            req.parameters,
            req.outputs,
        )
    elif kind == "echo":
        req = _request(meta["request"])
        assert oip_twin.response_from_mip(mip.decode(data), rows=rows) == (
            req.inputs,
            req.parameters,
        )
    elif kind == "reply":
        outputs = _tensors(meta["outputs"])
        reply = oip.reply_to_mip(outputs, meta["parameters"], rows=rows, n_input=meta["n_input"])
        assert mip.encode(reply) == data
        assert oip_twin.response_from_mip(mip.decode(data), rows=rows) == (
            outputs,
            meta["parameters"],
        )
    elif kind == "error":
        assert mip.encode(oip.error_to_mip(meta["message"])) == data
        with pytest.raises(oip.BackendError) as info:
            oip_twin.response_from_mip(mip.decode(data))
        assert info.value.message == meta["message"]
    else:  # rest: the binary extension's framing
        req = oip.decode_rest_request(data, meta["header_length"])
        expected = _request(meta["request"])
        assert (req.inputs, req.parameters) == (expected.inputs, expected.parameters)
        assert oip.encode_rest_request(expected, binary=True) == (data, meta["header_length"])
        sizes = [memoryview(t.data).nbytes for t in req.inputs]
        framed = spec.BINARY_BODY.parse(data, header_length=meta["header_length"], sizes=sizes)
        assert [bytes(t.data) for t in req.inputs] == list(framed.tensors)
