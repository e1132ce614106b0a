"""The pure-Python Clipper codec: the construct spec plus the validation both twins share.

``wirekit/_fast/clipper.pyx`` is its Cython twin: same functions, same results, same errors
(field, frame, offset and text) for the same frames.  Keep the checks here and there in one
order: frames are checked front to back, each size against the frame it announces as soon
as both have been reached.
"""

from __future__ import annotations

import re
from typing import Any, cast

import numpy as np
from construct import Array, Container, Int32ul, Int64ul

from wirekit.errors import DecodeError, EncodeError

from . import spec
from .messages import (
    DTYPES,
    OUTPUT_DTYPE,
    PROTOCOL,
    RPC_VERSION,
    Direction,
    Generation,
    Heartbeat,
    HeartbeatReply,
    HeartbeatType,
    InputType,
    Message,
    NewContainer,
    PredictRequest,
    PredictResponse,
    as_direction,
    as_generation,
    check_input_type,
    check_request_type,
    check_u32,
    normalize_inputs,
    normalize_outputs,
    registration_fields,
    stoi_prefix,
)

G16, G17, V3 = Generation.G2016, Generation.G2017, Generation.V3
OUT, IN = Direction.TO_CLIPPER, Direction.TO_CONTAINER
_WS = b" \t\n\v\f\r"
_DIGITS = re.compile(rb"[0-9]*")
_TYPE_NAMES = ("bytes", "int32", "float32", "float64", "string")


def _fail(field: str, offset: int, text: str, frame: int) -> DecodeError:
    return DecodeError(PROTOCOL, field, offset, text, frame=frame)


# --- frame access ----------------------------------------------------------------------------


def _views(frames: Any) -> list[memoryview]:
    if not isinstance(frames, list | tuple):
        frames = list(frames)
    out = []
    for i, f in enumerate(frames):
        try:
            mv = memoryview(f)
        except TypeError:
            raise TypeError(
                f"frame {i}: expected a bytes-like object, got {type(f).__name__}"
            ) from None
        if not mv.c_contiguous:
            raise TypeError(f"frame {i}: not a contiguous buffer")
        if mv.ndim != 1 or mv.format != "B":
            mv = mv.cast("B")
        out.append(mv)
    return out


def _need(views: list[Any], count: int, what: str) -> None:
    n = len(views)
    if n != count:
        raise _fail("frames", 0, f"{what} has {count} frames, got {n}", min(n, count))


def _at_least(views: list[Any], count: int, what: str) -> None:
    n = len(views)
    if n < count:
        raise _fail("frames", 0, f"{what} has at least {count} frames, got {n}", n)


def _u32(views: list[Any], i: int, field: str) -> int:
    f = views[i]
    if len(f) != 4:
        raise _fail(field, min(len(f), 4), f"expected 4 bytes, got {len(f)}", i)
    return spec.U32.parse(f.tobytes()).value


def _u64(views: list[Any], i: int, field: str) -> int:
    f = views[i]
    if len(f) != 8:
        raise _fail(field, min(len(f), 8), f"expected 8 bytes, got {len(f)}", i)
    return spec.U64.parse(f.tobytes()).value


def _size_2017(views: list[Any], i: int, field: str) -> int:
    f = views[i]
    if len(f) == 8:
        return spec.SIZE_2017_LONG.parse(f.tobytes()).value
    if len(f) == 4:
        return spec.SIZE_2017_MD.parse(f.tobytes()).value
    raise _fail(
        field,
        min(len(f), 8),
        f"expected 8 bytes (or 4, as the markdown spec says), got {len(f)}",
        i,
    )


def _msg_id_2017(views: list[Any], i: int) -> int:
    f = views[i]
    if len(f) == 8:
        value = spec.U64.parse(f.tobytes()).value
        if value > 0xFFFFFFFF:
            raise _fail("msg_id", 4, f"8-byte id {value} does not fit 32 bits", i)
        return value
    if len(f) != 4:
        raise _fail(
            "msg_id",
            min(len(f), 4),
            f"expected 4 bytes (or 8, as the JVM container sends), got {len(f)}",
            i,
        )
    return spec.U32.parse(f.tobytes()).value


