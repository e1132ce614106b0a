"""The load generator of the OIP benchmark: one process, the same for every server measured.

    python oip_load.py SPEC.json

``SPEC.json`` says what to send and where::

    {"kind": "http" | "grpc", "host": "127.0.0.1", "port": 8080, "in_flight": 32,
     "warmup": 64, "ready_timeout": 120, "request_file": "/tmp/req.bin",
     "answer_file": "/tmp/answer.bin", "method": "/pkg.Service/Method"}

* ``http``: the file holds one whole HTTP/1.1 request (head and body), sent as it is again
  and again on ``in_flight`` keep-alive connections, each with one request outstanding
  (asyncio streams; the answer read by its ``Content-Length`` or chunked framing).
* ``grpc``: the file holds one serialized request message, sent with ``grpc.aio`` on one
  channel (one HTTP/2 connection, as gRPC clients do), ``in_flight`` calls outstanding;
  ``method`` is the RPC's full name.  Messages stay bytes: no generated code is needed.

It waits until the server answers well (``ready_timeout`` seconds at most: servers start in
their own time), connects, sends ``warmup`` requests, writes the first answer's body to
``answer_file`` and one JSON line to stdout: ``{"ready": true, "status": ..., "headers":
{...}}`` -- for the caller to check.  Then it reads commands from stdin, one a line:
``run N`` sends ``N`` requests (``in_flight`` at a time) and answers ``{"elapsed_s",
"requests", "failed", "first_failure", "p50_us", "p99_us"}``; ``quit`` (or the end of
stdin) ends it.  The caller reads the servers' CPU before writing ``run N`` and after reading
the answer, so the load generator's own CPU is never counted.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

#: bound on one request (a server that stops answering ends the run with an error)
REQUEST_TIMEOUT = 60.0


class HttpConnection:
    """One keep-alive HTTP/1.1 connection sending the same request bytes each time; opened
    again when the server closed it while idle (uvicorn does after 5 s, MLServer's default),
    as HTTP clients do."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    @classmethod
    async def open(cls, host: str, port: int) -> HttpConnection:
        """A connection to ``host``:``port``."""
        conn = cls(host, port)
        await conn._connect()
        return conn

    async def _connect(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader, self.writer = await asyncio.open_connection(
            self.host, self.port, limit=1 << 24
        )

    async def ask(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        """Send ``request``; the answer's status, headers (lower-case names) and body."""
        assert self.reader is not None and self.writer is not None
        if self.reader.at_eof():
            await self._connect()
            assert self.reader is not None and self.writer is not None
        self.writer.write(request)
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionResetError) as exc:
            if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                raise
            await self._connect()  # closed while idle: once more on a fresh connection
            assert self.reader is not None and self.writer is not None
            self.writer.write(request)
            head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._chunked()
        else:
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, body

    async def _chunked(self) -> bytes:
        assert self.reader is not None
        parts: list[bytes] = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")  # no trailers expected
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)

    def close(self) -> None:
        """Close the connection."""
        if self.writer is not None:
            self.writer.close()


Ask = Callable[[], Awaitable[tuple[int, dict[str, str], bytes]]]


async def http_askers(spec: dict[str, Any]) -> tuple[list[Ask], Callable[[], Awaitable[None]]]:
    """One asker per connection (``in_flight`` of them) and the coroutine that closes them."""
    with open(spec["request_file"], "rb") as fh:
        request = fh.read()
    connections = [
        await HttpConnection.open(spec["host"], spec["port"]) for _ in range(spec["in_flight"])
    ]

    def asker(conn: HttpConnection) -> Ask:
        return lambda: conn.ask(request)

    async def close() -> None:
        for conn in connections:
            conn.close()

    return [asker(conn) for conn in connections], close


async def grpc_askers(spec: dict[str, Any]) -> tuple[list[Ask], Callable[[], Awaitable[None]]]:
    """``in_flight`` askers sharing one channel (bytes in, bytes out), and its closer."""
    import grpc

    with open(spec["request_file"], "rb") as fh:
        request = fh.read()
    size = 64 << 20
    channel = grpc.aio.insecure_channel(
        f"{spec['host']}:{spec['port']}",
        options=[("grpc.max_send_message_length", size), ("grpc.max_receive_message_length", size)],
    )
    call = channel.unary_unary(spec["method"])

    async def ask() -> tuple[int, dict[str, str], bytes]:
        try:
            reply = await call(request, timeout=REQUEST_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            return exc.code().value[0] or -1, {"details": exc.details() or ""}, b""
        return 0, {}, reply

    async def close() -> None:
        await channel.close()

    return [ask] * spec["in_flight"], close


def _ok(kind: str, status: int) -> bool:
    return status == (200 if kind == "http" else 0)


async def run(askers: list[Ask], kind: str, count: int) -> dict[str, Any]:
    """``count`` requests, one outstanding per asker; the round's time and latencies."""
    left = count
    latencies: list[int] = []
    failures: list[str] = []

    async def worker(ask: Ask) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            start = time.perf_counter_ns()
            status, headers, body = await asyncio.wait_for(ask(), REQUEST_TIMEOUT)
            latencies.append(time.perf_counter_ns() - start)
            if not _ok(kind, status):
                failures.append(f"{status} {headers.get('details', '')}{body[:200]!r}")

    start = time.perf_counter()
    await asyncio.gather(*(worker(ask) for ask in askers))
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "elapsed_s": elapsed,
        "requests": count,
        "failed": len(failures),
        "first_failure": failures[0] if failures else None,
        "p50_us": latencies[len(latencies) // 2] / 1e3,
        "p99_us": latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)] / 1e3,
    }


async def wait_ready(spec: dict[str, Any]) -> None:
    """Ask once and again (a fresh connection each time) until the server answers the
    request well, or ``ready_timeout`` seconds pass (then the last failure is the answer):
    the servers start in their own time and say nothing when they are ready."""
    kind = spec["kind"]
    deadline = time.monotonic() + spec.get("ready_timeout", 0)
    while True:
        try:
            askers, close = await (http_askers if kind == "http" else grpc_askers)(
                {**spec, "in_flight": 1}
            )
            try:
                status, _, _ = await asyncio.wait_for(askers[0](), REQUEST_TIMEOUT)
            finally:
                await close()
            if _ok(kind, status) or time.monotonic() > deadline:
                return
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            if time.monotonic() > deadline:
                return
        await asyncio.sleep(0.2)


async def main(spec: dict[str, Any]) -> None:
    kind = spec["kind"]
    await wait_ready(spec)
    askers, close = await (http_askers if kind == "http" else grpc_askers)(spec)
    try:
        status, headers, body = await askers[0]()
        if spec.get("warmup"):
            await run(askers, kind, spec["warmup"])
        with open(spec["answer_file"], "wb") as fh:
            fh.write(body)
        _say({"ready": True, "status": status, "headers": headers})
        loop = asyncio.get_running_loop()
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
            if not line or line[0] == "quit":
                return
            _say(await run(askers, kind, int(line[1])))
    finally:
        await close()


def _say(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        asyncio.run(main(json.load(fh)))
