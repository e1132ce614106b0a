"""The OIP REST backend in front of a server that reads JSON only (MLServer 1.7.1's REST
API): binary requests sent at once, before the backend has found out, are each answered --
asked again in JSON, even those whose binary failure comes back after another request
found the server JSON-only (issue 37: a burst at a fresh backend made MLServer's 500 the
client's 503).

The server is a real one on loopback (aiohttp): binary bodies fail with 500, the k-th one
after k tenths of a second; JSON bodies are echoed at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json

from aiohttp import web
from serve_support import run

from wirekit.oip import InferRequest, tensor_from_json
from wirekit.oip.tensors import tensor_to_json_data
from wirekit.serve.backends.oip import OipRestBackend
from wirekit.serve.backends.servers import ServerAddress
from wirekit.serve.config import ModelConfig


async def json_only_server() -> tuple[web.AppRunner, int, list[str]]:
    """The server (runner, port) and the content types it was sent, in order."""
    seen: list[str] = []
    binary_count = itertools.count(1)

    async def infer(request: web.Request) -> web.Response:
        seen.append(request.content_type)
        body = await request.read()
        if request.content_type != "application/json":
            await asyncio.sleep(0.1 * next(binary_count))
            return web.Response(status=500, text="Internal Server Error")
        doc = json.loads(body)
        return web.json_response({"model_name": "echo", "outputs": doc["inputs"]})

    app = web.Application()
    app.router.add_post("/v2/models/echo/infer", infer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port, seen


def test_a_burst_of_first_requests_to_a_json_only_server_is_all_answered():
    async def main():
        runner, port, seen = await json_only_server()
        address = ServerAddress("oip", "127.0.0.1", port, None, "echo")
        backend = OipRestBackend(
            address, ModelConfig(name="echo", backend="oip"), connections=8, timeout=10
        )
        try:
            reqs = [
                InferRequest([tensor_from_json("x", "INT64", [1, 2], [k, -k])]) for k in range(4)
            ]
            answers = await asyncio.gather(*(backend.call(req) for req in reqs))
            after = await backend.call(reqs[0])  # found out: JSON only, at once
            return answers, after, seen, backend.binary
        finally:
            await backend.close()
            await runner.cleanup()

    answers, after, seen, binary = run(main(), 30)
    assert [tensor_to_json_data(outputs[0]) for outputs, _ in answers] == [
        [k, -k] for k in range(4)
    ]
    assert tensor_to_json_data(after[0][0]) == [0, 0]
    assert binary is False
    assert seen.count("application/octet-stream") == 4
    assert seen[-1] == "application/json" and seen.count("application/json") == 5
