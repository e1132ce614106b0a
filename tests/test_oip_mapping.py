"""The OIP <-> MIP mapping: both twins equal the construct spec, round trips are lossless in
both rules ("sample", "rows"), echo answers a request back, and bad input is a DecodeError
with the same text from either twin."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oip_strategies import replies, requests, tensors
from twins import IMPLEMENTATIONS, load_codec

from wirekit import mip, oip
from wirekit.errors import DecodeError
from wirekit.mip.runtime import echo
from wirekit.oip import items, spec


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def oip_twin(request):
    """The ``fast`` (wirekit._fast.oip) or ``pure`` (wirekit.oip._pure) twin."""
    return load_codec("oip", request.param)


def _outcome(call, *args, **kwargs):
    """("ok", result) or (the error's class, its text and field)."""
    try:
        return ("ok", call(*args, **kwargs))
    except (DecodeError, oip.BackendError) as exc:
        return (type(exc).__name__, str(exc), getattr(exc, "field", None))


def _echo(wire: bytes) -> mip.Inference:
    """What wirekit's default echo handler answers to a request wire, through the wire."""
    request = mip.decode(wire)
    reply = mip.Inference.reply(echo(list(request.samples)), request.n_input)
    return mip.decode(mip.encode(reply))


# --- the twins equal the construct spec -----------------------------------------------------


@settings(max_examples=100)
@given(st.booleans(), st.data())
def test_request_to_mip_equals_construct_spec(oip_twin, rows, data):
    req = data.draw(requests(rows=rows))
    wire = oip_twin.request_to_mip(req, rows=rows)
    assert wire == spec.request_wire(req, rows)
    assert mip.decode(wire) == mip.decode(spec.request_wire(req, rows))


@settings(max_examples=100)
@given(tensors())
def test_tensor_item_equals_construct_spec(t):
    head = items.tensor_head(t, "t")
    assert head + bytes(t.data) == spec.tensor_item(t)
    assert items.read_tensor_item(spec.tensor_item(t), "t") == spec.parse_tensor_item(
        spec.tensor_item(t)
    )


@settings(max_examples=100)
@given(st.booleans(), st.data())
def test_reply_to_mip_equals_construct_spec(rows, data):
    outputs, parameters = data.draw(replies(rows=rows))
    reply = oip.reply_to_mip(outputs, parameters, rows=rows, n_input=3)
    per_sample = items.split_rows(outputs, "outputs")[1] if rows else [outputs]
    expected = [it for o in per_sample for it in spec.reply_items(o, parameters)]
    assert [dict(type=i.type, data=bytes(i.data)) for i in reply.items] == expected


# --- round trips ----------------------------------------------------------------------------


@settings(max_examples=100)
@given(st.booleans(), st.data())
def test_request_round_trip(oip_twin, rows, data):
    req = data.draw(requests(rows=rows))
    back = oip.mip_to_request(mip.decode(oip_twin.request_to_mip(req, rows=rows)), rows=rows)
    assert back.inputs == req.inputs
    assert back.parameters == req.parameters
    assert back.outputs == req.outputs
    assert back.id is None  # the id stays at the door


@settings(max_examples=100)
@given(st.booleans(), st.data())
def test_reply_round_trip(oip_twin, rows, data):
    outputs, parameters = data.draw(replies(rows=rows))
    wire = mip.encode(oip.reply_to_mip(outputs, parameters, rows=rows))
    got, params = oip_twin.response_from_mip(mip.decode(wire), rows=rows)
    assert got == outputs and params == parameters


@settings(max_examples=100)
@given(st.booleans(), st.data())
def test_echo_answers_the_request_back(oip_twin, rows, data):
    """The rule: a REQUEST item in a reply is read as the reply's parameters, so wirekit's
    echo handler answers a request's tensors as outputs and its parameters as the reply's."""
    req = data.draw(requests(rows=rows))
    outputs, params = oip_twin.response_from_mip(
        _echo(oip_twin.request_to_mip(req, rows=rows)), rows=rows
    )
    assert outputs == req.inputs and params == req.parameters


def test_twins_agree_on_views_not_copies(oip_twin):
    big = oip.Tensor("x", "FP32", (1024,), bytes(range(256)) * 16)
    wire = mip.encode(oip.reply_to_mip([big]))
    reply = mip.decode(wire)
    (out,), _ = oip_twin.response_from_mip(reply)
    assert isinstance(out.data, memoryview) and out.data.obj is wire
    assert out == big


def test_transport_parameters_do_not_travel(oip_twin):
    req = oip.InferRequest(
        [oip.Tensor("a", "INT8", (1,), b"\x05", {"binary_data_size": 1, "unit": "m"})],
        id="1",
        outputs=[oip.RequestedOutput("y", {"binary_data": True})],
        parameters={"binary_data_output": True, "k": 1},
    )
    first = mip.decode(oip_twin.request_to_mip(req)).items
    assert json.loads(first[0].as_bytes()) == {"parameters": {"k": 1}, "outputs": [{"name": "y"}]}
    back = oip.mip_to_request(mip.decode(oip_twin.request_to_mip(req)))
    assert back.inputs[0].parameters == {"unit": "m"}


# --- errors: same class and text from both twins -------------------------------------------


def _tensor_request(*inputs: oip.Tensor) -> oip.InferRequest:
    return oip.InferRequest(list(inputs))


BAD_REQUESTS = {
    "unknown datatype": _tensor_request(oip.Tensor("a", "FP8", (1,), b"\0")),
    "short data": _tensor_request(oip.Tensor("a", "FP32", (2,), b"\0" * 4)),
    "huge shape": _tensor_request(oip.Tensor("a", "FP64", (10**6, 10**6), b"\0" * 8)),
    "overflowing shape": _tensor_request(oip.Tensor("a", "INT8", (2**62, 2**62, 8), b"\0")),
    "dim beyond i64": _tensor_request(oip.Tensor("a", "INT8", (2**64, 0), b"")),
    "negative dim": _tensor_request(oip.Tensor("a", "INT8", (-1,), b"")),
    "bad BYTES": _tensor_request(oip.Tensor("a", "BYTES", (2,), b"\x05\0\0\0ab")),
    "BYTES too many": _tensor_request(oip.Tensor("a", "BYTES", (10**12,), b"\0\0\0\0")),
    "second of two bad": _tensor_request(
        oip.Tensor("a", "INT8", (1,), b"\0", {"x": object()}),
        oip.Tensor("b", "INT8", (2,), b"\0"),
    ),
    "name too long": _tensor_request(oip.Tensor("n" * 70000, "INT8", (1,), b"\0")),
    "too many dims": _tensor_request(oip.Tensor("a", "INT8", (1,) * 257, b"\0")),
    "too many inputs": _tensor_request(*[oip.Tensor("a", "INT8", (1,), b"\0")] * 255),
    "bad request parameters": oip.InferRequest([], parameters={"x": {1, 2}}),
}


def _pure_only() -> bool:
    from wirekit._impl import pure_requested

    return pure_requested()


def _twins() -> tuple[str, ...]:
    """The twins to compare here: both, or only the pure one under WIREKIT_PURE=1."""
    return ("pure",) if _pure_only() else ("pure", "fast")


@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_same_error_from_both_twins(case, rows):
    req = BAD_REQUESTS[case]
    outcomes = [
        _outcome(load_codec("oip", impl).request_to_mip, req, rows=rows) for impl in _twins()
    ]
    assert outcomes[0][0] == "DecodeError", outcomes[0]
    assert all(o == outcomes[0] for o in outcomes)


ROWS_ERRORS = {
    "no inputs": (oip.InferRequest([]), "rows: no inputs"),
    "scalar": (_tensor_request(oip.Tensor("s", "INT8", (), b"\0")), "has no dimension 0"),
    "zero rows": (_tensor_request(oip.Tensor("z", "INT8", (0, 2), b"")), "has 0 rows"),
    "different rows": (
        _tensor_request(
            oip.Tensor("a", "INT8", (2,), b"\0\0"), oip.Tensor("b", "INT8", (3,), b"\0\0\0")
        ),
        'tensor "b" has 3 rows, tensor "a" has 2',
    ),
    "too many rows": (
        _tensor_request(oip.Tensor("r", "BOOL", (70000,), b"\0" * 70000)),
        "at most 65535",
    ),
}


@pytest.mark.parametrize("case", list(ROWS_ERRORS))
def test_rows_errors(oip_twin, case):
    req, text = ROWS_ERRORS[case]
    with pytest.raises(DecodeError, match=text):
        oip_twin.request_to_mip(req, rows=True)


def _item(kind: int, data: bytes) -> mip.Item:
    return mip.Item(kind, data)


def _reply(*sample: mip.Item) -> mip.Inference:
    return mip.decode(mip.encode(mip.Inference.reply([list(sample)])))


GOOD_TENSOR = spec.tensor_item(oip.Tensor("y", "INT16", (2,), b"\1\0\2\0"))
BAD_REPLIES = {
    "short head": _reply(_item(items.OipItem.TENSOR, b"\x01\x00")),
    "unknown code": _reply(_item(items.OipItem.TENSOR, b"\x00" + GOOD_TENSOR[1:])),
    "code 200": _reply(_item(items.OipItem.TENSOR, b"\xc8" + GOOD_TENSOR[1:])),
    "ndim past end": _reply(
        _item(items.OipItem.TENSOR, GOOD_TENSOR[:1] + b"\xff" + GOOD_TENSOR[2:])
    ),
    "name length past end": _reply(
        _item(items.OipItem.TENSOR, GOOD_TENSOR[:2] + b"\xff\xff" + GOOD_TENSOR[4:])
    ),
    "parameters length past end": _reply(
        _item(items.OipItem.TENSOR, GOOD_TENSOR[:4] + b"\xff\xff\xff\xff" + GOOD_TENSOR[8:])
    ),
    "data short": _reply(_item(items.OipItem.TENSOR, GOOD_TENSOR[:-1])),
    "negative dim": _reply(
        _item(items.OipItem.TENSOR, GOOD_TENSOR[:9] + b"\xff" * 8 + GOOD_TENSOR[17:])
    ),
    "name not UTF-8": _reply(
        _item(items.OipItem.TENSOR, GOOD_TENSOR[:8] + b"\xff" + GOOD_TENSOR[9:])
    ),
    "foreign item": _reply(_item(1, b"hello")),
    "two parameters": _reply(
        _item(items.OipItem.PARAMETERS, b"{}"), _item(items.OipItem.PARAMETERS, b"{}")
    ),
    "parameters not an object": _reply(_item(items.OipItem.PARAMETERS, b"[1]")),
    "error item": _reply(
        _item(items.OipItem.TENSOR, GOOD_TENSOR), _item(items.OipItem.ERROR, b"model exploded")
    ),
    "two samples": mip.Inference.reply([[_item(items.OipItem.TENSOR, GOOD_TENSOR)]] * 2),
    "not inference": mip.Ping(True),
}


@pytest.mark.parametrize("case", list(BAD_REPLIES))
def test_bad_reply_same_error_from_both_twins(case):
    msg = BAD_REPLIES[case]
    outcomes = [_outcome(load_codec("oip", impl).response_from_mip, msg) for impl in _twins()]
    assert outcomes[0][0] in ("DecodeError", "BackendError"), outcomes[0]
    assert all(o == outcomes[0] for o in outcomes)


def test_backend_error_message(oip_twin):
    with pytest.raises(oip.BackendError, match=r"^model exploded$"):
        oip_twin.response_from_mip(_reply(_item(items.OipItem.ERROR, b"model exploded")))
    rows_error = mip.decode(mip.encode(oip.error_to_mip("bad row", batch_size=3)))
    with pytest.raises(oip.BackendError, match=r"^bad row$"):
        oip_twin.response_from_mip(rows_error, rows=True)


def test_select_outputs():
    a, b = oip.Tensor("a", "INT8", (), b"\0"), oip.Tensor("b", "INT8", (), b"\1")
    assert oip.select_outputs([a, b], []) == [a, b]
    assert oip.select_outputs([a, b], [oip.RequestedOutput("b")]) == [b]
    with pytest.raises(DecodeError, match='unknown output "c"') as info:
        oip.select_outputs([a, b], [oip.RequestedOutput("b"), oip.RequestedOutput("c")])
    assert info.value.field == "outputs[1].name"


def test_mip_item_count(oip_twin):
    req = _tensor_request(
        oip.Tensor("a", "INT8", (3, 2), b"\0" * 6), oip.Tensor("b", "INT8", (3,), b"\0" * 3)
    )
    for rows in (False, True):
        wire = mip.decode(oip_twin.request_to_mip(req, rows=rows))
        assert len(wire.items) == oip.mip_item_count(req, rows=rows) == (9 if rows else 3)


def test_mip_to_request_rows_must_share_the_request():
    one = oip.request_to_mip(
        oip.InferRequest([oip.Tensor("a", "INT8", (1,), b"\0")], parameters={"p": 1})
    )
    two = oip.request_to_mip(
        oip.InferRequest([oip.Tensor("a", "INT8", (1,), b"\0")], parameters={"p": 2})
    )
    mixed = mip.Inference.request([mip.decode(one).items, mip.decode(two).items])
    with pytest.raises(DecodeError, match="sample 1 carries another request"):
        oip.mip_to_request(mixed, rows=True)
    with pytest.raises(DecodeError, match="2 samples, a request in sample mode holds one"):
        oip.mip_to_request(mixed)


def test_request_to_mip_copies_the_tensor_bytes_once(oip_twin):
    """A 4 MiB binary tensor (a view of the HTTP body) costs one allocation of its size: the
    wire it is copied into, once."""
    import tracemalloc

    body = bytearray(4 << 20)
    req = oip.InferRequest([oip.Tensor("x", "FP32", (1 << 20,), memoryview(body))])
    oip_twin.request_to_mip(req)  # warm up (imports, caches)
    tracemalloc.start()
    try:
        wire = oip_twin.request_to_mip(req)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(wire) - len(body) < 100
    assert peak < len(body) + (64 << 10)


def _mutations(data: bytes):
    """A valid TENSOR item's bytes with one byte changed, cut, or extended."""
    return st.one_of(
        st.tuples(st.integers(0, max(len(data) - 1, 0)), st.integers(0, 255)).map(
            lambda c: data[: c[0]] + bytes([c[1]]) + data[c[0] + 1 :]
        ),
        st.integers(0, len(data)).map(lambda n: data[:n]),
        st.binary(max_size=8).map(lambda tail: data + tail),
    )


@settings(max_examples=300)
@given(st.data())
def test_damaged_tensor_items_same_outcome_from_both_twins(data):
    if _pure_only():
        pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
    t = data.draw(tensors())
    item = data.draw(st.one_of(st.binary(max_size=40), _mutations(spec.tensor_item(t))))
    msg = mip.Inference.reply([[mip.Item(int(items.OipItem.TENSOR), item)]])
    fast = _outcome(load_codec("oip", "fast").response_from_mip, msg)
    pure = _outcome(load_codec("oip", "pure").response_from_mip, msg)
    assert fast == pure
