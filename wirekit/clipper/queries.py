"""The frontend's query port, sans-IO: which queries are taken, how they decode, what is answered.

``wirekit clipper predict`` (and :func:`wirekit.clipper.frontend.query`) send a JSON query to
the frontend's query socket, a ROUTER::

    [identity, b"", b'{"model": "m", "inputs": [[1, 2]], "input_type": "doubles", "timeout": 5}']

and get ``[identity, b"", b'{"outputs": [...]}']`` or ``[identity, b"", b'{"error": "..."}']``
back.  :class:`QueryDesk` decides, for each message the socket hands over, whether it is taken
(a :class:`Ticket`) or refused at once (the reply to send): a message of another shape, a body
over ``max_query_size``, more than ``max_pending`` queries or ``max_pending_bytes`` bytes
already held by queries taken and not yet answered.  Taking and refusing cost the same
whatever the body holds: nothing is decoded.  :meth:`QueryDesk.decode` then turns a ticket's
body into a :class:`Query` (or a :class:`~wirekit.errors.DecodeError` naming what is wrong);
it changes nothing, so the frontend runs it on a thread of its own, away from the socket
loop.  :meth:`QueryDesk.admit` charges the decoded inputs' memory in place of the body's (a
JSON number of 2 bytes becomes a Python object of 24 to 32: decoded inputs take up to ~20
times their text) and refuses the query if that passes ``max_pending_bytes``;
:meth:`QueryDesk.reply` makes the answer and :meth:`QueryDesk.answered` gives the ticket's
share of the caps back.

The desk keeps no sockets: the runtime (``wirekit.clipper.frontend``) moves the frames, and
every count changes on the thread that drives the sockets (``take`` and ``answered``).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from itertools import chain
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
    at; its timeout counts from then), the bytes charged to it (its body's size, then its
    decoded inputs' estimated memory), and the body until :meth:`QueryDesk.decode` reads
    it (then ``b""``: a query waiting for a replica holds its decoded inputs, not its text
    too)."""

    identity: bytes
    received: float
    charged: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Query:
    """A decoded query: the batch to submit, how long it may wait (seconds), and the
    memory its inputs take (estimated by :func:`held_bytes`)."""

    model: str
    inputs: list
    timeout: float
    input_type: InputType | None
    held: int


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
                f"too many query bytes: queries waiting for an answer hold "
                f"{self.pending_bytes}, this query's {size} would pass the limit of "
                f"{self.max_pending_bytes} (--max-pending-query-bytes); try again later",
            )
        self.pending += 1
        self.pending_bytes += size
        return Ticket(identity, now, size, body)

    def admit(self, ticket: Ticket, query: Query) -> list[bytes] | None:
        """The ticket's query is decoded: charge what its inputs hold in place of its body;
        None when that stays within ``max_pending_bytes`` (submit it), else the error reply
        to send (the ticket is then answered: nothing stays charged)."""
        self.pending_bytes += query.held - ticket.charged
        ticket.charged = query.held
        if self.pending_bytes <= self.max_pending_bytes:
            return None
        self.answered(ticket)
        return self.reply(
            ticket.identity,
            None,
            f"too many query bytes: this query's inputs hold about {query.held} bytes once "
            f"decoded, with the queries waiting for an answer that passes the limit of "
            f"{self.max_pending_bytes} (--max-pending-query-bytes); try again later",
        )

    def answered(self, ticket: Ticket) -> None:
        """The ticket's query is answered: its share of the caps is free again."""
        self.pending -= 1
        self.pending_bytes -= ticket.charged

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
    """The :class:`Query` a JSON body holds, else :class:`~wirekit.errors.DecodeError`.

    The body is read as ``json.loads`` reads it (the same values, the same errors), but
    the ``inputs`` array one element at a time: a thread running this lets others run
    between two inputs, so a query of many inputs does not hold the interpreter for its
    whole length (one input is read in one call)."""
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")
        req = _load_object(text)
    except RecursionError:
        raise _bad("body", 0, "the JSON is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise _bad("body", exc.pos, exc.msg) from None
    except ValueError as exc:  # not UTF-8/16/32, or an integer of too many digits
        raise _bad("body", 0, str(exc)) from None
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
    return Query(model, inputs, timeout, itype, held_bytes(inputs))


# The json module's own scanner (undocumented names, which typeshed does not declare).
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # (value, end) at an index
_SKIP = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]
_scanstring = json.decoder.scanstring  # type: ignore[attr-defined]


