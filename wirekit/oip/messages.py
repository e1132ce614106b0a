"""Open Inference Protocol (OIP, "KServe v2") message types, shared by every twin and door.

A tensor is held the way the binary tensor data extension carries it, whatever form it
arrived in (JSON ``data``, the binary extension, gRPC ``raw_input_contents`` or typed
``contents``): its raw bytes, little-endian, row-major; a BYTES tensor as its elements one
after another, each a 4-byte little-endian length and that many bytes.  So one tensor has one
byte form, which the MIP mapping (:mod:`wirekit.oip.mapping`) carries untouched and every
door writes back out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

PROTOCOL = "oip"

Buffer = bytes | bytearray | memoryview


class Datatype(NamedTuple):
    """One OIP datatype: its name on the wire, its number in wirekit's TENSOR item (``code``),
    the bytes of one element (0: BYTES, variable) and NumPy's little-endian dtype for it
    (BF16 has none in NumPy: its elements are read as ``<u2``)."""

    name: str
    code: int
    size: int
    numpy: str


#: every OIP datatype, by name, in the order of their codes (1..14)
DATATYPES: dict[str, Datatype] = {
    d.name: d
    for d in (
        Datatype("BOOL", 1, 1, "?"),
        Datatype("UINT8", 2, 1, "u1"),
        Datatype("UINT16", 3, 2, "<u2"),
        Datatype("UINT32", 4, 4, "<u4"),
        Datatype("UINT64", 5, 8, "<u8"),
        Datatype("INT8", 6, 1, "i1"),
        Datatype("INT16", 7, 2, "<i2"),
        Datatype("INT32", 8, 4, "<i4"),
        Datatype("INT64", 9, 8, "<i8"),
        Datatype("FP16", 10, 2, "<f2"),
        Datatype("FP32", 11, 4, "<f4"),
        Datatype("FP64", 12, 8, "<f8"),
        Datatype("BF16", 13, 2, "<u2"),
        Datatype("BYTES", 14, 0, "O"),
    )
}
#: datatype code -> datatype
BY_CODE: dict[int, Datatype] = {d.code: d for d in DATATYPES.values()}


@dataclass(slots=True)
class Tensor:
    """One named tensor of a request or a response.

    ``data``: the raw bytes (see the module docstring); decoded binary data is a
    ``memoryview`` into the buffer it came in (no copy).  ``parameters``: the tensor's own
    OIP parameters (``binary_data_size`` and ``binary_data`` are the transport's, not kept)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Buffer
    parameters: dict[str, Any] = field(default_factory=dict)

    def element_count(self) -> int:
        """The elements its shape holds (1 for a scalar shape ``()``)."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(slots=True)
class RequestedOutput:
    """One entry of a request's ``outputs``: a name, and its parameters (``binary_data``)."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    """An OIP inference request: ``id`` (None when the client sent none), the input tensors,
    the outputs asked for (empty: all of them) and the request's parameters."""

    inputs: list[Tensor]
    id: str | None = None
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferResponse:
    """An OIP inference response."""

    model_name: str
    outputs: list[Tensor]
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


__all__ = [
    "BY_CODE",
    "DATATYPES",
    "PROTOCOL",
    "Buffer",
    "Datatype",
    "InferRequest",
    "InferResponse",
    "RequestedOutput",
    "Tensor",
]
