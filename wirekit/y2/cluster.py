"""The y2 communication services over ZeroMQ: ``wirekit y2 service`` and ``wirekit y2 client``.

Runtimes only: each is one thread running a ``zmq.Poller`` loop that moves bytes between
sockets and a state machine of :mod:`wirekit.y2.service` (which does all the protocol work).

* :class:`ClientService` binds a ROUTER; every node's service connects a DEALER to it whose
  routing id is the node's name.
* :class:`NodeService` listens for its worker on TCP (the y2 worker link), binds a PULL
  *inbox* for the other nodes' Deltas and, once the client has sent the node its index and
  the inboxes of the others, connects one PUSH to each of them.

Flow control (the policy is in ``specs/y2.md``): a Delta that ZeroMQ cannot take for a peer
(its high-water mark reached) is kept, and the worker is not read until it has gone; the
inbox is not read while the worker's queue is over its cap (``slow_worker="block"``) or its
Deltas are dropped and counted (``"drop"``).
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from wirekit._logging import BurstLog

from .decoder import DEFAULT_MAX_MESSAGE_SIZE
from .service import (
    DEFAULT_MAX_WORKER_BUFFER,
    MAX_BATCH,
    STATUS_INTERVAL,
    ClientRegistry,
    CloseNewcomer,
    CloseWorker,
    ConnectPeers,
    Event,
    NodeSession,
    NodeState,
    SlowWorker,
    Stop,
    TakeNewcomer,
    ToClient,
    ToPeers,
    valid_endpoint,
)

log = logging.getLogger("wirekit.y2.service")

#: Default ZeroMQ high-water mark (messages) of each PUSH to a peer and of the inbox.
DEFAULT_HWM = 1000
#: How long the client keeps trying to deliver its last messages (``done``) on exit (ms).
DEFAULT_LINGER_MS = 2000
_POLL_MS = 100
_READ_SIZE = 1024 * 1024
#: Messages taken from one ZeroMQ socket before the loop looks at the others again.
_BATCH = 64


def _bind_tcp(host: str, port: int) -> socket.socket:
    sock = socket.create_server((host, port), reuse_port=False)
    sock.setblocking(False)
    return sock


class NodeService:
    """One node's communication service.

    ``client``: the client service's ZeroMQ endpoint (``tcp://host:port``);
    ``worker_listen``: where the worker connects (y2's worker uses 127.0.0.1:8888);
    ``name``: the node's name at the client (default: host name and worker port), under
    which it gets the same id after a restart; ``inbox``: where to bind for the other nodes'
    Deltas; ``advertise``: the inbox address to give the others (when bound to 0.0.0.0).
    """

    def __init__(
        self,
        client: str,
        worker_listen: tuple[str, int] = ("127.0.0.1", 8888),
        *,
        name: str | None = None,
        inbox: str = "tcp://127.0.0.1:*",
        advertise: str | None = None,
        hwm: int = DEFAULT_HWM,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_worker_buffer: int = DEFAULT_MAX_WORKER_BUFFER,
        slow_worker: SlowWorker | str = SlowWorker.BLOCK,
        context: zmq.Context | None = None,
    ) -> None:
        self._ctx = context or zmq.Context.instance()
        self._listener = _bind_tcp(*worker_listen)
        self.worker_address: tuple[str, int] = self._listener.getsockname()[:2]
        self.name = name or f"{socket.gethostname()}:{self.worker_address[1]}"
        self.hwm = hwm
        self._inbox = self._ctx.socket(zmq.PULL)
        self._inbox.setsockopt(zmq.RCVHWM, hwm)
        self._inbox.setsockopt(zmq.MAXMSGSIZE, max(max_message_size, MAX_BATCH) + 64)
        self._inbox.setsockopt(zmq.LINGER, 0)
        self._inbox.bind(inbox)
        self.inbox = advertise or self._inbox.getsockopt_string(zmq.LAST_ENDPOINT)
        if not valid_endpoint(self.inbox):
            self._listener.close()
            self._inbox.close()
            raise ValueError(
                f"the inbox address {self.inbox!r} cannot be connected to from other nodes; "
                "give --advertise tcp://HOST:PORT"
            )
        self._client = self._ctx.socket(zmq.DEALER)
        self._client.setsockopt(zmq.ROUTING_ID, self.name.encode())
        self._client.setsockopt(zmq.MAXMSGSIZE, 1 << 20)
        self._client.setsockopt(zmq.LINGER, DEFAULT_LINGER_MS)
        self._client.connect(client)
        self.session = NodeSession(
            self.inbox,
            max_message_size=max_message_size,
            max_worker_buffer=max_worker_buffer,
            slow_worker=slow_worker,
        )
        self._peers: list[zmq.Socket] = []
        self._pending: dict[zmq.Socket, deque[tuple[bytes, ...]]] = {}
        self._to_client: deque[tuple[bytes, ...]] = deque()
        self._worker: socket.socket | None = None
        self._worker_peer = ""  # its address, for the log
        # a connection made while the worker (which spoke) is connected: it waits beside it
        # until it speaks (then it is the worker) or goes (a probe)
        self._newcomer: socket.socket | None = None
        self._newcomer_peer = ""
        # a port probe or a garbage link is one line per burst, never one per connection
        self._probe_log = BurstLog(log)
        self._bad_link_log = BurstLog(log, level=logging.ERROR)
        self.error: str | None = None
        self._closed = False

    # ------------------------------------------------------------ the loop

    def run(self, stop: threading.Event | None = None) -> str | None:
        """Serve until the client says every node finished (returns None), the client
        refuses the node (returns its reason) or ``stop`` is set (returns None)."""
        stop = stop or threading.Event()
        self._to_client.append(self.session.hello().frames)
        next_status = time.monotonic() + STATUS_INTERVAL
        try:
            while not stop.is_set() and not self.session.stopped:
                now = time.monotonic()
                if now >= next_status:
                    self._handle(self.session.progress())
                    next_status = now + STATUS_INTERVAL
                poller = zmq.Poller()  # anew: a closed worker's descriptor must not stay
                self._register(poller)
                ready = dict(poller.poll(_POLL_MS))
                if self._listener.fileno() in ready:
                    self._accept()
                if self._client in ready:
                    self._from_client()
                if self._inbox in ready:
                    self._from_peers()
                for peer in self._peers:
                    if ready.get(peer, 0) & zmq.POLLOUT:
                        self._flush_peer(peer)
                worker = self._worker
                if worker is not None:
                    flags = ready.get(worker.fileno(), 0)
                    if flags & zmq.POLLOUT:
                        self._write_worker()
                    if flags & (zmq.POLLIN | zmq.POLLERR) and self._worker is worker:
                        self._read_worker()
                newcomer = self._newcomer
                if newcomer is not None:
                    flags = ready.get(newcomer.fileno(), 0)
                    if flags & zmq.POLLOUT:
                        self._write_newcomer()
                    if flags & (zmq.POLLIN | zmq.POLLERR) and self._newcomer is newcomer:
                        self._read_newcomer()
                if self._to_client:
                    self._flush_client()
        finally:
            self.close()
        return self.error

    def _register(self, poller: zmq.Poller) -> None:
        s = self.session
        poller.register(self._listener.fileno(), zmq.POLLIN)
        poller.register(self._client, zmq.POLLIN | (zmq.POLLOUT if self._to_client else 0))
        peer_in = s.accepts_peer_input
        if not peer_in:
            s.counters.peer_input_paused += 1
        poller.register(self._inbox, zmq.POLLIN if peer_in else 0)
        for peer in self._peers:
            poller.register(peer, zmq.POLLOUT if self._pending[peer] else 0)
        worker = self._worker
        if worker is not None:
            blocked = any(self._pending.values()) or bool(self._to_client)
            if blocked:
                s.counters.worker_input_paused += 1
            flags = zmq.POLLIN if s.accepts_worker_input and not blocked else 0
            if s.worker_buffered:
                flags |= zmq.POLLOUT
            poller.register(worker.fileno(), flags)
            newcomer = self._newcomer
            if newcomer is not None:
                flags = zmq.POLLIN if s.accepts_worker_input and not blocked else 0
                if s.newcomer_data_to_write() is not None:
                    flags |= zmq.POLLOUT
                poller.register(newcomer.fileno(), flags)

    # ------------------------------------------------------------ worker link

    def _accept(self) -> None:
        try:
            conn, addr = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # out of descriptors, ...: the next turn tries again
            log.error("worker link: cannot accept: %s", exc)
            return
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = f"{addr[0]}:{addr[1]}"
        old = self._worker
        if old is not None and self.session.takes_newcomers:
            # the worker has spoken: the newcomer takes its place only once it speaks too
            if self._newcomer is not None:
                self._newcomer.close()
            self._handle(self.session.newcomer_connected())
            self._newcomer, self._newcomer_peer = conn, peer
            log.info("worker link: a connection from %s waits beside the worker's", peer)
            return
        if old is not None:
            log.warning("worker link: a new connection from %s replaces the open one", addr)
            old.close()
        self._handle(self.session.worker_connected())
        self._worker, self._worker_peer = conn, peer
        log.info("worker link: worker connected from %s", self._worker_peer)

    def _drop_worker(self, why: str, *, stopping: bool = False) -> None:
        worker = self._worker
        if worker is None:
            return
        self._worker = None
        s = self.session
        spoke = s.worker_spoke
        probe = s.worker_attached and not spoke and not (stopping or s.stopped)
        try:
            fd = worker.fileno()
            worker.close()
        finally:
            events = s.worker_closed()
        log.info("worker link: closed (%s, fd %d)", why, fd)
        if probe:
            self._log_probe(self._worker_peer)
        a = s.activity()
        if spoke and s.node is not None and not s.stopped and a.state is NodeState.ENDED:
            log.info(
                "node %d ended without Finished: its worker sent %d Deltas (%d words) and "
                "%d Runtime",
                s.node.node_id,
                a.deltas_from_worker,
                a.words_from_worker,
                a.runtime_from_worker,
            )
        self._handle(events)

    def _drop_newcomer(self, why: str) -> None:
        newcomer, self._newcomer = self._newcomer, None
        if newcomer is None:
            return
        newcomer.close()
        log.info("worker link: the connection from %s closed (%s)", self._newcomer_peer, why)
        if self.session.has_newcomer:  # not for garbage: that was logged as such
            self.session.newcomer_closed()
            self._log_probe(self._newcomer_peer)

    def _log_probe(self, peer: str) -> None:
        self._probe_log.event(
            time.monotonic(),
            "worker link: the connection from %s closed before any y2 message (a port "
            "probe?); the node waits for its worker",
            peer,
        )

    def _read_newcomer(self) -> None:
        assert self._newcomer is not None
        data = self._read(self._newcomer, self._drop_newcomer, "it disconnected")
        if data:
            self._handle(self.session.newcomer_data(data))

    @staticmethod
    def _read(sock: socket.socket, drop: Callable[[str], None], closed: str) -> bytes:
        """What ``sock`` has to read (b"" when nothing now); a failed read or a closed
        connection is handed to ``drop`` (with ``closed`` for a close) and reads b"" too."""
        try:
            data = sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return b""
        except OSError as exc:
            drop(f"read failed: {exc}")
            return b""
        if not data:
            drop(closed)
        return data

    def _write_newcomer(self) -> None:
        newcomer = self._newcomer
        assert newcomer is not None
        data = self.session.newcomer_data_to_write()
        if data is None:
            return
        try:
            n = newcomer.send(data)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop_newcomer("it went away")
            return
        self.session.newcomer_sent(n)

    def _read_worker(self) -> None:
        assert self._worker is not None
        data = self._read(self._worker, self._drop_worker, "the worker disconnected")
        if data:
            self._handle(self.session.worker_data(data))

    def _write_worker(self) -> None:
        worker = self._worker
        assert worker is not None
        while bufs := self.session.buffers_to_worker():
            try:
                n = worker.sendmsg(bufs)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                    log.warning("worker link: write failed: %s", exc)
                self._drop_worker("the worker went away")
                return
            self.session.worker_sent(n)

    # ------------------------------------------------------------ ZeroMQ

    def _from_client(self) -> None:
        for _ in range(_BATCH):
            try:
                frames = self._client.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            events = self.session.client_message(frames)
            if not events:
                log.warning("client: unexpected message %r", [f[:32] for f in frames[:4]])
            self._handle(events)
            if self.session.stopped:
                return

    def _from_peers(self) -> None:
        s = self.session
        for _ in range(_BATCH):
            if not s.accepts_peer_input:
                return
            try:
                frames = self._inbox.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            errors = s.counters.peer_errors
            taken = s.peer_message([f.buffer for f in frames])
            if not taken and (errors < 10 or errors % 1000 == 999):
                log.warning(
                    "inbox: malformed message from another node dropped (%d so far)",
                    s.counters.peer_errors,
                )

    def _flush_peer(self, peer: zmq.Socket) -> None:
        pending = self._pending[peer]
        while pending:
            try:
                peer.send_multipart(pending[0], zmq.NOBLOCK)
            except zmq.Again:
                return
            pending.popleft()

    def _flush_client(self) -> None:
        while self._to_client:
            try:
                self._client.send_multipart(self._to_client[0], zmq.NOBLOCK)
            except zmq.Again:
                return
            self._to_client.popleft()

    def _handle(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, ToPeers):
                for peer in self._peers:
                    pending = self._pending[peer]
                    if not pending:
                        try:
                            peer.send_multipart(event.frames, zmq.NOBLOCK)
                            continue
                        except zmq.Again:
                            pass
                    pending.append(event.frames)
            elif isinstance(event, ToClient):
                self._to_client.append(event.frames)
            elif isinstance(event, ConnectPeers):
                self._connect_peers(event.endpoints)
            elif isinstance(event, CloseWorker):
                self._bad_link_log.event(
                    time.monotonic(), "worker link: %s; closing the link", event.error
                )
                self._drop_worker("protocol error")
            elif isinstance(event, CloseNewcomer):
                self._bad_link_log.event(
                    time.monotonic(), "worker link: %s; closing the link", event.error
                )
                self._drop_newcomer("protocol error")
            elif isinstance(event, TakeNewcomer):
                self._take_newcomer()
            elif isinstance(event, Stop):
                self.error = event.error
                if event.error:
                    log.error("client: %s", event.error)
                else:
                    log.info("client: every node finished")

    def _take_newcomer(self) -> None:
        """The newcomer is the worker link now; the old one, if still open, is closed."""
        if self._newcomer is None:  # closed already (the service stops)
            return
        old, self._worker = self._worker, self._newcomer
        self._newcomer = None
        if old is not None:
            log.warning(
                "worker link: the connection from %s spoke: it replaces the open one",
                self._newcomer_peer,
            )
            old.close()
        self._worker_peer = self._newcomer_peer
        log.info("worker link: worker connected from %s", self._worker_peer)

    def _connect_peers(self, endpoints: tuple[str, ...]) -> None:
        node = self.session.node
        log.info(
            "node %s of %s; peers %s",
            node and node.node_id,
            node and node.node_count,
            ", ".join(endpoints),
        )
        for endpoint in endpoints:
            peer = self._ctx.socket(zmq.PUSH)
            peer.setsockopt(zmq.SNDHWM, self.hwm)
            peer.setsockopt(zmq.LINGER, 0)
            try:
                peer.connect(endpoint)
            except zmq.ZMQError as exc:  # a host name that does not resolve, ...
                log.error(
                    "cannot connect to the inbox %s: %s; its node gets no Deltas", endpoint, exc
                )
                self.session.counters.client_errors += 1
                peer.close()
                continue
            self._peers.append(peer)
            self._pending[peer] = deque()

    def counters(self) -> dict[str, Any]:
        """The session's counters and the Deltas still waiting for a peer."""
        out: dict[str, Any] = self.session.counters.as_dict()
        out["deltas_pending_to_peers"] = sum(len(p) for p in self._pending.values())
        node = self.session.node
        out["node_id"] = None if node is None else node.node_id
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._newcomer is not None:
            self._newcomer.close()
            self._newcomer = None
        if self._worker is not None:
            self._drop_worker("the service stopped", stopping=True)
        self._listener.close()
        for sock in (self._inbox, self._client, *self._peers):
            sock.close()


class ClientService:
    """The client service: registers ``nodes`` nodes and collects their reports."""

    def __init__(
        self,
        nodes: int,
        listen: str = "tcp://127.0.0.1:5560",
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        context: zmq.Context | None = None,
    ) -> None:
        self._ctx = context or zmq.Context.instance()
        self.registry = ClientRegistry(nodes, max_message_size=max_message_size)
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.MAXMSGSIZE, 1 << 20)
        self._sock.setsockopt(zmq.LINGER, DEFAULT_LINGER_MS)
        # A restarted service reconnects under its name (its routing id) before the ROUTER
        # may have seen its old connection end; by default ZeroMQ then ignores the newcomer
        # and its hello is lost.  Hand the name over to the newest connection instead.
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self._sock.bind(listen)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def run(self, stop: threading.Event | None = None, timeout: float | None = None) -> bool:
        """Serve until every node has finished or ended (True), ``stop`` is set (False) or,
        with ``timeout``, nothing moved for ``timeout`` seconds (False; every service is told
        to stop, and ``registry.aborted`` says why)."""
        stop = stop or threading.Event()
        reg = self.registry
        errors = 0
        seen, last_move = reg.progress, time.monotonic()
        try:
            while not stop.is_set() and not reg.done:
                if reg.progress != seen:
                    seen, last_move = reg.progress, time.monotonic()
                elif timeout is not None and time.monotonic() - last_move >= timeout:
                    self._give_up(timeout)
                    break
                if not self._sock.poll(_POLL_MS):
                    continue
                for _ in range(_BATCH):
                    try:
                        sender, *frames = self._sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    before = len(reg.nodes)
                    rec = reg.nodes.get(sender)
                    state = rec and rec.state
                    for to, reply in reg.receive(sender, frames):
                        self._sock.send_multipart([to, *reply])
                    if rec is not None and rec.state is not state:
                        log.info("node %d: %s", rec.node_id, rec.state.value)
                    if len(reg.nodes) != before:
                        log.info(
                            "node %r registered (%d of %d)",
                            sender[:64],
                            len(reg.nodes),
                            reg.node_count,
                        )
                    if reg.counters.errors != errors:
                        errors = reg.counters.errors
                        log.warning("client: %s", reg.errors[-1] if reg.errors else "error")
        finally:
            self._sock.close()
        return reg.done

    def _give_up(self, timeout: float) -> None:
        reg = self.registry
        reason = f"no progress for {timeout:g} s; still running: {', '.join(reg.not_over())}"
        log.error("client: %s", reason)
        for to, reply in reg.abort(reason):  # a ROUTER drops what a gone service cannot take
            self._sock.send_multipart([to, *reply], zmq.NOBLOCK)
