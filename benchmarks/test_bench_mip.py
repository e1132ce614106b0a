"""MIP: header decode, inference decode and inference encode (32 items × 64 B)."""

from __future__ import annotations

import struct

import pytest

from wirekit._fast import mip as fast
from wirekit.mip import Inference, Item, _pure, spec

HEADER = struct.Struct(">BBBBI")
INFERENCE_HEAD = struct.Struct(">BBH")
ITEM_HEAD = struct.Struct(">II")

MESSAGE = Inference.request([[Item(1 + k % 3, bytes([k]) * 64)] for k in range(32)])
WIRE = fast.encode(MESSAGE)
CONTAINER = _pure.to_container(MESSAGE)


def struct_header(buf):
    return HEADER.unpack_from(buf, 0)


def struct_decode(buf):
    """A hand-written struct loop: header, inference head, then the items."""
    _version, _kind, subtype, _reserved, _remaining = HEADER.unpack_from(buf, 0)
    n_input, n_output, batch = INFERENCE_HEAD.unpack_from(buf, 8)
    pos, items = 12, []
    for _ in range(batch * (n_output if subtype else n_input)):
        kind, size = ITEM_HEAD.unpack_from(buf, pos)
        pos += 8
        items.append((kind, buf[pos : pos + size]))
        pos += size
    return items


def struct_encode(items, n_input, batch):
    parts = [b""]
    for kind, data in items:
        parts.append(ITEM_HEAD.pack(kind, len(data)))
        parts.append(data)
    payload = INFERENCE_HEAD.pack(n_input, 0, batch) + b"".join(parts)
    return HEADER.pack(0, 2, 0, 0, len(payload)) + payload


PLAIN_ITEMS = [(it.type, bytes(it.data)) for it in MESSAGE.items]


@pytest.mark.benchmark(group="mip header decode")
@pytest.mark.parametrize("who", ["fast", "construct", "baseline"])
def test_header_decode(benchmark, who):
    run = {
        "fast": lambda: fast.check_header(WIRE),
        "construct": lambda: spec.HEADER.parse(WIRE[:8]),
        "baseline": lambda: struct_header(WIRE),
    }[who]
    result = benchmark(run)
    remaining = {
        "fast": lambda r: r[2],
        "construct": lambda r: r.remaining,
        "baseline": lambda r: r[4],
    }[who](result)
    assert remaining == len(WIRE) - 8


@pytest.mark.benchmark(group="mip inference decode 32x64B")
@pytest.mark.parametrize("who", ["fast", "construct", "baseline"])
def test_inference_decode(benchmark, who):
    run = {
        "fast": lambda: fast.decode(WIRE).items,
        "construct": lambda: spec.MESSAGE.parse(WIRE).payload["items"],
        "baseline": lambda: struct_decode(WIRE),
    }[who]
    items = benchmark(run)
    assert [(it[0] if who != "construct" else it.type) for it in items] == [
        it.type for it in MESSAGE.items
    ]
    assert bytes(items[5][1] if who != "construct" else items[5].data) == bytes(
        MESSAGE.items[5].data
    )


@pytest.mark.benchmark(group="mip inference encode 32x64B")
@pytest.mark.parametrize("who", ["fast", "construct", "baseline"])
def test_inference_encode(benchmark, who):
    run = {
        "fast": lambda: fast.encode(MESSAGE),
        "construct": lambda: spec.MESSAGE.build(CONTAINER),
        "baseline": lambda: struct_encode(PLAIN_ITEMS, 1, 32),
    }[who]
    assert benchmark(run) == WIRE