def _utf8(data: Any, field: str, base: int, frame: int) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(field, base + exc.start, f"invalid UTF-8: {exc.reason}", frame) from None


def _request_type(views: list[Any], i: int) -> int:
    rt = _u32(views, i, "request_type")
    if rt == 1:
        raise _fail(
            "request_type",
            0,
            "feedback request (type 1): Clipper defines no body for it and never sends one; "
            "not decoded",
            i,
        )
    if rt != 0:
        raise _fail("request_type", 0, f"unknown request type {rt} (0 predict, 1 feedback)", i)
    return rt


def _ascii_input_type(views: list[Any], i: int) -> InputType:
    """The registration's input type, read the way ``std::stoi`` reads it.

    No ``int()`` of the peer's digits (a frame may hold millions): leading zeros are
    skipped and any value past 4 is unknown, whatever its length (as the Cython twin).
    """
    data = views[i].tobytes()
    p = len(data) - len(data.lstrip(_WS))
    start = p
    negative = p < len(data) and data[p] == 45  # "-"
    if p < len(data) and data[p] in b"+-":
        p += 1
    digits = p
    run = cast(re.Match[bytes], _DIGITS.match(data, p))  # matches the empty string too
    p = run.end()
    if p == digits:
        raise _fail("input_type", digits, "expected a decimal integer (read by std::stoi)", i)
    value = run.group().lstrip(b"0")
    if len(value) > 1 or value > b"4" or (negative and value):
        shown = data[start : min(p, start + 20)].decode("ascii")
        if p - start > 20:
            shown += "..."
        raise _fail("input_type", start, f"unknown input type {shown} (0..4)", i)
    return InputType(int(value or b"0"))


# --- messages --------------------------------------------------------------------------------


def _new_container(views: list[Any], gen: Generation) -> NewContainer:
    k = 0 if gen is G16 else 1
    _need(views, 4 + k + (gen is V3), f"a {gen.value} registration")
    name = _utf8(views[k + 1], "model_name", 0, k + 1)
    version = _utf8(views[k + 2], "model_version", 0, k + 2)
    if gen is G16 and not stoi_prefix(views[k + 2].tobytes()):
        raise _fail(
            "model_version",
            0,
            "2016 Clipper parses the version with std::stoi; it does not start with an integer",
            k + 2,
        )
    itype = _ascii_input_type(views, k + 3)
    rpc = None
    if gen is V3:
        rpc = _u32(views, 5, "rpc_version")
        if rpc != RPC_VERSION:
            raise _fail("rpc_version", 0, f"expected {RPC_VERSION}, got {rpc}", 5)
    return NewContainer(name, version, itype, rpc)


def _response_2016(views: list[Any]) -> PredictResponse:
    msg_id = _u32(views, 1, "msg_id")
    f = views[2]
    n = len(f)
    if n % 4:
        raise _fail("outputs", n - n % 4, f"{n} bytes is not a whole number of float32 values", 2)
    if n == 0:
        raise _fail("outputs", 0, "no outputs (a response has one per input)", 2)
    return PredictResponse(msg_id, np.frombuffer(f, OUTPUT_DTYPE))


def _response_2017(views: list[Any]) -> PredictResponse:
    _need(views, 4, "a 2017 prediction response")
    msg_id = _msg_id_2017(views, 2)
    f = views[3]
    size = len(f)
    if size < 4:
        raise _fail(
            "payload", size, f"truncated: need 4 bytes for the output count, have {size}", 3
        )
    count = Int32ul.parse(f[:4].tobytes())
    if count == 0:
        raise _fail("payload", 0, "no outputs (a response has one per input)", 3)
    room = (size - 4) // 4
    if count > room:
        raise _fail(
            "payload", 4, f"{count} outputs announced, the frame holds at most {room} lengths", 3
        )
    start = 4 + 4 * count
    lengths = Array(count, Int32ul).parse(f[4:start].tobytes())
    total = sum(lengths)
    if total != size - start:
        raise _fail(
            "payload", start, f"the lengths add up to {total} bytes, {size - start} follow them", 3
        )
    outputs, p = [], start
    for i, length in enumerate(lengths):
        outputs.append(_utf8(f[p : p + length], f"outputs[{i}]", p, 3))
        p += length
    return PredictResponse(msg_id, outputs)


