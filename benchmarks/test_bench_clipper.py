"""Clipper: request decode (2017 and v3) and response encode (2017 and v3).

The baselines parse the way Clipper's own Python container does: 2017 with
``np.frombuffer`` + ``np.split`` + ``np.array``; v3 by copying every input frame into a
reused buffer and reshaping it; responses with ``struct.pack_into`` loops into a reused
``bytearray``.  "construct" is the spec in ``wirekit/clipper/spec.py`` (parse, then the
mapping to messages).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from wirekit._fast import clipper as fast
from wirekit.clipper import (
    Direction,
    Generation,
    InputType,
    PredictRequest,
    PredictResponse,
    _pure,
    spec,
)

G17, V3 = Generation.G2017, Generation.V3
IN = Direction.TO_CONTAINER
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")


def _request(n, width):
    rng = np.random.default_rng(n * width)
    return PredictRequest(7, InputType.DOUBLES, rng.standard_normal((n, width)))


REQ17 = _request(3, 500)
WIRE17 = fast.encode(REQ17, G17)
WIRE17_1K = fast.encode(_request(2, 64), G17)  # 1 KiB of doubles
WIRE17_1M = fast.encode(_request(2, 65536), G17)  # 1 MiB of doubles
REQ3 = _request(32, 10)
WIRE3 = fast.encode(REQ3, V3)
OUTPUTS = [f"label-{k:03d}" for k in range(32)]
RESP = PredictResponse(7, OUTPUTS)
WIRE_RESP17 = fast.encode(RESP, G17)
WIRE_RESP3 = fast.encode(RESP, V3)
_DTYPES = {0: np.uint8, 1: np.int32, 2: np.float32, 3: np.float64}


def baseline_decode_2017(frames):
    """Clipper's 2017 Python container: struct for the scalars, NumPy for the inputs."""
    msg_type = U32.unpack(frames[1])[0]
    msg_id = U32.unpack(frames[2])[0]
    request_type = U32.unpack(frames[3])[0]
    assert msg_type == 1 and request_type == 0
    header = np.frombuffer(frames[5], dtype=np.int32)
    input_type, splits = header[0], header[2:]
    inputs = np.array(np.split(np.frombuffer(frames[7], dtype=_DTYPES[int(input_type)]), splits))
    return msg_id, inputs


