"""Sans-IO state machines of the y2 communication services: no sockets here.

y2 runs, on each node, a *worker* (training) and a *communication service*; the services and
one *client service* form the cluster.  wirekit's runtimes (:mod:`wirekit.y2.cluster`) move
bytes between sockets and the two state machines of this module:

* :class:`NodeSession` -- one node's service: the worker link (bytes in, framed by the y2
  :class:`~wirekit.y2.Decoder`), the messages to and from the client service and the Delta
  messages to and from the other nodes' services.
* :class:`ClientRegistry` -- the client service: registration of N nodes (ids 0..N-1, the
  same id again for a node that comes back under its name), Runtime and Finished reports and
  each node's :class:`NodeActivity`; done when every node has finished, or *ended*: its
  worker's connection closed without Finished (y2's own worker usually ends so).  Only a
  worker that spoke the protocol ends its node: a connection that closes before any valid
  message (a port probe) or that sends garbage is not one.

Messages between services are ZeroMQ multipart messages (see ``specs/y2.md``, "The
communication services"); every y2 message inside them is carried as its worker-link bytes
(handshake + payload), so nothing is re-encoded on the way.
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from wirekit.errors import DecodeError

from .decoder import DEFAULT_MAX_MESSAGE_SIZE, Decoder
from .messages import (
    HANDSHAKE_SIZE,
    PROTOCOL,
    WORD_SIZE,
    Finished,
    Message,
    MessageType,
    NodeIndex,
    Runtime,
)

#: bytes, or a memoryview of a ZeroMQ frame (taken without a copy)
Buffer = bytes | memoryview

# ---------------------------------------------------------------- the ZeroMQ messages

#: service -> client: ``[HELLO, inbox endpoint]`` (y2's ClientRequest: register this node).
HELLO = b"hello"
#: client -> service: ``[INDEX, NodeIndex bytes, inbox of node 0, ..., inbox of node N-1]``.
INDEX = b"index"
#: service -> client: ``[RUNTIME, node id (i32), Runtime bytes]``.
RUNTIME = b"runtime"
#: service -> client: ``[FINISHED, node id (i32), NodeActivity (64 bytes)]``, the activity
#: as of the Finished (one message: the client may be done as soon as it has read it).
FINISHED = b"finished"
#: client -> service: ``[DONE]``, every node has finished: the service stops.
DONE = b"done"
#: client -> service: ``[REFUSED, reason (utf-8)]``, the cluster has no room for this node.
REFUSED = b"refused"
#: service -> client: ``[STATUS, node id (i32), NodeActivity (64 bytes)]``: the node's worker
#: connected or went, or its counts moved.
STATUS = b"status"
#: client -> service: ``[ABORT, reason (utf-8)]``, the client gave up (``--timeout``).
ABORT = b"abort"
#: Service -> service messages carry no kind: ``[sender node id (i32), Delta bytes]``, the
#: bytes of one or more whole Delta messages end to end.

#: Default cap on bytes queued for one worker (what its service has not written yet).
DEFAULT_MAX_WORKER_BUFFER = 16 * 1024 * 1024
#: Deltas of one read from the worker go to the others as one ZeroMQ message of at most this
#: many bytes (a larger Delta goes alone).
MAX_BATCH = 1024 * 1024
#: Largest endpoint string a service may register.
MAX_ENDPOINT = 1024
#: Seconds between a service's reports of its worker's progress to the client (when it moved).
STATUS_INTERVAL = 1.0


class SlowWorker(str, enum.Enum):
    """What a service does with Deltas from other nodes while its worker's queue is full."""

    #: Stop taking Deltas from the other nodes (ZeroMQ then queues up to its high-water mark
    #: and the senders' services stop reading their workers): nothing is lost.
    BLOCK = "block"
    #: Drop the Delta and count it (``deltas_dropped``, ``words_dropped``).
    DROP = "drop"


def _i32(value: int) -> bytes:
    return value.to_bytes(4, "big", signed=True)


def _read_i32(frame: Buffer) -> int | None:
    return int.from_bytes(frame, "big", signed=True) if len(frame) == 4 else None


def _frame_type(frame: Buffer) -> int:
    return int.from_bytes(frame[:4], "big", signed=True)


# ---------------------------------------------------------------- events of a node session


@dataclass(frozen=True, slots=True)
class ToClient:
    """Send these frames to the client service."""

    frames: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ToPeers:
    """Send these frames to every other node's service."""

    frames: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ConnectPeers:
    """Connect to these inboxes (every other node's; the node's own is left out)."""

    endpoints: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CloseWorker:
    """Close the worker link: the worker broke the protocol."""

    error: DecodeError