def _response_v3(views: list[Any]) -> PredictResponse:
    _at_least(views, 5, "a v3 prediction response")
    msg_id = _u32(views, 2, "msg_id")
    announced = _u64(views, 3, "header_size")
    h = views[4]
    hl = len(h)
    if announced != hl:
        raise _fail("header_size", 0, f"announces {announced} bytes, the header frame has {hl}", 3)
    if hl % 8:
        raise _fail("header", hl - hl % 8, f"{hl} bytes is not a whole number of u64 values", 4)
    if hl == 0:
        raise _fail("header", 0, "truncated: need 8 bytes for the output count, have 0", 4)
    count = Int64ul.parse(h[:8].tobytes())
    if count == 0:
        raise _fail("header", 0, "no outputs (a response has one per input)", 4)
    if count != hl // 8 - 1:
        raise _fail(
            "header", 0, f"announces {count} outputs, the frame holds {hl // 8 - 1} lengths", 4
        )
    header = spec.RESPONSE_HEADER_U64.parse(h.tobytes())
    _need(views, 5 + count, f"a v3 prediction response with {count} outputs")
    outputs = []
    for i, length in enumerate(header.lengths):
        f = views[5 + i]
        if len(f) != length:
            raise _fail(
                f"lengths[{i}]",
                8 + 8 * i,
                f"announces {length} bytes, output frame {5 + i} has {len(f)}",
                4,
            )
        outputs.append(_utf8(f, f"outputs[{i}]", 0, 5 + i))
    return PredictResponse(msg_id, outputs)


def _header_u32(views: list[Any], i: int) -> tuple[int, int, list[int]]:
    h = views[i]
    hl = len(h)
    if hl % 4:
        raise _fail("header", hl - hl % 4, f"{hl} bytes is not a whole number of u32 values", i)
    if hl < 8:
        raise _fail(
            "header", hl, f"truncated: need 8 bytes (input type, number of inputs), have {hl}", i
        )
    itype = Int32ul.parse(h[:4].tobytes())
    if itype > 4:
        raise _fail("input_type", 0, f"unknown input type {itype} (0..4)", i)
    n = Int32ul.parse(h[4:8].tobytes())
    if n == 0:
        raise _fail("num_inputs", 4, "no inputs (Clipper never sends an empty batch)", i)
    if n - 1 != hl // 4 - 2:
        raise _fail(
            "num_inputs", 4, f"{n} inputs need {n - 1} offsets, the header holds {hl // 4 - 2}", i
        )
    header = spec.HEADER_U32.parse(h.tobytes())
    return itype, n, list(header.offsets)


def _split_strings(f: memoryview, n: int, frame: int) -> list[str]:
    data = f.tobytes()
    out, p = [], 0
    for i in range(n):
        nul = data.find(b"\0", p)
        if nul < 0:
            raise _fail("content", p, f"string {i} of {n} has no NUL terminator", frame)
        out.append(_utf8(data[p:nul], f"inputs[{i}]", p, frame))
        p = nul + 1
    if p != len(data):
        raise _fail("content", p, f"{len(data) - p} bytes after the last of {n} strings", frame)
    return out


