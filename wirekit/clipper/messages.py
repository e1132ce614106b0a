"""Clipper model-container RPC message types, shared by the Cython twin and the pure path.

One set of classes covers all three generations (2016 legacy, 2017, RPC v3) and both
directions; which frames a message becomes depends on the generation it is encoded for.

Equality of messages that carry NumPy data (:class:`PredictRequest`,
:class:`PredictResponse`) is *wire equality*: two messages are equal when they have the same
scalar fields and their data would go on the wire as the same bytes.  So a decoded 2-D
``(n, L)`` array equals a list of its ``n`` rows, and ``[[1, 2]]`` equals
``np.array([[1, 2]], dtype=np.int32)`` for an ``INTS`` request.  Those two classes are not
hashable.  :func:`same_message` is the same comparison as a function.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any

import numpy as np

from wirekit.errors import EncodeError

PROTOCOL = "clipper"

#: The version number RPC v3 puts on every message to a container and at the end of
#: a registration.
RPC_VERSION = 3


class Generation(str, Enum):
    """The three incompatible wire generations of Clipper's container RPC."""

    G2016 = "2016"  #: no message types, no heartbeats (ucbrise/clipper f5f76d05)
    G2017 = "2017"  #: message types and heartbeats (9f396e0e, up to May 2018)
    V3 = "v3"  #: RPC_VERSION = 3 (80c97d27 to the final release)


class Direction(str, Enum):
    """Who sends a message."""

    TO_CLIPPER = "to_clipper"  #: container -> Clipper (the DEALER sends)
    TO_CONTAINER = "to_container"  #: Clipper -> container (the ROUTER sends)


class InputType(IntEnum):
    """Input type codes, the same in every generation."""

    BYTES = 0
    INTS = 1
    FLOATS = 2
    DOUBLES = 3
    STRINGS = 4


class MessageType(IntEnum):
    """The message-type frame of 2017 and v3."""

    NEW_CONTAINER = 0
    CONTAINER_CONTENT = 1
    HEARTBEAT = 2


class HeartbeatType(IntEnum):
    """What Clipper's heartbeat answer asks of the container."""

    KEEPALIVE = 0
    REQUEST_CONTAINER_METADATA = 1


class RequestType(IntEnum):
    """The request-type frame of a request.  Only PREDICT has a defined body."""

    PREDICT = 0
    FEEDBACK = 1


#: Wire dtype (little-endian) of each numeric input type.
DTYPES: dict[int, np.dtype] = {
    InputType.BYTES: np.dtype("u1"),
    InputType.INTS: np.dtype("<i4"),
    InputType.FLOATS: np.dtype("<f4"),
    InputType.DOUBLES: np.dtype("<f8"),
}
#: The 2016 prediction response: one float32 per input.
OUTPUT_DTYPE = np.dtype("<f4")


@dataclass(frozen=True, slots=True)
class NewContainer:
    """A container's registration (its first message; ``REQUEST_CONTAINER_METADATA`` answer).

    ``model_version`` is text: 2017 and v3 Clipper keep it as an opaque string; 2016 Clipper
    parses it with ``std::stoi``, so a 2016 registration needs it to start with an integer.
    ``rpc_version`` is 3 for v3 (encoding ``None`` for v3 writes 3) and ``None`` otherwise.
    """

    model_name: str
    model_version: str
    input_type: InputType
    rpc_version: int | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A container's heartbeat (2017, v3): ``["", 2]``."""


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    """Clipper's answer to a heartbeat (2017, v3)."""

    heartbeat_type: HeartbeatType


@dataclass(frozen=True, slots=True, eq=False)
class PredictRequest:
    """A batch of inputs for the model (Clipper -> container).

    Decoded ``inputs`` are, for numeric types, a 2-D ``(n, L)`` array when every input has
    the same length ``L`` and otherwise a list of 1-D arrays; both view the frames (v3's
    equal-length inputs arrive in separate frames and are copied into one array).  Bytes
    inputs are ``uint8`` arrays; strings are a ``list[str]``.  To encode, pass any of those,
    or lists of numbers, or ``bytes`` for ``BYTES`` inputs.  Equality is wire equality.
    """

    msg_id: int
    input_type: InputType
    inputs: Any
    request_type: int = 0

    def __eq__(self, other: object) -> bool:
        return same_message(self, other) if type(other) is PredictRequest else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        """The number of inputs."""
        return len(self.inputs)

    def input_list(self) -> list[Any]:
        """The inputs as a list: one 1-D array (or ``str``) per input."""
        return list(self.inputs)


