"""Request bodies of the HTTP front door: read within their limits, charged to the process's
memory budget, and refused *before* they are parsed when their parsed form would not fit.

A body is held three ways while its request is handled: its bytes, the Python objects
``json.loads`` builds from them, and what the handler makes of those.  The bytes are charged
to the budget before they are read (from ``Content-Length``) or as they arrive (chunked
bodies).  The parsed form is bounded before parsing by :func:`json_cost`, a scan at C speed:
every JSON value but the first is opened by ``[`` or ``{`` or follows a ``,``, so counting
those three bytes bounds how many values ``json.loads`` can build, whatever they are -- an
empty sample ``[]`` costs a list object like any other.  A body whose bound does not fit is
refused with no parsing at all, so parsing, which holds the event loop (and the GIL: a
thread would not help), never takes longer than the budget allows values.

=====================  ===================================================================
too big                ``Content-Length`` or the bytes received over ``http.max_body_size``,
                       or bytes + parsed estimate over the whole budget: 413 (with
                       ``Expect: 100-continue``: before ``100 Continue``, the body never
                       invited, connection closed: :func:`unwanted_body_refusal`)
over budget now        the budget cannot take them while other requests hold it: 503 with
                       ``Retry-After`` (the same request may fit later)
too slow               the body not complete ``http.body_timeout`` after its headers: 408,
                       connection closed
compressed             a ``Content-Encoding`` other than ``identity``: 415 (never inflated)
=====================  ===================================================================

Every answer is JSON ``{"error": ...}``; the charge is given back when the request ends
(the HTTP door gives each request its :class:`BodyReader` and releases it).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import StreamReader, web

from wirekit.mip.limits import BufferBudget

from ..config import HttpLimits
from ..dispatch.payload import loads

#: what one JSON value counted by :func:`json_cost` may cost once parsed, in bytes, at most:
#: measured on CPython 3.11, an empty list and its slot in its parent take 64 bytes, a dict
#: of one short key 192 bytes for its two counted values (``{`` and the ``,`` after it), a
#: short string 59; 128 covers each with room for container over-allocation
VALUE_COST = 128


def json_cost(raw: bytes | bytearray) -> tuple[int, int]:
    """``(values, bytes)``: an upper bound of the JSON values ``json.loads(raw)`` can build
    and an estimate of the memory they and their text take while parsed.

    Every value but the first begins with ``[`` or ``{`` or follows a ``,``; the count also
    takes those bytes inside strings, so it errs on the safe side.  The text is counted twice
    (the decoded document, the strings built from it), four bytes a character unless the body
    is ASCII (one non-ASCII character makes CPython store the whole text four bytes wide).
    """
    values = raw.count(b"[") + raw.count(b"{") + raw.count(b",") + 1
    width = 1 if raw.isascii() else 4
    return values, VALUE_COST * values + 2 * width * len(raw)


class Charge:
    """The bytes one request holds in the process's memory budget."""

    __slots__ = ("budget", "held")

    def __init__(self, budget: BufferBudget) -> None:
        self.budget = budget
        self.held = 0

    def grow(self, size: int) -> bool:
        """Hold ``size`` bytes more: False (and nothing held) if the budget cannot take them."""
        if not self.budget.resize(self.held, self.held + size):
            return False
        self.held += size
        return True

    def fits_ever(self, size: int) -> bool:
        """Whether ``size`` bytes more could be held with no other request holding any."""
        return self.held + size <= self.budget.limit

    def release(self) -> None:
        """The request ends: give everything back."""
        self.budget.resize(self.held, 0)
        self.held = 0


def _refusal(cls: type[web.HTTPException], message: str, **headers: str) -> web.HTTPException:
    """The JSON answer ``{"error": message}`` with the status of ``cls``, to raise."""
    return cls(
        text=json.dumps({"error": message}, separators=(",", ":")),
        content_type="application/json",
        headers=headers or None,
    )


def _too_large(message: str) -> web.HTTPException:
    return web.HTTPRequestEntityTooLarge(
        0,
        text=json.dumps({"error": message}, separators=(",", ":")),
        content_type="application/json",
    )


def _over_max_body_size(limits: HttpLimits) -> web.HTTPException:
    return _too_large(
        f"the body is over the limit of {limits.max_body_size} bytes (http.max_body_size)"
    )


def _announced_too_large(announced: int, limits: HttpLimits) -> web.HTTPException:
    return _too_large(
        f"a body of {announced} bytes is over the limit of {limits.max_body_size}"
        " (http.max_body_size)"
    )


def unwanted_body_refusal(request: web.BaseRequest, limits: HttpLimits) -> web.HTTPException | None:
    """The 413 for a request that asks whether to send its body (``Expect: 100-continue``)
    while its ``Content-Length`` is already over ``http.max_body_size`` (None: no such
    request).  The door answers it before aiohttp would answer ``100 Continue``, so the body
    is never invited, and closes the connection (a body sent anyway is not read)."""
    if request.headers.get("Expect", "").strip().lower() != "100-continue":
        return None
    try:
        announced = request.content_length
    except ValueError:  # aiohttp answers a malformed Content-Length before the handler
        return None
    if announced is None or announced <= limits.max_body_size:
        return None
    return _announced_too_large(announced, limits)


def _refuse_compressed(request: web.Request) -> None:
    """415 for a body sent compressed: it is never inflated."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise _refusal(
            web.HTTPUnsupportedMediaType,
            f"Content-Encoding {encoding!r} is not accepted: send the body uncompressed",
        )


class BodyReader:
    """Reads one request's body within the limits and holds its :class:`Charge`."""

    __slots__ = ("charge", "limits", "received")

    def __init__(self, limits: HttpLimits, budget: BufferBudget) -> None:
        self.limits = limits
        self.charge = Charge(budget)
        self.received = 0  #: bytes of the body received so far (as it is read in chunks)

    def _hold(self, size: int, what: str) -> None:
        """Charge ``size`` bytes for ``what``, or refuse the request (413 or 503)."""
        if self.charge.grow(size):
            return
        budget = self.charge.budget
        if not self.charge.fits_ever(size):
            raise _too_large(
                f"{what} would take {size} bytes: over the process's memory budget of"
                f" {budget.limit} bytes"
            )
        raise _refusal(
            web.HTTPServiceUnavailable,
            f"{what} would take {size} bytes: the process's memory budget ({budget.limit}"
            f" bytes) is taken by other requests, try again",
            **{"Retry-After": "1"},
        )

    async def read(self, request: web.Request) -> bytes | bytearray:
        """The whole body, charged as it arrives."""
        _refuse_compressed(request)
        announced = self._announced(request)
        content = request.content
        if content.is_eof():  # all there already (small bodies come with their headers)
            return self._whole(content.read_nowait(-1), announced)
        # an announced body is read into its final place (no copy when it grows: what is held
        # is what is charged); a chunked one grows as it comes
        body = bytearray(announced) if announced is not None else bytearray()
        received = await self._receive(content, body, announced)
        if received < len(body):  # fewer bytes than announced (aiohttp raises before this)
            del body[received:]
        return body

    def _announced(self, request: web.Request) -> int | None:
        """The body's ``Content-Length``, charged now (None: not announced; chunked)."""
        try:
            announced = request.content_length
        except ValueError:  # aiohttp answers a malformed Content-Length before the handler
            return None
        if announced is not None:
            if announced > self.limits.max_body_size:
                raise _announced_too_large(announced, self.limits)
            self._hold(announced, "the body")
        return announced

    def _whole(self, data: bytes, announced: int | None) -> bytes:
        """A body that came whole with its headers, checked and charged (if not yet)."""
        if len(data) > self.limits.max_body_size:
            raise _over_max_body_size(self.limits)
        if announced is None:
            self._hold(len(data), "the body")
        return data

    async def _receive(self, content: StreamReader, body: bytearray, announced: int | None) -> int:
        """Read the rest of the body into ``body`` within ``http.body_timeout`` (408 and the
        connection closed when it is not complete by then); returns the bytes received."""
        try:
            await asyncio.wait_for(self._pull(content, body, announced), self.limits.body_timeout)
        except asyncio.TimeoutError:
            exc = _refusal(
                web.HTTPRequestTimeout,
                f"the body was not complete {self.limits.body_timeout:g} s after the headers"
                f" ({self.received} bytes received; http.body_timeout)",
            )
            exc.force_close()
            raise exc from None
        return self.received

    async def _pull(self, content: StreamReader, body: bytearray, announced: int | None) -> None:
        """Read chunks into ``body`` until the body ends, each one checked against
        ``http.max_body_size`` and charged (a chunked body's) as it comes."""
        while True:
            chunk = await content.readany()
            if not chunk:
                return
            received = self.received
            size = received + len(chunk)
            if size > self.limits.max_body_size:
                raise _over_max_body_size(self.limits)
            if announced is None:
                self._hold(len(chunk), "the body")
                body.extend(chunk)
            else:  # aiohttp never passes on more than Content-Length says
                body[received:size] = chunk
            self.received = size

    async def json(self, request: web.Request) -> Any:
        """The body parsed as JSON, refused before parsing when its parsed form would not
        fit the budget (see :func:`json_cost`).  ``ValueError``/``RecursionError`` for a
        body that is not JSON, as ``json.loads`` raises them."""
        raw = await self.read(request)
        self.hold_json(raw)
        return loads(raw)  # strict JSON: NaN and Infinity are refused (payload.loads)

    def hold_json(self, text: bytes | bytearray) -> None:
        """Charge what the JSON ``text`` (a body, or the JSON part of one) takes once parsed
        (see :func:`json_cost`), before it is parsed: 413 or 503 when the budget refuses."""
        values, cost = json_cost(text)
        self._hold(cost, f"the body parsed (up to {values} JSON values; refused before parsing)")

    def hold(self, size: int, what: str) -> None:
        """Charge ``size`` bytes more that the request builds from its body (``what``: what
        they are, for the refusal): 413 when they could never fit the budget, 503 when
        other requests hold it now.  Given back with the rest when the request ends."""
        self._hold(size, what)

    def release(self) -> None:
        self.charge.release()


#: the request's entry holding its :class:`BodyReader` (set by the door for each request,
#: :class:`wirekit.serve.doors.httpdoor.HttpDoor`): a typed key where aiohttp has them (3.13+,
#: which warns about plain strings), else a string
READER_KEY: Any = (
    web.RequestKey("wirekit.body", BodyReader) if hasattr(web, "RequestKey") else "wirekit.body"
)


__all__ = [
    "READER_KEY",
    "VALUE_COST",
    "BodyReader",
    "Charge",
    "json_cost",
    "unwanted_body_refusal",
]