def _content(views: list[Any], hi: int, ci: int, itype: int, n: int, offsets: list[int]) -> Any:
    """Inputs of a 2016/2017 request: header frame ``hi``, content frame ``ci``."""
    if itype == InputType.STRINGS:
        for i, off in enumerate(offsets):
            if off != i + 1:
                raise _fail(
                    f"offsets[{i}]",
                    8 + 4 * i,
                    f"expected {i + 1} (Clipper counts each string as one element), got {off}",
                    hi,
                )
        return _split_strings(views[ci], n, ci)
    f = views[ci]
    size = len(f)
    dtype = DTYPES[itype]
    es = dtype.itemsize
    if size % es:
        raise _fail(
            "content",
            size - size % es,
            f"{size} bytes is not a whole number of {_TYPE_NAMES[itype]} values",
            ci,
        )
    total = size // es
    prev = 0
    for i, off in enumerate(offsets):
        if off < prev:
            raise _fail(f"offsets[{i}]", 8 + 4 * i, f"{off} is less than the previous {prev}", hi)
        if off > total:
            raise _fail(
                f"offsets[{i}]",
                8 + 4 * i,
                f"{off} is past the {total} elements of the content",
                hi,
            )
        prev = off
    flat = np.frombuffer(f, dtype)
    bounds = [0, *offsets, total]
    width = bounds[1]
    if all(bounds[k + 1] - bounds[k] == width for k in range(n)):
        return flat.reshape(n, width)
    return [flat[bounds[k] : bounds[k + 1]] for k in range(n)]


def _request_2016(views: list[Any]) -> PredictRequest:
    _need(views, 5, "a 2016 prediction request")
    msg_id = _u32(views, 1, "msg_id")
    _request_type(views, 2)
    itype, n, offsets = _header_u32(views, 3)
    return PredictRequest(msg_id, InputType(itype), _content(views, 3, 4, itype, n, offsets))


def _request_2017(views: list[Any]) -> PredictRequest:
    _need(views, 8, "a 2017 prediction request")
    msg_id = _u32(views, 2, "msg_id")
    _request_type(views, 3)
    announced = _size_2017(views, 4, "header_size")
    if announced != len(views[5]):
        raise _fail(
            "header_size",
            0,
            f"announces {announced} bytes, the header frame has {len(views[5])}",
            4,
        )
    itype, n, offsets = _header_u32(views, 5)
    announced = _size_2017(views, 6, "content_size")
    if announced != len(views[7]):
        raise _fail(
            "content_size",
            0,
            f"announces {announced} bytes, the content frame has {len(views[7])}",
            6,
        )
    return PredictRequest(msg_id, InputType(itype), _content(views, 5, 7, itype, n, offsets))


def _request_v3(views: list[Any]) -> PredictRequest:
    _at_least(views, 7, "a v3 prediction request")
    msg_id = _u32(views, 3, "msg_id")
    _request_type(views, 4)
    announced = _u64(views, 5, "header_size")
    h = views[6]
    hl = len(h)
    if announced != hl:
        raise _fail("header_size", 0, f"announces {announced} bytes, the header frame has {hl}", 5)
    if hl % 8:
        raise _fail("header", hl - hl % 8, f"{hl} bytes is not a whole number of u64 values", 6)
    if hl < 16:
        raise _fail(
            "header", hl, f"truncated: need 16 bytes (input type, number of inputs), have {hl}", 6
        )
    itype = Int64ul.parse(h[:8].tobytes())
    if itype > 4:
        raise _fail("input_type", 0, f"unknown input type {itype} (0..4)", 6)
    n = Int64ul.parse(h[8:16].tobytes())
    if n == 0:
        raise _fail("num_inputs", 8, "no inputs (Clipper never sends an empty batch)", 6)
    if n != hl // 8 - 2:
        raise _fail(
            "num_inputs", 8, f"{n} inputs need {n} sizes, the header holds {hl // 8 - 2}", 6
        )
    sizes = spec.HEADER_U64.parse(h.tobytes()).sizes
    _need(views, 7 + n, f"a v3 prediction request with {n} inputs")
    inputs: list[Any] = []
    dtype = DTYPES.get(itype)
    for i, size in enumerate(sizes):
        f = views[7 + i]
        if len(f) != size:
            raise _fail(
                f"sizes[{i}]",
                16 + 8 * i,
                f"announces {size} bytes, input frame {7 + i} has {len(f)}",
                6,
            )
        if dtype is None:
            inputs.append(_utf8(f, f"inputs[{i}]", 0, 7 + i))
            continue
        if size % dtype.itemsize:
            raise _fail(
                f"inputs[{i}]",
                size - size % dtype.itemsize,
                f"{size} bytes is not a whole number of {_TYPE_NAMES[itype]} values",
                7 + i,
            )
        inputs.append(np.frombuffer(f, dtype))
    if dtype is not None and all(len(x) == len(inputs[0]) for x in inputs):
        # One frame per input: a 2-D batch needs one copy (as Clipper's own container makes).
        batch = np.empty((n, len(inputs[0])), dtype)
        for i, x in enumerate(inputs):
            batch[i] = x
        return PredictRequest(msg_id, InputType(itype), batch)
    return PredictRequest(msg_id, InputType(itype), inputs)


