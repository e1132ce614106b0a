"""Clipper's container RPC declared with ``construct``: the readable reference and the oracle.

A Clipper message is a ZeroMQ *multipart* message: a list of frames, each a byte string
whose length is its own (ZeroMQ carries it).  The container (DEALER) sees every message
starting with an empty delimiter frame.  Each frame's content is declared below as a
construct; ``MESSAGES`` lists, per generation and message kind, the frames in order.
Integers are little-endian.  Text frames are raw bytes with neither NUL nor length prefix.

2016 legacy (no message types; Clipper tells a registration from a response by whether it
knows the sender)::

    to Clipper    registration   "" | name | version | input type (ASCII)
                  response       "" | msg_id u32 | f32[one per input]
    to container  request        "" | msg_id u32 | request type u32 |
                                    u32[type, n, n-1 cumulative element offsets] | content

2017 (message type 0 registration, 1 content, 2 heartbeat)::

    to Clipper    heartbeat      "" | 2
                  registration   "" | 0 | name | version | input type (ASCII)
                  response       "" | 1 | msg_id | u32 N, u32 len[N], UTF-8 outputs
    to container  heartbeat      "" | 2 | heartbeat type
                  request        "" | 1 | msg_id | request type | i64 H | header (H bytes,
                                    as 2016) | i64 C | content (C bytes, as 2016)

RPC v3 (every message to the container starts with the version 3)::

    to Clipper    heartbeat      "" | 2
                  registration   "" | 0 | name | version | input type (ASCII) | 3
                  response       "" | 1 | msg_id | u64 H | u64[N, len...] | N output frames
    to container  heartbeat      "" | 3 | 2 | heartbeat type
                  request        "" | 3 | 1 | msg_id | request type | u64 H |
                                    u64[type, n, byte size...] | n input frames

2016/2017 content is one frame: the inputs concatenated, each string NUL-terminated (string
offsets count one "element" per string).  v3 sends one frame per input, strings bare.

:func:`parse` and :func:`build` turn frames into construct ``Container`` trees and back; the
pure codec (``_pure.py``) maps those to messages and adds the checks (frame counts, sizes
against frames, offsets) with exact error positions.  They are the test oracle for both
twins and the "construct" contender of the benchmarks.
"""

from __future__ import annotations

import re
import struct
from typing import Any, cast

import numpy as np
from construct import (
    AdaptationError,
    Adapter,
    Array,
    Bytes,
    Container,
    CString,
    Float64l,
    GreedyBytes,
    GreedyRange,
    GreedyString,
    Int32sl,
    Int32ul,
    Int64sl,
    Int64ul,
    Select,
    StringEncoded,
    Struct,
    Terminated,
    this,
)

from .messages import Direction, Generation, InputType

#: A 4-byte little-endian unsigned frame: message type, heartbeat type, msg_id, request type,
#: RPC version.  (Clipper writes C++ ``int``s; identical below 2**31.)
U32 = Struct("value" / Int32ul, Terminated)
#: A 2017 size frame: C++ ``long`` (8 bytes) as Clipper sends it; the markdown says 32 bits,
#: so a 4-byte frame is read too.  Built as 8 bytes.
SIZE_2017_LONG = Struct("value" / Int64sl, Terminated)
SIZE_2017_MD = Struct("value" / Int32sl, Terminated)
SIZE_2017 = Select(SIZE_2017_LONG, SIZE_2017_MD)
#: A v3 size frame.
U64 = Struct("value" / Int64ul, Terminated)
#: A 2017 response's msg_id: 4 bytes, or 8 as the JVM container sends it (Clipper reads the
#: low 4; wirekit requires the high 4 to be zero).  Built as 4 bytes.
MSG_ID_2017 = Select(U32, U64)
#: The empty delimiter frame.
DELIMITER = Struct(Terminated)
#: Model name / version: the whole frame as UTF-8 text.
TEXT = Struct("value" / GreedyString("utf8"))


