"""The MIP lane: the dispatcher's per-request path from a MIP client to a MIP backend, with
every request of one read handled in one call (the pure-Python twin; the compiled one is
``wirekit/_fast/servelane.pyx``, used unless ``WIREKIT_PURE`` is set or it is not built).

A MIP front-door connection of a model served only by pipelined MIP backends, without
adaptive batching, takes its requests through a :class:`Lane`:

* :meth:`Lane.take` -- the well-formed inference requests at the start of a read, in one
  call: each gets its id, its arrival row (batched, as :meth:`RequestStore.arrival` does;
  the arrivals of the read journaled in one write before any of them is sent; when that
  write fails -- a full disk -- none is sent, each is answered as refused:
  :meth:`Dispatcher.lane_refused`),
  a device by quota, and a slot on that backend's open connection; the requests for one
  connection go out in one write, byte for byte as they came.  With the cache on, a request
  answered recently is answered from the cache instead (device ``cache``, 0 attempts), and
  a backend's answer is cached.  A request whose device (drawn once, by
  :meth:`Router.choose <wirekit.serve.dispatch.router.Router.choose>`) has no open connection or no
  free slot is handed to the dispatcher's attempt loop *with that device*
  (:meth:`Dispatcher.start`), where it waits for a slot: the lane never draws twice, so the
  quotas hold under load.  A message the lane does not take (a ping, a malformed message, a
  partial frame, the dispatcher closing) stops it: the front door handles that one message
  its general way and hands the rest of the read back to the lane.
* :class:`LaneCall` -- one request on its way: it sits in the backend connection's queue as
  its own pending call and future.  A well-formed inference reply is its answer (status
  ``ok``, the bytes passed back as they came); anything else -- an error reply, a reply that
  needs KubeMo's ``n_output`` correction, a timeout, a lost connection -- hands the request to
  the dispatcher's attempt loop (:meth:`Dispatcher.lane_fallback`), which records and
  answers it (resubmitted to another device, backed off, exactly once) as any request.
* :meth:`Lane.answers` -- the answers ready at the head of the connection's queue, in
  order, when the front door flushes: each lane answer is recorded then (time out, the
  completion row, its journal line, metrics), so that the front door writes the journal
  before it writes the answers.
* :meth:`Lane.abandon` -- the client went away (:meth:`MipFrontDoor.connection_lost
  <wirekit.serve.doors.mipfront.MipFrontDoor.connection_lost>`): every request it is still owed
  ends at once, through the dispatcher's completion record -- ``ok`` when its answer was
  complete (not yet written), else ``abandoned`` (:meth:`Dispatcher.abandoned`,
  :meth:`Dispatcher.abandon`).  A backend's later reply to an abandoned call only frees
  its slot.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from typing import Any

from wirekit import mip
from wirekit.errors import DecodeError
from wirekit.mip import ErrorCode, ErrorReply

from ..logs import serve_logger
from .cache import digest
from .payload import Payload

log = serve_logger()

_INTERNAL = mip.encode(ErrorReply(int(ErrorCode.INTERNAL)))
_CACHE = "cache"  # the device of an answer from the cache

IN_FLIGHT, ANSWERED, HANDED_OVER, ABANDONED = 0, 1, 2, 3  #: LaneCall states


def inference_size(buf: Any, pos: int, end: int, subtype: int, max_items: int = -1) -> int:
    """The size of the MIP message at ``buf[pos:end]`` if it is complete and a well-formed
    inference message of ``subtype`` (0 request, 1 response) of at most ``max_items`` items
    (-1: any number) -- one ``mip.decode(buf, max_items)`` takes without an error -- else
    -1."""
    if end - pos < 12:
        return -1
    try:  # the codec's frame check
        stop = mip.frame_size(buf if end == len(buf) else memoryview(buf)[:end], pos)
    except DecodeError:
        return -1
    if stop is None or stop < 12 or buf[pos + 1] != 2 or buf[pos + 2] != subtype:
        return -1
    stop += pos
    width = buf[pos + 9] if subtype else buf[pos + 8]
    count = width * ((buf[pos + 10] << 8) | buf[pos + 11])
    if 0 <= max_items < count:
        return -1
    p = pos + 12
    for _ in range(count):
        if stop - p < 8:
            return -1
        p += 8 + int.from_bytes(buf[p + 4 : p + 8], "big")
        if p > stop:
            return -1
    return stop - pos if p == stop else -1


class LaneCall:
    """One request of a :class:`Lane` on its way to a backend: the backend connection's
    pending call and its future at once (``future`` is the call itself)."""

    __slots__ = (
        "client",
        "conn",
        "deadline",
        "fallback",
        "job",
        "key",
        "lane",
        "reply",
        "rid",
        "row",
        "state",
        "t_back",
        "t_in",
        "timeout",
        "wire",
    )

    def __init__(
        self,
        lane: Lane,
        row: Any,
        client: Any,
        conn: Any,
        rid: str,
        wire: bytes,
        t_in: float,
        deadline: float,
    ) -> None:
        self.lane = lane
        self.row = row
        self.client = client
        self.conn = conn
        self.rid = rid
        self.wire = wire
        self.t_in = t_in
        self.t_back = 0.0  #: when the backend's reply came
        self.deadline = deadline
        self.timeout = client.timeout
        self.state = IN_FLIGHT
        self.reply: bytes | None = None
        self.job: Any = None  #: the dispatcher's Job once handed over and answered
        self.fallback: Any = None  #: the dispatcher's Job once handed over
        self.key: bytes | None = None  #: its cache key (the cache on)

    @property
    def future(self) -> LaneCall:
        return self

    def done(self) -> bool:
        return self.state != IN_FLIGHT

    def set_result(self, frame: bytes) -> None:
        """The backend's reply (called once, by the backend connection)."""
        self.t_back = self.lane.dispatcher.clock()
        self.client.release_slot()
        if self.state == ABANDONED:  # ended when its client went away
            return
        if inference_size(frame, 0, len(frame), 1) != len(frame):
            self.state = HANDED_OVER
            self.fallback = self.lane.dispatcher.lane_fallback(self, frame, None)
            return
        self.state = ANSWERED
        self.reply = frame
        lane = self.lane
        if self.key is not None and lane.cache is not None:  # a key only with the cache on
            lane.cache.put(lane.model, self.key, Payload(frame), len(frame))
        lane.wake(self)

    def set_exception(self, exc: BaseException) -> None:
        """No reply: a timeout or a lost connection (called at most once)."""
        self.client.call_failed(self.conn, exc)
        if self.state == ABANDONED:  # ended when its client went away
            return
        self.state = HANDED_OVER
        self.fallback = self.lane.dispatcher.lane_fallback(self, None, exc)

    def job_done(self, job: Any) -> None:
        """The attempt loop answered the request (its ``notify``)."""
        self.job = job
        self.lane.wake(self)


