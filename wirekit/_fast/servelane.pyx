# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of ``wirekit.serve.lane`` (the dispatcher's MIP lane): same classes, same
behaviour; ``tests/test_serve_lane.py`` runs both."""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint32_t

from wirekit._fast.mip cimport _frame_ok

import asyncio
import logging

from wirekit import mip
from wirekit.mip import ErrorCode, ErrorReply
from wirekit.serve.cache import digest
from wirekit.serve.payload import Payload

cdef object log = logging.getLogger("wirekit.serve")
cdef object _CANCELLED = asyncio.CancelledError

cdef int _ARRIVAL = 0, _COMPLETION = 1
cdef bytes _INTERNAL = mip.encode(ErrorReply(int(ErrorCode.INTERNAL)))
cdef str _OK = "ok"
cdef str _CACHE = "cache"

IN_FLIGHT, ANSWERED, HANDED_OVER = 0, 1, 2
NO_JOURNAL, LINES, COMPLETE = 0, 1, 2
DEF S_IN_FLIGHT = 0
DEF S_ANSWERED = 1
DEF S_HANDED_OVER = 2
DEF M_LINES = 1
DEF M_COMPLETE = 2


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
    cdef readonly object row, client, conn, job, reply, key
    cdef readonly str rid
    cdef readonly bytes wire
    cdef readonly double t_in, deadline, timeout
    cdef readonly int state

    @property
    def future(self):
        return self

    def done(self):
        return self.state != S_IN_FLIGHT

    def set_result(self, bytes frame):
        """The backend's reply (called once, by the backend connection)."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(frame)
        self.client._release_slot()
        if _size(<const uint8_t*>PyBytes_AS_STRING(frame), 0, n, 1, -1) != n:
            self.state = S_HANDED_OVER
            self.lane.dispatcher.lane_fallback(self, frame, None)
            return
        self.state = S_ANSWERED
        self.reply = frame
        cdef Lane lane = self.lane
        if self.key is not None:
            lane.cache.put(lane.model, self.key, Payload(frame), n)
        lane.wake(self)

    def set_exception(self, exc):
        """No reply: a timeout or a lost connection (called at most once)."""
        self.state = S_HANDED_OVER
        self.client._call_failed(self.conn, exc)
        self.lane.dispatcher.lane_fallback(self, None, exc)

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
    """The MIP lane of one front-door connection (see ``wirekit.serve.lane.Lane``)."""

    cdef readonly object dispatcher, store, stats, wake, pending, cache
    cdef readonly str model, client
    cdef readonly bint enabled
    cdef Py_ssize_t max_size, max_items
    cdef object _clock, _router, _single, _append
    cdef dict _clients, _names
    cdef double _hex_of
    cdef str _hex

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
        self.stats = dispatcher.metrics._get(model)
        self._clock = dispatcher._clock
        self._router = dispatcher.router
        self._names = {}
        self._hex_of = -1.0
        self._hex = ""
        self._single = None
        self._clients = {}
        if route is not None:
            _cfg, rows, clients = route
            self._clients = dict(clients)
            if len(rows) == 1:
                self._single = rows[0]

    def take(self, src, Py_ssize_t pos, Py_ssize_t end, double t_in):
        """Send the well-formed inference requests at ``src[pos:end]``; return where the
        first one not taken starts (see ``wirekit.serve.lane.Lane.take``)."""
        cdef object d = self.dispatcher
        if not self.enabled or d.closing:
            return pos
        cdef Py_buffer view
        cdef const uint8_t* base
        cdef Py_ssize_t size, n = 0
        cdef bint whole = type(src) is bytes
        cdef object row, key, conn, frame, ids = d._ids, t_obj = t_in
        cdef str rid, prefix = d._prefix, model = self.model, client_name = self.client
        cdef LaneCall call
        cdef _Group group = None, g
        cdef dict groups = None
        cdef list ops = []
        cdef object single = self._single
        cdef bint payloads = self.store.payloads
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
                row = single if single is not None else self._router.choose(model, ())
                key = row.key
                if group is None or group.client is not self._clients[key]:
                    if groups is None:
                        groups = {}
                    group = groups.get(key)
                    if group is None:
                        group = _Group.__new__(_Group)
                        group.client = self._clients[key]
                        conn = group.client._conn
                        if conn is None or conn.closed:
                            break
                        group.conn = conn
                        group.in_flight = group.client._in_flight
                        group.limit = group.client.max_in_flight
                        group.timeout = group.client.timeout
                        group.deadline = conn.loop.time() + group.timeout
                        group.frames = []
                        group.calls = []
                        groups[key] = group
                if group.in_flight >= group.limit:
                    break
                if whole and pos == 0 and size == end:
                    frame = src
                else:
                    frame = PyBytes_FromStringAndSize(<const char*>base + pos, size)
                rid = f"{prefix}{next(ids):x}"
                call = LaneCall.__new__(LaneCall)
                call.lane = self
                call.row = row
                call.client = group.client
                call.conn = group.conn
                call.rid = rid
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
                ops.append((_ARRIVAL, (rid, model, client_name, t_obj, size,
                                       frame if payloads else None)))
                n += 1
                pos += size
        finally:
            PyBuffer_Release(&view)
        if not n:
            return pos
        for g in groups.values():
            if not g.calls:
                continue
            g.client._in_flight = g.in_flight
            conn = g.conn
            conn.waiting.extend(g.calls)
            out = conn.out
            if out is not None:  # writes of this loop pass are being gathered
                out.extend(g.frames)
            else:
                conn.transport.write(g.frames[0] if len(g.frames) == 1 else b"".join(g.frames))
            if g.deadline < conn.timer_due:
                conn.arm(g.deadline)
        d.active += n
        d.lane_requests += n
        stats = self.stats
        stats.requests += n
        stats.queue += n
        self.store.extend(ops, None, 0)
        return pos

    def answers(self, pending):
        """Pop the answers ready at the head of ``pending``, in order, recording the lane's
        own; return them (see ``wirekit.serve.lane.Lane.answers``)."""
        cdef list out = [], ops = [], lines = []
        cdef Py_ssize_t nbytes = 0, n = 0, size
        cdef double t_out = 0.0, rt, total = 0.0, lo, hi
        cdef str tout_hex = "", line, names, device
        cdef int attempts
        cdef object t_obj = None, head, cls, row, store = self.store, stats = self.stats
        cdef LaneCall call
        cdef int mode = store.lane_mode()
        cdef set succeeded = None
        cdef object last = None
        lo = stats.min
        hi = stats.max
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
                        tout_hex = t_obj.hex()
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
                        attempts = 0
                    else:
                        device = row.key
                        attempts = 1
                        if row is not last:  # DeviceRow hashes its fields: once per run
                            succeeded.add(row)
                            last = row
                    size = PyBytes_GET_SIZE(call.wire)
                    if mode == M_COMPLETE:
                        store.complete(call.rid, self.model, self.client, device, call.t_in,
                                       t_obj, _OK, size, attempts, call.wire, True)
                    else:
                        if mode == M_LINES:
                            names = self._names_of(device)
                            line = (f'["{call.rid}",{names}"{self._tin_hex(call.t_in)}",'
                                    f'"{tout_hex}","ok",{size},{attempts},null]\n')
                            nbytes += len(line)
                            lines.append(line)
                        ops.append((_COMPLETION, (device, t_obj, _OK, attempts, call.rid)))
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
            stats.queue -= n
            statuses = stats.statuses
            statuses[_OK] = statuses.get(_OK, 0) + n
            stats.count += n
            stats.total += total
            stats.min = lo
            stats.max = hi
            self.dispatcher.active -= n
            router = self._router
            for row in succeeded:
                router.succeed(row)
            if ops:
                store.extend(ops, lines, nbytes)
        return out

    cdef str _names_of(self, str device):
        names = self._names.get(device)
        if names is None:
            names = self._names[device] = self.store.journal_names(self.model, self.client,
                                                                   device)
        return names

    cdef str _tin_hex(self, double t_in):
        if t_in != self._hex_of:  # the requests of one read share their time
            self._hex_of = t_in
            self._hex = float(t_in).hex()
        return self._hex


