"""A small recording TCP proxy: capture both directions of connections for ``wirekit decode``.

Plain sockets and threads, bounded: it accepts up to ``max_connections`` connections (each
within ``accept_timeout`` of the previous; one whose target cannot be reached counts too: it
is logged, counted in ``refused``, and closed), forwards bytes both ways until either side closes
or stays idle for ``idle_timeout`` seconds, and keeps at most ``max_bytes`` per direction of
the first connection in ``upstream``/``downstream`` (``overflow`` says when it stopped
recording them).  With ``pcapng`` (a binary file), every connection is also written there as
TCP traffic with capture timestamps — what ``wirekit record`` does — for ``wirekit decode``.

>>> with RecordingProxy(("127.0.0.1", 5555)) as proxy:   # doctest: +SKIP
...     dealer.connect(f"tcp://127.0.0.1:{proxy.port}")
...     ...
>>> proxy.upstream, proxy.downstream                    # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from typing import BinaryIO

log = logging.getLogger(__name__)


class RecordingProxy:
    """Listen on ``listen_host`` (``listen_port``, random by default), forward to ``target``.

    ``upstream`` holds what the first connecting client sent, ``downstream`` what the target
    sent back.  Use as a context manager, or call ``start()``/``close()``.
    """

    def __init__(
        self,
        target: tuple[str, int],
        listen_host: str = "127.0.0.1",
        *,
        listen_port: int = 0,
        accept_timeout: float | None = 10.0,
        idle_timeout: float | None = 10.0,
        max_bytes: int = 16 * 1024 * 1024,
        max_connections: int | None = 1,
        pcapng: BinaryIO | None = None,
    ) -> None:
        self.target = target
        self.accept_timeout = accept_timeout
        self.idle_timeout = idle_timeout
        self.max_bytes = max_bytes
        self.max_connections = max_connections
        self.upstream = bytearray()
        self.downstream = bytearray()
        self.overflow = False
        self.error: BaseException | None = None
        self.connections = 0  #: connections forwarded to the target
        self.refused = 0  #: clients accepted whose connection to the target failed
        self._listener = socket.create_server((listen_host, listen_port))
        self._listener.settimeout(accept_timeout)
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._pumps: list[threading.Thread] = []
        self._writer = None
        if pcapng is not None:
            from wirekit.capture import PcapngWriter

            self._writer = PcapngWriter(pcapng)
        self._thread = threading.Thread(target=self._serve, name="zmtp-recorder", daemon=True)

    def start(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __enter__(self) -> RecordingProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def wait(self, timeout: float | None = 10.0) -> bool:
        """Wait until every connection has closed; True if they did within ``timeout``."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self, timeout: float = 10.0) -> None:
        """Stop forwarding (closing every connection) and wait for the threads."""
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for sock in self._sockets:
            sock.close()

    def _serve(self) -> None:
        try:
            while (
                self.max_connections is None
                or self.connections + self.refused < self.max_connections
            ):
                try:
                    client, peer = self._listener.accept()
                except OSError as exc:  # timeout, or closed
                    if self.connections == 0:
                        self.error = exc
                    break
                self._connect(client, peer)
        finally:
            for pump in list(self._pumps):
                pump.join()

    def _connect(self, client: socket.socket, peer: tuple) -> None:
        try:
            server = socket.create_connection(self.target, timeout=self.accept_timeout)
        except OSError as exc:
            self.error = exc
            self.refused += 1
            log.warning(
                "cannot connect to the target %s:%s for the client from %s:%s (%s); "
                "the client is closed",
                self.target[0], self.target[1], peer[0], peer[1], exc.strerror or exc,
            )  # fmt: skip
            client.close()
            return
        first = self.connections == 0
        self.connections += 1
        log.info("connection %d: %s:%s -> %s:%s", self.connections, peer[0], peer[1], *self.target)
        with self._lock:
            self._sockets += [client, server]
        for sock in (client, server):
            sock.settimeout(self.idle_timeout)
        conversation = None
        if self._writer is not None:
            from wirekit.capture import TcpConversation

            ends = ((peer[0], peer[1]), (self.target[0], self.target[1]))
            conversation = TcpConversation(self._writer, *_numeric(ends))
            with self._lock:
                conversation.open(time.time())
        state = {"open": 2, "conversation": conversation}
        for src, dst, side in ((client, server, 0), (server, client, 1)):
            record = (self.upstream if side == 0 else self.downstream) if first else None
            pump = threading.Thread(
                target=self._pump, args=(src, dst, record, side, state), daemon=True
            )
            self._pumps.append(pump)
            pump.start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bytearray | None,
              side: int, state: dict) -> None:  # fmt: skip
        conversation = state["conversation"]
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if conversation is not None:
                    with self._lock:
                        conversation.send(side, time.time(), data)
                if record is not None:
                    room = self.max_bytes - len(record)
                    if len(data) > room:
                        self.overflow = True
                    record += data[: max(room, 0)]
                dst.sendall(data)
        except OSError:
            pass  # idle timeout, reset or closed by close(): stop this direction
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            with self._lock:
                state["open"] -= 1
                if conversation is not None and state["open"] == 0:
                    conversation.close(time.time())


def _numeric(ends: tuple) -> tuple:
    """Endpoints with numeric addresses (a target given by name is resolved once)."""
    out = []
    for host, port in ends:
        try:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4]
            out.append((info[0], int(port)))
        except OSError:
            out.append(("127.0.0.1", int(port)))
    return tuple(out)
