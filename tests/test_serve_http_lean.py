"""Issue 36: the HTTP door's lean path for OIP inferences (wirekit.serve.doors.lean).

Differential tests over raw sockets against an in-process service with a real MIP echo
backend: every byte sequence gets the same answer on a connection the lean path owns as on
a connection aiohttp owns (made aiohttp's by a ``GET`` first), Date header aside; the lean
path answers the requests it takes (counted), and leaves every other to aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re

import pytest
from serve_support import deployment
from support.loops import LOOPS
from support.service import running_service, start_backend

from wirekit.mip.runtime import echo
from wirekit.serve.doors import httpdoor, lean

MAX_BODY = 4096
WAIT = 10.0
#: a GET that makes a fresh connection aiohttp's for good
GET_LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
#: every test on both event loops
pytestmark = pytest.mark.parametrize("loop", LOOPS)
DOC = json.dumps(
    {"id": "r1", "inputs": [{"name": "x", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}
).encode()


def infer(body: bytes = DOC, path: str = "/v2/models/m/infer", extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"%sContent-Length: %d\r\n\r\n%s" % (path.encode(), extra, len(body), body)
    )


def run(loop: str, coro, timeout: float = 60.0):
    """Run a test coroutine on ``loop`` (asyncio or uvloop) with an overall time bound."""
    factory = None
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(asyncio.wait_for(coro, timeout))


@contextlib.asynccontextmanager
async def lean_service(path, **http):
    backend, port = await start_backend(echo)
    doc = deployment(
        path / "r.db",
        {"m": {"timeout": 5}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [port]}],
        cache={"max_entries": 0},
        http={"max_body_size": MAX_BODY, **http},
    )
    async with running_service(doc, backends=[backend]) as service:
        yield service.addresses()["http"]


@pytest.fixture
def taken(monkeypatch):
    """The requests the lean path took (their models), counted through its parser."""
    seen: list[str] = []

    def counting(buf, max_body=lean.MAX_BODY):
        found = lean.parse(buf, max_body)
        if isinstance(found, lean.LeanRequest):
            seen.append(found.model)
        return found

    monkeypatch.setattr(httpdoor, "parse", counting)
    return seen


def _answers(data: bytes, n: int) -> list[tuple[bytes, bytes]]:
    """``n`` HTTP answers at the start of ``data``: (head without Date, body)."""
    out = []
    data = data.replace(b"HTTP/1.1 100 Continue\r\n\r\n", b"")
    for _ in range(n):
        end = data.index(b"\r\n\r\n")
        head = data[:end]
        length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
        body = data[end + 4 : end + 4 + length]
        data = data[end + 4 + length :]
        head = re.sub(rb"\r\nDate: [^\r]*", b"", head)
        head = re.sub(rb"(X-Request-Id: )[^\r]*", rb"\1(an id)", head)  # one per request
        lines = head.split(b"\r\n")
        out.append((b"\r\n".join([lines[0], *sorted(lines[1:])]), body))
    assert data == b"", data
    return out


async def exchange(port: int, pieces: list[bytes], n: int, *, first: bytes = b"") -> list:
    """Send ``first`` (answered, its answer dropped), then ``pieces`` one write each; the
    ``n`` answers to the pieces, or what came before the connection closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if first:
            writer.write(first)
            await asyncio.wait_for(_read_answers(reader, 1), WAIT)
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0)
        return await asyncio.wait_for(_read_answers(reader, n), WAIT)
    finally:
        writer.close()


async def _read_answers(reader: asyncio.StreamReader, n: int) -> list:
    data = b""
    while True:
        try:
            return _answers(data, n)
        except (ValueError, AttributeError, AssertionError, IndexError):
            pass
        chunk = await reader.read(65536)
        if not chunk:
            return [("closed", re.sub(rb"\r\nDate: [^\r]*", b"", data))]
        data += chunk


def _same_as_aiohttp(port: int, pieces: list[bytes], n: int) -> list:
    async def both():
        mine = await exchange(port, pieces, n)
        theirs = await exchange(port, pieces, n, first=GET_LIVE)
        assert mine == theirs
        return mine

    return both()


def test_pipelined_requests_are_answered_in_order_by_the_lean_path(tmp_path, taken, loop):
    async def main():
        async with lean_service(tmp_path) as port:
            bodies = [DOC.replace(b"r1", b"r%d" % i) for i in range(5)]
            answers = await _same_as_aiohttp(port, [b"".join(infer(b) for b in bodies)], 5)
            ids = [json.loads(body)["id"] for _head, body in answers]
            assert ids == [f"r{i}" for i in range(5)]
            assert all(head.startswith(b"HTTP/1.1 200 OK") for head, _ in answers)
            assert taken.count("m") >= 5

    run(loop, main())


def test_a_request_split_at_every_byte_gets_the_same_answer(tmp_path, taken, loop):
    async def main():
        async with lean_service(tmp_path) as port:
            request = infer()
            whole = await exchange(port, [request], 1)
            assert whole[0][0].startswith(b"HTTP/1.1 200 OK")
            for cut in range(1, len(request)):
                got = await exchange(port, [request[:cut], request[cut:]], 1)
                assert got == whole, cut
            assert len(taken) >= len(request)

    run(loop, main())


