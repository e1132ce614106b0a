"""The HTTP front door's listener: aiohttp's request handling behind a gate that bounds the
connections and the time a client may take to send its headers.

aiohttp parses HTTP and drops kept-alive connections that stay idle
(``keepalive_timeout``: ``http.idle_timeout``); it has no limit on how long a client takes
to send a request's headers, nor on how many connections are open.  :class:`HttpDoor` opens
the listening socket itself with aiohttp's public protocol factory (``AppRunner.server``)
wrapped in :class:`GatedConnection`, which

* answers a connection beyond ``http.max_connections`` with a 503 and closes it at once
  (its file descriptor is given back at once: the other doors keep theirs);
* drops a connection whose request headers are not complete ``http.header_timeout`` after
  it opened, or after the first byte of a further request on a kept-alive connection; a
  request counts as begun when aiohttp hands it to the application, as ended when the
  application has answered (the door's request scope, :meth:`HttpDoor.scoped`: it also gives
  each request its :class:`~wirekit.serve.doors.httpbody.BodyReader`, whose charge to the
  memory budget it gives back when the request ends);
* charges an answer the client does not read (what the transport holds unsent once it asks
  for a pause) to the memory budget, and drops the connection when nothing of it leaves for
  ``http.write_stall_timeout``: decided by the MIP doors' own
  :class:`~wirekit.mip.limits.Guard`, run by their :class:`~wirekit.mip.server.Watchdog`
  (through :class:`~wirekit.mip.limits.UnsentReplies`), not by a copy of them.

Every refusal and drop is logged once per burst
(:class:`~wirekit.serve.doors.fdwatch.BurstLog`), never once per connection: a flood is one
line every few seconds, with a count.  So is a malformed request (aiohttp's parser refuses
it, 400, and closes the connection; aiohttp would log an ERROR with a traceback for each):
:class:`BadRequestLog` takes aiohttp's report of it, counts it
(``wirekit_serve_http_bad_requests_total``) and logs one WARNING per burst, no traceback.
A request that asks to send a body over ``http.max_body_size`` (``Expect: 100-continue``) is
answered 413 before aiohttp would invite the body.  Running out of file descriptors, which
concerns every door, is watched by :class:`~wirekit.serve.doors.fdwatch.FdWatch`.

The access log (``http.access_log`` or ``--access-log``; off by default) is one INFO line per
request answered, from :class:`AccessLogger` to the logger ``wirekit.serve.access``.  Off,
aiohttp is given no access logger at all: not even the clock is read for it.

What a request costs the door beyond aiohttp's parsing and the application's routing: the
request scope wraps aiohttp's request handler (the application) itself rather than running
as a middleware, so that the application has no middleware at all and aiohttp builds no
middleware chain per request -- every route of the door, the hot ones and the admin ones,
goes the same lean way.  The hot routes (OIP inferences, TF Serving predictions) go leaner
still: a connection starts on the door's own parser of their simplest well-formed requests
(:mod:`wirekit.serve.doors.lean`), answered through the same handler logic, body charge and
request scope, and is handed over to aiohttp, for good, at the first request that parser
does not take -- another route, anything malformed or unusual -- with the bytes buffered
from that request's start.  With the access log on, every request goes through aiohttp.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.log import server_logger

from wirekit._logging import FIELDS
from wirekit.mip.limits import BufferBudget, Deadlines, UnsentReplies
from wirekit.mip.server import Watchdog

from ..config import HttpLimits
from ..logs import serve_logger
from .fdwatch import BurstLog, warn_if_cap_exceeds_fds
from .httpbody import READER_KEY, BodyReader, unwanted_body_refusal

if TYPE_CHECKING:
    from .oiprest import OipRestHandlers
    from .tfserving import TfServingHandlers
from .http import json_object
from .lean import (
    INTERNAL_ERROR,
    LEAN_KEY,
    MAX_BODY,
    OIP,
    Handover,
    LeanHandlers,
    LeanRequest,
    answer_bytes,
    error_bytes,
    exception_bytes,
    parse,
    response_bytes,
)
from .oiprest import HEADER_LENGTH, Refused, encoded, header_length

log = serve_logger()
#: aiohttp's request handler: a request in, its response out
RequestHandler: TypeAlias = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
#: the access log's logger (one INFO record per request answered, when it is on)
access_log = serve_logger("wirekit.serve.access")
#: the request's entry holding when the door's middleware took it (``perf_counter``; set
#: only when the access log is on); typed where aiohttp has typed keys, as ``READER_KEY``
ACCESS_START: Any = (
    web.RequestKey("wirekit.access_start", float)
    if hasattr(web, "RequestKey")
    else "wirekit.access_start"
)


#: how long stopping the door waits for the requests in flight (aiohttp's own default)
SHUTDOWN_TIMEOUT = 60.0


class AccessLogger(AbstractAccessLogger):
    """aiohttp's access logger for the HTTP door: one INFO record per request answered,
    ``CLIENT "METHOD PATH" STATUS BYTES DURATION ms``, with the same values as structured
    fields (``method``, ``path``, ``status``, ``bytes``, ``duration`` in seconds,
    ``client``) that the JSON log format writes as keys.  ``path`` is the request target as
    sent (query string included, not percent-decoded); ``bytes`` the body bytes answered;
    ``duration`` runs from the door's middleware taking the request (headers read) to the
    answer written."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        started = request.get(ACCESS_START)
        if started is not None:  # aiohttp's own clock is the loop's: milliseconds on uvloop
            time = perf_counter() - started
        client = request.remote or ""
        method, path, status = request.method, request.raw_path, response.status
        size = response.body_length
        fields = {
            "method": method,
            "path": path,
            "status": status,
            "bytes": size,
            "duration": round(time, 6),
            "client": client,
        }
        self.logger.info(
            '%s "%s %s" %d %d %.3f ms',
            client,
            method,
            path,
            status,
            size,
            time * 1000.0,
            extra={FIELDS: fields},
        )

    @property
    def enabled(self) -> bool:
        """Whether a record would be logged (aiohttp asks once per connection; when not, it
        does not time the requests)."""
        return self.logger.isEnabledFor(logging.INFO)


