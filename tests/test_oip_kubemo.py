"""The OIP mapping against KubeMo's own server (``kubemo==0.0.dev2`` from PyPI, real sockets):
which item kinds a KubeMo model can carry a tensor in (specs/oip.md, "KubeMo")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from mip_net import KubemoServer, kubemo_echo, raw_connection, read_message

from wirekit import mip, oip

kubemo = pytest.importorskip("kubemo")
serialize = pytest.importorskip("kubemo.serialize")

REQUEST = oip.InferRequest(
    [
        oip.Tensor("x", "FP32", (2,), b"\0\0\x80?\0\0\0@"),
        oip.Tensor("s", "BYTES", (1,), b"\x02\0\0\0\xff\xfe"),  # not UTF-8
    ],
    parameters={"p": 1},
)


def _ask(model, wire: bytes) -> mip.Message:
    with KubemoServer(model) as server, raw_connection(server.address) as sock:
        sock.sendall(wire)
        return read_message(sock)


@contextlib.contextmanager
def _oip_items_registered() -> Iterator[None]:
    """KubeMo's extension point: a pass-through ``Serial`` for each OIP item type (kept as
    its bytes), removed again afterwards."""

    class PassThrough(serialize.Serial):
        def __init__(self, reader) -> None:
            super().__init__(type(self).kind, reader)

        def decode(self) -> bytes:
            return self.reader.getvalue()

    table = serialize._default_serializations
    for kind in oip.OipItem:
        serialize.register(type(f"Oip{kind.name}", (PassThrough,), {"kind": int(kind)}))
    try:
        yield
    finally:
        for kind in oip.OipItem:
            table.pop(int(kind), None)


def _echo_as_received(*samples):
    """A KubeMo model answering each sample with the items it received, their kinds kept."""
    return tuple(tuple(value.serial for value in sample) for sample in samples)


def test_kubemo_refuses_the_oip_item_types_it_does_not_know():
    assert _ask(kubemo_echo, oip.request_to_mip(REQUEST)) == mip.ErrorReply(mip.ErrorCode.INTERNAL)


@pytest.mark.parametrize("rows", [False, True])
def test_kubemo_model_with_the_oip_types_registered_round_trips(rows):
    req = oip.InferRequest(
        [oip.Tensor("x", "FP32", (2, 1), b"\0\0\x80?\0\0\0@")], parameters={"p": 1}
    )
    with _oip_items_registered():
        reply = _ask(_echo_as_received, oip.request_to_mip(req, rows=rows))
    assert oip.response_from_mip(reply, rows=rows) == (req.inputs, req.parameters)


@pytest.mark.parametrize("kind", [mip.ItemType.TEXT, mip.ItemType.JSON])
def test_kubemo_text_and_json_items_carry_a_tensor_item_bit_exact(kind):
    """KubeMo's Text and Json keep an item's bytes as read (even not UTF-8), so a TENSOR
    item's bytes ride in them unchanged; only their type number differs."""
    tensor = REQUEST.inputs[1]
    data = oip.items.tensor_head(tensor, "s") + bytes(tensor.data)
    reply = _ask(kubemo_echo, mip.encode(mip.Inference.request([[mip.Item(kind, data)]])))
    assert isinstance(reply, mip.Inference)
    assert [(i.type, i.as_bytes()) for i in reply.items] == [(kind, data)]
    assert oip.items.read_tensor_item(reply.items[0].data, "items[0]") == tensor