@dataclass(frozen=True, slots=True, eq=False)
class PredictResponse:
    """The model's outputs for one request (container -> Clipper), one per input.

    2016: a float32 array (or anything convertible); 2017 and v3: a list of ``str``.
    ``msg_id`` echoes the request's.  Equality is wire equality.
    """

    msg_id: int
    outputs: Any

    def __eq__(self, other: object) -> bool:
        return same_message(self, other) if type(other) is PredictResponse else NotImplemented

    __hash__ = None  # type: ignore[assignment]


Message = NewContainer | Heartbeat | HeartbeatReply | PredictRequest | PredictResponse


# --- normalisation shared by both twins (encode side and equality) -------------------------


def as_generation(value: Any) -> Generation:
    """``value`` (a :class:`Generation` or its string) as a Generation, else ValueError."""
    try:
        return Generation(value)
    except ValueError:
        raise ValueError(
            f"unknown Clipper generation {value!r} (expected '2016', '2017' or 'v3')"
        ) from None


def as_direction(value: Any) -> Direction:
    """``value`` (a :class:`Direction` or its string) as a Direction, else ValueError."""
    try:
        return Direction(value)
    except ValueError:
        raise ValueError(
            f"unknown direction {value!r} (expected 'to_clipper' or 'to_container')"
        ) from None


def check_u32(value: Any, field: str) -> int:
    """``value`` if it is an int in 0..2**32-1, else EncodeError."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise EncodeError(PROTOCOL, field, f"expected an int, got {type(value).__name__}")
    if not 0 <= value <= 0xFFFFFFFF:
        raise EncodeError(PROTOCOL, field, f"{value} is out of range 0..4294967295")
    return int(value)


def check_input_type(value: Any) -> InputType:
    """``value`` as an :class:`InputType`, else EncodeError."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 4:
        raise EncodeError(PROTOCOL, "input_type", f"{value!r} is not an input type 0..4")
    return InputType(value)


_STOI_PREFIX = re.compile(rb"[ \t\n\v\f\r]*[+-]?[0-9]")


def stoi_prefix(data: bytes) -> bool:
    """True when ``std::stoi`` finds an integer at the start of ``data`` (2016 versions)."""
    return _STOI_PREFIX.match(data) is not None


def _text(value: Any, field: str) -> bytes:
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise EncodeError(PROTOCOL, field, f"not encodable as UTF-8: {exc.reason}") from None
    raise EncodeError(PROTOCOL, field, f"expected str, got {type(value).__name__}")


def registration_fields(msg: NewContainer, generation: Generation) -> tuple[bytes, bytes, int]:
    """Validated ``(name, version, input_type)`` of a registration for ``generation``."""
    name = _text(msg.model_name, "model_name")
    version = _text(msg.model_version, "model_version")
    if generation is Generation.G2016 and not stoi_prefix(version):
        raise EncodeError(
            PROTOCOL,
            "model_version",
            f"2016 Clipper parses the version with std::stoi; {msg.model_version!r} does "
            f"not start with an integer",
        )
    itype = check_input_type(msg.input_type)
    if generation is Generation.V3:
        if msg.rpc_version not in (None, RPC_VERSION):
            raise EncodeError(
                PROTOCOL,
                "rpc_version",
                f"v3 peers accept only {RPC_VERSION}, got {msg.rpc_version!r}",
            )
    elif msg.rpc_version is not None:
        raise EncodeError(
            PROTOCOL,
            "rpc_version",
            f"a {generation.value} registration has no version frame (got {msg.rpc_version!r})",
        )
    return name, version, int(itype)


def check_request_type(value: Any) -> int:
    """A request type that can be encoded (only 0, predict), else EncodeError."""
    rt = check_u32(value, "request_type")
    if rt == RequestType.FEEDBACK:
        raise EncodeError(
            PROTOCOL,
            "request_type",
            "feedback requests (type 1) have no defined body; Clipper never sends them",
        )
    if rt != RequestType.PREDICT:
        raise EncodeError(PROTOCOL, "request_type", f"unknown request type {rt} (0 predict)")
    return rt


