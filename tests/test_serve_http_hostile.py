"""Hostile bodies against ``wirekit serve``'s HTTP front door (issue 13).

Every one gets a 4xx JSON answer that names the problem, nothing is built for a body over the
item limit, and the front door keeps answering good requests afterwards. Real loopback HTTP to
an in-process service with a real MIP backend; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import io
import tracemalloc

import aiohttp
import pytest
from serve_support import deployment, run, start_backend, tagged

from wirekit.serve.config import parse_config
from wirekit.serve.service import Service

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=20)
MAX_ITEMS = 1000


@contextlib.asynccontextmanager
async def http_service(path):
    """Model ``m`` (app ``app``) on one wirekit MIP backend; yields the HTTP base URL."""
    backend, port = await start_backend(tagged("A"))
    doc = deployment(
        path / "r.db",
        {"m": {"timeout": 5, "apps": ["app"]}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [port]}],
        cache={"max_entries": 0},
        mip={"max_items": MAX_ITEMS},
    )
    service = Service(parse_config(doc))
    try:
        await service.start()
        yield f"http://127.0.0.1:{service.addresses()['http']}"
    finally:
        await service.stop()
        await backend.shutdown()


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
