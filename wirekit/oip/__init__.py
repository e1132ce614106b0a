"""The Open Inference Protocol (OIP, "KServe v2"): message types, REST and binary codecs, and
the lossless mapping onto MIP items (specs/oip.md)."""

from .messages import (
    BY_CODE,
    DATATYPES,
    PROTOCOL,
    Datatype,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
)

__all__ = [
    "BY_CODE",
    "DATATYPES",
    "PROTOCOL",
    "Datatype",
    "InferRequest",
    "InferResponse",
    "RequestedOutput",
    "Tensor",
]
