# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython twin of ``wirekit.mip.connection.Connection`` (the pure class is ``PyConnection``):
the sans-IO state machine of one MIP server connection, same methods, same events, same
replies, same errors.

Framing is the codec's own (``wirekit._fast.mip``: the header rule, the frame check, the
decoder), the buffering is that of :class:`wirekit._framing.FramedStream` (a ``bytes`` read
kept as is while nothing else is buffered, complete frames sliced out of it; a ``bytearray``
otherwise), the limits are the connection's :class:`~wirekit.mip.limits.Guard` (a Python
object: the runtime's watchdog shares it).  ``tests/test_mip_connection_twins.py`` drives both
twins with the same bytes and requires the same events, bytes out and states; the fuzz target
``mip_connection`` does the same under AddressSanitizer.

Memory: nothing is read outside the ``bytes`` or ``bytearray`` it is in (every position is
checked against its end before a pointer is formed), nothing is allocated beyond the bytes
received (a frame is sliced only once complete and within ``max_message_size``; a skipped
message is a count, not a buffer).
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyObject_GenericSetAttr
from libc.stdint cimport uint8_t, uint32_t

from wirekit._fast.mip cimport _decode, _frame_ok, _header_error, _header_fault

cdef extern from "Python.h":
    object PyType_GenericAlloc(type t, Py_ssize_t n)

from collections import deque

from wirekit._fast import mip as _fast_codec
from wirekit.errors import DecodeError
from wirekit.mip.connection import (
    DEFAULT_MAX_IN_FLIGHT,
    Answered,
    LocalProtocolError,
    Rejected,
    Request,
    error_reply,
)
from wirekit.mip import limits as _limits
from wirekit.mip.limits import Guard, Limits, MemoryBudget, OverBudget
from wirekit.mip.messages import PROTOCOL, ErrorCode, ErrorReply, Ping

DEF HEADER_SIZE = 8
DEF RESUME_FACTOR = 2  # reading resumes once the answers owed are at most max_in_flight / 2
DEF COMPACT_AT = 65536  # FramedStream._drop: consumed bytes dropped from the buffer's front
DEF INFERENCE_HEADER = 12  # the message header and n_input, n_output, batch_size
DEF ADMIT = 0  # what the budget says to a request about to be decoded (connection._admit)
DEF PARK = 1
DEF REFUSE = 2

# the memory budget's estimates (wirekit.mip.limits), as C numbers
cdef Py_ssize_t ITEM_COST = _limits.ITEM_COST
cdef Py_ssize_t REQUEST_COST = _limits.REQUEST_COST
cdef Py_ssize_t LANE_FACTOR = _limits.LANE_FACTOR
cdef Py_ssize_t SMALL_REQUEST_COST = _limits.SMALL_REQUEST_COST
cdef Py_ssize_t SMALL_FRAME = _limits.SMALL_FRAME

cdef type _REQUEST = Request
cdef type _PING = Ping
cdef type _ERROR_REPLY = ErrorReply
cdef str _MESSAGE = "message", _FRAME = "frame"
cdef bytes _PONG = b"\x00\x01\x01\x00\x00\x00\x00\x00"
cdef object _METHOD = ErrorCode.METHOD
cdef object _SUBTYPE = ErrorCode.SUBTYPE
cdef object _SHAPE = ErrorCode.SHAPE
cdef object _MEMORY = ErrorCode.MEMORY
cdef int _MEMORY_CODE = int(ErrorCode.MEMORY)
cdef str _NOT_PLACED_READ = "reply() or owe() the last Request before reading on"
cdef str _RELEASED = "the connection was released"
cdef str _NOT_PLACED_EVENT = "reply() or owe() the last Request before the next event"


cdef inline uint32_t _be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline Py_ssize_t _items(bytes frame) noexcept:
    """``n_input`` x ``batch_size`` from a whole inference frame's header (the caller
    checked it has one: 12 bytes at least)."""
    cdef const uint8_t* b = <const uint8_t*>PyBytes_AS_STRING(frame)
    return <Py_ssize_t>b[8] * ((<Py_ssize_t>b[10] << 8) | b[11])