#: characters of aiohttp's reason for refusing a request that a WARNING quotes at most (the
#: reason quotes what the client sent)
REASON_CHARS = 200


class BadRequestLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The logger the door gives aiohttp's request handlers (aiohttp's ``logger``): a
    request aiohttp's parser refused -- its report carries the parser's
    :class:`~aiohttp.http_exceptions.HttpProcessingError` -- is the client's fault: counted
    by the door and logged once per burst at WARNING (:meth:`HttpDoor.bad_request`), never
    with a traceback.  Everything else goes on to aiohttp's own logger (``aiohttp.server``)
    unchanged: an exception in the application is still an ERROR with its traceback."""

    def __init__(self, door: HttpDoor) -> None:
        super().__init__(server_logger, {})
        self.door = door

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            peer = args[0] if args else None
            self.door.bad_request(exc, peer if isinstance(peer, str) else None)
            return
        super().log(level, msg, *args, **kwargs)


class GatedConnection(asyncio.Protocol):
    """One HTTP connection: aiohttp's handler for it, behind the door's cap and header
    timeout.  Everything the transport says is passed on to the handler unchanged.

    An answer its client does not read is charged to the memory budget and its write stall
    timed by the same :class:`~wirekit.mip.limits.Guard` and
    :class:`~wirekit.mip.server.Watchdog` as a MIP connection's, through
    :class:`~wirekit.mip.limits.UnsentReplies` (``http.write_stall_timeout``)."""

    __slots__ = (
        "body_timer",
        "buffer",
        "busy",
        "client_name",
        "door",
        "handler",
        "idle",
        "in_request",
        "lean",
        "replies",
        "timer",
        "transport",
        "waiting_since",
        "watchdog",
    )

    def __init__(self, door: HttpDoor) -> None:
        self.door = door
        self.handler: asyncio.Protocol | None = None  #: aiohttp's (None: refused)
        self.transport: asyncio.Transport | None = None
        #: when the headers being waited for began to be (None: none are)
        self.waiting_since: float | None = None
        self.in_request = False
        self.timer: asyncio.TimerHandle | None = None
        loop = door.loop
        #: what the transport holds unsent while it asked for a pause (the client does not
        #: read): charged to the memory budget until it resumes, its write stall timed
        self.replies = UnsentReplies(door.write_deadlines, door.budget, loop.time())
        self.watchdog = Watchdog(self.replies, loop, loop.time, self._unsent, self._stalled)
        #: the OIP handlers of the lean path while it owns the connection (None: aiohttp
        #: has it, for good; :mod:`wirekit.serve.doors.lean`)
        self.lean: LeanHandlers | None = door.lean
        self.buffer = bytearray()  #: bytes the lean path holds, from a request's start
        self.busy = False  #: the lean path answers a request
        self.client_name: str | None = None  #: the client as the store records it
        self.idle: asyncio.TimerHandle | None = None  #: the lean path's keep-alive timer
        self.body_timer: asyncio.TimerHandle | None = None  #: a lean body's timer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        door = self.door
        transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        if not door.admit(self, transport):
            return
        self.transport = transport
        self.handler = handler = door.handler_factory()
        handler.connection_made(transport)
        self.waiting_since = door.loop.time()
        self.timer = door.loop.call_at(self.waiting_since + door.limits.header_timeout, self.check)

    def data_received(self, data: bytes) -> None:
        handler = self.handler
        if handler is None:
            return
        if self.waiting_since is None and not self.in_request:  # a further request begins
            self.waiting_since = now = self.door.loop.time()
            if self.timer is None:
                self.timer = self.door.loop.call_at(
                    now + self.door.limits.header_timeout, self.check
                )
        if self.lean is None:
            handler.data_received(data)
            return
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        self.buffer += data
        if not self.busy:
            self._next()

    # ------------------------------------------------------------------ the lean path

    def _next(self) -> None:
        """Answer the request at the start of the buffer if it is the lean path's, hand the
        connection over to aiohttp if it is not, or wait for more bytes."""
        lean, buffer = self.lean, self.buffer
        if lean is None or self.transport is None:
            return
        if not buffer:
            self._keep_alive()
            return
        found = parse(buffer, self.door.lean_max_body)
        if found is None:
            return
        if isinstance(found, Handover):
            self._handover()
            return
        if isinstance(found, int):  # the head read, the body still coming
            if not self.in_request:  # the headers are whole: the request begins
                self.request_started()
                self.body_timer = self.door.loop.call_later(
                    self.door.limits.body_timeout, self._body_late
                )
            return
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        body = bytes(buffer[found.body_start : found.body_end])
        del buffer[: found.body_end]
        if not self.in_request:
            self.request_started()
        self.busy = True
        task = self.door.loop.create_task(self._serve(lean, found, body))
        self.door.lean_tasks.add(task)
        task.add_done_callback(self.door.lean_tasks.discard)

    async def _serve(self, lean: LeanHandlers, req: LeanRequest, body: bytes) -> None:
        """Answer ``req`` through its handlers' logic, within the request scope."""
        door = self.door
        reader = BodyReader(door.limits, door.budget)
        close = False
        out: list[Any]
        try:
            try:
                if req.route == OIP:
                    out = await self._oip(lean.oip, req, body, reader)
                else:
                    out = await self._tfs(lean.tfs, req, body, reader)
            except Refused as refused:
                out = [error_bytes(refused.status, refused.message)]
            except web.HTTPException as exc:  # the body reader's 413, 503
                out = [exception_bytes(exc)]
            except Exception:
                log.exception("wirekit serve: error answering an OIP inference")
                out, close = [INTERNAL_ERROR], True
            finally:
                reader.release()
            transport = self.transport
            if transport is not None:
                transport.writelines(out)
                if close:
                    transport.close()
                    self.lean = None
        finally:
            self.busy = False
            self.request_ended()
            self._next()

    async def _oip(
        self, oip: OipRestHandlers, req: LeanRequest, body: bytes, reader: BodyReader
    ) -> list[Any]:
        """An OIP inference's answer (:meth:`OipRestHandlers.answer`'s steps)."""
        model, version = oip.model_named(req.model, req.version)
        json_length = header_length(req.header_length)
        reader.hold(len(body), "the body")
        response, binary = await oip.infer_body(
            model, version, json_length, body, reader, self.peer()
        )
        content_type, binary_length, pieces = encoded(response, binary)
        extra = [] if binary_length is None else [(HEADER_LENGTH, str(binary_length))]
        return answer_bytes(200, content_type, extra, pieces)

    async def _tfs(
        self, tfs: TfServingHandlers, req: LeanRequest, body: bytes, reader: BodyReader
    ) -> list[Any]:
        """A TF Serving prediction's answer (:meth:`TfServingHandlers.predict`'s steps)."""
        found = tfs.model_at(req.model, req.version)
        if isinstance(found, web.Response):
            return response_bytes(found)
        reader.hold(len(body), "the body")
        doc = json_object(reader, body)
        return response_bytes(await tfs.predict_doc(found[0], doc, self.peer()))

    def peer(self) -> str:
        """The client as the store records it (as :func:`~.oiprest.client`)."""
        name = self.client_name
        if name is None:
            transport = self.transport
            peer = transport.get_extra_info("peername") if transport is not None else None
            host = peer[0] if isinstance(peer, tuple | list) and peer else None
            name = self.client_name = f"http:{host or '?'}"
        return name

    def _keep_alive(self) -> None:
        """Nothing buffered after an answer: close the connection if no request comes
        within ``http.idle_timeout`` (aiohttp's keep-alive, for the lean path)."""
        if self.idle is None and self.transport is not None:
            self.idle = self.door.loop.call_later(self.door.limits.idle_timeout, self._idle)

    def _idle(self) -> None:
        self.idle = None
        if self.transport is not None and not self.busy and not self.buffer:
            self.transport.close()

    def _body_late(self) -> None:
        """A lean request's body not whole ``http.body_timeout`` after its headers: 408 and
        the connection closed, as the body reader answers it."""
        self.body_timer = None
        transport = self.transport
        if transport is None or self.busy:
            return
        head_end = self.buffer.find(b"\r\n\r\n")
        received = len(self.buffer) - head_end - 4 if head_end >= 0 else 0
        limits = self.door.limits
        transport.write(
            error_bytes(
                408,
                f"the body was not complete {limits.body_timeout:g} s after the headers"
                f" ({received} bytes received; http.body_timeout)",
                close=True,
            )
        )
        self.lean = None
        self.buffer.clear()
        self.request_ended()
        transport.close()

    def _handover(self) -> None:
        """Give the connection to aiohttp for good, with the bytes buffered from the start
        of the request the lean path does not take."""
        self.lean = None
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        if self.in_request:  # aiohttp's scope starts the request again
            self.in_request = False
            self.waiting_since = self.door.loop.time()
        data, self.buffer = bytes(self.buffer), bytearray()
        if self.handler is not None and data:
            self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        if self.lean is not None and self.buffer and not self.busy:
            self._handover()  # a request cut short: aiohttp's to answer as it does
        return self.handler.eof_received() if self.handler is not None else None

    def pause_writing(self) -> None:
        """The transport holds more than its high-water mark unsent: the client is not
        reading its answer.  What it holds is charged to the memory budget, and the
        connection is dropped if no byte of it leaves for ``http.write_stall_timeout``."""
        if self.handler is None:
            return
        self.handler.pause_writing()
        now = self.door.loop.time()
        self.replies.writing(True, now, self._unsent())
        self.watchdog.arm(now)

    def resume_writing(self) -> None:
        self._stop_stall_clock()
        if self.handler is not None:
            self.handler.resume_writing()

    def _unsent(self) -> int:
        transport = self.transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def _stop_stall_clock(self) -> None:
        self.watchdog.stop()
        self.replies.writing(False, self.door.loop.time())

    def _stalled(self, _why: str) -> None:
        """The watchdog's verdict: nothing of the answer left for ``http.write_stall_timeout``
        (the guard's reason is the MIP doors' words; the door logs its own line)."""
        transport = self.transport
        if transport is None:
            return
        self.door.write_stalled(self.door.loop.time(), self.replies.unsent)
        self._stop_stall_clock()
        transport.abort()  # close() would wait for the unsent bytes to leave: they never do

    def connection_lost(self, exc: Exception | None) -> None:
        handler = self.handler
        if handler is None:
            return
        for timer in (self.timer, self.idle, self.body_timer):
            if timer is not None:
                timer.cancel()
        self.timer = self.idle = self.body_timer = None
        self.lean = None
        self.watchdog.stop()
        self.replies.release()
        self.door.left(self)
        self.handler = None
        self.transport = None
        handler.connection_lost(exc)

    def request_started(self) -> None:
        self.in_request = True
        self.waiting_since = None

    def request_ended(self) -> None:
        self.in_request = False

    def check(self) -> None:
        """The header timer: drop the connection if its headers are late, else look again
        when they would be."""
        self.timer = None
        since = self.waiting_since
        transport = self.transport
        if since is None or transport is None:
            return
        door = self.door
        due = since + door.limits.header_timeout
        now = door.loop.time()
        if now < due:
            self.timer = door.loop.call_at(due, self.check)
            return
        door.header_timed_out(now)
        transport.close()


