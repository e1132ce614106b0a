"""Hostile bodies against ``wirekit serve``'s HTTP front door (issue 13).

Every one gets a 4xx JSON answer that names the problem, nothing is built for a body over the
item limit, and the front door keeps answering good requests afterwards. Real loopback HTTP to
an in-process service with a real MIP backend; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import tracemalloc

import aiohttp
import pytest
from serve_support import deployment, run, start_backend, tagged
from support.service import running_service

from wirekit.serve.service import Service

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=20)
MAX_ITEMS = 1000


@contextlib.asynccontextmanager
async def http_service(path, *, service_out: list | None = None, **top):
    """Model ``m`` (app ``app``) on one wirekit MIP backend; yields the HTTP base URL
    (``service_out`` receives the service; ``top``: more of the deployment)."""
    backend, port = await start_backend(tagged("A"))
    doc = deployment(
        path / "r.db",
        {"m": {"timeout": 5, "apps": ["app"]}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [port]}],
        cache={"max_entries": 0},
        **{"mip": {"max_items": MAX_ITEMS}, **top},
    )
    async with running_service(doc, backends=[backend]) as service:
        if service_out is not None:
            service_out.append(service)
        yield f"http://127.0.0.1:{service.addresses()['http']}"


async def _post(http, url, body: bytes):
    headers = {"Content-Type": "application/json"}
    async with http.post(url, data=io.BytesIO(body), headers=headers) as r:
        return r.status, await r.json(content_type=None)


async def _still_serving(http, base):
    status, doc = await _post(http, f"{base}/v1/models/m:predict", b'{"inputs": [["ok"]]}')
    assert status == 200, doc
    assert doc["outputs"] == [["A:OK"]]


HOSTILE = [
    # (path, body, status, words of the error)
    ("/v1/models/m:predict", b"[" * 100_000, 400, "nested too deeply"),
    ("/app/predict", b"[" * 100_000, 400, "nested too deeply"),
    ("/v1/models/m:predict", b'{"inputs": [[' + b"[" * 100_000 + b"]]}", 400, "nested"),
    ("/v1/models/m:predict", b"\xff\xfe", 400, "not JSON"),
    ("/v1/models/m:predict", b'"just a string"', 400, "JSON object"),
    ("/v1/models/m:predict", b'{"inputs": 5}', 400, "non-empty list"),
    ("/v1/models/m:predict", b'{"inputs": [5]}', 400, "list of values"),
    (
        "/v1/models/m:predict",
        b'{"inputs": [' + b",".join([b"[1]"] * (MAX_ITEMS + 1)) + b"]}",
        413,
        f"{MAX_ITEMS + 1} items exceed the limit of {MAX_ITEMS}",
    ),
    (
        "/v1/models/m:predict",
        b'{"inputs": [[' + b",".join([b"1"] * (MAX_ITEMS + 1)) + b"]]}",
        413,
        "items exceed the limit",
    ),
    (
        "/v1/models/m:predict",
        b'{"instances": [' + b",".join([b"1"] * (MAX_ITEMS + 1)) + b"]}",
        413,
        "items exceed the limit",
    ),
    (
        "/app/predict",
        b'{"input_batch": [' + b",".join([b"1"] * (MAX_ITEMS + 1)) + b"]}",
        413,
        "items exceed the limit",
    ),
    ("/app/predict", b'{"input_batch": 3}', 400, "input_batch"),
    # issue 25: an empty sample costs a row like any other (it counted nothing before)
    (
        "/v1/models/m:predict",
        b'{"inputs": [' + b",".join([b"[]"] * (MAX_ITEMS + 1)) + b"]}",
        413,
        f"{MAX_ITEMS + 1} items exceed the limit of {MAX_ITEMS}",
    ),
]


def test_hostile_bodies_get_a_clear_answer_and_the_front_door_keeps_serving(tmp_path):
    async def main():
        async with (
            http_service(tmp_path) as base,
            aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http,
        ):
            for path, body, status, words in HOSTILE:
                got, doc = await _post(http, base + path, body)
                assert (got, path) == (status, path), doc
                assert words in doc["error"], (path, doc)
                await _still_serving(http, base)

    run(main())


@pytest.mark.parametrize("path", ["/v1/models/m:predict", "/app/predict"])
def test_a_body_over_the_item_limit_builds_no_items(tmp_path, path):
    # 200k one-character samples: what the front door keeps of them must stay near the size of
    # the parsed JSON, not grow by an item object per sample.
    n = 200 * MAX_ITEMS
    key = b"inputs" if "v1" in path else b"input_batch"
    sample = b'["x"]' if "v1" in path else b'"x"'
    body = b'{"' + key + b'": [' + b",".join([sample] * n) + b"]}"

    async def main():
        async with (
            http_service(tmp_path) as base,
            aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http,
        ):
            tracemalloc.start()
            try:
                status, doc = await _post(http, base + path, body)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert status == 413, doc
            # The body, its parsed JSON (a list per sample, one shared "x"), and the client's
            # copy: well under what n Items with their tuples and requests would take.
            assert peak < 40 * len(body), (peak, len(body))
            await _still_serving(http, base)

    run(main())


async def _raw_request(port: int, head: bytes, body: bytes = b"") -> tuple[int, dict]:
    """One request written by hand; the answer's status and JSON."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        status_line = await asyncio.wait_for(reader.readline(), 20)
        headers = {}
        while (line := await asyncio.wait_for(reader.readline(), 20)) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        data = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 20)
        return int(status_line.split()[1]), json.loads(data)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _head(length: int | None, *extra: bytes) -> bytes:
    lines = [b"POST /v1/models/m:predict HTTP/1.1", b"Host: x", b"Content-Type: application/json"]
    if length is not None:
        lines.append(b"Content-Length: %d" % length)
    return b"\r\n".join([*lines, *extra]) + b"\r\n\r\n"


