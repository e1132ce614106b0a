"""What the MIP server and clients share, without any I/O: addresses, value conversion,
the runtime exceptions and the reply checks.

Sockets and ``asyncio`` live in :mod:`wirekit.mip.server` and :mod:`wirekit.mip.client` only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from wirekit import mip
from wirekit._impl import load_fast
from wirekit.errors import DecodeError, EncodeError, WirekitError

from .messages import (
    DEFAULT_MAX_ITEMS,
    PROTOCOL,
    ErrorCode,
    ErrorReply,
    Inference,
    Item,
    ItemType,
    Message,
)

log = logging.getLogger("wirekit.mip")

#: A batch as the server hands it to a handler and a client returns it: per sample, its items.
Batch = tuple[tuple[Item, ...], ...]

_BUFFERS = (bytes, bytearray, memoryview)


# --------------------------------------------------------------------------- addresses


def parse_address(address: str) -> tuple[str, tuple[str, int] | str]:
    """``tcp://host:port`` -> ``("tcp", (host, port))``; ``unix:///path`` -> ``("unix", path)``.

    IPv6 hosts go in brackets (``tcp://[::1]:5000``).  Port 0 asks the system for a free port.
    """
    if not isinstance(address, str):
        raise TypeError(f"address must be a str like 'tcp://127.0.0.1:5000', not {address!r}")
    parts = urlsplit(address)
    if parts.scheme == "tcp":
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None:
            raise ValueError(f"bad MIP address {address!r}: expected tcp://host:port")
        return "tcp", (parts.hostname, port)
    if parts.scheme == "unix":
        path = (parts.netloc or "") + parts.path  # unix:///abs/path or unix://rel/path
        if not path:
            raise ValueError(f"bad MIP address {address!r}: expected unix:///path/to/socket")
        return "unix", path
    raise ValueError(f"bad MIP address {address!r}: the scheme must be tcp:// or unix://")


def format_address(family: str, sockname: Any) -> str:
    """The ``tcp://``/``unix://`` form of a bound socket's name."""
    if family == "unix":
        return f"unix://{sockname}"
    host, port = sockname[0], sockname[1]
    if ":" in host:
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


# --------------------------------------------------------------------------- values


_TEXT, _JSON, _IMAGE = int(ItemType.TEXT), int(ItemType.JSON), int(ItemType.IMAGE)
_new_item = tuple.__new__


def to_item(value: Any) -> Item:
    """A typed item from a Python value.

    An :class:`Item` is taken as is; ``str`` becomes TEXT; ``bytes``/``bytearray``/
    ``memoryview`` become IMAGE (an encoded image file); anything else is serialised as JSON
    (use ``Item.json("...")`` for a JSON string).  The value itself is never modified.
    """
    cls = type(value)
    if cls is Item:
        return value
    if cls is str:
        return _new_item(Item, (_TEXT, value.encode("utf-8")))
    if isinstance(value, Item):
        return Item(value.type, value.data)
    if isinstance(value, _BUFFERS):
        return _new_item(Item, (_IMAGE, value))
    if isinstance(value, str):
        return _new_item(Item, (_TEXT, str(value).encode("utf-8")))
    try:
        return Item.json(value)
    except (TypeError, ValueError) as exc:
        raise EncodeError(PROTOCOL, "item", f"cannot send {cls.__name__} as JSON: {exc}") from None


def item_value(item: Item) -> Any:
    """The Python value of an item: TEXT -> ``str``, JSON -> parsed, anything else -> ``bytes``."""
    if item.type == ItemType.TEXT:
        return item.as_text()
    if item.type == ItemType.JSON:
        return item.as_json()
    return item.as_bytes()


_SINGLE = (str, dict, Item, *_BUFFERS)


class _Ragged(Exception):
    def __init__(self, sample: int, got: int, width: int) -> None:
        self.sample, self.got, self.width = sample, got, width


def _flatten_py(samples: Iterable[Any]) -> tuple[tuple[Item, ...], int, int]:
    """Items of every sample in order, items per sample, and the number of samples.

    A sample is a list/tuple (or other iterable) of values, or one bare value (str, bytes,
    dict, Item) for a one-item sample.  Raises ``_Ragged`` if the samples differ in width.
    """
    items: list[Item] = []
    add = items.append
    width = -1
    n = 0
    for sample in samples:
        cls = type(sample)
        if cls is list or cls is tuple:
            values = sample
        elif isinstance(sample, _SINGLE):
            values = (sample,)
        else:
            values = tuple(sample)
        w = len(values)
        if w != width:
            if width != -1:
                raise _Ragged(n, w, width)
            width = w
        for v in values:
            t = type(v)
            if t is Item:
                add(v)
            elif t is str:
                add(_new_item(Item, (_TEXT, v.encode("utf-8"))))
            else:
                add(to_item(v))
        n += 1
    return tuple(items), max(width, 0), n


def _new_inference_py(
    response: bool, n_input: int, n_output: int, batch_size: int, items: tuple[Item, ...]
) -> Inference:
    return Inference(response, n_input, n_output, batch_size, items)


def _singles_py(items: tuple[Item, ...]) -> Batch:
    return tuple([(it,) for it in items])


def _start_py(coro: Any) -> tuple[bool, Any]:
    """Run a coroutine to its first suspension: ``(True, result)`` if it returned without
    suspending, ``(False, yielded)`` if it suspended; what it raises propagates."""
    try:
        first = coro.send(None)
    except StopIteration as stop:
        return True, stop.value
    return False, first


def _deliver_py(data: bytes, waiting: Any, max_size: int) -> tuple[int, int]:
    """A client connection's fast path for the replies in one read: the whole inference
    replies at the start of ``data`` (header checked, within ``max_size``), each taken by
    the call at the head of ``waiting`` (``waiting.popleft().future.set_result(frame)``
    unless that future is done), while calls wait.  Returns the replies taken and the bytes
    they used; the rest of ``data`` -- anything else, a partial frame -- is the caller's."""
    n = len(data)
    pos = taken = 0
    frame_size = mip.frame_size
    while waiting and n - pos >= 8:
        try:
            size = frame_size(data, pos, max_size)  # the codec's frame check
        except DecodeError:
            break
        if size is None or data[pos + 1] != 2:
            break
        end = pos + size
        fut = waiting.popleft().future
        taken += 1
        if not fut.done():
            fut.set_result(data if end - pos == n else data[pos:end])
        pos = end
    return taken, pos


# The compiled versions of the helpers above (wirekit/_fast/mipnet.pyx), unless WIREKIT_PURE
# is set or they are not built; tests/test_mip_runtime_accel.py checks they agree.
_flatten, _new_inference, _singles, _start = _flatten_py, _new_inference_py, _singles_py, _start_py
deliver_replies = _deliver_py
_accel = load_fast("mipnet")
if _accel is not None:
    _accel.bind(Item, Inference, to_item, _Ragged, _SINGLE, _TEXT)
    _flatten, _new_inference, _singles = _accel.flatten, _accel.new_inference, _accel.singles
    _start = _accel.start
    deliver_replies = _accel.deliver


def build_request(batch: Iterable[Any]) -> Inference:
    """An inference request from per-sample inputs (see :func:`to_item` for the values)."""
    if isinstance(batch, _SINGLE):
        raise TypeError("infer() takes a batch: a list of samples, each a list of inputs")
    try:
        items, width, n = _flatten(batch)
    except _Ragged as exc:
        raise EncodeError(
            PROTOCOL,
            "n_input",
            f"sample {exc.sample} has {exc.got} inputs, sample 0 has {exc.width}",
        ) from None
    return _new_inference(False, width, 0, n, items)


class OutputShapeError(WirekitError):
    """A handler's outputs do not match the batch it was given (answered with SHAPE)."""


def build_reply(request: Inference, outputs: Any) -> Inference:
    """The inference response for ``request`` from a handler's ``outputs``.

    ``outputs`` holds one entry per sample of the request, in order; each entry is a
    sequence of output values (or one bare value when the model has a single output), and
    every sample must have the same number of outputs.
    """
    try:
        items, width, n = _flatten(outputs)
    except _Ragged as exc:
        raise OutputShapeError(
            f"sample {exc.sample} has {exc.got} outputs, sample 0 has {exc.width}"
        ) from None
    except TypeError as exc:
        raise OutputShapeError(f"outputs are not a sequence of samples: {exc}") from None
    if n != request.batch_size:
        raise OutputShapeError(f"{n} output samples for a batch of {request.batch_size}")
    if width > 255:
        raise OutputShapeError(f"{width} outputs per sample (at most 255)")
    return _new_inference(True, request.n_input, width, n, items)


def echo(batch: Batch) -> Batch:
    """A handler answering every sample with its own inputs (for smoke tests and benchmarks)."""
    return batch


async def async_echo(batch: Batch) -> Batch:
    """:func:`echo` as a coroutine function (served on the event loop, no thread hop)."""
    return batch


# --------------------------------------------------------------------------- client errors


_MEANING = {
    ErrorCode.PROTOCOL: "unsupported protocol version",
    ErrorCode.SUBTYPE: "the message is not a request",
    ErrorCode.METHOD: "method not implemented",
    ErrorCode.MEMORY: "message too large for the server",
    ErrorCode.SHAPE: "payload or outputs do not match the batch",
    ErrorCode.INTERNAL: "the model failed",
}


class ServerError(WirekitError):
    """The server answered with a MIP error reply; ``code`` is its :class:`ErrorCode`."""

    def __init__(self, code: int, address: str = "") -> None:
        self.code = ErrorCode(code)
        self.address = address
        where = f" {address}" if address else ""
        meaning = _MEANING[self.code]
        super().__init__(f"mip: server{where} answered {self.code.name} ({meaning})")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (int(self.code), self.address))