def _heartbeat_reply(views: list[Any], base: int, gen: Generation) -> HeartbeatReply:
    _need(views, base + 2, f"a {gen.value} heartbeat reply")
    hb = _u32(views, base + 1, "heartbeat_type")
    if hb > 1:
        raise _fail(
            "heartbeat_type",
            0,
            f"unknown heartbeat type {hb} (0 keep-alive, 1 request metadata)",
            base + 1,
        )
    return HeartbeatReply(HeartbeatType(hb))


def _unknown_type(mtype: int, frame: int) -> DecodeError:
    return _fail(
        "msg_type",
        0,
        f"unknown message type {mtype} (0 new container, 1 content, 2 heartbeat)",
        frame,
    )


def decode(frames: Any, generation: Any, direction: Any) -> Message:
    """Decode one message from its frames as the container sees them (delimiter first)."""
    gen = as_generation(generation)
    d = as_direction(direction)
    views = _views(frames)
    n = len(views)
    if n == 0:
        raise _fail("delimiter", 0, "no frames (expected an empty delimiter frame first)", 0)
    if len(views[0]):
        raise _fail(
            "delimiter",
            0,
            f"expected an empty frame, got {len(views[0])} bytes (for a ROUTER-side "
            f"message, strip the identity with from_router first)",
            0,
        )
    if gen is G16:
        if d is IN:
            return _request_2016(views)
        if n == 4:
            return _new_container(views, gen)
        if n == 3:
            return _response_2016(views)
        raise _fail(
            "frames",
            0,
            f"a 2016 message to Clipper has 3 frames (prediction response) or 4 "
            f"(registration), got {n}",
            min(n, 4),
        )
    if d is OUT:
        _at_least(views, 2, f"a {gen.value} message to Clipper")
        mtype = _u32(views, 1, "msg_type")
        if mtype == 2:
            _need(views, 2, f"a {gen.value} heartbeat")
            return Heartbeat()
        if mtype == 0:
            return _new_container(views, gen)
        if mtype == 1:
            return _response_2017(views) if gen is G17 else _response_v3(views)
        raise _unknown_type(mtype, 1)
    base = 1
    if gen is V3:
        _at_least(views, 2, "a v3 message to the container")
        rpc = _u32(views, 1, "rpc_version")
        if rpc != RPC_VERSION:
            raise _fail("rpc_version", 0, f"expected {RPC_VERSION}, got {rpc}", 1)
        base = 2
    _at_least(views, base + 1, f"a {gen.value} message to the container")
    mtype = _u32(views, base, "msg_type")
    if mtype == 2:
        return _heartbeat_reply(views, base, gen)
    if mtype == 1:
        return _request_2017(views) if gen is G17 else _request_v3(views)
    if mtype == 0:
        raise _fail("msg_type", 0, "message type 0 (new container) is only sent to Clipper", base)
    raise _unknown_type(mtype, base)


# --- encode ----------------------------------------------------------------------------------


def _u(value: Any) -> dict[str, Any]:
    return {"value": value}


