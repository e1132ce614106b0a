"""The HTTP door's lean path: the hot routes -- the Open Inference Protocol's inferences
(``POST /v2/models/NAME[/versions/V]/infer``) and TF Serving's predictions
(``POST /v1/models/NAME[/versions/N]:predict``) -- parsed and answered without aiohttp, on
a connection the door's :class:`~wirekit.serve.doors.httpdoor.GatedConnection` owns.

aiohttp's request handling (its parser, request and response objects, router, writer) costs
the door more CPU per request than the dispatcher's own work on a small inference; this path
reads only the simplest well-formed requests and gives a connection over to aiohttp, for
good, at the first byte sequence it does not fully understand:

* the request line is exactly ``POST /v2/models/NAME[/versions/V]/infer HTTP/1.1`` or
  ``POST /v1/models/NAME[/versions/N]:predict HTTP/1.1``, the path's segments of plain
  characters (no percent-escape, no query, no dot segment);
* every header line is ``token: visible characters`` ending ``\\r\\n`` (a bare LF or CR, an
  obs-fold, a control character: aiohttp's), the block within :data:`MAX_HEAD` bytes and
  :data:`MAX_FIELDS` lines;
* exactly one ``Content-Length`` (digits, at most :data:`MAX_BODY` bytes: a larger body is
  read by aiohttp, whose reader streams it), a ``Host``, no ``Transfer-Encoding``, ``Expect``,
  ``Upgrade`` nor ``Content-Encoding``, ``Connection`` absent or ``keep-alive``; no header
  the path reads given twice.

Anything else -- another route, a hostile or malformed request, a limit -- is aiohttp's to
answer, fed the bytes this path buffered from the start of that request: aiohttp keeps
every behaviour it has, this path only adds a shortcut for requests it would have answered
through the very same handler logic
(:meth:`~wirekit.serve.doors.oiprest.OipRestHandlers.infer_body` and
:func:`~.oiprest.encoded`; :meth:`~wirekit.serve.doors.tfserving.TfServingHandlers.predict_doc`
and :func:`~wirekit.serve.doors.http.json_object`),
the same :class:`~wirekit.serve.doors.httpbody.BodyReader` charge and the same request scope
(the door's header timer stops while a request is answered).

Why a strict hand parser and not ``httptools`` (llhttp): the subset is tiny and its check is
a handful of C-speed bytes operations and two regular expressions; llhttp would parse
everything, including what this path must refuse (chunked bodies, obs-folds it tolerates,
upgrades), so each callback would still need the same checks, plus a dependency.  The
requests are answered one at a time, in order (pipelined ones wait in the buffer).  The
access log and the lenient cases stay aiohttp's: with ``http.access_log`` on, the door does
not use this path.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, NamedTuple

from aiohttp import web
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE

if TYPE_CHECKING:
    from .oiprest import OipRestHandlers
    from .tfserving import TfServingHandlers

#: header block bytes this path reads at most (aiohttp's own line limit is 8190)
MAX_HEAD = 8190
#: header lines this path reads at most
MAX_FIELDS = 32
#: body bytes this path waits for at most (a larger body is aiohttp's, streamed)
MAX_BODY = 64 * 1024

#: the characters of a header name (RFC 9110 token)
_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
#: the characters of a path segment this path reads (RFC 3986 pchar without ``%``; ``:``
#: apart, as TF Serving's routes end ``:predict``)
_SEGMENT = b"-._~!$&'()*+,;=@0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
#: the characters a head may hold: visible ASCII, blanks, CR and LF (CR and LF only as
#: line ends: checked apart)
_HEAD_CHARS = bytes(range(0x20, 0x7F)) + b"\t\r\n"
#: headers that give the request to aiohttp whatever their value
_AIOHTTP_HEADERS = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"content-encoding"})
#: headers this path reads: given twice, the request is aiohttp's
_READ = frozenset({b"content-length", b"host", b"connection", b"inference-header-content-length"})
_PREFIXES = (b"POST /v2/models/", b"POST /v1/models/")
#: the route of a request the lean path takes
OIP, TFS = "oip", "tfs"


class LeanHandlers(NamedTuple):
    """The handlers whose logic the lean path answers with (the application's own)."""

    oip: OipRestHandlers
    tfs: TfServingHandlers


class Handover:
    """What :func:`parse` answers for bytes the lean path leaves to aiohttp."""


HANDOVER = Handover()
#: the application's entry holding its :class:`LeanHandlers` (set by ``build_app``)
LEAN_KEY: Any = (
    web.AppKey("wirekit.lean", LeanHandlers) if hasattr(web, "AppKey") else "wirekit.lean"
)


class LeanRequest(NamedTuple):
    """An inference request the lean path answers: its route (:data:`OIP`, :data:`TFS`),
    its model and version (the path's), the value of its OIP binary extension header
    (None: none), where its body begins and ends in the buffer."""

    route: str
    model: str
    version: str | None
    header_length: str | None
    body_start: int
    body_end: int


def parse(buf: bytes | bytearray, max_body: int = MAX_BODY) -> LeanRequest | Handover | int | None:
    """The request at the start of ``buf``: a :class:`LeanRequest` when it is whole and
    within the lean subset (its body at most ``max_body`` bytes), :data:`HANDOVER` when it
    is not within it, None when more bytes are needed to tell, or the body length (an int)
    when its head is read and its body is not whole yet."""
    size = len(buf)
    start = bytes(buf[:16])
    if not any(prefix.startswith(start) or start.startswith(prefix) for prefix in _PREFIXES):
        return HANDOVER
    end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
    if end < 0:
        return HANDOVER if size >= MAX_HEAD + 4 else None
    head = bytes(buf[:end])
    crlf = head.count(b"\r\n")
    if head.count(b"\n") != crlf or head.count(b"\r") != crlf or head.translate(None, _HEAD_CHARS):
        return HANDOVER  # a bare LF or CR, a control or non-ASCII byte: aiohttp's to judge
    if crlf > MAX_FIELDS:
        return HANDOVER
    lines = head.split(b"\r\n")
    target = _target(lines[0])
    if target is None:
        return HANDOVER
    route, model, version = target
    seen: dict[bytes, bytes] = {}
    for raw in lines[1:]:
        name, colon, value = raw.partition(b":")
        if not colon or not name or name.translate(None, _TOKEN):
            return HANDOVER  # not a token (an obs-fold begins with a blank)
        name = name.lower()
        if name in _AIOHTTP_HEADERS:
            return HANDOVER
        if name in _READ:
            if name in seen:
                return HANDOVER
            seen[name] = value.strip(b" \t")
    length = seen.get(b"content-length")
    if length is None or b"host" not in seen or not length.isdigit() or len(length) > 9:
        return HANDOVER
    connection = seen.get(b"connection")
    if connection is not None and connection.lower() != b"keep-alive":
        return HANDOVER
    body_size = int(length)
    if body_size > max_body:
        return HANDOVER
    body_start = end + 4
    if size < body_start + body_size:
        return body_size
    header = seen.get(b"inference-header-content-length")
    return LeanRequest(
        route,
        model,
        version,
        None if header is None else header.decode(),
        body_start,
        body_start + body_size,
    )


def _target(line: bytes) -> tuple[str, str, str | None] | None:
    """``(route, model, version or None)`` of a request line the lean path takes, or
    None."""
    if not line.endswith(b" HTTP/1.1"):
        return None
    parts = line[5:-9].split(b"/")  # after "POST ": "", "v2" or "v1", "models", ...
    count = len(parts)
    version: bytes | None = None
    if parts[1] == b"v2":  # /v2/models/NAME[/versions/V]/infer
        if count not in (5, 7) or parts[-1] != b"infer":
            return None
        route, model, allowed = OIP, parts[3], _SEGMENT + b":"
        if count == 7:
            if parts[4] != b"versions":
                return None
            version = parts[5]
    else:  # /v1/models/NAME[/versions/V]:predict (the prefix said v1)
        last, colon, verb = parts[-1].rpartition(b":")
        if count not in (4, 6) or verb != b"predict" or not colon:
            return None
        route, model, allowed = TFS, last, _SEGMENT
        if count == 6:
            if parts[4] != b"versions" or not last.isdigit():
                return None
            model, version = parts[3], last
    for segment in (model, version):
        if segment is None:
            continue
        if not segment or segment.translate(None, allowed) or not segment.strip(b"."):
            return None  # empty, an escape or another character, a dot segment
    return route, model.decode(), None if version is None else version.decode()


#: the status lines written, by status
_STATUS_LINES: dict[int, bytes] = {}
#: the end of every head: aiohttp's ``Server`` header
_SERVER = f"Server: {SERVER_SOFTWARE}\r\n\r\n".encode()
#: the ``Date`` header's last value, as text and as bytes (it changes once a second)
_date: list[Any] = ["", b""]


def _head(status: int, headers: list[tuple[str, str]], length: int, close: bool = False) -> bytes:
    """The status line and headers of an answer, as aiohttp writes them (``Date``,
    ``Server``)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (
            status,
            HTTPStatus(status).phrase.encode(),
        )
    fields = "".join(f"{name}: {value}\r\n" for name, value in headers).encode("latin-1")
    now = rfc822_formatted_time()  # aiohttp's: formatted once a second
    if now != _date[0]:
        _date[:] = [now, b"Date: %s\r\n" % now.encode()]
    connection = b"Connection: close\r\n" if close else b""
    return b"%s%sContent-Length: %d\r\n%s%s%s" % (
        line,
        fields,
        length,
        connection,
        _date[1],
        _SERVER,
    )


def answer_bytes(
    status: int, content_type: str, extra: list[tuple[str, str]], pieces: list[Any]
) -> list[Any]:
    """The pieces to write for an answer of ``status`` with body ``pieces``."""
    length = sum(memoryview(piece).nbytes for piece in pieces)
    head = _head(status, [("Content-Type", content_type), *extra], length)
    if length < MAX_BODY:  # one small write costs less than several
        return [head + b"".join(pieces)]
    return [head, *pieces]


def response_bytes(response: web.Response) -> list[Any]:
    """An aiohttp :class:`~aiohttp.web.Response` a handler made (its body whole), as
    aiohttp writes it."""
    body = response.body
    assert isinstance(body, bytes | bytearray)  # the handlers' answers are JSON bytes
    headers = [(k, v) for k, v in response.headers.items() if k.lower() != "content-length"]
    return [_head(response.status, headers, len(body)) + body]


def error_bytes(status: int, message: str, close: bool = False) -> bytes:
    """``{"error": message}`` answered ``status`` (as :func:`~.oiprest.error_answer`)."""
    body = json.dumps({"error": message}, separators=(",", ":"), allow_nan=False).encode()
    return _head(status, [("Content-Type", "application/json")], len(body), close) + body


def exception_bytes(exc: web.HTTPException) -> bytes:
    """An aiohttp HTTP exception a handler raised (the body reader's 413 and 503),
    answered as aiohttp answers it."""
    body = (exc.text or "").encode()
    headers = [(k, v) for k, v in exc.headers.items() if k.lower() != "content-length"]
    return _head(exc.status, headers, len(body)) + body


#: aiohttp's answer to a handler that raised
INTERNAL_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 55\r\nConnection: close\r\n\r\n"
    b"500 Internal Server Error\n\nServer got itself in trouble"
)

__all__ = [
    "HANDOVER",
    "LEAN_KEY",
    "MAX_BODY",
    "MAX_FIELDS",
    "MAX_HEAD",
    "OIP",
    "TFS",
    "LeanHandlers",
    "LeanRequest",
    "answer_bytes",
    "error_bytes",
    "exception_bytes",
    "parse",
    "response_bytes",
]