class Lane:
    """The MIP lane of one front-door connection (see the module docstring).

    ``route``: ``(model config, device rows, {row key: pipelined AsyncClient})`` from
    :meth:`Dispatcher.lane_route`, or None (then :meth:`take` takes nothing).  ``pending``:
    the front door's queue of answers to come; ``max_size`` and ``max_items``: the front
    door's limits (a request over them is not taken: the front door refuses it);
    ``wake(call)`` is called when a call is answered (the front door's ``_done``)."""

    def __init__(
        self,
        dispatcher: Any,
        model: str,
        client: str,
        route: Any,
        max_size: int,
        max_items: int,
        pending: deque,
        wake: Any,
    ) -> None:
        self.dispatcher = dispatcher
        self.pending = pending
        self.model = model
        self.client = client
        self.max_size = max_size
        self.max_items = max_items
        self.wake = wake
        self.enabled = route is not None
        self.store = dispatcher.store
        self.cache = dispatcher.cache if dispatcher.cache.enabled else None
        self.stats = dispatcher.metrics.stats(model)
        self._clock = dispatcher.clock
        self.version = dispatcher.route_version
        self.off = False  #: the model is no longer routed through the lane
        self.clients: dict[str, Any] = {}
        self.single: Any = None
        if route is not None:
            self._route(route)

    def _route(self, route: Any) -> None:
        if route is None:  # removed, or no longer served by pipelined MIP backends only
            self.off = True
            return
        _cfg, rows, self.clients = route
        self.single = rows[0] if len(rows) == 1 else None
        self.off = False

    def take(self, src: Any, pos: int, end: int, t_in: float) -> int:
        """Send the well-formed inference requests at ``src[pos:end]`` (the front door's
        read, or its buffer) that arrived at ``t_in``; return where the first one not taken
        starts.  Each becomes a :class:`LaneCall` appended to the front door's queue.

        When the dispatcher's routing changed since the last read (``route_version``: the
        catalog changed), the lane takes its route again first."""
        d = self.dispatcher
        if d.route_version != self.version and self.enabled:
            self.version = d.route_version
            self._route(d.lane_route(self.model))
        if not self.enabled or self.off or d.closing:
            return pos
        read = _Read(t_in)
        whole = type(src) is bytes
        while True:
            size = inference_size(src, pos, end, 0, self.max_items)
            if size < 0 or size > self.max_size:
                break
            # the read itself when it is exactly this request
            frame = src if whole and size == end and pos == 0 else bytes(src[pos : pos + size])
            self._take_one(read, frame)
            pos += size
        if read.arrived:
            self._send(read)
        if read.handed:
            self._start(read.handed)
        return pos

    def _take_one(self, read: _Read, frame: bytes) -> None:
        """One request of ``read``: sent with the others for its device, answered from the
        cache, or handed to the dispatcher (no open connection or no free slot)."""
        # The one draw for this request (wirekit.serve.dispatch.router): it is sent to this
        # device now, or waits for it in the dispatcher's attempt loop.
        row = (
            self.single
            if self.single is not None
            else self.dispatcher.router.choose(self.model, ())
        )
        group = read.groups.get(row.key)
        if group is None:
            group = read.groups[row.key] = _Group(self.clients[row.key])
        if group.free <= 0:  # no open connection or no free slot
            read.handed.append((self._hand_over(frame, read.t_in), row))
            return
        call = LaneCall(self, row, group.client, group.conn, "", frame, read.t_in, group.deadline)
        self.pending.append(call)
        if self.cache is not None:
            self._look_up(call)
        if call.state == IN_FLIGHT:
            group.free -= 1
            group.frames.append(frame)
            group.calls.append(call)
        read.arrived.append(call)

    def _look_up(self, call: LaneCall) -> None:
        """Answer ``call`` from the cache when it holds its answer (nothing sent); else keep
        its key, for its answer."""
        assert self.cache is not None
        call.key = digest(memoryview(call.wire)[8:])
        hit = self.cache.get(self.model, call.key)
        if hit is not None:  # answered at once, nothing sent
            call.state = ANSWERED
            call.row = None
            call.reply = hit.wire
            call.key = None

    def _send(self, read: _Read) -> None:
        """The requests of ``read`` get their ids and are recorded as arrived (their
        arrivals journaled), then leave: one write per connection."""
        d = self.dispatcher
        requests = []
        for call, rid in zip(read.arrived, d.new_ids(len(read.arrived)), strict=True):
            call.rid = rid
            requests.append((rid, len(call.wire), call.wire))
        if not d.lane_arrived(self.stats, self.model, self.client, read.t_in, requests):
            # their arrivals could not be journaled: none is sent, each ends refused
            for call in read.arrived:
                call.state = HANDED_OVER
                call.job = d.lane_refused(self.model, self.client, call.rid, call.t_in, call.wire)
            return
        for group in read.groups.values():
            if group.calls:
                group.client.send_calls(group.conn, group.frames, group.calls, group.deadline)

    def _hand_over(self, frame: bytes, t_in: float) -> Any:
        """A request that cannot be sent now (no open connection or no free slot on the
        device drawn for it): the dispatcher's job, in its place among the answers to come
        (started by :meth:`_start`)."""
        job = self.dispatcher.new_job(self.model, frame, self.client, t_in, self.wake)
        self.pending.append(job)
        return job

    def _start(self, handed: list[tuple[Any, Any]]) -> None:
        """Start the jobs of :meth:`_hand_over`, each on the device drawn for it (it waits
        for a slot there), once the lane's own requests hold their slots."""
        start = self.dispatcher.start
        for job, row in handed:
            try:
                start(job, row)
            except Exception as exc:  # answered INTERNAL, logged when its turn comes
                job.error = exc

    def answers(self, pending: deque) -> list[bytes]:
        """Pop the answers ready at the head of ``pending`` (bytes, the dispatcher's jobs,
        lane calls), in order, recording the lane's own (:meth:`Dispatcher.lane_answered`,
        the batched end of the requests that end ``ok``); return them."""
        out: list[bytes] = []
        flush: _Flush | None = None
        while pending:
            head = pending[0]
            cls = type(head)
            if cls is bytes:
                out.append(head)
            elif cls is LaneCall:
                if head.state == ANSWERED:
                    if flush is None:
                        flush = _Flush(self._clock(), self.stats.recent is not None)
                    flush.add(head)
                    out.append(head.reply)
                elif head.job is not None:
                    out.append(_job_answer(head.job))
                else:
                    break
            elif head.outcome is not None or head.error is not None:
                out.append(_job_answer(head))
            else:
                break
            pending.popleft()
        if flush is not None:
            self.dispatcher.lane_answered(
                self.stats,
                self.model,
                self.client,
                flush.t_out,
                flush.total,
                flush.lo,
                flush.hi,
                flush.succeeded,
                flush.done,
                flush.by_row,
                flush.backend,
            )
        return out

    def abandon(self, pending: deque) -> None:
        """The client went away: end every request of ``pending`` (the front door's queue
        of answers to come) now -- a lane call answered but not written yet ``ok`` (as
        :meth:`answers` records it), one still on its way ``abandoned``
        (:meth:`Dispatcher.abandoned`), a dispatcher's job through
        :meth:`Dispatcher.abandon`.  ``pending`` is left as it is (the connection drops
        it); the caller writes the journal."""
        d = self.dispatcher
        complete: deque = deque()
        for entry in pending:
            cls = type(entry)
            if cls is bytes:
                continue
            if cls is LaneCall:
                if entry.state == ANSWERED:
                    complete.append(entry)
                elif entry.state == IN_FLIGHT:
                    entry.state = ABANDONED
                    d.abandoned(self.model, self.client, entry.rid, entry.t_in, entry.wire, 1)
                elif entry.job is None and entry.fallback is not None:  # in the attempt loop
                    d.abandon(entry.fallback)
            else:
                d.abandon(entry)
        if complete:
            self.answers(complete)