def to_container(msg: Message, generation: Any) -> tuple[dict[str, Any], Direction]:
    """Validate ``msg`` for ``generation`` and map it onto the fields of ``spec.MESSAGES``
    (used by encode and the tests); also return the direction it travels in."""
    gen = as_generation(generation)
    cls = type(msg)
    # (the branches go by the exact class, which the type checker is told with casts)
    if cls is NewContainer:
        reg = cast(NewContainer, msg)
        _, _, itype = registration_fields(reg, gen)
        c: dict[str, Any] = {
            "kind": "new_container",
            "model_name": _u(reg.model_name),
            "model_version": _u(reg.model_version),
            "input_type": _u(itype),
        }
        if gen is not G16:
            c["msg_type"] = _u(0)
        if gen is V3:
            c["rpc_version"] = _u(RPC_VERSION)
        return c, OUT
    if cls is Heartbeat or cls is HeartbeatReply:
        if gen is G16:
            raise EncodeError(PROTOCOL, "message", "2016 Clipper has no heartbeats")
        if cls is Heartbeat:
            return {"kind": "heartbeat", "msg_type": _u(2)}, OUT
        hb = check_u32(cast(HeartbeatReply, msg).heartbeat_type, "heartbeat_type")
        if hb > 1:
            raise EncodeError(
                PROTOCOL,
                "heartbeat_type",
                f"unknown heartbeat type {hb} (0 keep-alive, 1 request metadata)",
            )
        c = {"kind": "heartbeat_reply", "msg_type": _u(2), "heartbeat_type": _u(hb)}
        if gen is V3:
            c["rpc_version"] = _u(RPC_VERSION)
        return c, IN
    if cls is PredictRequest:
        return _request_container(cast(PredictRequest, msg), gen), IN
    if cls is PredictResponse:
        return _response_container(cast(PredictResponse, msg), gen), OUT
    raise EncodeError(PROTOCOL, "message", f"not a Clipper message: {cls.__name__}")


def _elements(values: np.ndarray) -> list[Any]:
    """The values to build: float32 as NumPy scalars (``spec.Float32l`` writes their bits, a
    signaling NaN included), anything else as Python numbers."""
    return list(values) if values.dtype == np.float32 else values.tolist()


def _request_container(msg: PredictRequest, gen: Generation) -> dict[str, Any]:
    msg_id = check_u32(msg.msg_id, "msg_id")
    rt = check_request_type(msg.request_type)
    itype = int(check_input_type(msg.input_type))
    items = normalize_inputs(msg.inputs, itype)
    n = len(items)
    if n == 0:
        raise EncodeError(PROTOCOL, "inputs", "no inputs (Clipper never sends an empty batch)")
    c: dict[str, Any] = {"kind": "predict_request", "msg_id": _u(msg_id), "request_type": _u(rt)}
    strings = itype == InputType.STRINGS
    if gen is V3:
        sizes = [len(x) if strings else x.nbytes for x in items]
        c["rpc_version"] = _u(RPC_VERSION)
        c["msg_type"] = _u(1)
        c["header_size"] = _u(8 * (n + 2))
        c["header"] = {"input_type": itype, "num_inputs": n, "sizes": sizes}
        if strings:
            c["inputs"] = [{"values": x.decode("utf-8")} for x in items]
        elif itype == InputType.BYTES:
            c["inputs"] = [{"values": x.tobytes()} for x in items]
        else:
            c["inputs"] = [{"values": _elements(x)} for x in items]
        return c
    if n > 0xFFFFFFFF:
        raise EncodeError(PROTOCOL, "inputs", f"{n} inputs do not fit the u32 count")
    if strings:
        for i, x in enumerate(items):
            if b"\0" in x:
                raise EncodeError(
                    PROTOCOL,
                    f"inputs[{i}]",
                    f"contains a NUL byte, which ends a string in {gen.value} content",
                )
        offsets = list(range(1, n))
        values: Any = [x.decode("utf-8") for x in items]
        content_size = sum(len(x) + 1 for x in items)
    else:
        offsets, total = [], 0
        for x in items[:-1]:
            total += len(x)
            offsets.append(total)
        if total + len(items[-1]) > 0xFFFFFFFF:
            raise EncodeError(
                PROTOCOL, "inputs", f"more than 4294967295 elements; {gen.value} offsets are u32"
            )
        flat = np.concatenate(items)
        values = flat.tobytes() if itype == InputType.BYTES else _elements(flat)
        content_size = flat.nbytes
    c["header"] = {"input_type": itype, "num_inputs": n, "offsets": offsets}
    c["content"] = {"values": values}
    if gen is G17:
        c["msg_type"] = _u(1)
        c["header_size"] = _u(4 * (n + 1))
        c["content_size"] = _u(content_size)
    return c


