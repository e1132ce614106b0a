"""The frontend's query port, sans-IO: which queries are taken, how they decode, what is answered.

``wirekit clipper predict`` (and :func:`wirekit.clipper.frontend.query`) send a JSON query to
the frontend's query socket, a ROUTER::

    [identity, b"", b'{"model": "m", "inputs": [[1, 2]], "input_type": "doubles", "timeout": 5}']

and get ``[identity, b"", b'{"outputs": [...]}']`` or ``[identity, b"", b'{"error": "..."}']``
back.  :class:`QueryDesk` decides, for each message the socket hands over, whether it is taken
(a :class:`Ticket`) or refused at once (the reply to send): a message of another shape, a body
over ``max_query_size``, more than ``max_pending`` queries or ``max_pending_bytes`` body bytes
already taken and not yet answered.  Taking and refusing cost the same whatever the body
holds: nothing is decoded.  :meth:`QueryDesk.decode` then turns a ticket's body into a
:class:`Query` (or a :class:`~wirekit.errors.DecodeError` naming what is wrong); it changes
nothing, so the frontend runs it on a thread of its own, away from the socket loop.
:meth:`QueryDesk.reply` makes the answer and :meth:`QueryDesk.answered` gives the ticket's
share of the caps back.

The desk keeps no sockets: the runtime (``wirekit.clipper.frontend``) moves the frames, and
every count changes on the thread that drives the sockets (``take`` and ``answered``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from wirekit.errors import DecodeError

from .container import parse_input_type
from .messages import InputType

#: The ``protocol`` of the errors the desk reports (``wirekit.DecodeError``).
PROTOCOL = "clipper-query"
#: The largest query body decoded; a larger one is answered with an error, unread.
DEFAULT_MAX_QUERY_SIZE = 8 << 20
#: Queries taken and not yet answered, at most (decoding, waiting for a replica, in flight).
DEFAULT_MAX_PENDING = 256
#: Body bytes of the queries taken and not yet answered, at most.
DEFAULT_MAX_PENDING_BYTES = 64 << 20
#: The longest ``timeout`` a query may ask for, in seconds; a longer one is refused.
DEFAULT_MAX_TIMEOUT = 300.0
#: A query without ``timeout`` waits this long.
DEFAULT_TIMEOUT = 5.0
#: How many times ``max_query_size`` libzmq lets through on the query socket
#: (``MAXMSGSIZE``): a larger frame is dropped by libzmq with its connection, before the
#: frontend sees it, so it cannot be answered; up to it, a query is answered "too large".
HARD_SIZE_FACTOR = 8
#: Errors quote at most this many characters of a reason.
_REASON_CHARS = 200


@dataclass(eq=False, slots=True)
class Ticket:
    """A query taken by :meth:`QueryDesk.take`: who asked, when (the ``now`` it was taken
    at; its timeout counts from then), its body's size, and the body until
    :meth:`QueryDesk.decode` reads it (then ``b""``: a query waiting for a replica holds
    its decoded inputs, not its text too)."""

    identity: bytes
    received: float
    size: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Query:
    """A decoded query: the batch to submit, and how long it may wait (seconds)."""

    model: str
    inputs: list
    timeout: float
    input_type: InputType | None


def _check_limit(name: str, value: float, *, at_least: float = 0) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= at_least):
        raise ValueError(f"{name} must be a finite number at least {at_least:g}, got {value!r}")


class QueryDesk:
    """Takes or refuses the messages of a frontend's query socket, within its caps (see the
    module docstring).

    ``max_query_size``: the largest body decoded (bytes); ``max_pending``: queries taken and
    not yet answered; ``max_pending_bytes``: their body bytes; ``max_timeout``: the longest
    ``timeout`` a query may ask for (seconds; a longer one, or one that is not a finite
    number at least 0, is refused with an error).  :attr:`pending` and
    :attr:`pending_bytes` are what is taken now.
    """

    def __init__(
        self,
        *,
        max_query_size: int = DEFAULT_MAX_QUERY_SIZE,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        max_timeout: float = DEFAULT_MAX_TIMEOUT,
    ) -> None:
        _check_limit("max_query_size", max_query_size, at_least=1)
        _check_limit("max_pending", max_pending, at_least=1)
        _check_limit("max_pending_bytes", max_pending_bytes, at_least=1)
        _check_limit("max_timeout", max_timeout)
        self.max_query_size = int(max_query_size)
        self.max_pending = int(max_pending)
        self.max_pending_bytes = int(max_pending_bytes)
        self.max_timeout = float(max_timeout)
        self.pending = 0
        self.pending_bytes = 0

    @property
    def max_frame_size(self) -> int:
        """What libzmq lets through on the query socket (``MAXMSGSIZE``)."""
        return HARD_SIZE_FACTOR * self.max_query_size

    # -- the socket thread --

    def take(self, frames: list[bytes], now: float) -> Ticket | list[bytes]:
        """One message from the query ROUTER (``[identity, *frames]``) received at ``now``:
        a :class:`Ticket` when it is taken (counted until :meth:`answered`), else the error
        reply to send."""
        identity = frames[0]
        parts = len(frames) - 1
        if parts != 2 or frames[1]:
            return self.reply(identity, None, _shape_error(frames))
        body = frames[2]
        size = len(body)
        if size > self.max_query_size:
            return self.reply(
                identity,
                None,
                f"query too large: {size} bytes, the limit is {self.max_query_size} "
                f"(--max-query-size); it was not read",
            )
        if self.pending >= self.max_pending:
            return self.reply(
                identity,
                None,
                f"too many queries: {self.pending} are waiting for an answer, the limit is "
                f"{self.max_pending} (--max-pending-queries); try again later",
            )
        if self.pending_bytes + size > self.max_pending_bytes:
            return self.reply(
                identity,
                None,
                f"too many query bytes: {self.pending_bytes} are waiting for an answer, this "
                f"query's {size} would pass the limit of {self.max_pending_bytes} "
                f"(--max-pending-query-bytes); try again later",
            )
        self.pending += 1
        self.pending_bytes += size
        return Ticket(identity, now, size, body)

    def answered(self, ticket: Ticket) -> None:
        """The ticket's query is answered: its share of the caps is free again."""
        self.pending -= 1
        self.pending_bytes -= ticket.size

    # -- any thread: nothing changes --

    def decode(self, ticket: Ticket) -> Query:
        """The ticket's query, else :class:`~wirekit.errors.DecodeError` saying what is
        wrong (with its byte offset in the body, frame 1 of the client's message).  The
        ticket lets go of its body."""
        body, ticket.body = ticket.body, b""
        return decode_query(body, self.max_timeout)

    def reply(self, identity: bytes, outputs: Any, error: BaseException | str | None) -> list:
        """The frames answering ``identity``: ``{"outputs": outputs}``, or ``{"error":
        text}`` when ``error`` is given (a bad query's error reads ``bad query: ...``)."""
        if error is None:
            if isinstance(outputs, np.ndarray):
                outputs = outputs.tolist()
            body: dict = {"outputs": list(outputs)}
        elif isinstance(error, DecodeError):
            body = {"error": f"bad query: {error}"}
        else:
            body = {"error": str(error)}
        return [identity, b"", json.dumps(body).encode()]