def _cast(a: np.ndarray, dtype: np.dtype, field: str, what: str) -> np.ndarray:
    """``a`` as a C-contiguous array of ``dtype`` if the values fit, else EncodeError."""
    if a.dtype == dtype:
        return np.ascontiguousarray(a)
    if a.size == 0 and a.dtype.kind in "iufb":
        return np.zeros(a.shape, dtype)
    kind = a.dtype.kind
    if dtype.kind in "iu" and kind in "iu":
        info = np.iinfo(dtype)
        if a.min() < info.min or a.max() > info.max:
            raise EncodeError(PROTOCOL, field, f"values out of range for {what} ({dtype.name})")
        return np.ascontiguousarray(a, dtype)
    if dtype.kind == "f" and kind in "iuf":
        with np.errstate(over="raise"):
            try:
                return np.ascontiguousarray(a, dtype)
            except FloatingPointError:
                raise EncodeError(
                    PROTOCOL, field, f"values out of range for {what} ({dtype.name})"
                ) from None
    raise EncodeError(PROTOCOL, field, f"cannot send {a.dtype.name} values as {what}")


def _one_input(x: Any, itype: int, index: int) -> np.ndarray:
    dtype = DTYPES[itype]
    field = f"inputs[{index}]"
    if itype == InputType.BYTES and isinstance(x, bytes | bytearray | memoryview):
        view = memoryview(x)
        if not view.c_contiguous:
            raise EncodeError(PROTOCOL, field, "not a contiguous buffer")
        return np.frombuffer(
            view.cast("B") if view.ndim != 1 or view.format != "B" else view, np.uint8
        )
    if isinstance(x, str | bytes | bytearray | memoryview):
        raise EncodeError(
            PROTOCOL, field, f"expected numbers for {InputType(itype).name}, got {type(x).__name__}"
        )
    try:
        a = np.asarray(x)
    except (ValueError, TypeError) as exc:
        raise EncodeError(PROTOCOL, field, f"not an array of numbers: {exc}") from None
    if a.ndim != 1:
        raise EncodeError(PROTOCOL, field, f"expected a 1-D array, got shape {a.shape}")
    return _cast(a, dtype, field, InputType(itype).name)


def normalize_inputs(inputs: Any, input_type: Any) -> list[Any]:
    """The inputs of a request as a list of C-contiguous wire-dtype 1-D arrays (numeric
    types) or of UTF-8 ``bytes`` (strings).  EncodeError when they cannot be sent."""
    itype = int(check_input_type(input_type))
    if itype == InputType.STRINGS:
        if isinstance(inputs, str | bytes | bytearray | memoryview) or not isinstance(
            inputs, Sequence | np.ndarray
        ):
            raise EncodeError(
                PROTOCOL, "inputs", f"expected a sequence of strings, got {type(inputs).__name__}"
            )
        return [_text(s, f"inputs[{i}]") for i, s in enumerate(inputs)]
    if isinstance(inputs, np.ndarray) and inputs.dtype != object:
        if inputs.ndim != 2:
            raise EncodeError(
                PROTOCOL,
                "inputs",
                f"expected a 2-D array (one row per input) or a list of 1-D arrays, got "
                f"shape {inputs.shape}",
            )
        whole = _cast(inputs, DTYPES[itype], "inputs", InputType(itype).name)
        return list(whole)
    if isinstance(inputs, str | bytes | bytearray | memoryview) or not isinstance(
        inputs, Sequence | np.ndarray
    ):
        raise EncodeError(
            PROTOCOL, "inputs", f"expected a sequence of inputs, got {type(inputs).__name__}"
        )
    return [_one_input(x, itype, i) for i, x in enumerate(inputs)]


def normalize_outputs(outputs: Any, generation: Generation) -> Any:
    """2016: the outputs as a C-contiguous float32 array; 2017/v3: a list of UTF-8 bytes."""
    if generation is Generation.G2016:
        if isinstance(outputs, str | bytes | bytearray | memoryview):
            raise EncodeError(
                PROTOCOL, "outputs", f"expected float32 values, got {type(outputs).__name__}"
            )
        try:
            a = np.asarray(outputs)
        except (ValueError, TypeError) as exc:
            raise EncodeError(PROTOCOL, "outputs", f"not an array of numbers: {exc}") from None
        if a.ndim != 1:
            raise EncodeError(PROTOCOL, "outputs", f"expected a 1-D array, got shape {a.shape}")
        return _cast(a, OUTPUT_DTYPE, "outputs", "float32 outputs")
    if isinstance(outputs, str | bytes | bytearray | memoryview) or not isinstance(
        outputs, Sequence | np.ndarray
    ):
        raise EncodeError(
            PROTOCOL, "outputs", f"expected a sequence of strings, got {type(outputs).__name__}"
        )
    return [_text(s, f"outputs[{i}]") for i, s in enumerate(outputs)]


