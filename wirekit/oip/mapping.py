"""The lossless mapping between OIP requests/replies and MIP messages (specs/oip.md): the
side a MIP model uses (:func:`mip_to_request`, :func:`reply_to_mip`, :func:`error_to_mip`)
and the door's helpers around the twins' hot path (``request_to_mip``,
``response_from_mip``, bound in :mod:`wirekit.oip` from the compiled twin or the pure one).

Two rules, chosen per model (config key ``tensors``):

- ``"sample"`` (``rows=False``): the whole OIP request is ONE MIP sample, [REQUEST item,
  TENSOR item per input]; the reply one sample, [TENSOR item per output, optionally a
  PARAMETERS item] or [ERROR item].
- ``"rows"`` (``rows=True``): dim 0 of every input is the batch, each row one MIP sample
  [REQUEST item, TENSOR item per input row (shape without dim 0)], every sample carrying the
  same REQUEST item; the reply one sample per row, its outputs' rows stacked back.
"""

from __future__ import annotations

from typing import Any

from wirekit.errors import DecodeError
from wirekit.mip.messages import Inference, Item

from .items import (
    MAX_TENSORS,
    OipItem,
    parameters_item,
    read_request_item,
    read_tensor_item,
    split_rows,
    stack_rows,
    tensor_head,
)
from .messages import PROTOCOL, InferRequest, RequestedOutput, Tensor
from .tensors import check_tensor


def _fail(field: str, offset: int, message: str) -> DecodeError:
    return DecodeError(PROTOCOL, field, offset, message)


def request_from_sample(items: tuple[Item, ...] | list[Item], first: int = 0) -> InferRequest:
    """The OIP request one MIP sample carries ([REQUEST item, TENSOR items]); ``first`` is the
    index of its first item in the message (for error fields).  Tensor data are memoryviews
    into the items' data."""
    request: Item | None = None
    inputs = []
    for k, item in enumerate(items, first):
        if item.type == OipItem.TENSOR:
            inputs.append(read_tensor_item(item.data, f"items[{k}]"))
        elif item.type == OipItem.REQUEST and request is None:
            request = item
        else:
            raise _fail(f"items[{k}]", 0, f"item type {item.type:#x} is not one of an OIP request")
    if request is None:
        raise _fail(f"items[{first}]", 0, "a sample without a REQUEST item")
    parameters, outputs = read_request_item(request.data, f"items[{first}]")
    return InferRequest(inputs=inputs, outputs=outputs, parameters=parameters)


def mip_to_request(msg: Inference, *, rows: bool = False) -> InferRequest:
    """The OIP request a MIP request message carries: what a MIP model sees (the inverse of
    ``request_to_mip``; the request ``id`` stays at the door).  ``rows=False``: the message
    must hold one sample; ``rows=True``: its samples are the rows, stacked along dim 0, and
    must all carry the same REQUEST item."""
    if not isinstance(msg, Inference):
        raise _fail("request", 0, f"not a MIP inference request: {type(msg).__name__}")
    width = msg.width
    if msg.batch_size == 0 or width == 0:
        raise _fail("batch_size", 0, "a request with no items")
    if not rows and msg.batch_size != 1:
        raise _fail(
            "batch_size", 0, f"{msg.batch_size} samples, a request in sample mode holds one"
        )
    requests = [
        request_from_sample(msg.items[s * width : (s + 1) * width], s * width)
        for s in range(msg.batch_size)
    ]
    first = requests[0]
    for s, other in enumerate(requests[1:], 1):
        if (other.parameters, other.outputs) != (first.parameters, first.outputs):
            raise _fail(
                f"items[{s * width}]", 0, f"rows: sample {s} carries another request than sample 0"
            )
    if rows:
        first.inputs = stack_rows([r.inputs for r in requests], "items")
    return first


def reply_sample(outputs: list[Tensor], parameters: dict[str, Any] | None = None) -> list[Item]:
    """One reply sample's items: a TENSOR item per output, then a PARAMETERS item when there
    are parameters.  The outputs are checked (DecodeError naming the one that is wrong)."""
    if len(outputs) > MAX_TENSORS:
        raise _fail(
            "outputs", 0, f"{len(outputs)} outputs, a MIP sample carries at most {MAX_TENSORS}"
        )
    items = []
    for index, t in enumerate(outputs):
        check_tensor(t, f"outputs[{index}]")
        head = tensor_head(t, f"outputs[{index}]")
        items.append(Item(int(OipItem.TENSOR), b"".join((head, t.data))))
    if parameters:
        items.append(Item(int(OipItem.PARAMETERS), parameters_item(parameters)))
    return items


def reply_to_mip(
    outputs: list[Tensor],
    parameters: dict[str, Any] | None = None,
    *,
    rows: bool = False,
    n_input: int = 0,
) -> Inference:
    """A MIP model's answer to an OIP request: ``rows=False`` one sample of the outputs (and
    ``parameters``); ``rows=True`` one sample per row of dim 0 of the outputs, each with the
    parameters.  ``n_input`` is the request's, echoed as MIP servers do."""
    if rows:
        _count, row_outputs = split_rows(outputs, "outputs")
    else:
        row_outputs = [outputs]
    return Inference.reply([reply_sample(o, parameters) for o in row_outputs], n_input)


def error_to_mip(message: str, *, batch_size: int = 1, n_input: int = 0) -> Inference:
    """A MIP model's answer that the request failed, with the message the client will read:
    one ERROR item per sample (``batch_size``: the request's samples, for rows)."""
    item = Item(int(OipItem.ERROR), message.encode("utf-8", "replace"))
    return Inference.reply([[item]] * batch_size, n_input)


def select_outputs(outputs: list[Tensor], requested: list[RequestedOutput]) -> list[Tensor]:
    """The outputs the request asked for, in its order (``requested`` empty: all of them).
    A requested name the model did not answer is a DecodeError naming it."""
    if not requested:
        return list(outputs)
    by_name = {t.name: t for t in outputs}
    chosen = []
    for index, r in enumerate(requested):
        found = by_name.get(r.name)
        if found is None:
            raise _fail(f"outputs[{index}].name", 0, f'unknown output "{r.name}"')
        chosen.append(found)
    return chosen


def mip_item_count(req: InferRequest, *, rows: bool) -> int:
    """The MIP items ``request_to_mip`` makes of ``req`` (to check against a MIP limit before
    building the message): 1 + inputs, times the rows of dim 0 with ``rows``."""
    width = 1 + len(req.inputs)
    if rows and req.inputs and req.inputs[0].shape:
        return width * max(req.inputs[0].shape[0], 0)
    return width


__all__ = [
    "error_to_mip",
    "mip_item_count",
    "mip_to_request",
    "reply_sample",
    "reply_to_mip",
    "request_from_sample",
    "select_outputs",
]
