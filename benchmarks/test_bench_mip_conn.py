"""The MIP server's CPU per request: the compiled ``Connection`` against the pure one.

Three servers, each in its own process, all in the same run, each answering the same requests
(batch 1) from a raw pipelined socket client in this process:

* ``fast``: ``wirekit mip serve`` with the async echo handler: its connections are the
  selected ``Connection``, the compiled twin (``wirekit/_fast/mipconn.pyx``).
* ``pure-connection``: the same server with the pure ``PyConnection`` (the reference): the
  difference to ``fast`` is what the twin saves per request.
* ``baseline``: a raw asyncio echo (bytes in, the same bytes out): the floor of any asyncio
  server.

A round is ``ROUND`` requests with ``in_flight`` of them on the wire at once (1: one after the
other; 32: pipelined).  The server's CPU time over the round (``/proc/PID/schedstat``, in ns)
per request goes into ``extra_info["server_cpu_us"]``; ``benchmarks/ratios.py`` prints it with
its ratio to ``fast``.  Replies are checked; timings are never asserted.
"""

from __future__ import annotations

import socket
import sys

import pytest
from mip_net import CliServer, cpu_ns, python_server

from wirekit import mip
from wirekit.mip import Inference, Item
from wirekit.mip.runtime import parse_address

ROUND = 512
CONTENDERS = ("fast", "pure-connection", "baseline")


@pytest.fixture(scope="module")
def servers():
    if not sys.platform.startswith("linux"):
        pytest.skip("the server's CPU time is read from /proc")
    with (
        CliServer(handler="wirekit.mip.runtime:async_echo") as fast,
        python_server("pure_connection_serve_main") as pure,
        python_server("echo_server_main") as echo,
    ):
        yield {
            "fast": (fast.address, fast.proc.pid),
            "pure-connection": (pure.address, pure.proc.pid),
            "baseline": (echo.address, echo.proc.pid),
        }


class Pipelined:
    """A raw socket writing request ``k`` once fewer than ``in_flight`` are unanswered; each
    reply is as long as its request (the echo's, and wirekit's echo reply to batch 1)."""

    def __init__(self, address: str, in_flight: int) -> None:
        _family, (host, port) = parse_address(address)
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.in_flight = in_flight
        self.wires = [
            mip.encode(Inference.request([[Item.text(f"r{k:05d}")]])) for k in range(ROUND)
        ]
        self.size = len(self.wires[0])

    def round(self) -> bytes:
        sock, size, wires = self.sock, self.size, self.wires
        got = bytearray()
        sent = 0
        while len(got) < size * ROUND:
            window = min(ROUND, len(got) // size + self.in_flight)
            if sent < window:
                sock.sendall(b"".join(wires[sent:window]))
                sent = window
            got += sock.recv(1 << 20)
        return bytes(got)

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("in_flight", [1, 32])
@pytest.mark.parametrize("who", CONTENDERS)
def test_server_cpu_per_request(benchmark, servers, who, in_flight):
    benchmark.group = f"mip serve CPU per request, {in_flight} in flight (per {ROUND})"
    address, pid = servers[who]
    client = Pipelined(address, in_flight)
    cpu: list[int] = []

    def one_round() -> bytes:
        before = cpu_ns(pid)
        out = client.round()
        cpu.append(cpu_ns(pid) - before)
        return out

    try:
        first = one_round()  # warm up
        cpu.clear()
        out = benchmark(one_round)
    finally:
        client.close()

    # every reply is its request's echo: the same bytes from the raw echo; from wirekit the
    # inference response (subtype 1) with the same items (n_output 1)
    def reply(wire: bytes) -> bytes:
        return wire if who == "baseline" else wire[:2] + b"\x01" + wire[3:9] + b"\x01" + wire[10:]

    expect = b"".join(reply(w) for w in client.wires)
    assert first == expect and out == expect
    cpu.sort()
    benchmark.extra_info.update(
        server_cpu_us=cpu[len(cpu) // 2] / ROUND / 1e3,
        requests_per_s=ROUND / benchmark.stats.stats.median,
    )