def test_the_connection_goes_to_aiohttp_after_lean_requests(tmp_path, taken, loop):
    async def main():
        async with lean_service(tmp_path) as port:
            pieces = [infer(), infer(), GET_LIVE, infer()]
            answers = await exchange(port, [b"".join(pieces)], 4)
            assert [head.split(b"\r\n")[0] for head, _ in answers] == [b"HTTP/1.1 200 OK"] * 4
            assert json.loads(answers[2][1]) == {"live": True}
            assert len(taken) == 2  # the last one is aiohttp's: the connection is its own

    run(loop, main())


SMUGGLING = {
    "two content-lengths": infer(extra=b"Content-Length: 3\r\n"),
    "content-length and transfer-encoding": infer(extra=b"Transfer-Encoding: chunked\r\n"),
    "obs-fold": infer(extra=b"X-Folded: a\r\n b\r\n"),
    "bare LF": infer().replace(b"Host: 127.0.0.1\r\n", b"Host: 127.0.0.1\n"),
    "bare CR": infer().replace(b"Host: 127.0.0.1\r\n", b"Host: 127.0.0.1\rX: y\r\n"),
    "no host": infer().replace(b"Host: 127.0.0.1\r\n", b""),
    "signed length": infer().replace(b"Content-Length: ", b"Content-Length: +"),
    "expect": infer(extra=b"Expect: 100-continue\r\n"),
    "connection close": infer(extra=b"Connection: close\r\n"),
    "percent-escaped model": infer(path="/v2/models/%6d/infer"),
    "query": infer(path="/v2/models/m/infer?x=1"),
    "HTTP/1.0": infer().replace(b"HTTP/1.1", b"HTTP/1.0"),
    "lower-case method": infer().replace(b"POST", b"post"),
}


@pytest.mark.parametrize("name", list(SMUGGLING))
def test_requests_outside_the_lean_subset_get_aiohttps_answer(tmp_path, taken, name, loop):
    async def main():
        async with lean_service(tmp_path) as port:
            request = SMUGGLING[name] + infer()
            await _same_as_aiohttp(port, [request], 2)
            assert taken == []

    run(loop, main())


def test_errors_answered_by_the_lean_path_are_aiohttps(tmp_path, taken, loop):
    async def main():
        async with lean_service(tmp_path) as port:
            cases = [
                infer(path="/v2/models/nope/infer"),
                infer(path="/v2/models/m/versions/7/infer"),
                infer(b"{not json"),
                infer(extra=b"Inference-Header-Content-Length: 9999\r\n"),
                infer(extra=b"Inference-Header-Content-Length: x\r\n"),
            ]
            answers = await _same_as_aiohttp(port, [b"".join(cases)], len(cases))
            assert [head.split(b" ")[1] for head, _ in answers] == [b"404"] * 2 + [b"400"] * 3
            assert len(taken) == len(cases)

    run(loop, main())


def test_a_body_over_the_limit_gets_aiohttps_413(tmp_path, taken, loop):
    async def main():
        async with lean_service(tmp_path) as port:
            big = infer(b" " * (MAX_BODY + 1))
            answers = await _same_as_aiohttp(port, [big], 1)
            assert answers[0][0].startswith(b"HTTP/1.1 413"), answers
            assert taken == []

    run(loop, main())


def test_a_slow_body_gets_408_and_the_connection_closes(tmp_path, taken, loop):
    async def main():
        async with lean_service(tmp_path, body_timeout=0.3) as port:
            request = infer()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(request[:-5])
                data = await asyncio.wait_for(reader.read(), WAIT)  # to the close
            finally:
                writer.close()
            assert data.startswith(b"HTTP/1.1 408"), data
            assert b"http.body_timeout" in data

    run(loop, main())


def predict(body: bytes, path: str = "/v1/models/m:predict") -> bytes:
    return infer(body, path)


def test_tf_serving_predictions_are_the_lean_paths_too(tmp_path, taken, loop):
    async def main():
        async with lean_service(tmp_path) as port:
            cases = [
                predict(b'{"instances": [1, 2]}'),
                predict(b'{"inputs": [[1, 2]]}', "/v1/models/m/versions/1:predict"),
                predict(b'{"instances": [1]}', "/v1/models/nope:predict"),
                predict(b'{"instances": [1]}', "/v1/models/m/versions/9:predict"),
                predict(b"{not json"),
                predict(b"[1]"),
                predict(b'{"signature_name": 5, "instances": [1]}'),
            ]
            answers = await _same_as_aiohttp(port, [b"".join(cases)], len(cases))
            statuses = [head.split(b" ")[1] for head, _ in answers]
            assert statuses == [b"200", b"200", b"404", b"404", b"400", b"400", b"400"]
            assert json.loads(answers[0][1])["predictions"] == [1, 2]
            assert len(taken) == len(cases)

    run(loop, main())


async def slow_echo(batch):
    """An echo that takes its time: the request is in flight when the service stops."""
    await asyncio.sleep(0.5)
    return batch


def test_stopping_the_door_lets_a_lean_request_in_flight_end(tmp_path, taken, loop):
    async def main():
        backend, port = await start_backend(slow_echo)
        doc = deployment(
            tmp_path / "r.db",
            {"m": {"timeout": 5}},
            [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [port]}],
            cache={"max_entries": 0},
        )
        async with running_service(doc, backends=[backend]) as service:
            http = service.addresses()["http"]
            asking = asyncio.ensure_future(exchange(http, [infer()], 1))
            while not taken:
                await asyncio.sleep(0.01)
        answers = await asking  # the service stopped meanwhile
        assert answers[0][0].startswith(b"HTTP/1.1 200 OK"), answers

    run(loop, main())