class StoiInt(Adapter):
    """Decimal ASCII read the way ``std::stoi`` reads it (leading whitespace, a sign, digits;
    anything after is ignored); built as plain ``str(int)``."""

    _NUMBER = re.compile(rb"[ \t\n\v\f\r]*([+-]?)0*([0-9]+)")

    def _decode(self, obj: Any, context: Any, path: Any) -> int:
        match = self._NUMBER.match(obj)
        if match is None:
            raise AdaptationError(f"no decimal integer in {obj!r:.40}", path=path)
        digits = match.group(2)
        if len(digits) > 10:  # past any C int (std::stoi throws out_of_range); no int() of it
            raise AdaptationError(f"a {len(digits)}-digit integer is out of range", path=path)
        return int(match.group(1) + digits)

    def _encode(self, obj: Any, context: Any, path: Any) -> bytes:
        return str(int(obj)).encode("ascii")


#: Input type of a registration: decimal ASCII (the C++ container may add junk after it).
ASCII_INT = Struct("value" / StoiInt(GreedyBytes))

#: 2016/2017 request header: ``[input_type, num_inputs, offsets...]`` (n-1 offsets).
HEADER_U32 = Struct(
    "input_type" / Int32ul,
    "num_inputs" / Int32ul,
    "offsets" / Array(lambda c: max(c.num_inputs - 1, 0), Int32ul),
    Terminated,
)
#: v3 request header: ``[input_type, num_inputs, byte size of each input]``.
HEADER_U64 = Struct(
    "input_type" / Int64ul,
    "num_inputs" / Int64ul,
    "sizes" / Array(this.num_inputs, Int64ul),
    Terminated,
)
#: v3 response header: ``[N, byte length of each output]`` (no type element).
RESPONSE_HEADER_U64 = Struct(
    "count" / Int64ul,
    "lengths" / Array(this.count, Int64ul),
    Terminated,
)
#: 2017 response payload, one frame.
RESPONSE_2017 = Struct(
    "count" / Int32ul,
    "lengths" / Array(this.count, Int32ul),
    "outputs" / Array(this.count, StringEncoded(Bytes(lambda c: c.lengths[c._index]), "utf8")),
    Terminated,
)


class _Float32(Adapter):
    """A little-endian float32 (as ``Float32l``) that builds a NumPy ``float32`` bit for bit:
    through a Python float (a C double) a signaling NaN would come out quieted, unlike the
    bytes the caller's array holds."""

    def _decode(self, obj: bytes, context: Any, path: Any) -> float:
        return struct.unpack("<f", obj)[0]

    def _encode(self, obj: Any, context: Any, path: Any) -> bytes:
        if type(obj) is np.float32:
            return obj.tobytes()
        return struct.pack("<f", obj)


Float32l = _Float32(Bytes(4))

#: 2016 response: a bare float32 array.
RESPONSE_2016 = Struct("outputs" / GreedyRange(Float32l), Terminated)

#: Element constructs of the numeric input types.
ELEMENT = {
    InputType.BYTES: Bytes(1),
    InputType.INTS: Int32sl,
    InputType.FLOATS: Float32l,
    InputType.DOUBLES: Float64l,
}
ELEMENT_SIZE = {InputType.BYTES: 1, InputType.INTS: 4, InputType.FLOATS: 4, InputType.DOUBLES: 8}

#: 2016/2017 content frame: every element (numeric) or every NUL-terminated string.
CONTENT = {
    InputType.BYTES: Struct("values" / GreedyBytes),
    InputType.INTS: Struct("values" / GreedyRange(Int32sl), Terminated),
    InputType.FLOATS: Struct("values" / GreedyRange(Float32l), Terminated),
    InputType.DOUBLES: Struct("values" / GreedyRange(Float64l), Terminated),
    InputType.STRINGS: Struct("values" / GreedyRange(CString("utf8")), Terminated),
}
#: v3 input frame: one input, strings bare.
INPUT_V3 = {**CONTENT, InputType.STRINGS: Struct("values" / GreedyString("utf8"))}

G16, G17, V3 = Generation.G2016, Generation.G2017, Generation.V3
OUT, IN = Direction.TO_CLIPPER, Direction.TO_CONTAINER

