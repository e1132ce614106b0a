"""What a MIP server refuses and when it drops a connection: the limits, decided sans-IO.

Both MIP front doors -- :class:`wirekit.mip.server.Server` and the dispatcher's
:class:`wirekit.serve.doors.mipfront.MipFrontDoor` -- take their limits from one :class:`Limits`,
charge what their connections hold to one :class:`MemoryBudget` per process, and keep one
:class:`Guard` per connection, which makes every timing decision: the caller passes the time
(``now``, seconds on a monotonic clock) and what it holds, and gets back what to do.  No
sockets and no clock reading here.  The dispatcher's HTTP door
(:class:`wirekit.serve.doors.httpdoor.HttpDoor`) charges and times the answers its clients
do not read with the same :class:`Guard`, through :class:`UnsentReplies` (aiohttp reads its
connections, with deadlines of its own: only the write stall is the guard's there).

>>> limits = Limits(request_timeout=3.0, idle_timeout=60.0)
>>> guard = Guard(limits, MemoryBudget(limits.memory_budget), now=0.0)
>>> guard.received(now=1.0, held=5, partial=True, completed=False)   # a request's first byte
True
>>> guard.received(now=2.0, held=9, partial=True, completed=False)   # more of the same one
False
>>> guard.expired(now=3.9, paused=False, pending=False) is None
True
>>> guard.expired(now=4.0, paused=False, pending=False)   # 3 s after its first byte
'request incomplete 3.0 s after its first byte'

Every limit, its default, and how the front doors answer it:

=======================  =========  ======================================================
``request_timeout``      30 s       a request not complete this long after its first byte:
                                    the connection is dropped (measured from the first
                                    byte, so a trickle of bytes does not extend it)
``idle_timeout``         300 s      nothing received, buffered or owed this long: dropped
``write_stall_timeout``  30 s       replies the transport cannot send (the client does not
                                    read them) and no progress writing them this long:
                                    dropped
``max_message_size``     64 MiB     a header announcing more: MEMORY reply, then closed
``max_items``            65536      a message of more items: MEMORY reply, stream goes on
``memory_budget``        256 MiB    what all connections of the process hold together (old
                                    name ``max_buffered``): see below
=======================  =========  ======================================================

``None`` turns a timeout off.

What a connection holds, charged to the budget (:meth:`Guard.charge`): the bytes it has read
and not yet taken as messages; every request it has taken and not yet answered on the wire,
at :func:`request_cost` (its bytes, plus :data:`ITEM_COST` per item and
:data:`REQUEST_COST` per request for the Python objects it becomes); and the replies its
transport holds unsent while the client does not read them.  When the budget cannot take
more, a connection that still owes answers or has replies unsent *waits*: it is not read and
nothing more of it is decoded until its own answers go out (and if the client does not read
them it is dropped after ``write_stall_timeout``).  A connection that holds nothing of that
kind cannot wait for itself: a read that would take the budget past its limit is answered
MEMORY and the connection closed (a slowloris holding partial requests), and a request whose
decoded cost does not fit is answered MEMORY (the stream goes on) -- except a small one
(cost at most :data:`SMALL_REQUEST_COST`), which is always served, so a full budget does not
lock well-behaved clients out.
"""

from __future__ import annotations

from dataclasses import dataclass

from .decoder import DEFAULT_MAX_MESSAGE_SIZE
from .messages import DEFAULT_MAX_ITEMS

DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_IDLE_TIMEOUT = 300.0
DEFAULT_WRITE_STALL_TIMEOUT = 30.0
DEFAULT_MEMORY_BUDGET = 256 * 1024 * 1024
DEFAULT_MAX_BUFFERED = DEFAULT_MEMORY_BUDGET  #: the old name of :data:`DEFAULT_MEMORY_BUDGET`