def test_bodies_are_charged_to_the_memory_budget_and_refused_with_json(tmp_path):
    """Issue 25: a body is charged before it is read; over the budget now is 503, over it for
    ever (or over http.max_body_size) 413, a compressed one 415; every charge is given back."""
    limits = {"max_message_size": 1 << 20, "max_buffered": 2 << 20, "max_items": MAX_ITEMS}
    services: list[Service] = []

    async def main():
        async with (
            http_service(
                tmp_path, service_out=services, mip=limits, http={"max_body_size": 8 << 20}
            ) as base,
            aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http,
        ):
            (service,) = services
            port = service.addresses()["http"]
            # a client holding 1.5 MiB of the 2 MiB budget with a body it is still sending
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_head(3 << 19) + b'{"inputs": [')
            await writer.drain()
            for _ in range(200):
                if service.budget.total >= 3 << 19:
                    break
                await asyncio.sleep(0.01)
            assert service.budget.total == 3 << 19
            status, doc = await _raw_request(port, _head(1 << 20), b" " * (1 << 20))
            assert status == 503, doc
            assert "taken by other requests" in doc["error"]
            status, doc = await _raw_request(port, _head(3 << 20), b" " * (3 << 20))
            assert status == 413, doc
            assert "over the process's memory budget of 2097152 bytes" in doc["error"]
            status, doc = await _raw_request(port, _head(9 << 20))
            assert status == 413, doc
            assert "over the limit of 8388608 (http.max_body_size)" in doc["error"]
            status, doc = await _raw_request(port, _head(2, b"Content-Encoding: gzip"), b"{}")
            assert status == 415, doc
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            for _ in range(200):  # the held body's charge is given back when it ends
                if service.budget.total == 0:
                    break
                await asyncio.sleep(0.01)
            assert service.budget.total == 0
            # a chunked body is charged as it comes: over the budget, refused before parsing
            chunk = b"[]," * 300_000
            chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk)
            status, doc = await _raw_request(
                port, _head(None, b"Transfer-Encoding: chunked"), chunked
            )
            assert status == 413, doc
            assert "refused before parsing" in doc["error"]
            await _still_serving(http, base)
            assert service.budget.total == 0

    run(main())