class HttpDoor:
    """The HTTP front door of ``app``: its listener, its connections and their limits.

    >>> door = HttpDoor(app, HttpLimits(), BufferBudget(256 << 20))  # doctest: +SKIP
    >>> port = await door.start("127.0.0.1", 0); ...; await door.stop()   # doctest: +SKIP
    """

    def __init__(self, app: web.Application, limits: HttpLimits, budget: BufferBudget) -> None:
        self.limits = limits
        self.budget = budget  #: the process's: request bodies are charged to it
        #: the deadline a connection's :class:`~wirekit.mip.limits.Guard` keeps: the write
        #: stall (aiohttp and the header timer keep the others)
        self.write_deadlines = Deadlines(write_stall_timeout=limits.write_stall_timeout)
        self.open = 0  #: connections open (refused ones not counted)
        self._by_transport: dict[asyncio.BaseTransport, GatedConnection] = {}
        # the access log, when on; off, aiohttp has no access logger (no cost per request)
        access: dict[str, Any] = {"access_log": None}
        if limits.access_log:
            access = {"access_log": access_log, "access_log_class": AccessLogger}
        #: malformed requests aiohttp refused (``wirekit_serve_http_bad_requests_total``)
        self.bad_requests = 0
        self._bad_requests = BurstLog(log)
        self._runner = web.AppRunner(
            app,
            **access,
            # a malformed request: counted, one WARNING per burst (not aiohttp's traceback)
            logger=BadRequestLog(self),
            keepalive_timeout=limits.idle_timeout,
            # a compressed body is answered 415 (wirekit.serve.doors.httpbody), never inflated
            auto_decompress=False,
        )
        self._server: asyncio.AbstractServer | None = None
        #: the OIP handlers the lean path answers with (:mod:`wirekit.serve.doors.lean`;
        #: None: every request goes through aiohttp, as when the access log is on)
        self.lean: LeanHandlers | None = None if limits.access_log else app.get(LEAN_KEY)
        #: the bodies the lean path reads at most (a larger one is aiohttp's: 413 or streamed)
        self.lean_max_body = min(MAX_BODY, limits.max_body_size)
        self.lean_tasks: set[asyncio.Task[None]] = set()  #: the lean answers being made
        self.handler_factory: Callable[[], asyncio.Protocol] = _not_started
        self._loop: asyncio.AbstractEventLoop | None = None
        self._refusals = BurstLog(log)
        self._header_drops = BurstLog(log)
        self._write_stalls = BurstLog(log)
        error = {
            "error": f"too many connections: the HTTP front door holds {limits.max_connections}"
            " at most (http.max_connections); try again"
        }
        body = json.dumps(error).encode()
        self._refusal = (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Retry-After: 1\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the door is not started"
        return self._loop

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port``; returns the port bound."""
        self._loop = asyncio.get_running_loop()
        await self._runner.setup()
        # aiohttp's public protocol factory: one request handler per connection, each
        # request handled by the application within the door's scope
        factory = self._runner.server
        assert factory is not None  # set up just above
        factory.request_handler = self.scoped(factory.request_handler)
        self.handler_factory = factory
        self._server = await self._loop.create_server(
            lambda: GatedConnection(self), host, port, backlog=128
        )
        warn_if_cap_exceeds_fds(self.limits.max_connections)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening, close every connection (aiohttp lets requests in flight end)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        # the lean path's requests in flight end too (and the pipelined ones after them),
        # as aiohttp lets its own end, within the same bound
        deadline = self.loop.time() + SHUTDOWN_TIMEOUT if self._loop is not None else 0.0
        while self.lean_tasks and self.loop.time() < deadline:
            await asyncio.wait(set(self.lean_tasks), timeout=deadline - self.loop.time())
        if self._loop is not None:  # set up (aiohttp cleans up only what it set up)
            await self._runner.cleanup()
        if server is not None:
            await server.wait_closed()

    def admit(self, conn: GatedConnection, transport: asyncio.Transport) -> bool:
        """Count ``conn`` in, or answer 503 and close it when the cap is reached."""
        if self.open >= self.limits.max_connections:
            transport.write(self._refusal)
            transport.close()
            self._refusals.event(
                self.loop.time(),
                "wirekit serve: HTTP connection refused: %d open, the limit"
                " (http.max_connections); new connections get 503 until some close",
                self.open,
            )
            return False
        self.open += 1
        self._by_transport[transport] = conn
        return True

    def left(self, conn: GatedConnection) -> None:
        self.open -= 1
        if conn.transport is not None:
            self._by_transport.pop(conn.transport, None)

    def header_timed_out(self, now: float) -> None:
        self._header_drops.event(
            now,
            "wirekit serve: HTTP connection dropped: request headers not complete %g s after"
            " the connection opened or the request's first byte (http.header_timeout)",
            self.limits.header_timeout,
        )

    def write_stalled(self, now: float, unsent: int) -> None:
        self._write_stalls.event(
            now,
            "wirekit serve: HTTP connection dropped: its client read nothing of an answer for"
            " %g s, %d bytes left unsent (http.write_stall_timeout)",
            self.limits.write_stall_timeout,
            unsent,
        )

    def bad_request(self, exc: HttpProcessingError, peer: str | None) -> None:
        """A request aiohttp reported as malformed (its parser's refusal: 400, the
        connection closed): counted, logged once per burst."""
        self.bad_requests += 1
        reason = str(exc.message or type(exc).__name__)
        if len(reason) > REASON_CHARS:
            reason = reason[:REASON_CHARS] + "..."
        self._bad_requests.event(
            self.loop.time(),
            "wirekit serve: malformed HTTP request from %s refused, its connection closed: %s"
            " (wirekit_serve_http_bad_requests_total counts them)",
            peer or "?",
            reason,
        )

    def scoped(self, handler: RequestHandler) -> RequestHandler:
        """``handler`` (the application's) within the door's scope of a request: its
        connection is busy while the application answers it (no header timer runs then),
        its body is read by a :class:`BodyReader` whose charge is given back when it ends,
        and a body too slow (408) closes the connection once answered (aiohttp would keep
        reading it)."""
        connections = self._by_transport
        limits, budget = self.limits, self.budget
        timed = limits.access_log

        async def scope(request: web.BaseRequest) -> web.StreamResponse:
            if timed:
                request[ACCESS_START] = perf_counter()
            conn = connections.get(request.transport)  # type: ignore[arg-type]
            reader = request[READER_KEY] = BodyReader(limits, budget)
            if conn is not None:
                conn.request_started()
            try:
                # a body over http.max_body_size asked for (Expect: 100-continue): 413 now,
                # before the application's route would answer 100 Continue
                unwanted = unwanted_body_refusal(request, limits)
                if unwanted is not None:
                    return await _answer_and_close(request, unwanted)
                return await handler(request)
            except web.HTTPRequestTimeout as slow:  # the body's: answer, then drop the client
                return await _answer_and_close(request, slow)
            finally:
                reader.release()
                if conn is not None:
                    conn.request_ended()

        return scope


async def _answer_and_close(
    request: web.BaseRequest, answer: web.HTTPException
) -> web.HTTPException:
    """Write ``answer`` and close the connection at once (aiohttp would go on reading, or
    wait for, a body the door will not read)."""
    answer.force_close()  # says Connection: close
    await answer.prepare(request)
    await answer.write_eof()
    if request.transport is not None:
        request.transport.close()
    return answer


def _not_started() -> asyncio.Protocol:
    raise RuntimeError("the HTTP door is not started")


__all__ = ["AccessLogger", "BadRequestLog", "GatedConnection", "HttpDoor"]
