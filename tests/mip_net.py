"""Helpers for the MIP network tests: KubeMo's real server in a thread, raw sockets, a PNG.

Every blocking call has a timeout; every server and socket is closed by its context manager.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import kubemo
from PIL import Image
from support.process import TIMEOUT as TIMEOUT  # the tests import it from here too
from support.process import ServerProcess, listening_line

from wirekit import mip
from wirekit.mip.runtime import parse_address


def png_bytes(
    width: int = 3, height: int = 2, color: tuple[int, int, int] = (200, 10, 30)
) -> bytes:
    """A small, valid PNG file."""
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format="PNG")
    return buf.getvalue()


class KubemoServer:
    """KubeMo's own ``Server`` (from PyPI) serving ``model`` in a daemon thread.

    It runs KubeMo's real ``serve()`` loop; ``close()`` shuts the listening socket down, which
    makes the blocked ``accept`` fail and the loop end.
    """

    def __init__(self, model: Callable, network: str = "tcp") -> None:
        self._tmp = None
        if network == "tcp":
            self.server = kubemo.Server("tcp", ("127.0.0.1", 0))
            host, port = self.server.socket.getsockname()
            self.address = f"tcp://{host}:{port}"
        else:
            self._tmp = tempfile.mkdtemp(prefix="wk-kubemo-")
            path = os.path.join(self._tmp, "kubemo.sock")
            self.server = kubemo.Server("unix", path)
            self.address = f"unix://{path}"
        self.server.handle(kubemo.InferenceHandler(model))
        self.thread = threading.Thread(target=self._run, name="kubemo-server", daemon=True)

    def _run(self) -> None:
        with contextlib.suppress(OSError):
            self.server.serve()

    def __enter__(self) -> KubemoServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self.server.socket.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.server.close()
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "KubeMo's server thread did not stop"
        if self._tmp:
            with contextlib.suppress(OSError):
                os.rmdir(self._tmp)


def kubemo_echo(*samples):
    """A KubeMo model answering each sample with its inputs (re-encoded by KubeMo)."""
    outputs = []
    for sample in samples:
        row = []
        for value in sample:
            data = value.encode()
            kind = value.serial.kind
            if kind == kubemo.IMAGE:
                row.append(kubemo.Image(io.BytesIO(data)))
            elif kind == kubemo.JSON:
                row.append(kubemo.Json(io.BytesIO(data)))
            else:
                row.append(kubemo.Text(io.BytesIO(data)))
        outputs.append(tuple(row))
    return tuple(outputs)


@contextlib.contextmanager
def raw_connection(address: str, timeout: float = TIMEOUT) -> Iterator[socket.socket]:
    """A plain socket to a ``tcp://`` or ``unix://`` address, closed on exit."""
    family, target = parse_address(address)
    if family == "tcp":
        sock = socket.create_connection(target, timeout=timeout)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(target)
    try:
        yield sock
    finally:
        sock.close()


def read_message(sock: socket.socket) -> mip.Message:
    """Read exactly one MIP message from a socket (fails on EOF)."""
    decoder = mip.Decoder()
    while True:
        msg = decoder.next_message()
        if msg is not None:
            assert decoder.buffered == 0, "unexpected bytes after the reply"
            return msg
        data = sock.recv(65536)
        assert data, "connection closed before a whole reply arrived"
        decoder.feed(data)


def read_eof(sock: socket.socket) -> bytes:
    """Read until the peer closes; return what came."""
    chunks = []
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


class SubprocessServer(ServerProcess):
    """A server in a subprocess that prints ``listening on ADDRESS`` first; stopped by SIGTERM."""

    def __init__(self, argv: list[str]) -> None:
        super().__init__(argv, ready=listening_line)
        self.address = ""

    def start(self) -> SubprocessServer:
        super().start()
        self.address = self.first_line.split()[-1]
        return self


class CliServer(SubprocessServer):
    """``wirekit mip serve`` in a subprocess."""

    def __init__(self, *args: str, handler: str = "wirekit.mip.runtime:echo") -> None:
        argv = [sys.executable, "-m", "wirekit.cli", "mip", "serve", "--handler", handler]
        super().__init__(argv + (list(args) or ["--listen", "tcp://127.0.0.1:0"]))


def python_server(function: str) -> SubprocessServer:
    """``mip_net.<function>()`` in a subprocess (``kubemo_server_main``, ``echo_server_main``)."""
    code = f"import mip_net; mip_net.{function}()"
    return SubprocessServer([sys.executable, "-c", code])


def serve_kubemo(model: Callable) -> None:
    """KubeMo's server with ``model``, on a free port, until killed; its first line is
    ``listening on ADDRESS`` (for a :class:`SubprocessServer`)."""
    server = kubemo.Server("tcp", ("127.0.0.1", 0))
    server.handle(kubemo.InferenceHandler(model))
    host, port = server.socket.getsockname()
    print(f"listening on tcp://{host}:{port}", flush=True)
    server.serve()


def kubemo_server_main() -> None:
    """KubeMo's server with :func:`kubemo_echo`, on a free port, until killed."""
    serve_kubemo(kubemo_echo)


def echo_server_main() -> None:
    """A raw asyncio echo server (bytes in, same bytes out), on a free port, until killed.

    It runs on the same event loop as ``wirekit mip serve`` picks (``wirekit._loop``: uvloop
    when installed, unless ``WIREKIT_LOOP`` says otherwise), so the comparison is like with
    like."""
    import asyncio

    from wirekit import _loop

    class Echo(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport

        def data_received(self, data):
            self.transport.write(data)

    async def main():
        server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
        host, port = server.sockets[0].getsockname()
        print(f"listening on tcp://{host}:{port}", flush=True)
        await server.serve_forever()

    _loop.run(main())


def cpu_ns(pid: int) -> int:
    """The CPU time of every thread of process ``pid`` so far, in ns (Linux: schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that ended
            total += int((task / "schedstat").read_text().split()[0])
    return total


def pure_connection_serve_main() -> None:
    """``wirekit mip serve`` with the async echo handler, its connections the pure
    ``PyConnection`` (the reference the compiled twin is measured against), on a free port."""
    from wirekit import cli
    from wirekit.mip import connection, server

    server.Connection = connection.PyConnection  # type: ignore[misc]
    args = ["mip", "serve", "--handler", "wirekit.mip.runtime:async_echo"]
    sys.exit(cli.main([*args, "--listen", "tcp://127.0.0.1:0"]))