class ClientTimeout(WirekitError, TimeoutError):
    """No complete reply arrived in time (the connection is dropped)."""


class ConnectionLost(WirekitError, ConnectionError):
    """The server could not be reached, or closed the connection before replying."""


class UnexpectedReply(WirekitError):
    """A well-formed reply that does not answer the request (wrong kind or batch size)."""


def decode_reply(codec: Any, frame: bytes, max_items: int = DEFAULT_MAX_ITEMS) -> Message:
    """Decode a reply frame, tolerating KubeMo's inference-response quirk.

    A reply of more than ``max_items`` items is refused (DecodeError, code MEMORY).

    KubeMo's server writes the request's input count as the response's ``n_output``.  When a
    response does not decode with the ``n_output`` it announces, the one count with which its
    items fill the payload exactly (there is at most one) is used instead.
    """
    try:
        return codec.decode(frame, max_items)
    except DecodeError as exc:
        if exc.code != ErrorCode.SHAPE or len(frame) < 12 or frame[1] != 2 or frame[2] != 1:
            raise
        buf = bytearray(frame)
        for width in range(256):
            if width == frame[9]:
                continue
            buf[9] = width
            try:
                msg = codec.decode(buf, max_items)
            except DecodeError:
                continue
            log.debug("inference reply announced n_output=%d, its items say %d", frame[9], width)
            return msg
        raise


def check_reply(msg: Message, expected: type, batch_size: int, address: str) -> Message:
    """Raise for an error reply or a reply that does not answer a request of that type."""
    cls = type(msg)
    if isinstance(msg, ErrorReply):
        raise ServerError(msg.code, address)
    if cls is not expected or not msg.response:
        raise UnexpectedReply(
            f"mip: {address} answered a {expected.__name__.lower()} request with {msg!r}"
        )
    if isinstance(msg, Inference) and msg.batch_size != batch_size:
        raise UnexpectedReply(
            f"mip: {address} answered a batch of {batch_size} with {msg.batch_size} samples"
        )
    return msg


def samples_of(msg: Inference) -> list[tuple[Item, ...]]:
    """The reply's outputs per sample."""
    w = msg.n_output
    items = msg.items
    if w == 1:
        return list(_singles(items))
    return [items[k * w : (k + 1) * w] for k in range(msg.batch_size)]


__all__: Sequence[str] = (
    "Batch",
    "ClientTimeout",
    "ConnectionLost",
    "OutputShapeError",
    "ServerError",
    "UnexpectedReply",
    "async_echo",
    "build_reply",
    "build_request",
    "echo",
    "format_address",
    "item_value",
    "parse_address",
    "to_item",
)