def _load_object(text: str) -> dict:
    """``json.loads(text)`` for a JSON object, its ``"inputs"`` array read element by
    element; a document that is not an object is an error naming what it is."""
    i = _SKIP(text, 0).end()
    if not text.startswith("{", i):
        found = json.loads(text)  # what it is, or json's error for it
        raise _bad("body", 0, f"expected a JSON object, got {type(found).__name__}")
    obj: dict = {}
    i = _SKIP(text, i + 1).end()
    if text.startswith("}", i):
        return _end(obj, text, i + 1)
    while True:
        if not text.startswith('"', i):
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, i)
        key, i = _scanstring(text, i + 1)
        i = _SKIP(text, i).end()
        if not text.startswith(":", i):
            raise json.JSONDecodeError("Expecting ':' delimiter", text, i)
        i = _SKIP(text, i + 1).end()
        if key == "inputs" and text.startswith("[", i):
            obj[key], i = _load_array(text, i + 1)
        else:
            obj[key], i = _value(text, i)
        i = _SKIP(text, i).end()
        if text.startswith("}", i):
            return _end(obj, text, i + 1)
        if not text.startswith(",", i):
            raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
        i = _SKIP(text, i + 1).end()


def _end(obj: dict, text: str, i: int) -> dict:
    i = _SKIP(text, i).end()
    if i != len(text):
        raise json.JSONDecodeError("Extra data", text, i)
    return obj


def _value(text: str, i: int) -> tuple[Any, int]:
    try:
        return _SCAN(text, i)
    except StopIteration as stop:
        raise json.JSONDecodeError("Expecting value", text, stop.value) from None


def _load_array(text: str, i: int) -> tuple[list, int]:
    """The array whose ``[`` is just before ``i``, one element per call of the scanner."""
    items: list = []
    i = _SKIP(text, i).end()
    if text.startswith("]", i):
        return items, i + 1
    append = items.append
    while True:
        value, i = _value(text, i)
        append(value)
        i = _SKIP(text, i).end()
        if text.startswith("]", i):
            return items, i + 1
        if not text.startswith(",", i):
            raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
        i = _SKIP(text, i + 1).end()


#: What :func:`held_bytes` counts for a number, ``true``, ``false`` or ``null``: a pointer
#: and a float object (a small int is shared; a large one takes about half its digits).
_SCALAR_BYTES = 32
_NESTED = (list, dict, str, bytes)


def held_bytes(value: Any) -> int:
    """About the memory ``json.loads`` took for ``value`` (no less in the common shapes):
    every list, dict, string and bytes object's own size, and :data:`_SCALAR_BYTES` for
    every element.  Lists of scalars, lists of such lists and lists of strings are looked
    at in C (``map``), not element by element in Python."""
    getsize = sys.getsizeof
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        total += getsize(item)
        if type(item) is dict:
            total += _SCALAR_BYTES * len(item)
            stack.extend(item.values())
        elif type(item) is list:
            total += _SCALAR_BYTES * len(item)
            kinds = set(map(type, item))
            if kinds == {list}:  # rows: their own sizes and elements, then what they hold
                total += sum(map(getsize, item)) + _SCALAR_BYTES * sum(map(len, item))
                if not set(map(type, chain.from_iterable(item))).isdisjoint(_NESTED):
                    stack.extend(x for x in chain.from_iterable(item) if type(x) in _NESTED)
            elif kinds <= {str, bytes}:
                total += sum(map(getsize, item))
            elif not kinds.isdisjoint(_NESTED):
                stack.extend(x for x in item if type(x) in _NESTED)
    return total


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
    "held_bytes",
]
