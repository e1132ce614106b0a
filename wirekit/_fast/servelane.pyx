# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of ``wirekit.serve.dispatch.lane`` (the dispatcher's MIP lane): same classes, same
behaviour; ``tests/test_serve_lane.py`` runs both."""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.math cimport INFINITY
from libc.stdint cimport uint8_t, uint32_t

from wirekit._fast.mip cimport _frame_ok

import asyncio
import logging

from wirekit import mip
from wirekit.mip import ErrorCode, ErrorReply
from wirekit.serve.dispatch.cache import digest
from wirekit.serve.dispatch.payload import Payload

cdef object log = logging.getLogger("wirekit.serve")
cdef object _CANCELLED = asyncio.CancelledError

cdef bytes _INTERNAL = mip.encode(ErrorReply(int(ErrorCode.INTERNAL)))
cdef object _ZERO = 0, _ONE = 1
cdef str _CACHE = "cache"

IN_FLIGHT, ANSWERED, HANDED_OVER, ABANDONED = 0, 1, 2, 3
DEF S_IN_FLIGHT = 0
DEF S_ANSWERED = 1
DEF S_HANDED_OVER = 2
DEF S_ABANDONED = 3


cdef inline uint32_t _be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef Py_ssize_t _size(const uint8_t* b, Py_ssize_t pos, Py_ssize_t end,
                      int subtype, Py_ssize_t max_items) noexcept nogil:
    cdef Py_ssize_t stop, p, count, i, width
    if end - pos < 12:
        return -1
    stop = _frame_ok(b, end, pos, -1)  # the codec's frame check: -1 incomplete, -2 bad
    if stop < 12 or b[pos + 1] != 2 or b[pos + 2] != subtype:
        return -1
    stop += pos
    width = b[pos + 9] if subtype else b[pos + 8]
    count = width * ((b[pos + 10] << 8) | b[pos + 11])
    if 0 <= max_items < count:
        return -1
    p = pos + 12
    for i in range(count):
        if stop - p < 8:
            return -1
        p += 8 + <Py_ssize_t>_be32(b + p + 4)
        if p > stop:
            return -1
    return stop - pos if p == stop else -1


def inference_size(buf, Py_ssize_t pos, Py_ssize_t end, int subtype,
                   Py_ssize_t max_items=-1):
    """The size of the MIP message at ``buf[pos:end]`` if it is complete and a well-formed
    inference message of ``subtype`` (0 request, 1 response) of at most ``max_items`` items
    (-1: any number), else -1."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if pos < 0 or end > view.len or pos > end:
            return -1
        return _size(<const uint8_t*>view.buf, pos, end, subtype, max_items)
    finally:
        PyBuffer_Release(&view)


cdef class Lane