#: Bytes charged per item of a request taken from the wire, beyond its bytes: what decoding
#: makes of it, measured on CPython 3.11 (both codecs): an ``Item`` 72 B, a ``memoryview``
#: for data of 256 B or more 184 B (shorter data is a ``bytes`` of its own length + 33 B; an
#: empty one is shared), and the sample tuple of the handler's batch 56 B.  An empty item
#: costs 128 B, not 0: a 512 KiB request of 65,535 empty items is charged 21 MiB.
ITEM_COST = 320
#: Bytes charged per request in flight beyond its items: the request event, the decoded
#: message, its place in the reply order, the handler's future or task.
REQUEST_COST = 1024
#: A request a runtime's lane takes whole from the buffer (``Connection.take_frames``: the
#: dispatcher's MIP lane forwards it to a backend) is charged this many times its bytes: the
#: lane keeps it until its answer is recorded, meanwhile it is copied on its way (an asyncio
#: transport copies what it cannot send at once) and read back as an answer (an echo's is
#: as big) -- measured: 2 is not enough on asyncio.
LANE_FACTOR = 3
#: A request of at most this cost is decoded for a connection that holds nothing else
#: (nothing owed, nothing unsent) whatever the budget holds: a full budget never refuses a
#: well-behaved client's small request.  It is also the most a connection holds past the
#: budget that way.
SMALL_REQUEST_COST = 256 * 1024
#: What one connection may hold outside the budget, at most: one read past the moment it
#: stops being read (256 KiB, the event loop's read size), replies below its transport's
#: high-water mark (64 KiB), a small request served past a full budget
#: (:data:`SMALL_REQUEST_COST`), and its Python objects (protocol, transport, state machine:
#: about 10 KiB).  The bound of ``SECURITY.md``: RSS <= baseline + ``memory_budget`` +
#: ``CONNECTION_COST`` x connections + 3 x the largest message.
CONNECTION_COST = 640 * 1024
_HEADER = 8


def request_cost(frame: bytes | bytearray | memoryview) -> int:
    """What a whole inference request ``frame`` costs in flight: its bytes, plus
    :data:`ITEM_COST` per item (``n_input`` x ``batch_size`` from its header) and
    :data:`REQUEST_COST`."""
    items = frame[_HEADER] * ((frame[_HEADER + 2] << 8) | frame[_HEADER + 3])
    return len(frame) + ITEM_COST * items + REQUEST_COST


#: Frames of at most this many bytes cost at most :data:`SMALL_REQUEST_COST` whatever their
#: items (an item takes at least 8 bytes): no need to count them.
SMALL_FRAME = (SMALL_REQUEST_COST - REQUEST_COST) * 8 // (8 + ITEM_COST)