def _shape_error(frames: list[bytes]) -> DecodeError:
    """What is wrong with a message that is not ``[identity, b"", body]``."""
    parts = frames[1:]
    if parts and parts[0]:
        return DecodeError(
            PROTOCOL,
            "delimiter",
            0,
            f"expected an empty frame then one JSON body frame, got {len(parts)} frame(s) "
            f"starting with a non-empty one",
            frame=0,
        )
    if len(parts) < 2:
        return DecodeError(PROTOCOL, "body", 0, "no body frame after the delimiter", frame=1)
    return DecodeError(
        PROTOCOL,
        "body",
        0,
        f"expected one JSON body frame after the delimiter, got {len(parts) - 1}",
        frame=2,
    )


def _bad(field: str, offset: int, reason: str) -> DecodeError:
    if len(reason) > _REASON_CHARS:
        reason = reason[:_REASON_CHARS] + "..."
    return DecodeError(PROTOCOL, field, offset, reason, frame=1)


def decode_query(body: bytes, max_timeout: float = DEFAULT_MAX_TIMEOUT) -> Query:
    """The :class:`Query` a JSON body holds, else :class:`~wirekit.errors.DecodeError`."""
    try:
        req = json.loads(body)
    except RecursionError:
        raise _bad("body", 0, "the JSON is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise _bad("body", exc.pos, exc.msg) from None
    except ValueError as exc:  # not UTF-8/16/32, or an integer of too many digits
        raise _bad("body", 0, str(exc)) from None
    if not isinstance(req, dict):
        raise _bad("body", 0, f"expected a JSON object, got {type(req).__name__}")
    for name in ("model", "inputs"):
        if name not in req:
            raise _bad(name, 0, f"missing {name!r}")
    model, inputs = req["model"], req["inputs"]
    if not isinstance(model, str) or not isinstance(inputs, list):
        raise _bad("model", 0, "model must be a string and inputs a list")
    timeout = _timeout(req.get("timeout", DEFAULT_TIMEOUT), max_timeout)
    itype = req.get("input_type")
    try:
        itype = parse_input_type(itype) if itype is not None else None
    except (ValueError, TypeError) as exc:
        raise _bad("input_type", 0, str(exc)) from None
    if itype == InputType.BYTES:
        try:
            inputs = [bytes.fromhex(x) for x in inputs]
        except (ValueError, TypeError) as exc:
            raise _bad("inputs", 0, f"bytes inputs must be hex strings: {exc}") from None
    return Query(model, inputs, timeout, itype)


def _timeout(value: Any, max_timeout: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad("timeout", 0, f"timeout must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError as exc:  # an integer of hundreds of digits
        raise _bad("timeout", 0, f"timeout {exc}") from None
    if not 0.0 <= seconds <= max_timeout:
        raise _bad(
            "timeout",
            0,
            f"timeout must be a finite number of seconds from 0 to {max_timeout:g} "
            f"(the frontend's --max-query-timeout), got {seconds:g}",
        )
    return seconds


__all__ = [
    "DEFAULT_MAX_PENDING",
    "DEFAULT_MAX_PENDING_BYTES",
    "DEFAULT_MAX_QUERY_SIZE",
    "DEFAULT_MAX_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "PROTOCOL",
    "Query",
    "QueryDesk",
    "Ticket",
    "decode_query",
]
