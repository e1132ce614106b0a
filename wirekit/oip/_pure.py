"""The pure-Python twin of the OIP mapping's hot path: an OIP request to MIP wire bytes, and
a MIP reply to OIP tensors.

``wirekit/_fast/oip.pyx`` is its Cython twin: same functions, same results, same errors
(class, field, offset and text) for the same input.  Both take every check from
:mod:`wirekit.oip.items` and :mod:`wirekit.oip.tensors`, in one order.
"""

from __future__ import annotations

import struct
from typing import Any

from wirekit.errors import DecodeError
from wirekit.mip.messages import Inference, Item

from .errors import BackendError
from .items import (
    MAX_TENSORS,
    U32_MAX,
    OipItem,
    read_json_object,
    read_request_item,
    read_tensor_item,
    request_item,
    split_rows,
    stack_rows,
    tensor_head,
)
from .messages import PROTOCOL, Buffer, InferRequest, Tensor
from .tensors import check_tensor

_MIP_HEAD = struct.Struct(">BBBBIBBH")
_ITEM_HEAD = struct.Struct(">II")


def _fail(field: str, offset: int, message: str) -> DecodeError:
    return DecodeError(PROTOCOL, field, offset, message)


def request_plan(
    req: InferRequest, rows: bool
) -> tuple[int, list[list[tuple[int, bytes, Buffer]]]]:
    """What :func:`request_to_mip` writes, checked: the items per input count and, per
    sample, each item as ``(type, head bytes, data buffer)`` (the item's data is the head
    followed by the buffer).  Shared by both twins, so their checks and errors are one."""
    if len(req.inputs) > MAX_TENSORS:
        raise _fail(
            "inputs",
            0,
            f"{len(req.inputs)} inputs, a MIP sample carries at most {MAX_TENSORS}",
        )
    request: tuple[int, bytes, Buffer] = (int(OipItem.REQUEST), request_item(req), b"")
    if rows:
        _count, row_tensors = split_rows(req.inputs, "inputs")
    else:
        for index, t in enumerate(req.inputs):
            check_tensor(t, f"inputs[{index}]")
        row_tensors = [req.inputs]
    samples: list[list[tuple[int, bytes, Buffer]]] = []
    for tensors in row_tensors:
        sample = [request]
        for index, t in enumerate(tensors):
            sample.append((int(OipItem.TENSOR), tensor_head(t, f"inputs[{index}]"), t.data))
        samples.append(sample)
    return 1 + len(req.inputs), samples


def request_to_mip(req: InferRequest, *, rows: bool = False) -> bytes:
    """The MIP inference request wire that carries ``req``: one sample (``rows=False``) of
    [REQUEST, TENSOR per input], or (``rows=True``) one such sample per row of dim 0.  The
    tensors are checked first (DecodeError naming the one that is wrong); their bytes are
    copied once, into the wire."""
    return _write(*request_plan(req, rows))


def _write(width: int, samples: list[list[tuple[int, bytes, Buffer]]]) -> bytes:
    """The MIP request wire of a checked plan (:func:`request_plan`)."""
    total = 4
    for sample in samples:
        for _type, head, data in sample:
            total += 8 + len(head) + memoryview(data).nbytes
    if total > U32_MAX:
        raise _fail("inputs", 0, f"a MIP message of {total} payload bytes, at most {U32_MAX}")
    pieces: list[Buffer] = [_MIP_HEAD.pack(0, 2, 0, 0, total, width, 0, len(samples))]
    for sample in samples:
        for kind, head, data in sample:
            pieces.append(_ITEM_HEAD.pack(kind, len(head) + memoryview(data).nbytes))
            pieces.append(head)
            pieces.append(data)
    return b"".join(pieces)


def _reply_sample(
    items: tuple[Item, ...], first: int
) -> tuple[list[Tensor], dict[str, Any] | None]:
    """One reply sample's outputs and parameters (None: it carries none)."""
    outputs = []
    parameters: dict[str, Any] | None = None
    for k, item in enumerate(items, first):
        field = f"items[{k}]"
        if item.type == OipItem.TENSOR:
            outputs.append(read_tensor_item(item.data, field))
        elif item.type in (OipItem.PARAMETERS, OipItem.REQUEST):
            if parameters is not None:
                raise _fail(field, 0, "a second parameters item in one sample")
            if item.type == OipItem.PARAMETERS:
                parameters = read_json_object(item.data, field)
            else:  # an echoed request: its parameters are the reply's
                parameters = read_request_item(item.data, field)[0]
        else:
            raise _fail(field, 0, f"item type {item.type:#x} is not one of an OIP reply")
    return outputs, parameters


def response_from_mip(msg: Any, *, rows: bool = False) -> tuple[list[Tensor], dict[str, Any]]:
    """The outputs and parameters a MIP backend's reply carries (the inverse of
    :func:`wirekit.oip.reply_to_mip`), tensor data memoryviews into the reply (no copy; rows
    of more than one sample are joined).  An ERROR item in any sample raises
    :class:`BackendError` with its message; a reply that is not the mapping, DecodeError.
    A REQUEST item is read as the reply's parameters: an echoed request answers its inputs
    and parameters back."""
    if not isinstance(msg, Inference):
        raise _fail("reply", 0, f"not a MIP inference reply: {type(msg).__name__}")
    for item in msg.items:
        if item.type == OipItem.ERROR:
            raise BackendError(bytes(item.data).decode("utf-8", "replace"))
    width = msg.width
    if msg.batch_size == 0:
        raise _fail("batch_size", 0, "a reply with no samples")
    if not rows and msg.batch_size != 1:
        raise _fail("batch_size", 0, f"{msg.batch_size} samples, a reply in sample mode holds one")
    samples = []
    parameters: dict[str, Any] | None = None
    for s in range(msg.batch_size):
        outputs, found = _reply_sample(msg.items[s * width : (s + 1) * width], s * width)
        if s and found != parameters:
            raise _fail(
                f"items[{s * width}]", 0, f"rows: sample {s} has other parameters than sample 0"
            )
        parameters = found
        samples.append(outputs)
    if rows:
        return stack_rows(samples, "items"), parameters or {}
    return samples[0], parameters or {}


__all__ = ["BackendError", "request_plan", "request_to_mip", "response_from_mip"]