#: Frames after the delimiter, per (generation, direction, kind).  ``"*"`` marks the
#: repeated frames of v3 (one per input or output, count from the header).
MESSAGES: dict[tuple[Generation, Direction, str], list[tuple[str, Any]]] = {
    (G16, OUT, "new_container"): [
        ("model_name", TEXT),
        ("model_version", TEXT),
        ("input_type", ASCII_INT),
    ],
    (G16, OUT, "predict_response"): [("msg_id", U32), ("outputs", RESPONSE_2016)],
    (G16, IN, "predict_request"): [
        ("msg_id", U32),
        ("request_type", U32),
        ("header", HEADER_U32),
        ("content", CONTENT),
    ],
    (G17, OUT, "heartbeat"): [("msg_type", U32)],
    (G17, OUT, "new_container"): [
        ("msg_type", U32),
        ("model_name", TEXT),
        ("model_version", TEXT),
        ("input_type", ASCII_INT),
    ],
    (G17, OUT, "predict_response"): [
        ("msg_type", U32),
        ("msg_id", MSG_ID_2017),
        ("payload", RESPONSE_2017),
    ],
    (G17, IN, "heartbeat_reply"): [("msg_type", U32), ("heartbeat_type", U32)],
    (G17, IN, "predict_request"): [
        ("msg_type", U32),
        ("msg_id", U32),
        ("request_type", U32),
        ("header_size", SIZE_2017),
        ("header", HEADER_U32),
        ("content_size", SIZE_2017),
        ("content", CONTENT),
    ],
    (V3, OUT, "heartbeat"): [("msg_type", U32)],
    (V3, OUT, "new_container"): [
        ("msg_type", U32),
        ("model_name", TEXT),
        ("model_version", TEXT),
        ("input_type", ASCII_INT),
        ("rpc_version", U32),
    ],
    (V3, OUT, "predict_response"): [
        ("msg_type", U32),
        ("msg_id", U32),
        ("header_size", U64),
        ("header", RESPONSE_HEADER_U64),
        ("*outputs", TEXT),
    ],
    (V3, IN, "heartbeat_reply"): [("rpc_version", U32), ("msg_type", U32), ("heartbeat_type", U32)],
    (V3, IN, "predict_request"): [
        ("rpc_version", U32),
        ("msg_type", U32),
        ("msg_id", U32),
        ("request_type", U32),
        ("header_size", U64),
        ("header", HEADER_U64),
        ("*inputs", INPUT_V3),
    ],
}


def kind_of(frames: list[bytes], generation: Generation, direction: Direction) -> str:
    """Which message ``frames`` hold (by frame count in 2016, by type frame otherwise)."""
    if generation is G16:
        if direction is IN:
            return "predict_request"
        return "new_container" if len(frames) == 4 else "predict_response"
    at = 2 if generation is V3 and direction is IN else 1
    mtype = U32.parse(frames[at]).value
    if mtype == 2:
        return "heartbeat" if direction is OUT else "heartbeat_reply"
    if mtype == 1:
        return "predict_response" if direction is OUT else "predict_request"
    return "new_container"


def _frame_spec(spec: Any, input_type: int | None) -> Any:
    # a spec per input type (a dict) only comes after the header that gives the type
    return spec[InputType(cast(int, input_type))] if isinstance(spec, dict) else spec


def parse(frames: list[bytes], generation: Generation, direction: Direction) -> Container:
    """Parse the frames of one *valid* message into a Container (``kind`` plus one entry per
    frame; the v3 repeated frames become a list).  Raises construct errors on bad input."""
    frames = [bytes(f) for f in frames]
    kind = kind_of(frames, generation, direction)
    out = Container(kind=kind)
    DELIMITER.parse(frames[0])
    itype = None
    for k, (name, spec) in enumerate(MESSAGES[(generation, direction, kind)], start=1):
        if name.startswith("*"):
            out[name[1:]] = [_frame_spec(spec, itype).parse(f) for f in frames[k:]]
            break
        out[name] = _frame_spec(spec, itype).parse(frames[k])
        if name == "header" and "input_type" in out[name]:
            itype = out[name].input_type
    return out


def build(c: Container | dict, generation: Generation, direction: Direction) -> list[bytes]:
    """Build the frames (delimiter first) of the message described by ``c`` (see
    :func:`parse` for its shape)."""
    frames = [DELIMITER.build({})]
    itype = None
    for name, spec in MESSAGES[(generation, direction, c["kind"])]:
        if name.startswith("*"):
            frames.extend(_frame_spec(spec, itype).build(v) for v in c[name[1:]])
            break
        frames.append(_frame_spec(spec, itype).build(c[name]))
        if name == "header" and "input_type" in c[name]:
            itype = c[name]["input_type"]
    return frames
