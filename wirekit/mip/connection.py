"""The server side of one MIP connection, sans-IO: bytes in, events out, replies out in order.

In the manner of h11: no sockets, no clock and no tasks here.  A runtime feeds what it reads
(:meth:`Connection.receive_data`), takes the requests to answer (:meth:`Connection.next_event`),
tells the connection where each answer goes in the reply order (:meth:`Connection.reply`,
:meth:`Connection.owe`) and writes what :meth:`Connection.send` hands back.  The connection
alone decides

* framing (the codec's :func:`wirekit.mip.frame_size` through the
  :class:`~wirekit.mip.Decoder`), which error reply a malformed message gets, and the
  replies to pings and to messages that are not requests;
* when the stream is broken (a bad version or reserved byte, a message over
  ``max_message_size``, a read past the memory budget by a connection that holds nothing
  else): the error reply, then close (:attr:`Connection.done`);
* the order of answers to pipelined requests, whatever order they are ready in;
* when to stop reading (:attr:`Connection.reading`): ``max_in_flight`` answers owed
  (reading resumes when they are down to half), or the memory budget full while this
  connection still owes answers or has replies unsent (reading resumes when some go out);
* what it holds in the process's memory budget: bytes read, requests in flight at
  :func:`~wirekit.mip.limits.request_cost`, replies its transport holds unsent (the runtime
  reports them: :meth:`Connection.writing`, :meth:`Connection.written`);
* the limits of :mod:`wirekit.mip.limits`, through its own :class:`~wirekit.mip.limits.Guard`
  (the runtime passes the time and arms a timer when :meth:`Connection.timer_wanted` says).

>>> conn = Connection(Limits(), now=0.0)
>>> conn.receive_data(bytes.fromhex("0001000000000000") + b"\\x00\\x09" + bytes(6), now=0.0)
>>> conn.next_event()               # a ping: the connection answers it itself
Answered(message=Ping(response=False))
>>> conn.next_event().code          # an unknown kind: the connection answers METHOD
<ErrorCode.METHOD: 2>
>>> conn.next_event() is None       # more bytes needed
True
>>> conn.send(now=0.0).hex(" ")     # the pong, then the METHOD error reply, in order
'00 01 01 00 00 00 00 00 00 00 02 00 00 00 00 00'

``Connection`` is the compiled twin (``wirekit/_fast/mipconn.pyx``) unless ``WIREKIT_PURE=1``
or it is not built (:data:`IMPLEMENTATION` says which); :class:`PyConnection` is the pure
class, the reference: both have the same methods, events, replies and errors.

Errors are split as in h11: :class:`LocalProtocolError` when the runtime misuses the API
(a subclass of ``RuntimeError``); a peer that breaks the protocol raises nothing -- it gets
its error reply, and :meth:`Connection.next_event` reports it as a :class:`Rejected` event.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wirekit._impl import load_fast
from wirekit.errors import DecodeError

from .decoder import Decoder
from .limits import (
    LANE_FACTOR,
    REQUEST_COST,
    SMALL_FRAME,
    SMALL_REQUEST_COST,
    Guard,
    Limits,
    MemoryBudget,
    OverBudget,
    request_cost,
)
from .messages import PROTOCOL, ErrorCode, ErrorReply, Inference, Message, Ping

DEFAULT_MAX_IN_FLIGHT = 64
_RESUME_FACTOR = 2  # reading resumes once the answers owed are at most max_in_flight / 2
_ADMIT, _PARK, _REFUSE = 0, 1, 2  # what the budget says to a request about to be decoded
_RELEASED = "the connection was released"
_INFERENCE_HEADER = 12  # the message header and n_input, n_output, batch_size


class LocalProtocolError(RuntimeError):
    """The runtime used the connection wrongly (a bug in the caller, not in the peer)."""


@dataclass(frozen=True, slots=True)
class Request:
    """An inference request to answer: its decoded ``message`` and its bytes (``frame``).

    The runtime must give it its place in the reply order before it takes the next event:
    :meth:`Connection.reply` with the answer, or :meth:`Connection.owe` with a placeholder."""

    message: Inference
    frame: bytes


@dataclass(frozen=True, slots=True)
class Rejected:
    """The peer sent something the connection answered with an error reply (already queued
    in order): ``code`` and the codec's ``error``; ``closing`` if the stream is broken and
    the connection closes once the replies owed are out."""

    code: ErrorCode
    error: DecodeError
    closing: bool


@dataclass(frozen=True, slots=True)
class Answered:
    """A message the connection answered itself (a ping), its reply queued in order."""

    message: Message


Event = Request | Rejected | Answered

_set_message = Request.__dict__["message"].__set__
_set_frame = Request.__dict__["frame"].__set__


def _request(message: Inference, frame: bytes) -> Request:
    """``Request(message, frame)`` without the frozen dataclass ``__init__`` (per request)."""
    event = Request.__new__(Request)
    _set_message(event, message)
    _set_frame(event, frame)
    return event


class Slot:
    """A placeholder in the reply order for an answer not ready yet; set ``wire`` when it is
    (then :meth:`Connection.send` hands it out in its turn)."""

    __slots__ = ("wire",)

    def __init__(self, wire: bytes | None = None) -> None:
        self.wire = wire


def _error_wire(code: ErrorCode) -> bytes:
    from wirekit import mip

    return mip.encode(ErrorReply(int(code)))


_ERR: dict[ErrorCode, bytes] = {}
_PONG = b"\x00\x01\x01\x00\x00\x00\x00\x00"


def error_reply(code: ErrorCode) -> bytes:
    """The wire bytes of the error reply ``code``."""
    wire = _ERR.get(code)
    if wire is None:
        wire = _ERR[code] = _error_wire(code)
    return wire


def _ready(owed: deque[Any]) -> list[bytes]:
    """The default collector: pop the answers ready at the head of ``owed`` (bytes, filled
    :class:`Slot` s)."""
    out: list[bytes] = []
    while owed:
        head = owed[0]
        if type(head) is bytes:
            out.append(head)
        else:
            wire = head.wire
            if wire is None:
                break
            out.append(wire)
        owed.popleft()
    return out


class Connection:
    """One MIP connection as a server sees it (see the module docstring).

    ``limits`` are the server's; ``budget`` the process's shared memory budget (default: one
    of this connection's own); ``now`` the time (monotonic seconds) it was opened; ``codec``
    the MIP codec module (default: the active one).
    """

    __slots__ = (
        "_awaiting",
        "_budget_wait",
        "_closing_error",
        "_completed",
        "_costs",
        "_decode",
        "_decoder",
        "_handed",
        "_held_read",
        "_in_flight",
        "_next_frame",
        "_now",
        "_parked",
        "_pending_events",
        "_timer",
        "_unsent",
        "_unsettled",
        "closing",
        "guard",
        "max_in_flight",
        "max_items",
        "owed",
        "paused",
        "ready",
        "write_paused",
    )

    def __init__(
        self,
        limits: Limits | None = None,
        budget: MemoryBudget | None = None,
        now: float = 0.0,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        codec: Any = None,
    ) -> None:
        limits = limits if limits is not None else Limits()
        if codec is None:
            from wirekit import mip as codec  # the active implementation
        budget = budget if budget is not None else MemoryBudget(limits.memory_budget)
        self._decoder = Decoder(limits.max_message_size, max_items=limits.max_items, codec=codec)
        self._decode = codec.decode
        self._next_frame = self._decoder.next_frame
        self.max_items = limits.max_items
        self.max_in_flight = max(1, max_in_flight)
        self.guard = Guard(limits, budget, now)
        #: answers owed, in request order: ``bytes`` (ready) or placeholders (:meth:`owe`)
        self.owed: deque[Any] = deque()
        #: answers ready to go out before everything in :attr:`owed` (queued while nothing
        #: was owed: they wait only for :meth:`send`)
        self.ready: list[bytes] = []
        self.closing = False  #: no more requests will be read
        self.paused = False  #: reading stopped: too many answers owed
        self.write_paused = False  #: the runtime cannot write (its transport's flow control)
        self._closing_error: DecodeError | None = None
        self._pending_events: deque[Event] = deque()
        self._now = now
        self._completed = False  # a message was completed since the read was accounted
        self._unsettled = False  # a read not yet accounted with the guard
        self._timer = False
        self._awaiting = False  # a Request handed out, its place in the order not yet given
        # What this connection holds in the budget (guard.held is their sum, charged):
        self._held_read = 0  # bytes read, as of the last read accounted, less frames taken
        self._in_flight = 0  # the cost of the entries of ``owed`` (the sum of ``_costs``)
        self._costs: deque[int] = deque()  # the cost of each entry of ``owed``, in order
        self._unsent = 0  # bytes of replies the transport holds unsent while it is paused
        self._parked: bytes | None = None  # a whole request waiting for room in the budget
        self._handed: bytes | None = None  # the frame of the Request awaiting its place
        self._budget_wait = False  # reading paused until answers go out (budget full)

    # ------------------------------------------------------------------ state

    @property
    def reading(self) -> bool:
        """Whether the runtime should read from the peer now."""
        return not (self.paused or self.write_paused or self.closing)

    @property
    def broken(self) -> bool:
        """The stream broke: bytes the peer still sends are not requests."""
        return self._closing_error is not None

    @property
    def done(self) -> bool:
        """Closing and nothing owed: the runtime closes the connection now."""
        return self.closing and not self.owed and not self.ready and self._parked is None

    @property
    def pending(self) -> bool:
        """Answers are owed or waiting to be sent (the connection is not idle)."""
        return bool(self.owed or self.ready)

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken as messages (a whole request waiting for room
        in the memory budget included)."""
        parked = self._parked
        return self._decoder.buffered + (0 if parked is None else len(parked))

    @property
    def held(self) -> int:
        """Bytes this connection holds in the memory budget: read and not yet taken,
        requests in flight (at their cost), replies its transport holds unsent."""
        return self.guard.held

    def timer_wanted(self) -> bool:
        """True (once) when a request started or the transport stopped taking writes since
        the last call: the runtime's timer must then fire by ``guard.next_check(now)``
        (:class:`~wirekit.mip.server.Watchdog`)."""
        wanted, self._timer = self._timer, False
        return wanted

    # ------------------------------------------------------------------ bytes in

    def receive_data(self, data: bytes, now: float) -> None:
        """Bytes read from the peer at ``now``; take the events with :meth:`next_event`."""
        if self._awaiting:
            raise LocalProtocolError("reply() or owe() the last Request before reading on")
        if self.closing:
            return  # a broken stream's leftovers, or a shutdown in progress
        self._now = now
        self._unsettled = True
        self._decoder.feed(data)

    def receive_request(self, data: bytes, now: float) -> Request | None:
        """:meth:`receive_data` with the common case in one call: when ``data`` is exactly
        one inference request, nothing is buffered and nothing owed, its :class:`Request`
        (the read held nothing else: no :meth:`next_event` needed).  Otherwise None: take
        the events with :meth:`next_event`."""
        if not (
            self.owed
            or self.ready
            or self.write_paused
            or self.paused
            or self._unsettled
            or self.closing
            or self._awaiting
        ):
            frame = self._decoder.take_whole(data)
            if frame is not None:
                # The read is accounted: nothing held, nothing partial (never over budget).
                if self.guard.received(now, 0, False, True):
                    self._timer = True
                if (
                    len(frame) > SMALL_FRAME
                    and frame[1] == 2
                    and frame[2] == 0
                    and self._admit(frame) != _ADMIT
                ):
                    self._pending_events.append(self._over_budget(frame))
                    return None
                try:
                    msg = self._decode(frame, self.max_items)
                except DecodeError as exc:
                    self._pending_events.append(self._reject(exc))
                    return None
                if type(msg) is Inference and not msg.response:
                    self._awaiting = True
                    self._handed = frame
                    return _request(msg, frame)
                self._pending_events.append(self._answer(msg))
                return None
        self.receive_data(data, now)
        return None

    def end_of_input(self) -> None:
        """The peer sends no more: answer what was received, then close."""
        self.closing = True

    def shutdown(self) -> None:
        """The server stops: the complete requests already received are still handed out
        (whatever is owed; within the memory budget), then the connection closes."""
        self.closing = True
        self.paused = self._budget_wait

    def take_frames(self, take: Callable[..., int], *args: Any) -> int:
        """Let a runtime's lane take whole well-formed requests straight from the buffer:
        ``take(buf, pos, end, *args)`` returns where the first message it did not take
        starts (it must take whole frames the codec's :func:`~wirekit.mip.frame_size`
        accepts, and put their answers in :attr:`owed` itself, in order).  Only while
        reading; returns the bytes taken.  Each entry the lane puts in :attr:`owed` is
        charged :data:`~wirekit.mip.limits.LANE_FACTOR` times its share of those bytes."""
        if self._awaiting:
            raise LocalProtocolError("reply() or owe() the last Request before reading on")
        owed = self.owed
        if not self.reading or len(owed) >= self.max_in_flight:
            return 0
        before = len(owed)
        n = self._decoder.take_frames(take, *args)
        if n:
            self._completed = True
            read = self._held_read
            self._held_read = read - (n if n < read else read)
            k = len(owed) - before
            if k > 0:  # the lane's entries: LANE_FACTOR x their bytes, REQUEST_COST each
                each, extra = divmod(LANE_FACTOR * n, k)
                costs = self._costs
                costs.append(each + extra + REQUEST_COST)
                for _ in range(k - 1):
                    costs.append(each + REQUEST_COST)
                self._in_flight += LANE_FACTOR * n + k * REQUEST_COST
            if not self._charge():  # over the budget: take no more until answers go out
                self._wait_for_budget()
        return n

    def next_event(self) -> Event | None:
        """The next event, or None: more bytes are needed, or reading is paused (see
        :attr:`reading`).  Pings and messages that are not requests are answered here."""
        if self._awaiting or self._pending_events:
            if self._awaiting:
                raise LocalProtocolError("reply() or owe() the last Request before the next event")
            return self._pending_events.popleft()
        if self._closing_error is None:  # (the decoder is broken only then)
            if self._budget_wait:
                pass  # the budget is full: nothing more until this connection's answers go out
            elif not self.closing and (self.write_paused or len(self.owed) >= self.max_in_flight):
                # The runtime cannot write (it reads on when it can), or too much is owed.
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
                        if frame[1] == 2 and frame[2] == 0:  # a request: room for it?
                            verdict = self._admit(frame)
                            if verdict == _PARK:
                                self._parked = frame
                                self._wait_for_budget()
                                frame = None
                            elif verdict == _REFUSE:
                                return self._over_budget(frame)
                        if frame is not None:
                            msg = self._decode(frame, self.max_items)
                except DecodeError as exc:
                    self._completed = True  # a refused message is taken all the same
                    return self._reject(exc)
                if frame is not None:
                    if type(msg) is Inference and not msg.response:
                        self._awaiting = True
                        self._handed = frame
                        return _request(msg, frame)
                    return self._answer(msg)
        if self._unsettled:
            over = self._settle(self._now, self._completed)
            if over is not None:
                return over
        return None

    # ------------------------------------------------------------------ answers

    def reply(self, wire: bytes) -> None:
        """The answer to the request just taken, ready now."""
        self._awaiting = False
        self._handed = None
        if self.owed:
            self.owed.append(wire)
            self._costs.append(len(wire))
            self._in_flight += len(wire)
        else:
            self.ready.append(wire)

    def owe(self, entry: Any) -> None:
        """A placeholder for the answer to the request just taken (a :class:`Slot`, or what
        the runtime's collector for :meth:`send` understands): the request is in flight,
        charged to the memory budget at its cost until its answer is sent."""
        self._awaiting = False
        self.owed.append(entry)
        frame = self._handed
        self._handed = None
        cost = REQUEST_COST if frame is None else request_cost(frame)
        self._costs.append(cost)
        self._in_flight += cost
        self._charge()

    def send(self, now: float, collect: Callable[[deque[Any]], list[bytes]] | None = None) -> bytes:
        """The answers ready at the head of the reply order, as one write (``b""``: none).

        ``collect(owed)`` pops the ready ones and returns their bytes (default: ``bytes``
        entries and filled :class:`Slot` s).  Afterwards :attr:`reading` says whether to
        resume reading (then take :meth:`next_event` again: requests that arrived while
        paused) and :attr:`done` whether to close."""
        owed = self.owed
        out = self.ready
        popped = 0
        if owed:
            before = len(owed)
            more = (collect or _ready)(owed)
            if more:
                out += more
            popped = before - len(owed)
            if popped:
                if owed:
                    costs = self._costs
                    freed = 0
                    for _ in range(popped):
                        freed += costs.popleft()
                    self._in_flight -= freed
                else:
                    self._costs.clear()
                    self._in_flight = 0
        if self.paused and (
            popped if self._budget_wait else len(owed) * _RESUME_FACTOR <= self.max_in_flight
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

    def writing(self, paused: bool, now: float, unsent: int = 0) -> None:
        """The runtime's transport stopped (True) or resumed (False) taking writes;
        ``unsent``: the bytes it holds not yet sent (``get_write_buffer_size()``), charged
        to the memory budget while it is stopped.  Stopping starts the write-stall clock
        (then :meth:`timer_wanted`)."""
        self.write_paused = paused
        guard = self.guard
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

    def written(self, unsent: int, now: float) -> None:
        """While the transport is stopped: it holds ``unsent`` bytes now (the runtime says so
        when its timer fires).  Fewer than before is progress: the write-stall clock starts
        again."""
        if not self.write_paused:
            return
        self._unsent = unsent
        self.guard.writes_blocked(now, unsent)
        self._charge()

    def expired(self, now: float) -> str | None:
        """Why the connection must be dropped now (a deadline passed), or None."""
        return self.guard.expired(now, not self.reading, self.pending)

    def release(self) -> None:
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
            err = DecodeError(PROTOCOL, "connection", self._decoder.offset, _RELEASED)
            self._decoder.fail(err)
            self._closing_error = err
        self.guard.release()

    # ------------------------------------------------------------------ internals

    def _queue(self, wire: bytes) -> None:
        if self.owed:
            self.owed.append(wire)
            self._costs.append(len(wire))
            self._in_flight += len(wire)
        else:
            self.ready.append(wire)

    def _charge(self) -> bool:
        """Charge what the connection holds now (it is held already: whatever the budget
        holds); False if the budget is over its limit."""
        parked = self._parked
        held = self._held_read + self._in_flight + self._unsent
        if parked is not None:
            held += len(parked)
        return self.guard.overdraw(held)

    def _wait_for_budget(self) -> None:
        """Stop reading and decoding until answers of this connection go out."""
        self.paused = True
        self._budget_wait = True

    def _admit(self, frame: bytes) -> int:
        """Whether the whole request ``frame``, just taken from the buffer, may be decoded
        now (_ADMIT), must wait for this connection's answers to go out (_PARK), or is
        refused (_REFUSE, MEMORY): see :mod:`wirekit.mip.limits`."""
        n = len(frame)
        read = self._held_read
        read -= n if n < read else read  # its bytes leave the buffer
        self._held_read = read
        holds = bool(self.owed) or self._unsent > 0
        if (not holds and n <= SMALL_FRAME) or n < _INFERENCE_HEADER:
            return _ADMIT  # (too short: the codec refuses it, SHAPE)
        if frame[8] * ((frame[10] << 8) | frame[11]) > self.max_items:
            return _ADMIT  # the codec refuses it (MEMORY) without decoding its items
        cost = request_cost(frame)
        if not holds and cost <= SMALL_REQUEST_COST:
            return _ADMIT
        parked = self._parked
        held = read + self._in_flight + self._unsent + cost
        if parked is not None:
            held += len(parked)
        if self.guard.fits(held):
            return _ADMIT
        return _PARK if holds else _REFUSE

    def _over_budget(self, frame: bytes) -> Rejected:
        """A request the memory budget has no room for: MEMORY, the stream goes on."""
        code = ErrorCode.MEMORY
        self._queue(error_reply(code))
        budget = self.guard.budget
        text = (
            f"a request costing {request_cost(frame)} bytes in flight does not fit the "
            f"memory budget of {budget.limit} (holding {budget.total})"
        )
        error = DecodeError(PROTOCOL, "memory_budget", self._decoder.offset, text, code=int(code))
        return Rejected(code, error, False)

    def _answer(self, msg: Message) -> Answered | Rejected:
        cls = type(msg)
        if cls is Ping and not msg.response:  # type: ignore[union-attr]
            self._queue(_PONG)
            return Answered(msg)
        if cls is ErrorReply and msg.code == 0:  # type: ignore[union-attr]
            # Kind 0 with subtype 0: a "request" of the error kind, which no server implements.
            code = ErrorCode.METHOD
            text = "an error message is not a request"
        else:
            code = ErrorCode.SUBTYPE
            text = f"a {cls.__name__} response is not a request"
        self._queue(error_reply(code))
        error = DecodeError(PROTOCOL, "subtype", self._decoder.offset, text, code=int(code))
        return Rejected(code, error, False)

    def _reject(self, exc: DecodeError) -> Rejected:
        code = ErrorCode(exc.code if exc.code is not None else ErrorCode.SHAPE)
        self._queue(error_reply(code))
        if self._decoder.broken:
            self._break(exc)
        return Rejected(code, exc, self.closing)

    def _break(self, exc: DecodeError) -> None:
        self.closing = True
        self._closing_error = exc
        self.paused = False
        self._budget_wait = False
        self._held_read = 0  # nothing read will be used; what is owed and unsent still counts
        self._parked = None
        self._charge()

    def _settle(self, now: float, completed: bool) -> Rejected | None:
        """Account the read with the guard (once per read, when its events are taken)."""
        self._unsettled = False
        self._completed = False
        if self._closing_error is not None:
            return None
        decoder = self._decoder
        read = decoder.buffered
        held = read + self._in_flight + self._unsent
        parked = self._parked
        if parked is not None:
            held += len(parked)
        guard = self.guard
        try:
            timer = guard.received(now, held, not decoder.idle, completed)
        except OverBudget as exc:
            if not (self.owed or self._unsent):
                err = DecodeError(
                    PROTOCOL, "buffer", decoder.offset, str(exc), code=int(ErrorCode.MEMORY)
                )
                decoder.fail(err)
                self._queue(error_reply(ErrorCode.MEMORY))
                self._break(err)
                return Rejected(ErrorCode.MEMORY, err, True)
            # It owes answers: keep the bytes, read no more until answers go out.
            guard.overdraw(held)
            timer = guard.received(now, held, not decoder.idle, completed)
            self._wait_for_budget()
        self._held_read = read
        if timer:
            self._timer = True
        return None


#: The pure-Python state machine: the reference the compiled twin follows, and the one used
#: under ``WIREKIT_PURE=1`` or when the twin is not built.
PyConnection = Connection
# The one choice (wirekit._impl): the Cython twin (wirekit/_fast/mipconn.pyx) -- same
# methods, events, replies and errors -- unless WIREKIT_PURE is set or it is not built.  The
# servers construct ``Connection`` and get whichever is selected.
_fast = load_fast("mipconn")
if _fast is not None:
    Connection = _fast.Connection  # type: ignore[misc]
#: ``"fast"`` (the Cython twin) or ``"pure"``: which class ``Connection`` is.
IMPLEMENTATION = "pure" if _fast is None else "fast"

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "IMPLEMENTATION",
    "Answered",
    "Connection",
    "Event",
    "LocalProtocolError",
    "PyConnection",
    "Rejected",
    "Request",
    "Slot",
    "error_reply",
]
