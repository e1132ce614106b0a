"""The worker side of the y2 worker link: what a training process uses to talk to its
node's communication service (``wirekit y2 service``)::

    link = WorkerLink(("127.0.0.1", 8888))
    index = link.node_index(timeout=30)        # NodeIndex(node_id=0, node_count=3)
    link.send(Delta(words))                     # to every other node's worker
    link.receive(timeout=1)                     # the next Delta from another node
    link.send(Runtime(600, 1, 20, 2))           # to the client service
    link.send(Finished())

A reader thread frames what the service sends with the y2 :class:`~wirekit.y2.Decoder` and
queues the messages, so sending never waits for the worker to read (the service's own
flow control then decides; see ``specs/y2.md``).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time

from wirekit.errors import DecodeError

from .decoder import DEFAULT_MAX_MESSAGE_SIZE, Decoder
from .messages import Delta, Message, NodeIndex

_CLOSED = object()


class WorkerLink:
    """A worker's connection to its communication service (blocking API, one reader thread).

    ``connect_timeout``: how long to keep retrying while the service is not listening yet
    (y2's worker retries every second, for ever).
    """

    def __init__(
        self,
        address: tuple[str, int] = ("127.0.0.1", 8888),
        *,
        connect_timeout: float = 30.0,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self._sock = socket.create_connection(address, timeout=connect_timeout)
                break
            except ConnectionRefusedError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._decoder = Decoder(max_message_size)
        self._inbox: queue.Queue[object] = queue.Queue()
        self._index: NodeIndex | None = None
        self._send_lock = threading.Lock()
        #: Why the reader stopped (a DecodeError, an OSError) or None.
        self.error: BaseException | None = None
        self._reader = threading.Thread(target=self._read, name="y2-worker-link", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while data := self._sock.recv(256 * 1024):
                self._decoder.feed(data)
                for msg in self._decoder:
                    self._inbox.put(msg)
        except (OSError, DecodeError) as exc:
            self.error = exc
        finally:
            self._inbox.put(_CLOSED)

    def send(self, msg: Message) -> None:
        """Send one message (Delta, Runtime or Finished) to the service."""
        from wirekit import y2

        self.send_raw(y2.encode(msg))

    def send_raw(self, data: bytes) -> None:
        """Send bytes as they are (already encoded messages)."""
        with self._send_lock:
            self._sock.sendall(data)

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message from the service; None on timeout or once the link is closed."""
        try:
            msg = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        if msg is _CLOSED:
            self._inbox.put(_CLOSED)  # every later call sees it too
            return None
        if isinstance(msg, NodeIndex):
            self._index = msg
        return msg  # type: ignore[return-value]

    def node_index(self, timeout: float | None = None) -> NodeIndex | None:
        """Wait for the NodeIndex (the service sends it first); None on timeout."""
        if self._index is not None:
            return self._index
        msg = self.receive(timeout)
        return msg if isinstance(msg, NodeIndex) else None

    def deltas(self, count: int, timeout: float) -> list[Delta]:
        """Wait for ``count`` Deltas (at most ``timeout`` seconds in all)."""
        deadline = time.monotonic() + timeout
        out: list[Delta] = []
        while len(out) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            msg = self.receive(left)
            if msg is None:
                break
            if isinstance(msg, Delta):
                out.append(msg)
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._reader.join(5)

    def __enter__(self) -> WorkerLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
