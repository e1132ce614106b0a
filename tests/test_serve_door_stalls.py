"""Issue 35 item 7: a client that reads nothing of its answer is charged to the memory budget
and dropped by one rule on every door -- the write stall of :class:`wirekit.mip.limits.Guard`,
run by :class:`wirekit.mip.server.Watchdog` -- not by a second, hand-written copy in the HTTP
door.

In process, on both event loops: one client on the HTTP door and one on a MIP door (the MIP
server: the same sans-IO ``Connection``, ``Guard`` and ``Watchdog`` as the dispatcher's MIP
door) ask for a 16 MiB answer and never read it.  While the guard's verdict is held back,
neither door drops its client and both answers stay charged to the one budget; once it is let
through, both are dropped, each with its own log line, and the budget is empty again.  Every
wait is for an event, bounded; nothing depends on how long something took.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from support.loops import LOOPS

from wirekit import mip
from wirekit.mip import Inference, Item
from wirekit.mip.limits import Guard, MemoryBudget
from wirekit.mip.server import Server, echo
from wirekit.serve.config import HttpLimits
from wirekit.serve.doors.httpdoor import HttpDoor

STALL = 0.5  #: both doors' write_stall_timeout
BIG = 16 << 20  #: an answer far past what the kernel buffers hold
TIMEOUT = 20.0  #: the bound of every wait


def new_loop(name: str) -> asyncio.AbstractEventLoop:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (bounded) until ``condition()`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while not condition():
        assert loop.time() < deadline, f"not within {TIMEOUT} s: {what}"
        await asyncio.sleep(0.02)


async def non_reader(port: int, request: bytes) -> socket.socket:
    """A client that sends ``request`` and reads nothing (its receive buffer kept small)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, request)
    return sock


async def big_answer(_request: web.Request) -> web.Response:
    return web.Response(body=b"x" * BIG)


class Verdicts:
    """:meth:`Guard.expired` with its verdicts held back while :attr:`held`: the guards
    that were about to drop their connection are kept in :attr:`withheld`."""

    def __init__(self) -> None:
        self.held = True
        self.withheld: list[Guard] = []
        self.real = Guard.expired

    def patched(self) -> Callable[..., str | None]:
        """The replacement of ``Guard.expired``."""

        def expired(guard: Guard, now: float, paused: bool, pending: bool) -> str | None:
            why = self.real(guard, now, paused, pending)
            if why is not None and self.held:
                if guard not in self.withheld:
                    self.withheld.append(guard)
                return None
            return why

        return expired


async def both_doors_stalled(verdicts: Verdicts) -> dict[str, Any]:
    budget = MemoryBudget(1 << 30)  # the process's one budget, shared by both doors
    app = web.Application()
    app.router.add_get("/big", big_answer)
    door = HttpDoor(app, HttpLimits(write_stall_timeout=STALL), budget)
    server = Server(echo, inline=True, write_stall_timeout=STALL, budget=budget)
    http_port = await door.start("127.0.0.1", 0)
    await server.start("tcp://127.0.0.1:0")
    mip_port = int(server.address.rsplit(":", 1)[1])
    clients = []
    try:
        clients.append(await non_reader(http_port, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n"))
        wire = mip.encode(Inference.request([[Item.text("x" * BIG)]]))
        clients.append(await non_reader(mip_port, wire))
        await until(lambda: door.open == 1 and server.connection_count == 1, "both connected")
        (http_conn,) = door._by_transport.values()
        (mip_conn,) = server._connections
        http_guard, mip_guard = http_conn.replies.guard, mip_conn.conn.guard
        await until(
            lambda: http_guard in verdicts.withheld and mip_guard in verdicts.withheld,
            "both guards' write-stall verdicts",
        )
        held = {
            "open": (door.open, server.connection_count),
            "http": http_guard.held,
            "http_unsent": http_guard.unsent,
            "mip": mip_guard.held,
            "total": budget.total,
        }
        verdicts.held = False  # the guard's verdict goes through now: on both doors
        await until(lambda: door.open == 0 and server.connection_count == 0, "both dropped")
        return {"held": held, "after": budget.total}
    finally:
        for sock in clients:
            sock.close()
        await door.stop()
        await server.shutdown(grace=1.0)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_stalled_reader_is_dropped_by_the_same_guard_on_the_http_and_the_mip_door(
    loop, monkeypatch, caplog
):
    verdicts = Verdicts()
    monkeypatch.setattr(Guard, "expired", verdicts.patched())
    caplog.set_level(logging.INFO)
    event_loop = new_loop(loop)
    try:
        seen = event_loop.run_until_complete(
            asyncio.wait_for(both_doors_stalled(verdicts), 3 * TIMEOUT)
        )
    finally:
        event_loop.close()
    held = seen["held"]
    # While the guard held its verdict back, neither door dropped its client ...
    assert held["open"] == (1, 1)
    # ... and both unread answers were charged to the one budget, by their guards.
    assert held["http"] == held["http_unsent"] > 0
    assert held["mip"] > 0
    assert held["total"] == held["http"] + held["mip"]
    assert seen["after"] == 0  # both given back once dropped
    # Each door says so in its own words, as before.
    text = caplog.text
    assert "its client read nothing of an answer for 0.5 s" in text
    assert "(http.write_stall_timeout)" in text
    assert "no progress writing replies" in text
