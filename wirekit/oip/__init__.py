"""The Open Inference Protocol (OIP, "KServe v2"): message types, REST and binary codecs, and
the lossless mapping onto MIP items (specs/oip.md).

``request_to_mip`` and ``response_from_mip`` (the doors' hot path) come from the Cython twin
(``wirekit/_fast/oip.pyx``) unless ``WIREKIT_PURE=1`` or it is not built; ``IMPLEMENTATION``
tells which.  Everything else is the same code for both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wirekit._impl import lazy_codec

from . import _pure
from .errors import BackendError
from .items import OipItem
from .mapping import (
    error_to_mip,
    mip_item_count,
    mip_to_request,
    reply_sample,
    reply_to_mip,
    request_from_sample,
    select_outputs,
)
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
from .rest import (
    HEADER_LENGTH,
    binary_outputs,
    decode_rest_request,
    decode_rest_response,
    encode_rest_request,
    encode_rest_response,
)
from .tensors import check_tensor, tensor_from_json, tensor_to_json_data

#: The mapping's hot path, bound from the Cython twin (or the pure one) on first use.
_API = ("request_to_mip", "response_from_mip")
__getattr__ = lazy_codec(globals(), "oip", _pure, _API)

#: ``request_to_mip(req, *, rows=False) -> bytes``: the MIP request wire carrying ``req``
request_to_mip: Callable[..., bytes]
#: ``response_from_mip(msg, *, rows=False) -> (outputs, parameters)``; BackendError when
#: the backend answered an ERROR item
response_from_mip: Callable[..., tuple[list[Tensor], dict[str, Any]]]
#: ``"fast"`` (Cython) or ``"pure"``: which twin the two functions above come from
IMPLEMENTATION: str

__all__ = [
    "BY_CODE",
    "DATATYPES",
    "HEADER_LENGTH",
    "IMPLEMENTATION",
    "PROTOCOL",
    "BackendError",
    "Datatype",
    "InferRequest",
    "InferResponse",
    "OipItem",
    "RequestedOutput",
    "Tensor",
    "binary_outputs",
    "check_tensor",
    "decode_rest_request",
    "decode_rest_response",
    "encode_rest_request",
    "encode_rest_response",
    "error_to_mip",
    "mip_item_count",
    "mip_to_request",
    "reply_sample",
    "reply_to_mip",
    "request_from_sample",
    "request_to_mip",
    "response_from_mip",
    "select_outputs",
    "tensor_from_json",
    "tensor_to_json_data",
]