@dataclass(frozen=True, slots=True)
class CloseNewcomer:
    """Close the newcomer (a connection waiting beside the worker's): it sent garbage."""

    error: DecodeError


@dataclass(frozen=True, slots=True)
class TakeNewcomer:
    """The newcomer is the worker link now (it spoke, or the old link went): close the old
    link if it is still open."""


@dataclass(frozen=True, slots=True)
class Stop:
    """The service is done (``error`` None: every node finished)."""

    error: str | None = None


Event = ToClient | ToPeers | ConnectPeers | CloseWorker | CloseNewcomer | TakeNewcomer | Stop


class NodeState(str, enum.Enum):
    """Where a node is, as the client service sees it."""

    #: Registered; its worker has not connected yet (or the node has no index yet).
    WAITING = "waiting"
    #: Its worker is connected.
    RUNNING = "running"
    #: Its worker sent Finished.
    FINISHED = "finished"
    #: A worker that spoke the protocol (sent a Delta or a Runtime) is gone without Finished
    #: (y2's ``main.py`` stops its link right after queueing Finished, which then rarely
    #: leaves the worker).  A connection that never sent a valid message -- a port probe, a
    #: load balancer's check, garbage -- does not end its node.
    ENDED = "ended"


_ACTIVITY = struct.Struct(">8Q")


@dataclass(frozen=True, slots=True)
class NodeActivity:
    """What a node's worker has done so far, as its service reports it to the client."""

    worker_connections: int = 0
    worker_attached: bool = False
    #: NodeIndex messages written whole to a worker
    node_index_to_worker: int = 0
    deltas_from_worker: int = 0
    words_from_worker: int = 0
    runtime_from_worker: int = 0
    finished_from_worker: int = 0
    #: Deltas of the other nodes taken for the worker
    deltas_to_worker: int = 0

    def to_bytes(self) -> bytes:
        return _ACTIVITY.pack(*(int(getattr(self, name)) for name in self.__slots__))  # type: ignore[attr-defined]

    @classmethod
    def from_bytes(cls, frame: Buffer) -> NodeActivity | None:
        """The activity in ``frame``; None if it is not one (the wrong size)."""
        if len(frame) != _ACTIVITY.size:
            return None
        values = list(_ACTIVITY.unpack(frame))
        values[1] = bool(values[1])
        return cls(*values)

    @property
    def state(self) -> NodeState:
        if self.finished_from_worker:
            return NodeState.FINISHED
        if self.worker_attached:
            return NodeState.RUNNING
        spoke = self.deltas_from_worker or self.runtime_from_worker
        return NodeState.ENDED if spoke else NodeState.WAITING

    def as_dict(self) -> dict[str, int | bool]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


@dataclass(slots=True)
class NodeCounters:
    """What one node's service has done; printed on exit (``--json``: as JSON)."""

    worker_connections: int = 0
    node_index_to_worker: int = 0
    worker_replaced: int = 0
    worker_errors: int = 0
    #: worker connections that closed before any valid message (port probes, ...)
    worker_probes: int = 0
    deltas_from_worker: int = 0
    words_from_worker: int = 0
    deltas_to_worker: int = 0
    words_to_worker: int = 0
    deltas_dropped: int = 0
    words_dropped: int = 0
    runtime_forwarded: int = 0
    finished_forwarded: int = 0
    peer_errors: int = 0
    client_errors: int = 0
    peer_input_paused: int = 0
    worker_input_paused: int = 0
    worker_buffer_max: int = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


