"""A small recording TCP proxy: capture both directions of one connection for ``wirekit decode``.

Plain sockets and threads, bounded: it accepts one connection (``accept_timeout``), forwards
bytes both ways until either side closes or stays idle for ``idle_timeout`` seconds, and
keeps at most ``max_bytes`` per direction (``overflow`` says when it stopped recording).

>>> with RecordingProxy(("127.0.0.1", 5555)) as proxy:   # doctest: +SKIP
...     dealer.connect(f"tcp://127.0.0.1:{proxy.port}")
...     ...
>>> proxy.upstream, proxy.downstream                    # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import socket
import threading


class RecordingProxy:
    """Listen on ``listen_host`` (random port), forward one connection to ``target``.

    ``upstream`` holds what the connecting client sent, ``downstream`` what the target sent
    back.  Use as a context manager, or call ``start()``/``close()``.
    """

    def __init__(
        self,
        target: tuple[str, int],
        listen_host: str = "127.0.0.1",
        *,
        accept_timeout: float = 10.0,
        idle_timeout: float = 10.0,
        max_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.target = target
        self.accept_timeout = accept_timeout
        self.idle_timeout = idle_timeout
        self.max_bytes = max_bytes
        self.upstream = bytearray()
        self.downstream = bytearray()
        self.overflow = False
        self.error: BaseException | None = None
        self._listener = socket.create_server((listen_host, 0))
        self._listener.settimeout(accept_timeout)
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="zmtp-recorder", daemon=True)

    def start(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __enter__(self) -> RecordingProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def wait(self, timeout: float = 10.0) -> bool:
        """Wait until both directions have closed; True if they did within ``timeout``."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self, timeout: float = 10.0) -> None:
        """Stop forwarding (closing both connections) and wait for the threads."""
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for sock in self._sockets:
            sock.close()

    def _serve(self) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError as exc:  # timeout or closed before anyone connected
            self.error = exc
            return
        try:
            server = socket.create_connection(self.target, timeout=self.accept_timeout)
        except OSError as exc:
            self.error = exc
            client.close()
            return
        with self._lock:
            self._sockets += [client, server]
        for sock in (client, server):
            sock.settimeout(self.idle_timeout)
        pumps = [
            threading.Thread(target=self._pump, args=(client, server, self.upstream), daemon=True),
            threading.Thread(
                target=self._pump, args=(server, client, self.downstream), daemon=True
            ),
        ]
        for pump in pumps:
            pump.start()
        for pump in pumps:
            pump.join()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bytearray) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
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
