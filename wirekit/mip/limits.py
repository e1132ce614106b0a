"""What a MIP server refuses and when it drops a connection: the limits, decided sans-IO.

Both MIP front doors -- :class:`wirekit.mip.server.Server` and the dispatcher's
:class:`wirekit.serve.mipfront.MipFrontDoor` -- take their limits from one :class:`Limits`,
count their buffered bytes in one :class:`BufferBudget` per server, and keep one
:class:`Guard` per connection, which makes every timing decision: the caller passes the time
(``now``, seconds on a monotonic clock) and what it holds, and gets back what to do.  No
sockets and no clock reading here.

>>> limits = Limits(request_timeout=3.0, idle_timeout=60.0)
>>> guard = Guard(limits, BufferBudget(limits.max_buffered), now=0.0)
>>> guard.received(now=1.0, held=5, partial=True, completed=False)   # a request's first byte
True
>>> guard.received(now=2.0, held=9, partial=True, completed=False)   # more of the same one
False
>>> guard.expired(now=3.9, paused=False, pending=False) is None
True
>>> guard.expired(now=4.0, paused=False, pending=False)   # 3 s after its first byte
'request incomplete 3.0 s after its first byte'

Every limit, its default, and how the front doors answer it:

=====================  =========  ========================================================
``request_timeout``    30 s       a request not complete this long after its first byte:
                                  the connection is dropped (measured from the first byte,
                                  so a trickle of bytes does not extend it)
``idle_timeout``       300 s      nothing received, buffered or owed this long: dropped
``max_message_size``   64 MiB     a header announcing more: MEMORY reply, then closed
``max_items``          65536      a message of more items: MEMORY reply, stream goes on
``max_buffered``       256 MiB    a read that would take the bytes held by all connections
                                  of the server past it: MEMORY reply, that connection closed
=====================  =========  ========================================================

``None`` turns a timeout off.  Whole requests that arrive in one read are never held across
reads, so they are served whatever the budget holds: the budget limits only bytes a client
makes the server keep (partial requests, pipelined ones waiting their turn).
"""

from __future__ import annotations

from dataclasses import dataclass

from .decoder import DEFAULT_MAX_MESSAGE_SIZE
from .messages import DEFAULT_MAX_ITEMS

DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_IDLE_TIMEOUT = 300.0
DEFAULT_MAX_BUFFERED = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits of one MIP server (see the module docstring for what each one does)."""

    request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_items: int = DEFAULT_MAX_ITEMS
    max_buffered: int = DEFAULT_MAX_BUFFERED

    def __post_init__(self) -> None:
        for name in ("request_timeout", "idle_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds or None (off), got {value!r}")
        for name in ("max_message_size", "max_items", "max_buffered"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.max_buffered < self.max_message_size:
            raise ValueError(
                f"max_buffered ({self.max_buffered}) must be at least max_message_size "
                f"({self.max_message_size}): a request that size could never be received"
            )


class BufferBudget:
    """The bytes held by every connection of one server, against ``limit``."""

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


class Guard:
    """The limits of one connection: its share of the budget and its deadlines.

    The front door calls :meth:`received` after each read, :meth:`sent` after it writes
    replies, :meth:`resumed` when it resumes reading, :meth:`expired` when its timer fires
    (:meth:`next_check` says when to arm it), and :meth:`release` when the connection ends.
    """

    __slots__ = ("budget", "held", "idle_timeout", "last", "request_timeout", "started")

    def __init__(self, limits: Limits, budget: BufferBudget, now: float) -> None:
        self.budget = budget
        self.request_timeout = limits.request_timeout
        self.idle_timeout = limits.idle_timeout
        self.held = 0  #: bytes this connection holds in the budget
        self.started: float | None = None  #: first byte of the incomplete request, if any
        self.last = now  #: the last time anything was received or sent

    def received(self, now: float, held: int, partial: bool, completed: bool) -> bool:
        """After a read: ``held`` bytes are buffered now, ``partial`` if they (or bytes still
        to skip) are an incomplete message, ``completed`` if this read finished a message.

        Returns True when a request just started: the caller's timer must then fire by
        :meth:`next_check`.  Raises :class:`OverBudget` if the server cannot hold ``held``
        bytes more for this connection (then answer MEMORY and close).
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

    def sent(self, now: float) -> None:
        """Replies went out: the connection is not idle."""
        self.last = now

    def resumed(self, now: float) -> None:
        """Reading resumes after a pause of the server's making: the request being received
        is not charged for the pause."""
        if self.started is not None:
            self.started = now
        self.last = now

    def release(self) -> None:
        """The connection ends (or drops its buffer): give its bytes back to the budget."""
        self.budget.resize(self.held, 0)
        self.held = 0

    def expired(self, now: float, paused: bool, pending: bool) -> str | None:
        """Why the connection must be dropped now, or None.  ``paused``: the server stopped
        reading it (flow control: no deadline runs); ``pending``: replies are owed (it is
        not idle)."""
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
        """When to call :meth:`expired` next (None: both timeouts are off)."""
        steps = [t for t in (self.request_timeout, self.idle_timeout) if t is not None]
        if not steps:
            return None
        if self.started is not None and self.request_timeout is not None:
            due = self.started + self.request_timeout
        elif self.started is None and self.idle_timeout is not None:
            due = self.last + self.idle_timeout
        else:
            due = now
        # Not due yet, or due but held off (paused, replies owed): look again later.
        return due if due > now else now + min(steps)


class OverBudget(Exception):
    """A connection would take the server's buffered bytes past ``max_buffered``."""

    def __init__(self, held: int, budget: BufferBudget) -> None:
        self.held = held
        super().__init__(
            f"{held} bytes buffered for this connection would take the server past its "
            f"limit of {budget.limit} (holding {budget.total})"
        )


__all__ = [
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_BUFFERED",
    "DEFAULT_REQUEST_TIMEOUT",
    "BufferBudget",
    "Guard",
    "Limits",
    "OverBudget",
]