# --- wire equality ---------------------------------------------------------------------------


def _wire_inputs(msg: PredictRequest) -> Any:
    try:
        return [
            x if isinstance(x, bytes) else x.tobytes()
            for x in normalize_inputs(msg.inputs, msg.input_type)
        ]
    except EncodeError:
        return _Unequal()


def _wire_outputs(msg: PredictResponse) -> Any:
    out = msg.outputs
    numeric = isinstance(out, np.ndarray) and out.dtype != object
    if not numeric and isinstance(out, Sequence) and not isinstance(out, str | bytes):
        numeric = len(out) > 0 and all(
            isinstance(v, int | float | np.number) and not isinstance(v, bool) for v in out
        )
    try:
        if numeric:
            return ("f4", normalize_outputs(out, Generation.G2016).tobytes())
        return ("text", normalize_outputs(out, Generation.G2017))
    except EncodeError:
        return _Unequal()


class _Unequal:
    """Stands for data that cannot be put on the wire: equal to nothing, itself included."""

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


def same_message(a: Any, b: Any) -> bool:
    """Wire equality of two messages (what ``==`` does for every message class)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, PredictRequest):
        if (a.msg_id, a.request_type, a.input_type) != (b.msg_id, b.request_type, b.input_type):
            return False
        return a is b or _wire_inputs(a) == _wire_inputs(b)
    if isinstance(a, PredictResponse):
        return a.msg_id == b.msg_id and (a is b or _wire_outputs(a) == _wire_outputs(b))
    return a == b


# --- a JSON-ready description (CLI --json, golden vectors) -----------------------------------


def _values(arr: np.ndarray, full: bool) -> list[Any]:
    vals = arr if full else arr[:8]
    return [float(v) if arr.dtype.kind == "f" else int(v) for v in vals]


def to_jsonable(msg: Message, *, full_data: bool = True) -> dict[str, Any]:
    """A JSON-ready description of ``msg``; ``full_data=False`` shows at most 8 values."""
    if isinstance(msg, NewContainer):
        return {
            "kind": "new_container",
            "model_name": msg.model_name,
            "model_version": msg.model_version,
            "input_type": int(msg.input_type),
            "input_type_name": InputType(msg.input_type).name,
            "rpc_version": msg.rpc_version,
        }
    if isinstance(msg, Heartbeat):
        return {"kind": "heartbeat"}
    if isinstance(msg, HeartbeatReply):
        return {
            "kind": "heartbeat_reply",
            "heartbeat_type": int(msg.heartbeat_type),
            "heartbeat_type_name": HeartbeatType(msg.heartbeat_type).name,
        }
    if isinstance(msg, PredictRequest):
        itype = InputType(msg.input_type)
        out: dict[str, Any] = {
            "kind": "predict_request",
            "msg_id": msg.msg_id,
            "request_type": msg.request_type,
            "input_type": int(itype),
            "input_type_name": itype.name,
            "num_inputs": len(msg.inputs),
        }
        if itype == InputType.STRINGS:
            out["inputs"] = [s if full_data else s[:64] for s in msg.inputs]
            return out
        if isinstance(msg.inputs, np.ndarray) and msg.inputs.ndim == 2:
            out["shape"] = list(msg.inputs.shape)
        out["dtype"] = DTYPES[itype].name
        out["inputs"] = [
            {"size": int(np.asarray(x).size), "values": _values(np.asarray(x), full_data)}
            for x in msg.inputs
        ]
        return out
    if isinstance(msg, PredictResponse):
        outs = msg.outputs
        if isinstance(outs, np.ndarray) and outs.dtype != object:
            values: list[Any] = _values(outs, full_data)
        else:
            values = [s if full_data else s[:64] for s in outs]
        return {"kind": "predict_response", "msg_id": msg.msg_id, "outputs": values}
    raise TypeError(f"not a Clipper message: {type(msg).__name__}")