cdef class LaneCall:
    """One request of a :class:`Lane` on its way to a backend: the backend connection's
    pending call and its future at once."""

    cdef readonly Lane lane
    cdef readonly object row, client, conn, job, reply, key, fallback
    cdef readonly str rid
    cdef readonly bytes wire
    cdef readonly double t_in, deadline, timeout, t_back
    cdef readonly int state

    @property
    def future(self):
        return self

    def done(self):
        return self.state != S_IN_FLIGHT

    def set_result(self, bytes frame):
        """The backend's reply (called once, by the backend connection)."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(frame)
        self.t_back = self.lane._clock()  # when the backend's reply came
        self.client.release_slot()
        if self.state == S_ABANDONED:  # ended when its client went away
            return
        if _size(<const uint8_t*>PyBytes_AS_STRING(frame), 0, n, 1, -1) != n:
            self.state = S_HANDED_OVER
            self.fallback = self.lane.dispatcher.lane_fallback(self, frame, None)
            return
        self.state = S_ANSWERED
        self.reply = frame
        cdef Lane lane = self.lane
        if self.key is not None:
            lane.cache.put(lane.model, self.key, Payload(frame), n)
        lane.wake(self)

    def set_exception(self, exc):
        """No reply: a timeout or a lost connection (called at most once)."""
        self.client.call_failed(self.conn, exc)
        if self.state == S_ABANDONED:  # ended when its client went away
            return
        self.state = S_HANDED_OVER
        self.fallback = self.lane.dispatcher.lane_fallback(self, None, exc)

    def job_done(self, job):
        """The attempt loop answered the request (its ``notify``)."""
        self.job = job
        self.lane.wake(self)


cdef class _Group:
    """The requests of one ``take`` for one backend connection."""
    cdef object client, conn
    cdef Py_ssize_t in_flight, limit
    cdef double deadline, timeout
    cdef list frames, calls


cdef class Lane:
    """The MIP lane of one front-door connection (see ``wirekit.serve.dispatch.lane.Lane``)."""

    cdef readonly object dispatcher, store, stats, wake, pending, cache
    cdef readonly str model, client
    cdef readonly bint enabled
    cdef bint _off
    cdef Py_ssize_t max_size, max_items
    cdef object _clock, _router, _single, _append, _version
    cdef dict _clients

    def __init__(self, dispatcher, str model, str client, route, Py_ssize_t max_size,
                 Py_ssize_t max_items, pending, wake):
        self.dispatcher = dispatcher
        self.model = model
        self.client = client
        self.max_size = max_size
        self.max_items = max_items
        self.pending = pending
        self._append = pending.append
        self.wake = wake
        self.enabled = route is not None
        self.store = dispatcher.store
        self.cache = dispatcher.cache if dispatcher.cache.enabled else None
        self.stats = dispatcher.metrics.stats(model)
        self._clock = dispatcher.clock
        self._router = dispatcher.router
        self._single = None
        self._clients = {}
        self._off = False
        self._version = dispatcher.route_version
        if route is not None:
            self._route(route)

    cdef _route(self, route):
        """Take ``route`` (see ``wirekit.serve.dispatch.lane.Lane._route``)."""
        if route is None:
            self._off = True
            return
        _cfg, rows, clients = route
        self._clients = dict(clients)
        self._single = rows[0] if len(rows) == 1 else None
        self._off = False

    def take(self, src, Py_ssize_t pos, Py_ssize_t end, double t_in):
        """Send the well-formed inference requests at ``src[pos:end]``; return where the
        first one not taken starts (see ``wirekit.serve.dispatch.lane.Lane.take``)."""
        cdef object d = self.dispatcher
        if self.enabled and d.route_version != self._version:
            self._version = d.route_version
            self._route(d.lane_route(self.model))
        if not self.enabled or self._off or d.closing:
            return pos
        cdef Py_buffer view
        cdef const uint8_t* base
        cdef Py_ssize_t size, n = 0
        cdef bint whole = type(src) is bytes
        cdef object row, key, conn, frame, t_obj = t_in
        cdef str model = self.model, client_name = self.client
        cdef LaneCall call
        cdef _Group group = None, g
        cdef dict groups = None
        cdef list arrived = [], handed = None
        cdef object single = self._single
        cdef object cache = self.cache, hit
        PyObject_GetBuffer(src, &view, PyBUF_SIMPLE)
        try:
            base = <const uint8_t*>view.buf
            if end > view.len:
                end = view.len
            while True:
                size = _size(base, pos, end, 0, self.max_items)
                if size < 0 or size > self.max_size:
                    break
                # the one draw for this request (wirekit.serve.dispatch.router): sent to this device
                # now, or waiting for it in the dispatcher's attempt loop
                row = single if single is not None else self._router.choose(model, ())
                key = row.key
                if group is None or group.client is not self._clients[key]:
                    if groups is None:
                        groups = {}
                    group = groups.get(key)
                    if group is None:
                        group = _Group.__new__(_Group)
                        group.client = self._clients[key]
                        slots = group.client.free_slots()
                        group.frames = []
                        group.calls = []
                        groups[key] = group
                        group.in_flight = 0
                        if slots is None:  # nothing can be sent: limit 0
                            group.limit = 0
                        else:
                            group.conn, group.limit, group.deadline = slots
                            group.timeout = group.client.timeout
                if whole and pos == 0 and size == end:
                    frame = src
                else:
                    frame = PyBytes_FromStringAndSize(<const char*>base + pos, size)
                if group.in_flight >= group.limit:  # no open connection or no free slot
                    if handed is None:
                        handed = []
                    handed.append((self._hand_over(frame, t_obj), row))
                    pos += size
                    continue
                call = LaneCall.__new__(LaneCall)
                call.lane = self
                call.row = row
                call.client = group.client
                call.conn = group.conn
                call.wire = frame
                call.t_in = t_in
                call.deadline = group.deadline
                call.timeout = group.timeout
                call.state = S_IN_FLIGHT
                self._append(call)
                if cache is not None:
                    call.key = digest(memoryview(frame)[8:])
                    hit = cache.get(model, call.key)
                    if hit is not None:  # answered at once, nothing sent
                        call.state = S_ANSWERED
                        call.row = None
                        call.reply = hit.wire
                        call.key = None
                if call.state == S_IN_FLIGHT:
                    group.in_flight += 1
                    group.frames.append(frame)
                    group.calls.append(call)
                arrived.append(call)
                n += 1
                pos += size
        finally:
            PyBuffer_Release(&view)
        cdef list requests, rids
        cdef Py_ssize_t i
        if n:
            rids = d.new_ids(n)
            requests = []
            for i in range(n):
                call = <LaneCall>arrived[i]
                call.rid = <str>rids[i]
                requests.append((call.rid, PyBytes_GET_SIZE(call.wire), call.wire))
            # recorded (their arrivals journaled) before they leave
            if d.lane_arrived(self.stats, model, client_name, t_obj, requests):
                for g in groups.values():
                    if g.calls:
                        g.client.send_calls(g.conn, g.frames, g.calls, g.deadline)
            else:  # their arrivals could not be journaled: none is sent, each refused
                for i in range(n):
                    call = <LaneCall>arrived[i]
                    call.state = S_HANDED_OVER
                    call.job = d.lane_refused(model, client_name, call.rid, t_obj,
                                              call.wire)
        if handed is not None:
            self._start(handed)
        return pos

    cdef object _hand_over(self, frame, t_in):
        """A request that cannot be sent now: the dispatcher's job, in its place among the
        answers to come (see ``wirekit.serve.dispatch.lane.Lane._hand_over``)."""
        job = self.dispatcher.new_job(self.model, frame, self.client, t_in, self.wake)
        self._append(job)
        return job

    cdef _start(self, list handed):
        """Start the handed-over jobs, each on the device drawn for it (see
        ``wirekit.serve.dispatch.lane.Lane._start``)."""
        start = self.dispatcher.start
        for job, row in handed:
            try:
                start(job, row)
            except Exception as exc:
                job.error = exc

    def answers(self, pending):
        """Pop the answers ready at the head of ``pending``, in order, recording the lane's
        own; return them (see ``wirekit.serve.dispatch.lane.Lane.answers``)."""
        cdef list out = [], done = [], backend = []  # backend: the time of each sent
        cdef Py_ssize_t n = 0
        cdef double t_out = 0.0, rt, total = 0.0, lo = INFINITY, hi = -INFINITY
        cdef object t_obj = None, head, cls, row, device, attempts, tin_obj = None
        cdef double tin = -1.0
        cdef LaneCall call
        cdef set succeeded = None
        cdef object last = None
        cdef dict by_row = {} if self.stats.recent is not None else None  # window per device
        cdef list g
        while pending:
            head = pending[0]
            cls = type(head)
            if cls is bytes:
                out.append(head)
            elif cls is LaneCall:
                call = <LaneCall>head
                if call.state == S_ANSWERED:
                    if not n:
                        t_obj = self._clock()
                        t_out = t_obj
                        succeeded = set()
                    n += 1
                    rt = t_out - call.t_in
                    total += rt
                    if rt < lo:
                        lo = rt
                    if rt > hi:
                        hi = rt
                    row = call.row
                    if row is None:  # answered from the cache
                        device = _CACHE
                        attempts = _ZERO
                    else:
                        device = row.key
                        attempts = _ONE
                        backend.append(call.t_back - call.t_in)
                        if row is not last:  # DeviceRow hashes its fields: once per run
                            succeeded.add(row)
                            last = row
                        if by_row is not None:
                            g = by_row.get(device)
                            if g is None:
                                by_row[device] = [1, rt, rt, rt]
                            else:
                                g[0] += 1
                                g[1] += rt
                                if rt < g[2]:
                                    g[2] = rt
                                if rt > g[3]:
                                    g[3] = rt
                    if tin_obj is None or call.t_in != tin:  # one read, one time object:
                        tin = call.t_in                   # the store writes its text once
                        tin_obj = tin
                    done.append((call.rid, device, tin_obj, PyBytes_GET_SIZE(call.wire),
                                 attempts, call.wire))
                    out.append(call.reply)
                elif call.job is not None:
                    out.append(_job_answer(call.job))
                else:
                    break
            elif head.outcome is not None or head.error is not None:
                out.append(_job_answer(head))
            else:
                break
            pending.popleft()
        if n:
            self.dispatcher.lane_answered(self.stats, self.model, self.client, t_obj, total,
                                          lo, hi, succeeded, done, by_row, backend)
        return out


    def abandon(self, pending):
        """The client went away: end every request of ``pending`` now (see
        ``wirekit.serve.dispatch.lane.Lane.abandon``)."""
        cdef object d = self.dispatcher, entry, cls
        cdef LaneCall call
        cdef object complete = None
        for entry in pending:
            cls = type(entry)
            if cls is bytes:
                continue
            if cls is LaneCall:
                call = <LaneCall>entry
                if call.state == S_ANSWERED:
                    if complete is None:
                        complete = type(pending)()
                    complete.append(call)
                elif call.state == S_IN_FLIGHT:
                    call.state = S_ABANDONED
                    d.abandoned(self.model, self.client, call.rid, call.t_in, call.wire, 1)
                elif call.job is None and call.fallback is not None:  # in the attempt loop
                    d.abandon(call.fallback)
            else:
                d.abandon(entry)
        if complete is not None:
            self.answers(complete)


cdef object _job_answer(job):
    if job.outcome is not None:
        return job.outcome.response.wire
    if not isinstance(job.error, _CANCELLED):
        log.error("dispatch failed: %r", job.error)
    return _INTERNAL
