"""The parts of the oip control plane that need no model server: a server's error message
from its body, the ``host:port`` a message names, the per-device text of a failed add, and
probes/loads of servers that are not there (bounded, saying so)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from wirekit.serve.backends.oipcontrol import (
    ModelLoadError,
    RepositoryError,
    load,
    model_ready,
    probe,
    server_message,
    unload,
    where,
)
from wirekit.serve.backends.servers import ServerAddress

TRACEBACK = b"""Traceback (most recent call last):
  File "/x/registry.py", line 167, in _load_model
    model.ready = await model.load()
RuntimeError: weights file missing: /nowhere/model.bin
"""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error":"Model echo not found"}', "Model echo not found"),
        (b'{"detail":"Model with name x is not ready."}', "Model with name x is not ready."),
        (b'{"detail":[{"msg":"bad"}]}', '[{"msg": "bad"}]'),
        (TRACEBACK, "RuntimeError: weights file missing: /nowhere/model.bin"),
        (b"Internal Server Error", "Internal Server Error"),
        (b"", ""),
        (b"\xff\xfe not utf-8", "\ufffd\ufffd not utf-8"),
    ],
)
def test_server_message(body, message):
    assert server_message(body) == message


def test_server_message_is_bounded():
    text = server_message(json.dumps({"error": "x" * 5000}).encode(), limit=100)
    assert text == "x" * 97 + "..."


def test_where_names_the_port_asked():
    assert where(ServerAddress("oip", "10.0.0.1", 8080, 8081, "m")) == "10.0.0.1:8080"
    assert where(ServerAddress("oip", "::1", None, 8081, "m")) == "[::1]:8081 (gRPC)"


def test_a_failed_add_names_every_device():
    error = ModelLoadError(
        "m",
        {"n1/0/m": "loaded", "n2/0/m": "failed: 10.0.0.2:8080: load of model 'm' refused: x"},
        {"n1/0/m": "unloaded"},
    )
    assert str(error) == (
        "model 'm' not added: its load failed on 1 of 2 device(s): n1/0/m: loaded (then"
        " unloaded); n2/0/m: failed: 10.0.0.2:8080: load of model 'm' refused: x"
    )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("grpc", [False, True], ids=["rest", "grpc"])
def test_a_server_that_is_not_there(grpc):
    port = _closed_port()
    at = ServerAddress("oip", "127.0.0.1", None if grpc else port, port if grpc else None, "m")
    name = where(at)

    async def scenario():
        why = await probe(at, 2)
        with pytest.raises(RepositoryError) as ready:
            await model_ready(at, 2)
        with pytest.raises(RepositoryError) as loaded:
            await load(at, 2)
        with pytest.raises(RepositoryError) as unloaded:
            await unload(at, 2)
        return why, str(ready.value), str(loaded.value), str(unloaded.value)

    why, ready, loaded, unloaded = asyncio.run(scenario())
    if grpc:
        assert why.startswith(f"{name}: server not ready (UNAVAILABLE: ")
        assert loaded.startswith(f"{name}: load of model 'm' failed: UNAVAILABLE: ")
    else:
        assert why == f"{name}: Connection refused"
        assert loaded == f"{name}: load of model 'm' failed: Connection refused"
        assert unloaded == f"{name}: unload of model 'm' failed: Connection refused"
    assert ready.startswith(f"{name}: cannot be asked: ")


def test_a_server_that_never_answers_is_bounded():
    """A socket that accepts and says nothing: every call ends within its timeout."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        at = ServerAddress("oip", "127.0.0.1", sock.getsockname()[1], None, "m")

        async def scenario():
            loop = asyncio.get_running_loop()
            start = loop.time()
            why = await probe(at, 0.3)
            with pytest.raises(RepositoryError) as loaded:
                await load(at, 0.3)
            return why, str(loaded.value), loop.time() - start

        why, loaded, took = asyncio.run(scenario())
    assert why == f"{where(at)}: no answer in time"
    assert loaded == f"{where(at)}: load of model 'm' failed: no answer in time"
    assert took < 5


def test_tfserving_has_no_repository_api():
    at = ServerAddress("tfserving", "127.0.0.1", 8501, None, "m")
    with pytest.raises(RepositoryError, match="a tfserving server has no repository API"):
        asyncio.run(load(at, 1))