class NodeSession:
    """One node's communication service, sans IO.

    The runtime calls ``worker_connected`` / ``worker_data`` / ``worker_closed`` for the
    worker's TCP connection, ``client_message`` and ``peer_message`` for what ZeroMQ
    delivers, and carries out the events they return; it writes ``data_to_worker()`` to the
    worker (then ``worker_sent(n)``), and calls ``progress()`` now and then (every
    ``STATUS_INTERVAL``) to tell the client how far the worker has come.  Flow control: it
    reads the worker only while ``accepts_worker_input`` and takes other nodes' Deltas only
    while ``accepts_peer_input``.

    The client learns at once when the worker connects or its connection closes (a
    ``STATUS`` message): a connection that closes before the worker sent Finished ends the
    node, as far as the client is concerned, unless a worker connects again before the
    client has heard from every node -- if that worker spoke the protocol (sent a Delta or a
    Runtime).  A connection that closes before any valid message, or is closed for garbage
    before one, leaves the node waiting for its worker (``worker_probes``,
    ``worker_errors``).
    """

    def __init__(
        self,
        inbox: str,
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_worker_buffer: int = DEFAULT_MAX_WORKER_BUFFER,
        slow_worker: SlowWorker | str = SlowWorker.BLOCK,
        codec: ModuleType | None = None,
    ) -> None:
        self.inbox = inbox
        if codec is None:
            from wirekit import y2 as active  # the active implementation

            codec = active
        self._codec: ModuleType = codec
        self._scan_deltas = codec.scan_deltas
        self.max_message_size = max_message_size
        self.max_worker_buffer = max_worker_buffer
        self.slow_worker = SlowWorker(slow_worker)
        self.node: NodeIndex | None = None
        self.peers: tuple[str, ...] = ()
        self.counters = NodeCounters()
        self._node_id = b""
        self._node_index = b""
        self._decoder: Decoder | None = None
        self._spoke = False  # the attached link sent a valid message
        self._out: deque[Buffer] = deque()
        self._out_counts: deque[tuple[int, int]] = deque()  # Deltas and words per entry
        self._out_bytes = 0  # in _out and _held: under max_worker_buffer
        self._head = 0  # bytes of _out[0] already written
        # what was written whole to a link that has not spoken yet: delivered once it speaks,
        # written again to the next link if it goes without a word (a probe took it)
        self._held: deque[tuple[Buffer, tuple[int, int]]] = deque()
        self._held_bytes = 0
        self._holding = False  # the link has neither spoken nor read a whole buffer
        # a connection made while the worker's link, which spoke, is open: it gets its
        # NodeIndex and becomes the worker link once it speaks too (or once the old one goes)
        self._newcomer: Decoder | None = None
        self._newcomer_head = 0  # bytes of its NodeIndex written
        self._reported: NodeActivity | None = None  # the last STATUS sent
        self.stopped = False

    # ------------------------------------------------------------ client service

    def hello(self) -> ToClient:
        """The registration to send to the client service (again after a reconnection)."""
        return ToClient((HELLO, self.inbox.encode()))

    def client_message(self, frames: list[bytes]) -> list[Event]:
        """A message from the client service."""
        kind = frames[0] if frames else b""
        if kind == INDEX and len(frames) >= 3:
            try:
                msg = Decoder(self.max_message_size, codec=self._codec).decode(frames[1])
            except DecodeError:
                msg = None
            peers = [f.decode("utf-8", "replace") for f in frames[2:]]
            if (
                isinstance(msg, NodeIndex)
                and msg.node_count == len(peers)
                and all(map(valid_endpoint, peers))
            ):
                return self._indexed(msg, frames[1], peers)
        elif kind == DONE and len(frames) == 1:
            self.stopped = True
            return [Stop()]
        elif kind in (REFUSED, ABORT) and len(frames) == 2:
            self.stopped = True
            reason = frames[1].decode("utf-8", "replace")
            return [Stop(reason if kind == REFUSED else f"the client gave up: {reason}")]
        self.counters.client_errors += 1
        return []

    def _indexed(self, msg: NodeIndex, raw: bytes, peers: list[str]) -> list[Event]:
        if self.node is not None:
            if msg != self.node:
                self.counters.client_errors += 1
            return []  # the same index again (after a reconnection): nothing changes
        self.node = msg
        self._node_id = _i32(msg.node_id)
        self.peers = tuple(peers)
        self._node_index = raw
        if self._decoder is not None:  # a worker is waiting for its index
            self._queue(raw)
        others = tuple(p for i, p in enumerate(peers) if i != msg.node_id)
        # a worker that came and went before the index: the client hears of it now
        return [ConnectPeers(others), *self._status()]

    # ------------------------------------------------------------ reports to the client

    def activity(self) -> NodeActivity:
        """What the worker has done so far (what ``STATUS`` carries)."""
        c = self.counters
        return NodeActivity(
            worker_connections=c.worker_connections,
            worker_attached=self._decoder is not None,
            node_index_to_worker=c.node_index_to_worker,
            deltas_from_worker=c.deltas_from_worker,
            words_from_worker=c.words_from_worker,
            runtime_from_worker=c.runtime_forwarded,
            finished_from_worker=c.finished_forwarded,
            deltas_to_worker=c.deltas_to_worker,
        )

    def _status(self) -> list[Event]:
        """A ``STATUS`` for the client if the activity changed since the last one (and the
        node knows its id); else nothing."""
        if self.node is None or self.stopped:
            return []
        now = self.activity()
        if now == self._reported:
            return []
        self._reported = now
        return [ToClient((STATUS, self._node_id, now.to_bytes()))]

    def progress(self) -> list[Event]:
        """The runtime calls this every ``STATUS_INTERVAL``: a ``STATUS`` if anything moved."""
        return self._status()

    # ------------------------------------------------------------ worker link

    @property
    def worker_attached(self) -> bool:
        return self._decoder is not None

    @property
    def worker_spoke(self) -> bool:
        """True once the current link (attached, or just closed for malformed input) has
        sent a valid message (a Delta, Runtime or Finished): it is the node's worker, not a
        port probe."""
        return self._spoke

    @property
    def takes_newcomers(self) -> bool:
        """True while the attached link has spoken: a new connection then waits beside it
        (``newcomer_connected``) instead of replacing it, so that a port probe cannot take
        the worker's place."""
        return self._decoder is not None and self._spoke and not self.stopped

    def worker_connected(self) -> list[Event]:
        """A worker connected (a ``STATUS`` for the client).  The newest connection wins over
        a link that has not spoken: that one is taken as gone (counted in
        ``worker_replaced``; the runtime closes its socket), since a worker that reconnects
        may do so before its old connection's end is seen.  (While the attached link has
        spoken, a new connection is a newcomer instead: ``takes_newcomers``.)"""
        if self._decoder is not None:
            self.counters.worker_replaced += 1
            self._detach()
        self.counters.worker_connections += 1
        self._decoder = Decoder(self.max_message_size, codec=self._codec)
        self._spoke = False
        self._holding = True
        if self.node is not None:  # its index first, then the Deltas kept for it
            self._out.appendleft(self._node_index)
            self._out_counts.appendleft((0, 0))
            self._out_bytes += len(self._node_index)
        return self._status()

    def worker_closed(self) -> list[Event]:
        """The worker's connection is gone (a ``STATUS`` for the client: if it spoke the
        protocol and sent no Finished, the node has ended; if it sent no valid message, it
        was a probe, counted in ``worker_probes``, and the node waits for its worker).  The
        Deltas queued for it stay for a next worker, but for a message a link that spoke had
        partly been sent (dropped and counted; a link that never spoke took nothing: what it
        was written goes to the next one whole); a NodeIndex not yet sent is dropped (the
        next worker gets its own).  A newcomer waiting beside the link takes its place."""
        if self._decoder is not None and not self._spoke:
            self.counters.worker_probes += 1
        self._detach()
        if self._newcomer is not None:  # a worker that came back before its old link went
            return [self._take_newcomer(), *self._status()]
        return self._status()

    # ------------------------------------------------------------ a newcomer

    def newcomer_connected(self) -> list[Event]:
        """A connection made while ``takes_newcomers``: it is written its NodeIndex
        (``newcomer_data_to_write``) and read (``newcomer_data``); the worker's link goes on.
        A newcomer still waiting is replaced by this one (the runtime closes it; counted in
        ``worker_probes``)."""
        if self._newcomer is not None:
            self.counters.worker_probes += 1
        self.counters.worker_connections += 1
        self._newcomer = Decoder(self.max_message_size, codec=self._codec)
        self._newcomer_head = 0
        return []

    @property
    def has_newcomer(self) -> bool:
        return self._newcomer is not None

    def newcomer_data_to_write(self) -> memoryview | None:
        """The rest of the newcomer's NodeIndex, or None."""
        if self._newcomer is None or self._newcomer_head >= len(self._node_index):
            return None
        return memoryview(self._node_index)[self._newcomer_head :]

    def newcomer_sent(self, n: int) -> None:
        """``n`` bytes of ``newcomer_data_to_write()`` were written."""
        self._newcomer_head += n
        if n and self._newcomer_head == len(self._node_index):
            self.counters.node_index_to_worker += 1

    def newcomer_data(self, data: bytes) -> list[Event]:
        """Bytes from the newcomer.  Its first valid message makes it the worker link
        (``TakeNewcomer``; the old link is replaced, ``worker_replaced``) and the message
        goes on as the worker's; garbage before it closes the newcomer only
        (``CloseNewcomer``, ``worker_errors``)."""
        decoder = self._newcomer
        if decoder is None:
            return []
        try:
            decoder.feed(data)
            frame = decoder.next_frame()
            if frame is None:
                return []
            at = decoder.offset - len(frame)
            kind = _frame_type(frame)
            if kind not in (MessageType.DELTA, MessageType.RUNTIME, MessageType.FINISHED):
                raise DecodeError(PROTOCOL, "type", at, "a worker does not send NodeIndex")
        except DecodeError as exc:
            self.counters.worker_errors += 1
            self._newcomer = None
            return [CloseNewcomer(exc)]
        self.counters.worker_replaced += 1
        self._detach()  # the old link (it spoke: a message cut short is dropped)
        events: list[Event] = [self._take_newcomer()]
        if kind == MessageType.DELTA:
            events.append(self._deltas(frame, 1))
        else:
            events.append(self._from_worker(frame, at))
        events += self.worker_data(b"")  # what came after it
        return events + self._status()

    def newcomer_closed(self) -> None:
        """The newcomer's connection closed before it spoke: a probe (``worker_probes``)."""
        if self._newcomer is not None:
            self.counters.worker_probes += 1
            self._newcomer = None

    def _take_newcomer(self) -> TakeNewcomer:
        """The newcomer is the worker link (the old one is detached already)."""
        decoder, self._newcomer = self._newcomer, None
        assert decoder is not None
        self._decoder = decoder
        self._spoke = False
        self._holding = True
        written, index = self._newcomer_head, self._node_index
        if written < len(index):  # the rest of its NodeIndex first
            self._out.appendleft(index)
            self._out_counts.appendleft((0, 0))
            self._out_bytes += len(index)
            self._head = written
        return TakeNewcomer()

    def _detach(self) -> None:
        self._decoder = None
        out, counts = self._out, self._out_counts
        if self._holding:  # a probe: what it was written goes to the next link again
            self._head = 0
            while self._held:
                data, entry_counts = self._held.pop()
                out.appendleft(data)
                counts.appendleft(entry_counts)
            self._held_bytes = 0
        self._spoke = self._holding = False
        if out and self._head:
            deltas, words = counts.popleft()
            self._out_bytes -= len(out.popleft())
            self._head = 0
            self.counters.deltas_dropped += deltas
            self.counters.words_dropped += words
        for k in range(len(out) - 1, -1, -1):
            if counts[k][0] == 0:  # a NodeIndex
                self._out_bytes -= len(out[k])
                del out[k], counts[k]

    @property
    def accepts_worker_input(self) -> bool:
        """True when the runtime should read the worker (its index is known)."""
        return self._decoder is not None and self.node is not None and not self.stopped

    def worker_data(self, data: bytes) -> list[Event]:
        """Bytes from the worker -> events.  A protocol error gives ``CloseWorker``; the
        events before it (complete messages) still count.

        A run of consecutive Deltas goes to the other nodes as one ZeroMQ message, cut out of
        the decoder's buffer in one piece (at most ``MAX_BATCH`` bytes unless one Delta alone
        is larger)."""
        decoder = self._decoder
        if decoder is None:
            return []
        events: list[Event] = []
        runs: list[tuple[bytes, int]] = []
        try:
            decoder.feed(data)
            while True:
                if decoder.take_frames(self._take_deltas, runs):
                    blob, count = runs.pop()
                    events.append(self._deltas(blob, count))
                    continue
                frame = decoder.next_frame()
                if frame is None:
                    break
                at = decoder.offset - len(frame)
                if _frame_type(frame) == MessageType.DELTA:  # not taken above: unexpected
                    events.append(self._deltas(frame, 1))
                else:
                    events.append(self._from_worker(frame, at))
        except DecodeError as exc:
            self.counters.worker_errors += 1
            self._decoder = None
            events.append(CloseWorker(exc))
        return events

    def _take_deltas(self, buf: Any, pos: int, end: int, runs: list[tuple[bytes, int]]) -> int:
        """``Decoder.take_frames`` callback: take the run of whole Delta messages at
        ``buf[pos:]`` (the codec's ``scan_deltas``); what stops it -- another type, a partial
        message, a bad or oversize handshake -- ``next_frame`` then hands out or reports."""
        stop, count = self._scan_deltas(buf, pos, end, MAX_BATCH, self.max_message_size)
        if not count:
            return pos
        if type(buf) is bytes and pos == 0 and stop == len(buf):
            runs.append((buf, count))  # the whole chunk as it was read: no copy
        else:
            with memoryview(buf) as view:
                runs.append((bytes(view[pos:stop]), count))
        return stop

    def _count_deltas(self, blob: Buffer) -> int:
        """How many whole Delta messages ``blob`` is, end to end; -1 if anything else."""
        n = len(blob)
        if n > max(self.max_message_size, MAX_BATCH):
            return -1
        stop, count = self._scan_deltas(blob, 0, n, n, self.max_message_size)
        return count if stop == n and count else -1

    def _deltas(self, blob: bytes, count: int) -> ToPeers:
        self._delivered()
        self.counters.deltas_from_worker += count
        self.counters.words_from_worker += (len(blob) - HANDSHAKE_SIZE * count) // WORD_SIZE
        return ToPeers((self._node_id, blob))

    def _from_worker(self, frame: bytes, at: int) -> Event:
        kind = _frame_type(frame)
        if kind in (MessageType.RUNTIME, MessageType.FINISHED):
            self._delivered()
        if kind == MessageType.RUNTIME:
            self.counters.runtime_forwarded += 1
            return ToClient((RUNTIME, self._node_id, frame))
        if kind == MessageType.FINISHED:
            self.counters.finished_forwarded += 1
            self._reported = self.activity()  # the client's report: the counts at Finished
            return ToClient((FINISHED, self._node_id, self._reported.to_bytes()))
        raise DecodeError(PROTOCOL, "type", at, "a worker does not send NodeIndex")

    # ------------------------------------------------------------ other nodes

    @property
    def accepts_peer_input(self) -> bool:
        """False while Deltas for the worker wait past the limit and the policy is block."""
        return self.slow_worker is SlowWorker.DROP or self._out_bytes < self.max_worker_buffer

    def peer_message(self, frames: Sequence[Buffer]) -> bool:
        """Deltas from another node's service (one or more whole Delta messages, joined);
        False if the message was malformed (then it is dropped whole and counted)."""
        sender = _read_i32(frames[0]) if len(frames) == 2 else None
        blob = frames[1] if sender is not None else b""
        node = self.node
        deltas = self._count_deltas(blob)
        if (
            node is None
            or sender is None
            or not 0 <= sender < node.node_count
            or sender == node.node_id
            or deltas < 1
        ):
            self.counters.peer_errors += 1
            return False
        words = (len(blob) - HANDSHAKE_SIZE * deltas) // WORD_SIZE
        if self.slow_worker is SlowWorker.DROP and self._out_bytes >= self.max_worker_buffer:
            self.counters.deltas_dropped += deltas
            self.counters.words_dropped += words
            return True
        self.counters.deltas_to_worker += deltas
        self.counters.words_to_worker += words
        self._queue(blob, deltas, words)
        return True

    # ------------------------------------------------------------ bytes to the worker

    def _queue(self, data: Buffer, deltas: int = 0, words: int = 0) -> None:
        self._out.append(data)
        self._out_counts.append((deltas, words))
        self._out_bytes += len(data)
        if self._out_bytes > self.counters.worker_buffer_max:
            self.counters.worker_buffer_max = self._out_bytes

    @property
    def worker_buffered(self) -> int:
        """Bytes queued for the worker (connected or not yet) and not written yet."""
        return self._out_bytes - self._held_bytes - self._head

    def data_to_worker(self) -> memoryview | None:
        """The next bytes to write to the worker, or None (also while none is connected)."""
        if not self._out or self._decoder is None:
            return None
        return memoryview(self._out[0])[self._head :]

    def buffers_to_worker(self, limit: int = 64) -> list[memoryview]:
        """Up to ``limit`` pieces of the bytes to write to the worker, in order (for one
        scatter-gather write); empty when nothing waits."""
        out = self._out
        if not out or self._decoder is None:
            return []
        bufs = [memoryview(out[0])[self._head :]]
        for k in range(1, min(limit, len(out))):
            bufs.append(memoryview(out[k]))
        return bufs

    def worker_sent(self, n: int) -> None:
        """``n`` bytes of ``data_to_worker()`` were written.

        Until the link has spoken (sent a valid message), what it was written is held: a
        probe that closes without a word has taken nothing from the next worker.  A link
        that takes ``max_worker_buffer`` bytes without speaking is a reader: the worker."""
        while n and self._out:
            left = len(self._out[0]) - self._head
            if n < left:
                self._head += n
                return
            n -= left
            data = self._out.popleft()
            entry_counts = self._out_counts.popleft()
            if entry_counts[0] == 0:
                self.counters.node_index_to_worker += 1
            self._head = 0
            if self._holding:  # still in memory, under the same cap
                self._held.append((data, entry_counts))
                self._held_bytes += len(data)
            else:
                self._out_bytes -= len(data)
        if self._held_bytes >= self.max_worker_buffer:
            self._delivered(spoke=False)

    def _delivered(self, *, spoke: bool = True) -> None:
        """What the link was written is its own: it spoke (or read a whole buffer)."""
        self._spoke = self._spoke or spoke
        self._holding = False
        self._held.clear()
        self._out_bytes -= self._held_bytes
        self._held_bytes = 0


