"""The lean HTTP/1.1 client of the model-server backends
(:mod:`wirekit.serve.backends.httpclient`) against canned answers on a real loopback
socket: Content-Length, chunked and to-the-end bodies, keep-alive and ``Connection:
close``, an interim 100, the connection limit, a cancelled call's connection closed, and
what is not HTTP refused as :class:`HttpError`."""

from __future__ import annotations

import asyncio

import pytest
from serve_support import run

from wirekit.serve.backends.httpclient import HttpError, HttpPool


class Canned:
    """A server answering each request (head + Content-Length body) with the next of
    ``answers`` (bytes; ``None``: hold the connection, answer nothing; ``b""``: close it
    unanswered); it counts
    connections and keeps what it read."""

    def __init__(self, answers: list[bytes | None], silent_close: bool = False) -> None:
        self.answers = list(answers)
        self.silent_close = silent_close  # close each connection after its first answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers.pop(0)
                if answer is None:
                    await reader.read()
                    return
                if not answer:  # the request read, the connection closed unanswered
                    writer.close()
                    return
                writer.write(answer)
                await writer.drain()
                if self.silent_close:
                    await asyncio.sleep(0.05)
                    writer.close()
                    return
                lower = answer.lower()
                closing = b"connection: close" in lower or b"content-length" not in lower
                if closing and b"chunked" not in lower:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    async def __aenter__(self) -> tuple[Canned, int]:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return self, self.server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Length: 7\r\n\r\nhi"


def _exchange(
    answers: list[bytes | None], calls: int = 1, silent_close: bool = False, **pool: object
):
    async def go():
        async with Canned(answers, silent_close) as (server, port):
            client = HttpPool("127.0.0.1", port, limit=4, wanted=frozenset({b"x-length"}), **pool)
            results = []
            for _ in range(calls):
                await asyncio.sleep(0.1)
                try:
                    results.append(await client.post("/p", b"body", {"A": "b"}))
                except HttpError as exc:
                    results.append(exc)
            await client.close()
            return results, server

    return run(go(), timeout=10)


def test_keep_alive_reuses_one_connection():
    results, server = _exchange([OK, OK, OK], calls=3)
    assert results == [(200, {b"x-length": b"7"}, b"hi")] * 3
    assert server.connections == 1
    assert server.requests[0].startswith(b"POST /p HTTP/1.1\r\nHost: 127.0.0.1:")
    assert server.requests[0].endswith(b"Content-Length: 4\r\nA: b\r\n\r\nbody")


def test_connection_close_opens_a_new_one():
    close = b"HTTP/1.1 400 Bad\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbad"
    results, server = _exchange([close, OK], calls=2)
    assert results == [(400, {}, b"bad"), (200, {b"x-length": b"7"}, b"hi")]
    assert server.connections == 2


def test_chunked_and_interim_answers():
    chunked = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: 1\r\n\r\n"
    )
    results, server = _exchange([chunked, OK], calls=2)
    assert results == [(200, {}, b"abcde"), (200, {b"x-length": b"7"}, b"hi")]
    assert server.connections == 1


def test_a_body_to_the_end_of_the_connection():
    results, _server = _exchange([b"HTTP/1.0 200 OK\r\n\r\nall of it"])
    assert results == [(200, {}, b"all of it")]


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "a bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "a header line without a colon"),
        (
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 9\r\n\r\nshort",
            "connection lost before",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n" + b"x" * 20, "an answer over 10 bytes"),
    ],
)
def test_what_is_not_http_is_an_http_error(answer: bytes, why: str):
    (result,), _server = _exchange([answer], max_body=10)
    assert isinstance(result, HttpError) and why in str(result)


def test_nothing_listening():
    async def go():
        client = HttpPool("127.0.0.1", 1, limit=1)
        with pytest.raises(HttpError):
            await client.post("/p", b"", {})
        assert client.open == 0

    run(go(), timeout=10)


def test_the_limit_and_a_cancelled_call():
    """Two calls on a limit of one: the second waits; the first, cancelled (its server
    holds it), closes its connection, and the second gets a fresh one."""

    async def go():
        async with Canned([None, OK]) as (server, port):
            client = HttpPool("127.0.0.1", port, limit=1)
            first = asyncio.ensure_future(client.post("/p", b"", {}))
            await asyncio.sleep(0.05)
            second = asyncio.ensure_future(client.post("/p", b"", {}))
            await asyncio.sleep(0.05)
            assert client.open == 1 and not second.done()
            first.cancel()
            assert (await asyncio.wait_for(second, 5))[0] == 200
            assert server.connections == 2
            await client.close()
            assert client.open == 0

    run(go(), timeout=10)


def test_a_kept_alive_connection_the_server_closed_is_tried_once_more():
    """The server closes each connection after one answer without saying so: the second
    call finds its kept-alive connection closed and goes again on a new one."""
    results, server = _exchange([OK, OK, OK], calls=3, silent_close=True)
    assert results == [(200, {b"x-length": b"7"}, b"hi")] * 3
    assert server.connections == 3


def test_a_reused_connection_closed_before_an_answer_is_tried_once_more():
    """The server reads the second request on the kept-alive connection and closes it
    without a byte: it is sent again on a new connection.  A new connection closed so is an
    HttpError (nothing to retry)."""
    results, server = _exchange([OK, b"", OK], calls=2)
    assert results == [(200, {b"x-length": b"7"}, b"hi")] * 2
    assert server.connections == 2
    (result,), _server = _exchange([b""])
    assert isinstance(result, HttpError) and "connection lost before the answer" in str(result)