cdef object _job_answer(job):
    if job.outcome is not None:
        return job.outcome.response.wire
    if not isinstance(job.error, _CANCELLED):
        log.error("dispatch failed: %r", job.error)
    return _INTERNAL


cdef tuple _QUEUED_TAIL = (None, None, "queued", 0)


def merge_ops(list ops, Py_ssize_t chunk):
    """One hand-over of the store as statements (see ``wirekit.serve.store.merge_ops``):
    the INSERT rows ``chunk`` at a time, flattened, the rows left over, the UPDATEs."""
    cdef dict rows = {}
    cdef list updates = [], inserts, chunks = [], flat
    cdef tuple op, row, arrived
    cdef Py_ssize_t i, j, k, full, width
    cdef object rid, item
    for op in ops:
        row = <tuple>op[1]
        if op[0] == _ARRIVAL:
            rows[row[0]] = row + _QUEUED_TAIL
        else:
            rid = row[4]
            arrived = rows.get(rid)
            if arrived is not None:
                rows[rid] = arrived[:6] + row[:4]
            else:
                updates.append(row)
    inserts = list(rows.values())
    full = len(inserts) - len(inserts) % chunk
    for i in range(0, full, chunk):
        flat = []
        for j in range(i, i + chunk):
            flat.extend(<tuple>inserts[j])
        chunks.append(tuple(flat))
    return chunks, inserts[full:], updates