# ---------------------------------------------------------------- the client service


@dataclass(slots=True)
class NodeRecord:
    """One registered node, as the client service knows it."""

    node_id: int
    name: str
    inbox: str
    connections: int = 1
    finished: bool = False
    #: the latest STATUS from its service
    activity: NodeActivity = field(default_factory=NodeActivity)

    @property
    def state(self) -> NodeState:
        return NodeState.FINISHED if self.finished else self.activity.state

    @property
    def over(self) -> bool:
        """Finished, or ended without Finished."""
        return self.state in (NodeState.FINISHED, NodeState.ENDED)


@dataclass(slots=True)
class ClientCounters:
    registrations: int = 0
    reconnections: int = 0
    refused: int = 0
    runtime_received: int = 0
    finished_received: int = 0
    status_received: int = 0
    errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


@dataclass(slots=True)
class Report:
    """What the client service collected: per record, the node id and the message."""

    records: list[tuple[int, Message]] = field(default_factory=list)


Reply = tuple[bytes, tuple[bytes, ...]]


class ClientRegistry:
    """The client service, sans IO: ``receive(sender, frames)`` -> replies to send.

    ``sender`` is the service's ZeroMQ routing id (its name): a node that registers again
    under the same name gets its id again.  ``done`` once every node has finished (sent
    Finished) or ended (its worker's connection closed before Finished); then every service
    gets ``DONE``.  ``progress`` counts what moved (a registration, a Runtime, a Finished, a
    node's activity): the runtime gives up with ``abort(reason)`` when it stays still too
    long (``--timeout``).
    """

    def __init__(
        self,
        nodes: int,
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        codec: ModuleType | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        self.node_count = nodes
        self.nodes: dict[bytes, NodeRecord] = {}
        self.report = Report()
        self.counters = ClientCounters()
        self.errors: list[str] = []
        if codec is None:
            from wirekit import y2 as active  # the active implementation

            codec = active
        self._codec: ModuleType = codec
        self._decoder = Decoder(max_message_size, codec=codec)
        self.done = False
        self.progress = 0
        #: why the client gave up (``abort``), or None
        self.aborted: str | None = None

    @property
    def complete(self) -> bool:
        """True once every node has registered (and got its index)."""
        return len(self.nodes) == self.node_count

    def _index(self, rec: NodeRecord) -> tuple[bytes, ...]:
        inboxes = [r.inbox.encode() for r in sorted(self.nodes.values(), key=_by_id)]
        return (INDEX, self._codec.encode(NodeIndex(rec.node_id, self.node_count)), *inboxes)

    def receive(self, sender: bytes, frames: list[bytes]) -> list[Reply]:
        kind = frames[0] if frames else b""
        if kind == HELLO and len(frames) == 2:
            return self._hello(sender, frames[1])
        rec = self.nodes.get(sender)
        node_id = _read_i32(frames[1]) if len(frames) >= 2 else None
        if rec is None or node_id != rec.node_id:
            return self._error(sender, f"unexpected message {kind[:16]!r}")
        if kind == RUNTIME and len(frames) == 3:
            try:
                msg = self._decoder.decode(frames[2])
            except DecodeError as exc:
                return self._error(sender, str(exc))
            if not isinstance(msg, Runtime):
                return self._error(sender, "a runtime message without a Runtime")
            self.counters.runtime_received += 1
            self.progress += 1
            self.report.records.append((rec.node_id, msg))
            return []
        if kind == FINISHED and len(frames) in (2, 3):
            activity = NodeActivity.from_bytes(frames[2]) if len(frames) == 3 else rec.activity
            if activity is None:
                return self._error(sender, f"a finished of {len(frames[2])} bytes, not 64")
            rec.activity = activity
            self.counters.finished_received += 1
            if not rec.finished:
                rec.finished = True
                self.progress += 1
                self.report.records.append((rec.node_id, Finished()))
            return self._maybe_done()
        if kind == STATUS and len(frames) == 3:
            activity = NodeActivity.from_bytes(frames[2])
            if activity is None:
                return self._error(sender, f"a status of {len(frames[2])} bytes, not 64")
            self.counters.status_received += 1
            if activity != rec.activity:
                rec.activity = activity
                self.progress += 1
            return self._maybe_done()
        return self._error(sender, f"unexpected message {kind[:16]!r}")

    def _maybe_done(self) -> list[Reply]:
        if self.done or not self.complete or not all(r.over for r in self.nodes.values()):
            return []
        self.done = True
        return [(name, (DONE,)) for name in self.nodes]

    def abort(self, reason: str) -> list[Reply]:
        """Give up (the runtime's ``--timeout``): ``ABORT`` with ``reason`` to every
        registered node's service."""
        self.aborted = reason
        return [(name, (ABORT, reason.encode())) for name in self.nodes]

    def not_over(self) -> list[str]:
        """The nodes that have neither finished nor ended, as words for a person, and how
        many have not registered."""
        out = [
            f"node {r.node_id} ({r.name}, {r.state.value})"
            for r in sorted(self.nodes.values(), key=_by_id)
            if not r.over
        ]
        missing = self.node_count - len(self.nodes)
        if missing:
            out.append(f"{missing} of {self.node_count} nodes not registered")
        return out

    @property
    def outcome(self) -> str:
        """``finished`` (every node sent Finished), ``ended`` (every node finished or ended,
        some without Finished), ``aborted`` (``abort``) or ``running``."""
        if self.done:
            return "finished" if all(r.finished for r in self.nodes.values()) else "ended"
        return "aborted" if self.aborted is not None else "running"

    def _error(self, sender: bytes, text: str) -> list[Reply]:
        self.counters.errors += 1
        if len(self.errors) < 100:
            self.errors.append(f"{sender[:64]!r}: {text}")
        return []

    def _hello(self, sender: bytes, inbox: bytes) -> list[Reply]:
        try:
            endpoint = inbox.decode()
        except UnicodeDecodeError:
            return self._error(sender, "inbox endpoint is not UTF-8")
        if not valid_endpoint(endpoint):
            return self._error(sender, f"bad inbox endpoint {endpoint[:64]!r}")
        rec = self.nodes.get(sender)
        if rec is not None:
            self.counters.reconnections += 1
            self.progress += 1
            rec.connections += 1
            if endpoint != rec.inbox:
                # The other nodes are connected to the old inbox: refuse rather than split.
                reason = (
                    f"node {rec.node_id} registered with the inbox {rec.inbox}, not "
                    f"{endpoint[:64]}: restart it with --inbox {rec.inbox}"
                )
                self._error(sender, reason)
                return [(sender, (REFUSED, reason.encode()))]
            return [(sender, self._index(rec))] if self.complete else []
        if self.complete:
            self.counters.refused += 1
            return [(sender, (REFUSED, f"the cluster has {self.node_count} nodes".encode()))]
        self.counters.registrations += 1
        self.progress += 1
        self.nodes[sender] = NodeRecord(
            len(self.nodes), sender.decode("utf-8", "replace"), endpoint
        )
        if not self.complete:
            return []
        return [(name, self._index(rec)) for name, rec in self.nodes.items()]

    def summary(self) -> dict[str, Any]:
        """The report as JSON-ready data (``wirekit y2 client --json``)."""
        from .messages import to_jsonable

        return {
            "nodes": [
                {
                    "node_id": r.node_id,
                    "name": r.name,
                    "inbox": r.inbox,
                    "state": r.state.value,
                    "activity": r.activity.as_dict(),
                }
                for r in sorted(self.nodes.values(), key=_by_id)
            ],
            "records": [
                {"node_id": node_id, **to_jsonable(msg)} for node_id, msg in self.report.records
            ],
            "counters": self.counters.as_dict(),
            "errors": list(self.errors),
            "done": self.done,
            "outcome": self.outcome,
            "aborted": self.aborted,
        }

    def report_bytes(self) -> bytes:
        """The report as y2 worker-link messages: each Runtime and Finished preceded by the
        NodeIndex of the node it came from (``wirekit decode --proto y2`` reads it)."""
        out = bytearray()
        for node_id, msg in self.report.records:
            out += self._codec.encode(NodeIndex(node_id, self.node_count))
            out += self._codec.encode(msg)
        return bytes(out)


def valid_endpoint(endpoint: str) -> bool:
    """A ZeroMQ endpoint a service can connect to: ``tcp://HOST:PORT`` (or ``ipc://``,
    ``inproc://``), at most ``MAX_ENDPOINT`` characters, no wildcard."""
    if not 0 < len(endpoint) <= MAX_ENDPOINT or "*" in endpoint:
        return False
    scheme, sep, rest = endpoint.partition("://")
    if not sep or not rest or scheme not in ("tcp", "ipc", "inproc"):
        return False
    if scheme == "tcp":
        host, _, port = rest.rpartition(":")
        return bool(host) and port.isdigit() and 0 < int(port) < 65536 and host != "0.0.0.0"
    return True


def _by_id(rec: NodeRecord) -> int:
    return rec.node_id