cdef inline Py_ssize_t _cost(bytes frame) noexcept:
    """``wirekit.mip.limits.request_cost(frame)``."""
    return PyBytes_GET_SIZE(frame) + ITEM_COST * _items(frame) + REQUEST_COST


cdef object _request(object message, bytes frame):
    """``Request(message, frame)`` through its slots (no frozen dataclass ``__init__``)."""
    cdef object event = PyType_GenericAlloc(_REQUEST, 0)
    PyObject_GenericSetAttr(event, _MESSAGE, message)
    PyObject_GenericSetAttr(event, _FRAME, frame)
    return event


cdef list _ready(object owed):
    """The default collector (``connection._ready``): the answers ready at the head of
    ``owed`` (bytes, filled slots), popped."""
    cdef list out = []
    cdef object head, wire
    cdef object popleft = owed.popleft
    while owed:
        head = owed[0]
        if type(head) is bytes:
            out.append(head)
        else:
            wire = head.wire
            if wire is None:
                break
            out.append(wire)
        popleft()
    return out


cdef class Connection:
    """One MIP connection as a server sees it: the compiled twin of
    :class:`wirekit.mip.connection.PyConnection` (see that module for the API)."""

    cdef readonly object guard
    cdef readonly object owed
    cdef readonly list ready
    cdef public bint closing
    cdef public bint paused
    cdef public bint write_paused
    cdef readonly Py_ssize_t max_in_flight
    cdef readonly Py_ssize_t max_items

    cdef object _closing_error
    cdef object _pending_events
    cdef object _now
    cdef bint _completed
    cdef bint _unsettled
    cdef bint _timer
    cdef bint _awaiting
    cdef object _py_decode  # None: the compiled codec's decoder, called directly

    # what it holds in the memory budget (see PyConnection.__init__)
    cdef Py_ssize_t _held_read
    cdef Py_ssize_t _in_flight
    cdef object _costs  # deque of int
    cdef Py_ssize_t _unsent
    cdef object _parked  # bytes or None
    cdef object _handed  # bytes or None
    cdef bint _budget_wait

    # the framing (FramedStream's state, same meaning)
    cdef Py_ssize_t _max_size
    cdef object _chunk  # bytes or None
    cdef Py_ssize_t _cpos
    cdef bytearray _buf
    cdef Py_ssize_t _pos
    cdef Py_ssize_t _consumed
    cdef Py_ssize_t _skip
    cdef object _error  # DecodeError or None

    def __init__(self, limits=None, budget=None, now=0.0, *,
                 max_in_flight=DEFAULT_MAX_IN_FLIGHT, codec=None):
        limits = limits if limits is not None else Limits()
        budget = budget if budget is not None else MemoryBudget(limits.memory_budget)
        self._py_decode = None if codec is None or codec is _fast_codec else codec.decode
        self._max_size = limits.max_message_size
        self.max_items = limits.max_items
        self.max_in_flight = max(1, max_in_flight)
        self.guard = Guard(limits, budget, now)
        self.owed = deque()
        self.ready = []
        self.closing = False
        self.paused = False
        self.write_paused = False
        self._closing_error = None
        self._pending_events = deque()
        self._now = now
        self._completed = False
        self._unsettled = False
        self._timer = False
        self._awaiting = False
        self._held_read = 0
        self._in_flight = 0
        self._costs = deque()
        self._unsent = 0
        self._parked = None
        self._handed = None
        self._budget_wait = False
        self._chunk = None
        self._cpos = 0
        self._buf = bytearray()
        self._pos = 0
        self._consumed = 0
        self._skip = 0
        self._error = None

    # ------------------------------------------------------------------ state

    @property
    def reading(self):
        """Whether the runtime should read from the peer now."""
        return not (self.paused or self.write_paused or self.closing)

    @property
    def broken(self):
        """The stream broke: bytes the peer still sends are not requests."""
        return self._closing_error is not None

    @property
    def done(self):
        """Closing and nothing owed: the runtime closes the connection now."""
        return self.closing and not self.owed and not self.ready and self._parked is None

    @property
    def pending(self):
        """Answers are owed or waiting to be sent (the connection is not idle)."""
        return bool(self.owed or self.ready)

    @property
    def buffered(self):
        """Bytes received and not yet taken as messages (a parked request included)."""
        return self._buffered() + self._parked_size()

    @property
    def held(self):
        """Bytes this connection holds in the memory budget."""
        return self.guard.held

    def timer_wanted(self):
        """True (once) when a request started or the transport stopped taking writes."""
        cdef bint wanted = self._timer
        self._timer = False
        return wanted

    # ------------------------------------------------------------------ bytes in

    def receive_data(self, data, now):
        """Bytes read from the peer at ``now``; take the events with :meth:`next_event`."""
        if self._awaiting:
            raise LocalProtocolError(_NOT_PLACED_READ)
        if self.closing:
            return None
        self._now = now
        self._unsettled = True
        self._feed(data)

    def receive_request(self, data, now):
        """:meth:`receive_data` with the common case in one call (see ``PyConnection``)."""
        cdef object msg
        if not (
            self.owed
            or self.ready
            or self.write_paused
            or self.paused
            or self._unsettled
            or self.closing
            or self._awaiting
        ) and type(data) is bytes and self._take_whole(<bytes>data):
            if self.guard.received(now, 0, False, True):
                self._timer = True
            if (
                PyBytes_GET_SIZE(data) > SMALL_FRAME
                and _is_request(<bytes>data)
                and self._admit(<bytes>data) != ADMIT
            ):
                self._pending_events.append(self._over_budget(<bytes>data))
                return None
            try:
                msg = self._decode_frame(<bytes>data)
            except DecodeError as exc:
                self._pending_events.append(self._reject(exc))
                return None
            if _is_request(<bytes>data):
                self._awaiting = True
                self._handed = data
                return _request(msg, <bytes>data)
            self._pending_events.append(self._answer(msg))
            return None
        self.receive_data(data, now)
        return None

    def end_of_input(self):
        """The peer sends no more: answer what was received, then close."""
        self.closing = True

    def shutdown(self):
        """The server stops: the complete requests already received are still handed out,
        then the connection closes."""
        self.closing = True
        self.paused = self._budget_wait

    def take_frames(self, take, *args):
        """Let a runtime's lane take whole well-formed requests straight from the buffer
        (see ``PyConnection.take_frames``); returns the bytes taken."""
        cdef Py_ssize_t n, k, each, extra, i, before
        cdef object owed = self.owed
        if self._awaiting:
            raise LocalProtocolError(_NOT_PLACED_READ)
        if self.paused or self.write_paused or self.closing:
            return 0
        before = len(owed)
        if before >= self.max_in_flight:
            return 0
        n = self._take_frames(take, args)
        if n:
            self._completed = True
            self._held_read -= n if n < self._held_read else self._held_read
            k = len(owed) - before
            if k > 0:  # the lane's entries: LANE_FACTOR x their bytes, REQUEST_COST each
                each = LANE_FACTOR * n // k
                extra = LANE_FACTOR * n - each * k
                self._costs.append(each + extra + REQUEST_COST)
                for i in range(k - 1):
                    self._costs.append(each + REQUEST_COST)
                self._in_flight += LANE_FACTOR * n + k * REQUEST_COST
            if not self._charge():
                self._wait_for_budget()
        return n

    def next_event(self):
        """The next event, or None: more bytes are needed, or reading is paused."""
        cdef object frame, msg, over
        if self._awaiting or self._pending_events:
            if self._awaiting:
                raise LocalProtocolError(_NOT_PLACED_EVENT)
            return self._pending_events.popleft()
        cdef int verdict
        if self._closing_error is None:
            if self._budget_wait:
                pass  # the budget is full: nothing more until this connection's answers go out
            elif not self.closing and (
                self.write_paused or len(self.owed) >= self.max_in_flight
            ):
                self.paused = self.paused or not self.write_paused
            else:
                frame = self._parked
                try:
                    if frame is not None:
                        self._parked = None
                    else:
                        frame = self._next_frame()
                        if frame is not None:
                            self._completed = True
                    if frame is not None:
                        if _is_request(<bytes>frame):  # a request: room for it?
                            verdict = self._admit(<bytes>frame)
                            if verdict == PARK:
                                self._parked = frame
                                self._wait_for_budget()
                                frame = None
                            elif verdict == REFUSE:
                                return self._over_budget(<bytes>frame)
                        if frame is not None:
                            msg = self._decode_frame(<bytes>frame)
                except DecodeError as exc:
                    self._completed = True  # a refused message is taken all the same
                    return self._reject(exc)
                if frame is not None:
                    if _is_request(<bytes>frame):
                        self._awaiting = True
                        self._handed = frame
                        return _request(msg, <bytes>frame)
                    return self._answer(msg)
        if self._unsettled:
            over = self._settle()
            if over is not None:
                return over
        return None

    # ------------------------------------------------------------------ answers

    def reply(self, wire):
        """The answer to the request just taken, ready now."""
        self._awaiting = False
        self._handed = None
        if self.owed:
            self.owed.append(wire)
            self._costs.append(len(wire))
            self._in_flight += len(wire)
        else:
            self.ready.append(wire)

    def owe(self, entry):
        """A placeholder for the answer to the request just taken (in flight, charged at
        its cost until its answer is sent)."""
        cdef Py_ssize_t cost
        self._awaiting = False
        self.owed.append(entry)
        frame = self._handed
        self._handed = None
        cost = REQUEST_COST if frame is None else _cost(<bytes>frame)
        self._costs.append(cost)
        self._in_flight += cost
        self._charge()

    def send(self, now, collect=None):
        """The answers ready at the head of the reply order, as one write (``b""``: none)."""
        cdef object owed = self.owed
        cdef list out = self.ready
        cdef object more
        cdef Py_ssize_t before, popped = 0, freed, i
        if owed:
            before = len(owed)
            more = _ready(owed) if collect is None else collect(owed)
            if more:
                out += more
            popped = before - len(owed)
            if popped:
                if owed:
                    freed = 0
                    for i in range(popped):
                        freed += <Py_ssize_t>self._costs.popleft()
                    self._in_flight -= freed
                else:
                    self._costs.clear()
                    self._in_flight = 0
        if self.paused and (
            popped != 0 if self._budget_wait
            else len(owed) * RESUME_FACTOR <= self.max_in_flight
        ):
            self.paused = False
            self._budget_wait = False
            if not self.closing and not self.write_paused:
                self.guard.resumed(now)
        if not out:
            if popped:
                self._charge()
            return b""
        self.guard.sent(now)
        wire = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        if self.write_paused:  # it waits in the transport with the rest
            self._unsent += len(wire)
            self.guard.writes_blocked(now, self._unsent)
            self._charge()
        elif popped:
            self._charge()
        return wire

    def writing(self, paused, now, unsent=0):
        """The runtime's transport stopped (True) or resumed (False) taking writes;
        ``unsent``: the bytes it holds not yet sent (see ``PyConnection.writing``)."""
        guard = self.guard
        self.write_paused = paused
        if paused:
            self._unsent = unsent
            guard.writes_blocked(now, unsent)
            if guard.write_stall_timeout is not None:
                self._timer = True
        else:
            self._unsent = 0
            guard.writes_flowing()
            if self._budget_wait:
                self.paused = False
                self._budget_wait = False
            if not self.paused and not self.closing:
                guard.resumed(now)
        self._charge()

    def written(self, unsent, now):
        """While the transport is stopped: it holds ``unsent`` bytes now (see
        ``PyConnection.written``)."""
        if not self.write_paused:
            return None
        self._unsent = unsent
        self.guard.writes_blocked(now, unsent)
        self._charge()

    def expired(self, now):
        """Why the connection must be dropped now (a deadline passed), or None."""
        return self.guard.expired(
            now, self.paused or self.write_paused or self.closing, self.pending
        )

    def release(self):
        """The connection ended: give what it holds back to the memory budget."""
        self.closing = True
        self._awaiting = False
        self._budget_wait = False
        self.owed.clear()
        self.ready.clear()
        self._costs.clear()
        self._in_flight = 0
        self._unsent = 0
        self._held_read = 0
        self._parked = None
        self._handed = None
        if self._closing_error is None:  # drop the bytes read: nothing more is decoded
            err = DecodeError(PROTOCOL, "connection", self._offset(), _RELEASED)
            self._fail(err)
            self._closing_error = err
        self.guard.release()

    # ------------------------------------------------------------------ internals

    cdef object _decode_frame(self, bytes frame):
        if self._py_decode is None:
            return _decode(frame, 0, self.max_items, True)
        return self._py_decode(frame, self.max_items)

    cdef void _queue(self, bytes wire):
        if self.owed:
            self.owed.append(wire)
            self._costs.append(PyBytes_GET_SIZE(wire))
            self._in_flight += PyBytes_GET_SIZE(wire)
        else:
            self.ready.append(wire)

    cdef inline Py_ssize_t _parked_size(self):
        return 0 if self._parked is None else PyBytes_GET_SIZE(self._parked)

    cdef bint _charge(self) except -1:
        """Charge what the connection holds now (``PyConnection._charge``)."""
        return self.guard.overdraw(
            self._held_read + self._in_flight + self._unsent + self._parked_size()
        )

    cdef void _wait_for_budget(self):
        self.paused = True
        self._budget_wait = True

    cdef int _admit(self, bytes frame) except -1:
        """``PyConnection._admit``: ADMIT, PARK or REFUSE the whole request ``frame``."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(frame)
        cdef Py_ssize_t cost, read = self._held_read
        cdef bint holds
        read -= n if n < read else read  # its bytes leave the buffer
        self._held_read = read
        holds = len(self.owed) > 0 or self._unsent > 0
        if (not holds and n <= SMALL_FRAME) or n < INFERENCE_HEADER:
            return ADMIT  # (too short: the codec refuses it, SHAPE)
        if _items(frame) > self.max_items:
            return ADMIT  # the codec refuses it (MEMORY) without decoding its items
        cost = _cost(frame)
        if not holds and cost <= SMALL_REQUEST_COST:
            return ADMIT
        if self.guard.fits(read + self._in_flight + self._unsent + cost + self._parked_size()):
            return ADMIT
        return PARK if holds else REFUSE

    cdef object _over_budget(self, bytes frame):
        """A request the memory budget has no room for: MEMORY, the stream goes on."""
        self._queue(error_reply(_MEMORY))
        budget = self.guard.budget
        text = (
            f"a request costing {_cost(frame)} bytes in flight does not fit the "
            f"memory budget of {budget.limit} (holding {budget.total})"
        )
        error = DecodeError(PROTOCOL, "memory_budget", self._offset(), text, code=_MEMORY_CODE)
        return Rejected(_MEMORY, error, False)

    cdef object _answer(self, object msg):
        cdef type cls = type(msg)
        if cls is _PING and not msg.response:
            self._queue(_PONG)
            return Answered(msg)
        if cls is _ERROR_REPLY and msg.code == 0:
            code = _METHOD
            text = "an error message is not a request"
        else:
            code = _SUBTYPE
            text = f"a {cls.__name__} response is not a request"
        self._queue(error_reply(code))
        error = DecodeError(PROTOCOL, "subtype", self._offset(), text, code=int(code))
        return Rejected(code, error, False)

    cdef object _reject(self, object exc):
        code = ErrorCode(exc.code if exc.code is not None else _SHAPE)
        self._queue(error_reply(code))
        if self._error is not None:
            self._break(exc)
        return Rejected(code, exc, self.closing)

    cdef int _break(self, object exc) except -1:
        self.closing = True
        self._closing_error = exc
        self.paused = False
        self._budget_wait = False
        self._held_read = 0  # nothing read will be used; what is owed and unsent still counts
        self._parked = None
        self._charge()
        return 0

    cdef object _settle(self):
        """Account the read with the guard (once per read, when its events are taken)."""
        cdef bint completed = self._completed
        cdef Py_ssize_t read, held
        cdef object timer
        self._unsettled = False
        self._completed = False
        if self._closing_error is not None:
            return None
        read = self._buffered()
        held = read + self._in_flight + self._unsent + self._parked_size()
        guard = self.guard
        try:
            timer = guard.received(self._now, held, not self._idle(), completed)
        except OverBudget as exc:
            if not (len(self.owed) > 0 or self._unsent > 0):
                err = DecodeError(PROTOCOL, "buffer", self._offset(), str(exc), code=_MEMORY_CODE)
                self._fail(err)
                self._queue(error_reply(_MEMORY))
                self._break(err)
                return Rejected(_MEMORY, err, True)
            # It owes answers: keep the bytes, read no more until answers go out.
            guard.overdraw(held)
            timer = guard.received(self._now, held, not self._idle(), completed)
            self._wait_for_budget()
        self._held_read = read
        if timer:
            self._timer = True
        return None

    # ------------------------------------------------------------------ framing
    # FramedStream's methods (wirekit._framing), same state, same results.

    cdef Py_ssize_t _buffered(self):
        if self._chunk is not None:
            return PyBytes_GET_SIZE(self._chunk) - self._cpos
        return PyByteArray_GET_SIZE(self._buf) - self._pos

    cdef Py_ssize_t _offset(self):
        return self._consumed + (self._cpos if self._chunk is not None else self._pos)

    cdef bint _idle(self):
        return (
            self._chunk is None
            and self._pos == PyByteArray_GET_SIZE(self._buf)
            and not self._skip
            and self._error is None
        )

    cdef void _clear_consumed(self):
        """Forget the consumed bytes at the buffer's front (nothing unconsumed is there)."""
        self._consumed += self._pos
        del self._buf[:]
        self._pos = 0

    cdef _feed(self, data):
        cdef Py_ssize_t dropped
        if self._error is not None:
            raise self._error
        if self._chunk is not None:
            self._spill()
        if (
            not self._skip
            and type(data) is bytes
            and self._pos == PyByteArray_GET_SIZE(self._buf)
            and PyBytes_GET_SIZE(data)
        ):
            # Nothing buffered: keep the read itself, no copy.
            if self._pos:
                self._clear_consumed()
            self._chunk = data
            self._cpos = 0
            return
        view = memoryview(data).cast("B")
        if self._skip:
            dropped = min(self._skip, len(view))
            self._skip -= dropped
            self._consumed += dropped
            view = view[dropped:]
        if self._pos and self._pos == PyByteArray_GET_SIZE(self._buf):
            self._clear_consumed()
        self._buf += view

    cdef void _fail(self, object err):
        self._consumed = self._offset()
        self._chunk = None
        self._cpos = 0
        self._buf = bytearray()
        self._pos = 0
        self._skip = 0
        self._error = err

    cdef bint _take_whole(self, bytes data):
        """``FramedStream.take_whole``: True (``data`` accounted as fed and taken) if
        nothing is buffered and ``data`` is exactly one valid frame within the limit."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
        if (
            self._chunk is not None
            or self._pos != PyByteArray_GET_SIZE(self._buf)
            or self._skip
            or self._error is not None
        ):
            return False
        if _frame_ok(<const uint8_t*>PyBytes_AS_STRING(data), n, 0, self._max_size) != n:
            return False
        self._consumed += self._pos + n
        if self._pos:
            del self._buf[:]
            self._pos = 0
        return True

    cdef Py_ssize_t _take_frames(self, object take, tuple args) except -1:
        cdef Py_ssize_t cpos, n, start, new
        if self._error is not None or self._skip:
            return 0
        if self._chunk is not None:
            chunk = self._chunk
            cpos = self._cpos
            n = PyBytes_GET_SIZE(chunk)
            new = _checked(take(chunk, cpos, n, *args), cpos, n)
            if new == n:
                self._chunk = None
                self._consumed += n
            else:
                self._cpos = new
            return new - cpos
        start = self._pos
        n = PyByteArray_GET_SIZE(self._buf)
        if start == n:
            return 0
        new = _checked(take(self._buf, start, n, *args), start, n)
        if new != start:
            self._drop(new - start)
        return new - start

    cdef object _next_frame(self):
        """``FramedStream.next_frame``: the next complete frame's bytes, or None."""
        cdef Py_ssize_t cpos, n, size, start, avail, at
        cdef const uint8_t* h
        cdef int fault
        chunk = self._chunk
        if chunk is not None:
            cpos = self._cpos
            n = PyBytes_GET_SIZE(chunk)
            size = _frame_ok(<const uint8_t*>PyBytes_AS_STRING(chunk), n, cpos, self._max_size)
            if size >= 0:
                if cpos + size == n:
                    self._chunk = None
                    self._consumed += n
                    if cpos == 0:
                        return chunk
                else:
                    self._cpos = cpos + size
                return PyBytes_FromStringAndSize(PyBytes_AS_STRING(chunk) + cpos, size)
            self._spill()
        if self._error is not None:
            raise self._error
        if self._skip:
            return None
        start = self._pos
        avail = PyByteArray_GET_SIZE(self._buf) - start
        if avail < HEADER_SIZE:
            return None
        at = self._offset()
        h = <const uint8_t*>PyByteArray_AS_STRING(self._buf) + start
        fault = _header_fault(h)
        if fault:
            err = _header_error(h, at, fault)
            if fault <= 2:  # a bad version or reserved byte: nothing after it can be trusted
                self._error = err
            else:  # well framed: drop this message's bytes and keep going
                self._drop(HEADER_SIZE + <Py_ssize_t>_be32(h + 4))
            raise err
        size = HEADER_SIZE + <Py_ssize_t>_be32(h + 4)
        if size > self._max_size:
            self._error = DecodeError(
                PROTOCOL, "remaining", at + 4,
                f"message of {size} bytes exceeds the limit of {self._max_size}",
                code=_MEMORY_CODE,
            )
            raise self._error
        if avail < size:
            return None
        raw = PyBytes_FromStringAndSize(PyByteArray_AS_STRING(self._buf) + start, size)
        self._drop(size)
        return raw

    cdef void _spill(self):
        """Move the unconsumed rest of the kept read into the buffer."""
        cdef Py_ssize_t cpos = self._cpos
        chunk = self._chunk
        if chunk is None:
            return
        self._chunk = None
        self._consumed += cpos
        if cpos:
            self._buf += memoryview(chunk)[cpos:]
        else:
            self._buf += chunk

    cdef void _drop(self, Py_ssize_t n):
        cdef Py_ssize_t avail = PyByteArray_GET_SIZE(self._buf) - self._pos
        cdef Py_ssize_t take = n if n < avail else avail
        self._pos += take
        self._skip = n - take
        if self._pos >= COMPACT_AT and self._pos * 2 >= PyByteArray_GET_SIZE(self._buf):
            del self._buf[: self._pos]
            self._consumed += self._pos
            self._pos = 0


cdef inline bint _is_request(bytes frame):
    """A decoded frame is an inference request (kind 2, subtype 0)."""
    cdef const uint8_t* b = <const uint8_t*>PyBytes_AS_STRING(frame)
    return b[1] == 2 and b[2] == 0


cdef Py_ssize_t _checked(object got, Py_ssize_t pos, Py_ssize_t end) except -1:
    """What a lane's ``take`` returned: a position in ``pos..end``, else the same ValueError
    as ``FramedStream.take_frames``."""
    cdef Py_ssize_t new
    if type(got) is int and pos <= got <= end:
        new = got
        return new
    raise ValueError(f"take() returned {got!r}, not a position in {pos}..{end}")