class _Group:
    """The requests of one :meth:`Lane.take` for one backend connection (the compiled
    twin's ``_Group``)."""

    __slots__ = ("calls", "client", "conn", "deadline", "frames", "free")

    def __init__(self, client: Any) -> None:
        self.client = client
        slots = client.free_slots()
        self.conn: Any = None
        self.free = 0
        self.deadline = 0.0
        if slots is not None:
            self.conn, self.free, self.deadline = slots
        self.frames: list[bytes] = []
        self.calls: list[LaneCall] = []


class _Read:
    """What one :meth:`Lane.take` gathers: the requests of one read that arrived at
    ``t_in``."""

    __slots__ = ("arrived", "groups", "handed", "t_in")

    def __init__(self, t_in: float) -> None:
        self.t_in = t_in
        self.groups: dict[str, _Group] = {}  # row key -> its requests
        self.arrived: list[LaneCall] = []  # their ids are given at the end
        self.handed: list[tuple[Any, Any]] = []  # (job, row): for the dispatcher, after


class _Flush:
    """The lane's answers of one :meth:`Lane.answers` that end ``ok`` (answered at
    ``t_out``): what :meth:`Dispatcher.lane_answered` records."""

    __slots__ = ("backend", "by_row", "done", "hi", "last", "lo", "succeeded", "t_out", "total")

    def __init__(self, t_out: float, per_row: bool) -> None:
        self.t_out = t_out
        self.total = 0.0
        self.lo = math.inf
        self.hi = -math.inf
        self.done: list[tuple[str, str, float, int, int, bytes]] = []  # for the store
        self.backend: list[float] = []  # the backend time of each sent (not from the cache)
        self.succeeded: set[Any] = set()
        self.last: Any = None
        # per row key [n, total, lo, hi], for the window per device (gathered only when the
        # controller keeps a window)
        self.by_row: dict[str, list[Any]] | None = {} if per_row else None

    def add(self, call: LaneCall) -> None:
        """``call`` answered: its response time, device and row."""
        rt = self.t_out - call.t_in
        self.total += rt
        self.lo = min(self.lo, rt)
        self.hi = max(self.hi, rt)
        row = call.row
        if row is None:  # answered from the cache
            device, attempts = _CACHE, 0
        else:
            device, attempts = row.key, 1
            self.backend.append(call.t_back - call.t_in)
            if row is not self.last:  # DeviceRow hashes its fields: once per run
                self.succeeded.add(row)
                self.last = row
            if self.by_row is not None:
                _add_time(self.by_row, device, rt)
        wire = call.wire
        self.done.append((call.rid, device, call.t_in, len(wire), attempts, wire))


def _add_time(by_row: dict[str, list[Any]], key: str, rt: float) -> None:
    """One response time ``rt`` of the row ``key`` into ``by_row``'s ``[n, total, lo, hi]``."""
    g = by_row.get(key)
    if g is None:
        by_row[key] = [1, rt, rt, rt]
    else:
        g[0] += 1
        g[1] += rt
        g[2] = min(g[2], rt)
        g[3] = max(g[3], rt)


def _job_answer(job: Any) -> bytes:
    """What a job of the dispatcher's general path answers (an INTERNAL error reply when it
    was cancelled or failed)."""
    if job.outcome is not None:
        return job.outcome.response.wire
    if not isinstance(job.error, asyncio.CancelledError):
        log.error("dispatch failed: %r", job.error)
    return _INTERNAL