@dataclass(frozen=True, slots=True, init=False)
class Limits:
    """The limits of one MIP server (see the module docstring for what each one does).

    ``max_buffered`` is the old name of ``memory_budget`` (as a keyword and an attribute)."""

    request_timeout: float | None
    idle_timeout: float | None
    write_stall_timeout: float | None
    max_message_size: int
    max_items: int
    memory_budget: int

    def __init__(
        self,
        request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_items: int = DEFAULT_MAX_ITEMS,
        memory_budget: int | None = None,
        write_stall_timeout: float | None = DEFAULT_WRITE_STALL_TIMEOUT,
        *,
        max_buffered: int | None = None,
    ) -> None:
        if memory_budget is not None and max_buffered not in (None, memory_budget):
            raise ValueError(
                f"memory_budget ({memory_budget}) and its old name max_buffered "
                f"({max_buffered}) disagree: give one"
            )
        budget = memory_budget if memory_budget is not None else max_buffered
        if budget is None:
            budget = DEFAULT_MEMORY_BUDGET
        setattr_ = object.__setattr__
        setattr_(self, "request_timeout", request_timeout)
        setattr_(self, "idle_timeout", idle_timeout)
        setattr_(self, "write_stall_timeout", write_stall_timeout)
        setattr_(self, "max_message_size", max_message_size)
        setattr_(self, "max_items", max_items)
        setattr_(self, "memory_budget", budget)
        for name in ("request_timeout", "idle_timeout", "write_stall_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds or None (off), got {value!r}")
        for name in ("max_message_size", "max_items", "memory_budget"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.memory_budget < self.max_message_size:
            raise ValueError(
                f"memory_budget ({self.memory_budget}) must be at least max_message_size "
                f"({self.max_message_size}): a request that size could never be received"
            )

    @property
    def max_buffered(self) -> int:
        """The old name of :attr:`memory_budget`."""
        return self.memory_budget


class MemoryBudget:
    """What every connection of one process holds, in bytes (``total``), against ``limit``.

    Each front door charges what a connection holds with :meth:`resize` (which refuses
    growth past the limit) or :meth:`force` (what is already held, counted whatever the
    limit)."""

    __slots__ = ("limit", "total")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0

    def resize(self, old: int, new: int) -> bool:
        """A connection's held bytes go from ``old`` to ``new``: False (and nothing changes)
        if that growth would take the total past the limit."""
        total = self.total + new - old
        if new > old and total > self.limit:
            return False
        self.total = total
        return True

    def fits(self, old: int, new: int) -> bool:
        """Whether :meth:`resize` from ``old`` to ``new`` would succeed (nothing changes)."""
        return new <= old or self.total + new - old <= self.limit

    def force(self, old: int, new: int) -> bool:
        """Count ``new`` bytes instead of ``old`` whatever the limit (memory already in use);
        returns whether the total is still within the limit."""
        self.total += new - old
        return self.total <= self.limit


#: The old name of :class:`MemoryBudget`.
BufferBudget = MemoryBudget


@dataclass(frozen=True, slots=True)
class Deadlines:
    """The deadlines a :class:`Guard` keeps (a :class:`Limits` has them with the rest), for a
    connection whose other limits are kept elsewhere: the HTTP door's keeps
    ``write_stall_timeout`` alone.  None: off."""

    request_timeout: float | None = None
    idle_timeout: float | None = None
    write_stall_timeout: float | None = None


class Guard:
    """The limits of one connection: its charge to the budget and its deadlines.

    The front door calls :meth:`received` after each read, :meth:`charge` or
    :meth:`overdraw` when what it holds changes otherwise, :meth:`sent` after it writes
    replies, :meth:`writes_blocked` / :meth:`writes_flowing` as its transport stops and
    resumes taking writes, :meth:`resumed` when it resumes reading, :meth:`expired` when its
    timer fires (:meth:`next_check` says when to arm it), and :meth:`release` when the
    connection ends.
    """

    __slots__ = (
        "budget",
        "held",
        "idle_timeout",
        "last",
        "request_timeout",
        "stalled",
        "started",
        "unsent",
        "write_stall_timeout",
    )

    def __init__(self, limits: Limits | Deadlines, budget: MemoryBudget, now: float) -> None:
        self.budget = budget
        self.request_timeout = limits.request_timeout
        self.idle_timeout = limits.idle_timeout
        self.write_stall_timeout = limits.write_stall_timeout
        self.held = 0  #: bytes this connection holds in the budget
        self.started: float | None = None  #: first byte of the incomplete request, if any
        self.last = now  #: the last time anything was received or sent
        #: since when replies wait unsent with no progress writing them (None: not blocked)
        self.stalled: float | None = None
        self.unsent = 0  #: bytes of replies the transport held at the last report

    def received(self, now: float, held: int, partial: bool, completed: bool) -> bool:
        """After a read: the connection holds ``held`` bytes now, ``partial`` if some of them
        (or bytes still to skip) are an incomplete message, ``completed`` if this read
        finished a message.

        Returns True when a request just started: the caller's timer must then fire by
        :meth:`next_check`.  Raises :class:`OverBudget` if the budget cannot take ``held``
        bytes for this connection (then nothing changes: the caller answers MEMORY and
        closes, or :meth:`overdraw` s and stops reading).
        """
        self.last = now
        if held != self.held:
            if not self.budget.resize(self.held, held):
                raise OverBudget(held, self.budget)
            self.held = held
        if partial:
            if self.started is None or completed:
                self.started = now
                return self.request_timeout is not None
        else:
            self.started = None
        return False

    def fits(self, held: int) -> bool:
        """Whether the budget can take this connection holding ``held`` bytes."""
        return self.budget.fits(self.held, held)

    def charge(self, held: int) -> bool:
        """The connection holds ``held`` bytes: False (nothing changes) if the budget cannot
        take the growth."""
        if held != self.held:
            if not self.budget.resize(self.held, held):
                return False
            self.held = held
        return True

    def overdraw(self, held: int) -> bool:
        """The connection holds ``held`` bytes already (counted whatever the budget holds);
        returns whether the budget is still within its limit."""
        if held != self.held:
            self.budget.force(self.held, held)
            self.held = held
        return self.budget.total <= self.budget.limit

    def sent(self, now: float) -> None:
        """Replies went out: the connection is not idle."""
        self.last = now

    def writes_blocked(self, now: float, unsent: int) -> None:
        """The transport holds ``unsent`` bytes of replies it cannot send now: the
        write-stall clock runs from the last time that amount went down."""
        if self.stalled is None or unsent < self.unsent:
            self.stalled = now
        self.unsent = unsent

    def writes_flowing(self) -> None:
        """The transport takes writes again: no write stall."""
        self.stalled = None
        self.unsent = 0

    def resumed(self, now: float) -> None:
        """Reading resumes after a pause of the server's making: the request being received
        is not charged for the pause."""
        if self.started is not None:
            self.started = now
        self.last = now

    def release(self) -> None:
        """The connection ends: give everything it holds back to the budget."""
        self.budget.resize(self.held, 0)
        self.held = 0

    def expired(self, now: float, paused: bool, pending: bool) -> str | None:
        """Why the connection must be dropped now, or None.  ``paused``: the server stopped
        reading it (flow control: no request or idle deadline runs); ``pending``: replies are
        owed (it is not idle).  The write-stall deadline runs whatever the reading."""
        stalled = self.stalled
        if (
            stalled is not None
            and self.write_stall_timeout is not None
            and now - stalled >= self.write_stall_timeout
        ):
            return (
                f"no progress writing replies for {now - stalled:.1f} s "
                f"({self.unsent} bytes unsent)"
            )
        if paused:
            return None
        if self.started is not None:
            if self.request_timeout is not None and now - self.started >= self.request_timeout:
                return f"request incomplete {now - self.started:.1f} s after its first byte"
            return None
        if not pending and self.idle_timeout is not None and now - self.last >= self.idle_timeout:
            return f"idle for {now - self.last:.1f} s"
        return None

    def next_check(self, now: float) -> float | None:
        """When to call :meth:`expired` next (None: every timeout is off)."""
        steps = [
            t
            for t in (self.request_timeout, self.idle_timeout, self.write_stall_timeout)
            if t is not None
        ]
        if not steps:
            return None
        if self.started is not None and self.request_timeout is not None:
            due = self.started + self.request_timeout
        elif self.started is None and self.idle_timeout is not None:
            due = self.last + self.idle_timeout
        else:
            due = now
        if self.stalled is not None and self.write_stall_timeout is not None:
            stall_due = self.stalled + self.write_stall_timeout
            if due <= now or stall_due < due:
                due = stall_due
        # Not due yet, or due but held off (paused, replies owed): look again later.
        return due if due > now else now + min(steps)


class UnsentReplies:
    """The write side alone of a connection that something else reads and answers (the HTTP
    door's: aiohttp), sans-IO: what its transport holds unsent while it asks for a pause is
    charged to the budget, and the write stall timed, by a :class:`Guard` -- the same calls
    and decisions as a MIP :class:`~wirekit.mip.connection.Connection`'s write side
    (:meth:`writing`, :meth:`written`, :meth:`expired`, :meth:`release`), so one
    :class:`~wirekit.mip.server.Watchdog` runs either.

    >>> budget = MemoryBudget(1 << 20)
    >>> replies = UnsentReplies(Deadlines(write_stall_timeout=30.0), budget, now=0.0)
    >>> replies.writing(True, now=0.0, unsent=70_000)     # the client does not read
    >>> budget.total, replies.guard.next_check(0.0)
    (70000, 30.0)
    >>> replies.written(60_000, now=30.0)                 # it read some: 30 s more
    >>> replies.expired(now=59.9) is None
    True
    >>> replies.expired(now=60.0)
    'no progress writing replies for 30.0 s (60000 bytes unsent)'
    """

    __slots__ = ("guard", "write_paused")

    def __init__(self, limits: Limits | Deadlines, budget: MemoryBudget, now: float) -> None:
        self.guard = Guard(limits, budget, now)
        self.write_paused = False  #: the transport asked for a pause and did not resume

    def writing(self, paused: bool, now: float, unsent: int = 0) -> None:
        """The transport stopped (True) or resumed (False) taking writes; ``unsent``: the
        bytes it holds not yet sent, charged to the budget while it is stopped (whatever the
        budget holds: memory already in use).  Stopping starts the write-stall clock."""
        self.write_paused = paused
        guard = self.guard
        if paused:
            guard.writes_blocked(now, unsent)
        else:
            guard.writes_flowing()
            unsent = 0
        guard.overdraw(unsent)

    def written(self, unsent: int, now: float) -> None:
        """While stopped: the transport holds ``unsent`` bytes now.  Fewer than before is
        progress: the write-stall clock starts again."""
        if self.write_paused:
            self.guard.writes_blocked(now, unsent)
            self.guard.overdraw(unsent)

    def expired(self, now: float) -> str | None:
        """Why the connection must be dropped now (its write stall is too long), or None."""
        return self.guard.expired(now, True, True)  # no request or idle deadline here

    @property
    def unsent(self) -> int:
        """The bytes the transport held unsent at the last report."""
        return self.guard.unsent

    def release(self) -> None:
        """The connection ended: give what it holds back to the budget."""
        self.write_paused = False
        self.guard.writes_flowing()
        self.guard.release()


class OverBudget(Exception):
    """A connection would take the process's memory past ``memory_budget``."""

    def __init__(self, held: int, budget: MemoryBudget) -> None:
        self.held = held
        super().__init__(
            f"{held} bytes held for this connection would take the server past its "
            f"memory budget of {budget.limit} (holding {budget.total})"
        )


__all__ = [
    "CONNECTION_COST",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_BUFFERED",
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_WRITE_STALL_TIMEOUT",
    "ITEM_COST",
    "LANE_FACTOR",
    "REQUEST_COST",
    "SMALL_FRAME",
    "SMALL_REQUEST_COST",
    "BufferBudget",
    "Deadlines",
    "Guard",
    "Limits",
    "MemoryBudget",
    "OverBudget",
    "UnsentReplies",
    "request_cost",
]