def _response_container(msg: PredictResponse, gen: Generation) -> dict[str, Any]:
    msg_id = check_u32(msg.msg_id, "msg_id")
    outs = normalize_outputs(msg.outputs, gen)
    n = len(outs)
    if n == 0:
        raise EncodeError(PROTOCOL, "outputs", "no outputs (a response has one per input)")
    c: dict[str, Any] = {"kind": "predict_response", "msg_id": _u(msg_id)}
    if gen is G16:
        c["outputs"] = {"outputs": _elements(outs)}
        return c
    c["msg_type"] = _u(1)
    lengths = [len(x) for x in outs]
    texts = [x.decode("utf-8") for x in outs]
    if gen is G17:
        for i, length in enumerate(lengths):
            if length > 0xFFFFFFFF:
                raise EncodeError(PROTOCOL, f"outputs[{i}]", "longer than 4 GiB - 1")
        c["payload"] = {"count": n, "lengths": lengths, "outputs": texts}
        return c
    c["header_size"] = _u(8 * (n + 1))
    c["header"] = {"count": n, "lengths": lengths}
    c["outputs"] = [_u(t) for t in texts]
    return c


def from_container(c: Container, generation: Any) -> Message:
    """Map a Container parsed by :func:`spec.parse` back to a message (test oracle)."""
    gen = as_generation(generation)
    kind = c.kind
    if kind == "heartbeat":
        return Heartbeat()
    if kind == "heartbeat_reply":
        return HeartbeatReply(HeartbeatType(c.heartbeat_type.value))
    if kind == "new_container":
        itype = InputType(c.input_type.value)
        rpc = c.rpc_version.value if gen is V3 else None
        return NewContainer(c.model_name.value, c.model_version.value, itype, rpc)
    if kind == "predict_response":
        if gen is G16:
            return PredictResponse(c.msg_id.value, np.array(c.outputs.outputs, OUTPUT_DTYPE))
        if gen is G17:
            return PredictResponse(c.msg_id.value, list(c.payload.outputs))
        return PredictResponse(c.msg_id.value, [o.value for o in c.outputs])
    itype = InputType(c.header.input_type)
    if gen is V3:
        if itype == InputType.STRINGS:
            inputs: Any = [x["values"] for x in c.inputs]
        else:
            inputs = [_array(x["values"], itype) for x in c.inputs]
        return PredictRequest(c.msg_id.value, itype, inputs)
    values = c.content["values"]
    if itype == InputType.STRINGS:
        return PredictRequest(c.msg_id.value, itype, list(values))
    flat = _array(values, itype)
    bounds = [0, *c.header.offsets, len(flat)]
    inputs = [flat[bounds[k] : bounds[k + 1]] for k in range(c.header.num_inputs)]
    return PredictRequest(c.msg_id.value, itype, inputs)


def _array(values: Any, itype: int) -> np.ndarray:
    if itype == InputType.BYTES:
        return np.frombuffer(bytes(values), np.uint8)
    return np.array(values, DTYPES[itype]).reshape(-1)


def encode(msg: Message, generation: Any) -> list[bytes]:
    """Encode one message to its frames as the container sees them (delimiter first)."""
    gen = as_generation(generation)
    c, direction = to_container(msg, gen)
    return spec.build(c, gen, direction)
