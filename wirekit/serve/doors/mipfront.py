"""The MIP front door: one TCP listener per model, speaking MIP to clients.

Clients may pipeline: requests on one connection are dispatched concurrently and answered in
the order they came.  Malformed messages get the MIP error reply the codec names; after a bad
version or reserved byte, or a message over the size limit, the connection is closed after
the reply since the stream can no longer be trusted.

The limits are :mod:`wirekit.mip.limits`' (the config's ``mip`` table), decided by the same
:class:`~wirekit.mip.limits.Guard` and :class:`~wirekit.mip.server.Watchdog` as
``wirekit mip serve``'s: a request must be complete ``request_timeout`` after its first byte,
an idle connection is dropped after ``idle_timeout``, one whose replies wait unsent with no
progress after ``write_stall_timeout``, and a request of more than ``max_items`` items is
answered MEMORY.  What every connection holds -- bytes read, requests in flight, replies
unsent -- is charged to the process's one memory budget (``Service.budget``, the config's
``memory_budget``): when it is full, a connection that owes answers is not read until they
go out, one that holds only a partial request is answered MEMORY and closed.

Well-formed inference requests of a model the MIP lane serves are taken a read at a time by
:class:`wirekit.serve.dispatch.lane.Lane` (or its compiled twin); the rest, one message at a
time, by :meth:`Dispatcher.start`.  Either way the answers go back in order, after the journal
write.

A model removed while the dispatcher runs (``DELETE /admin/models/{name}``) stops taking
requests at once: a request that arrives after that on a connection still open is answered
with a METHOD error reply (MIP error replies carry no text; the log says "model ... was
removed"); the answers owed are sent, then the connection is closed.

A client that goes away (or is dropped) while it is owed answers ends those requests at
once: ``ok`` when the answer was complete but not yet written, else ``abandoned``
(:meth:`wirekit.serve.dispatch.lane.Lane.abandon`, through the dispatcher's completion record).
They leave the queue then; a backend's later reply to one of them only frees its slot.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from wirekit._memory import MemoryReturn
from wirekit.mip import ErrorCode, ErrorReply
from wirekit.mip.connection import Connection, Rejected, Request
from wirekit.mip.limits import Limits, MemoryBudget
from wirekit.mip.server import Watchdog

from ..dispatch.dispatcher import Dispatcher, Job, UnknownModel
from ..dispatch.payload import Payload
from ..logs import serve_logger

log = serve_logger()

MAX_PIPELINED = 128  #: answers owed per connection before reading pauses
#: the answer to a request for a model removed while its connection is open: MIP error
#: replies carry a code only; METHOD ("not implemented") says "not served here"
REMOVED = Payload(None, ErrorReply(int(ErrorCode.METHOD)))


class MipFrontDoor(asyncio.Protocol):
    """One client connection to the listener of ``model``: moves bytes between the transport
    and a sans-IO :class:`~wirekit.mip.connection.Connection` (framing, error replies, reply
    order, pausing, limits), and hands its requests to the lane and the dispatcher.

    ``budget`` is the process's memory budget, shared by every door (default: one of this
    connection's own, of ``limits.memory_budget``); ``memory_return`` gives memory back to the
    system after big connections end (:mod:`wirekit._memory`)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        model: str,
        tasks: set[asyncio.Task],
        limits: Limits | None = None,
        budget: MemoryBudget | None = None,
        memory_return: MemoryReturn | None = None,
    ) -> None:
        limits = limits if limits is not None else Limits()
        self.dispatcher = dispatcher
        self.store = dispatcher.store
        self._clock = dispatcher.clock
        self._now = 0.0
        self.loop = asyncio.get_running_loop()
        self.model = model
        self.tasks = tasks
        self.max_message_size = limits.max_message_size
        self.max_items = limits.max_items
        self.conn = Connection(limits, budget, time.monotonic(), max_in_flight=MAX_PIPELINED)
        self.memory_return = memory_return
        self.watchdog = Watchdog(self.conn, self.loop, time.monotonic, self._unsent, self._drop)
        self._paused = False  # the transport's reading, as last set
        self._flush_soon = False
        self.transport: asyncio.Transport | None = None
        self.client = "mip:?"
        self.lane: Any = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.client = f"mip:{peer[0]}:{peer[1]}"
        d = self.dispatcher
        self.lane = d.lane.Lane(
            d,
            self.model,
            self.client,
            d.lane_route(self.model),
            self.max_message_size,
            self.max_items,
            self.conn.owed,
            self._done,
        )
        self.watchdog.arm(time.monotonic())

    def connection_lost(self, exc) -> None:
        self.transport = None
        self._release()
        self.watchdog.stop()

    def _release(self) -> None:
        """Nothing more is taken from this connection: the requests it is still owed end
        (``ok`` if their answer was complete, else ``abandoned``: :meth:`Lane.abandon
        <wirekit.serve.dispatch.lane.Lane.abandon>`, on record in the journal at once), what it
        holds goes back to the budget."""
        conn = self.conn
        if conn.owed:
            self.lane.abandon(conn.owed)
            self._write_journal()
        held = conn.held
        conn.release()
        if self.memory_return is not None:
            self.memory_return.released(held)

    def pause_writing(self) -> None:
        """The client does not read its replies fast enough: what the transport holds is
        charged to the budget, reading stops, the write-stall clock runs."""
        now = time.monotonic()
        conn = self.conn
        conn.writing(True, now, self._unsent())
        self._sync_reading()
        if conn.timer_wanted():
            self.watchdog.arm(now)

    def resume_writing(self) -> None:
        self.conn.writing(False, time.monotonic())
        self._pump()

    def _unsent(self) -> int:
        transport = self.transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def _drop(self, why: str) -> None:
        if self.transport is not None:
            log.info("dropping %s: %s", self.client, why)
            self._release()
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        now = time.monotonic()
        self._now = self._clock()  # the arrival time of the requests of this read
        if self.lane.enabled:  # the lane frames the well-formed requests itself
            conn.receive_data(data, now)
        else:
            request = conn.receive_request(data, now)
            if request is not None:
                self._handle(request)
        self._pump()
        if conn.timer_wanted():
            self.watchdog.arm(now)

    def _pump(self) -> None:
        """Take every event the connection has (the lane first: the well-formed requests
        at once, wirekit.serve.dispatch.lane), write the answers ready, pause or resume reading as
        the connection says."""
        conn = self.conn
        take = self.lane.take if self.lane.enabled else None
        while True:
            while True:
                if take is not None:
                    conn.take_frames(take, self._now)
                event = conn.next_event()
                if event is None:
                    break
                if type(event) is Request:
                    self._handle(event)
                elif type(event) is Rejected:
                    log.debug("%s: answering %s: %s", self.client, event.code.name, event.error)
            was_paused = conn.paused
            self._write()
            if not was_paused or conn.paused:
                break  # else reading resumed: requests that arrived meanwhile are next
        self._sync_reading()

    def _sync_reading(self) -> None:
        """Pause or resume the transport's reading as the connection says."""
        transport = self.transport
        if transport is None:
            return
        conn = self.conn
        if conn.paused or conn.write_paused:
            if not self._paused:
                self._paused = True
                transport.pause_reading()
        elif self._paused and not conn.closing:
            self._paused = False
            transport.resume_reading()

    def _handle(self, request: Request) -> None:
        # Its completion record waits for _write, which writes the journal (all the
        # records of this loop pass at once) before any answer goes out.
        job = Job(self.model, Payload(request.frame, request.message), self.client, self._done)
        job.t_in = self._now
        self.conn.owe(job)
        try:
            self.dispatcher.start(job)
        except UnknownModel as exc:  # removed while this connection is open
            log.info("%s: %s", self.client, exc)
            self.dispatcher.refuse(job, str(exc), REMOVED)  # recorded: ends failed
        except Exception as exc:  # answered INTERNAL, logged in _write
            job.error = exc

    def close(self) -> None:
        """Close the connection once the answers written so far are sent (the model was
        removed)."""
        if self.transport is not None:
            self.transport.close()

    def _done(self, job) -> None:
        owed = self.conn.owed
        if len(owed) == 1 and owed[0] is job and not self._flush_soon:
            self._flush()  # the only request in flight: answer it now
        elif not self._flush_soon:  # replies finished in one loop pass go out in one write
            self._flush_soon = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        if self.conn.paused:
            self._pump()  # answers out may resume reading: take what waits in the buffer
        else:
            self._write()

    def _write_journal(self) -> None:
        """Write the completion records made so far to the store's journal (a failure --
        a full disk -- does not hold the answers back: logged once per burst by
        :meth:`Dispatcher.write_completions`)."""
        self.dispatcher.write_completions()

    def _write(self) -> None:
        conn = self.conn
        out = conn.send(time.monotonic(), self.lane.answers)  # records the lane's answers
        self._write_journal()  # before any answer: what is answered is on record
        transport = self.transport
        if transport is None:
            return
        if out:
            transport.write(out)
        if conn.done:
            transport.close()
