"""``wirekit._loop``: the event loop the runtime commands use (uvloop optional)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from wirekit import _loop

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None


def test_choices_resolve(monkeypatch):
    monkeypatch.delenv("WIREKIT_LOOP", raising=False)
    assert _loop.resolve("asyncio") == "asyncio"
    assert _loop.resolve("auto") == ("uvloop" if HAVE_UVLOOP else "asyncio")
    assert _loop.resolve(None) == _loop.resolve("auto")
    monkeypatch.setenv("WIREKIT_LOOP", "asyncio")
    assert _loop.resolve(None) == "asyncio"
    with pytest.raises(ValueError, match="must be one of"):
        _loop.resolve("trio")


@pytest.mark.parametrize("choice", ["asyncio", "auto"])
def test_run_uses_the_chosen_loop(choice, monkeypatch):
    monkeypatch.delenv("WIREKIT_LOOP", raising=False)

    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    module = _loop.run(which(), choice)
    if _loop.resolve(choice) == "uvloop":
        assert module.startswith("uvloop")
    else:
        assert module.startswith("asyncio")


def test_a_server_and_client_work_on_each_loop():
    from wirekit.mip import Item
    from wirekit.mip.client import AsyncClient
    from wirekit.mip.runtime import async_echo
    from wirekit.mip.server import Server

    async def main():
        server = Server(async_echo)
        await server.start("tcp://127.0.0.1:0")
        async with server, AsyncClient(server.address) as client:
            return await client.infer([["a"], ["b"]])

    for choice in ["asyncio", "uvloop"] if HAVE_UVLOOP else ["asyncio"]:
        assert _loop.run(main(), choice) == [(Item.text("a"),), (Item.text("b"),)]