class BaselineV3:
    """Clipper's v3 Python container: each input frame copied into one reused buffer."""

    def __init__(self):
        self.buffer = bytearray(1024)

    def decode(self, frames):
        assert U32.unpack(frames[1])[0] == 3 and U32.unpack(frames[2])[0] == 1
        msg_id = U32.unpack(frames[3])[0]
        assert U32.unpack(frames[4])[0] == 0
        header = np.frombuffer(frames[6], dtype=np.uint64)
        input_type, n = int(header[0]), int(header[1])
        sizes = header[2:]
        total = int(sizes.sum())
        if len(self.buffer) < total:
            self.buffer = bytearray(total * 2)
        view = memoryview(self.buffer)
        pos = 0
        for k in range(n):
            size = int(sizes[k])
            view[pos : pos + size] = frames[7 + k]
            pos += size
        flat = np.frombuffer(self.buffer, dtype=_DTYPES[input_type], count=total // 8)
        return msg_id, flat.reshape((n, -1))


BASELINE_V3 = BaselineV3()


class BaselineResponse:
    """Clipper's Python response writer: ``struct.pack_into`` into a reused bytearray."""

    buffer = bytearray(1024)

    def encode_2017(self, msg_id_bytes, outputs):
        encoded = [o.encode("utf-8") for o in outputs]
        n = len(encoded)
        buf = self.buffer
        U32.pack_into(buf, 0, n)
        pos, end = 4, 4 + 4 * n
        view = memoryview(buf)
        for out in encoded:
            U32.pack_into(buf, pos, len(out))
            pos += 4
            view[end : end + len(out)] = out
            end += len(out)
        return [b"", U32.pack(1), msg_id_bytes, bytes(buf[:end])]

    def encode_v3(self, msg_id_bytes, outputs):
        encoded = [o.encode("utf-8") for o in outputs]
        n = len(encoded)
        header = bytearray(8 * (n + 1))
        U64.pack_into(header, 0, n)
        for k, out in enumerate(encoded):
            U64.pack_into(header, 8 * (k + 1), len(out))
        return [b"", U32.pack(1), msg_id_bytes, U64.pack(len(header)), bytes(header), *encoded]


BASELINE_RESPONSE = BaselineResponse()


def construct_decode(frames, gen):
    return _pure.from_container(spec.parse(frames, gen, IN), gen)


def construct_encode(msg, gen):
    container, direction = _pure.to_container(msg, gen)
    return spec.build(container, gen, direction)


def _inputs(result, who):
    if who == "baseline":
        return result[1]
    return np.asarray(np.vstack(result.inputs))


@pytest.mark.benchmark(group="clipper 2017 request decode 3x500 doubles")
@pytest.mark.parametrize("who", ["fast", "construct", "baseline"])
def test_request_decode_2017(benchmark, who):
    run = {
        "fast": lambda: fast.decode(WIRE17, G17, IN),
        "construct": lambda: construct_decode(WIRE17, G17),
        "baseline": lambda: baseline_decode_2017(WIRE17),
    }[who]
    assert np.array_equal(_inputs(benchmark(run), who), REQ17.inputs)


@pytest.mark.benchmark(group="clipper 2017 request decode 1MiB vs 1KiB")
@pytest.mark.parametrize("who", ["fast", "fast-1MiB", "baseline-1MiB"])
def test_request_decode_2017_zero_copy(benchmark, who):
    """Decode time must not grow with the payload: "fast" is 1 KiB, "fast-1MiB" 1 MiB."""
    run = {
        "fast": lambda: fast.decode(WIRE17_1K, G17, IN),
        "fast-1MiB": lambda: fast.decode(WIRE17_1M, G17, IN),
        "baseline-1MiB": lambda: baseline_decode_2017(WIRE17_1M),
    }[who]
    result = benchmark(run)
    inputs = result[1] if who.startswith("baseline") else result.inputs
    assert inputs.shape == ((2, 64) if who == "fast" else (2, 65536))
    if who != "baseline-1MiB":  # the fast path views the content frame
        content = (WIRE17_1K if who == "fast" else WIRE17_1M)[7]
        assert np.shares_memory(inputs, np.frombuffer(content, np.uint8))


@pytest.mark.benchmark(group="clipper v3 request decode 32x10 doubles")
@pytest.mark.parametrize("who", ["fast", "construct", "baseline"])
def test_request_decode_v3(benchmark, who):
    run = {
        "fast": lambda: fast.decode(WIRE3, V3, IN),
        "construct": lambda: construct_decode(WIRE3, V3),
        "baseline": lambda: BASELINE_V3.decode(WIRE3),
    }[who]
    assert np.array_equal(_inputs(benchmark(run), who), REQ3.inputs)


@pytest.mark.benchmark(group="clipper 2017 response encode 32 strings")
@pytest.mark.parametrize("who", ["fast", "construct", "baseline"])
def test_response_encode_2017(benchmark, who):
    msg_id = U32.pack(7)
    run = {
        "fast": lambda: fast.encode(RESP, G17),
        "construct": lambda: construct_encode(RESP, G17),
        "baseline": lambda: BASELINE_RESPONSE.encode_2017(msg_id, OUTPUTS),
    }[who]
    assert benchmark(run) == WIRE_RESP17


@pytest.mark.benchmark(group="clipper v3 response encode 32 strings")
@pytest.mark.parametrize("who", ["fast", "construct", "baseline"])
def test_response_encode_v3(benchmark, who):
    msg_id = U32.pack(7)
    run = {
        "fast": lambda: fast.encode(RESP, V3),
        "construct": lambda: construct_encode(RESP, V3),
        "baseline": lambda: BASELINE_RESPONSE.encode_v3(msg_id, OUTPUTS),
    }[who]
    assert benchmark(run) == WIRE_RESP3
