"""MIP over loopback TCP: request round trips of wirekit vs KubeMo vs a raw asyncio echo.

Each contender is a client in this process and a server in its own subprocess, all in the
same run, one request in flight (so requests/s = 1 / mean latency):

* ``fast``: wirekit's blocking ``Client`` -> ``wirekit mip serve`` with an async echo handler.
* ``kubemo``: KubeMo's ``Client`` -> KubeMo's ``Server`` with an echo model (from PyPI).
* ``baseline``: a raw socket writing the same request bytes -> an asyncio ``Protocol`` that
  writes them back; the client reads as many bytes as it sent.  No protocol work at all: the
  floor any MIP runtime on asyncio sits on.

Each round is one request; ``extra_info`` carries requests/s and the p50/p99 latency, which
``benchmarks/ratios.py`` prints.  Results are checked equal; timings are never asserted.
"""

from __future__ import annotations

import asyncio
import io
import socket
import threading
import time

import kubemo
import pytest
from mip_net import CliServer, python_server

from wirekit import mip
from wirekit.mip import Inference, Item
from wirekit.mip.client import AsyncClient, Client
from wirekit.mip.runtime import parse_address

ITEM = 64  # bytes of text per item


def texts(batch: int) -> list[str]:
    return [f"{k:02d}".ljust(ITEM, "x") for k in range(batch)]


@pytest.fixture(scope="module")
def servers():
    with (
        CliServer(handler="wirekit.mip.runtime:async_echo") as wirekit_server,
        python_server("kubemo_server_main") as kubemo_server,
        python_server("echo_server_main") as echo_server,
    ):
        yield {
            "fast": wirekit_server.address,
            "kubemo": kubemo_server.address,
            "baseline": echo_server.address,
        }


def wirekit_call(address: str, batch: int):
    client = Client(address)
    sample = [[t] for t in texts(batch)]

    def call():
        return [out[0].as_text() for out in client.infer(sample)]

    return call, client.close


def kubemo_call(address: str, batch: int):
    client = kubemo.Client()
    data = texts(batch)

    def call():
        # KubeMo's client consumes its inputs: fresh objects every call.
        outputs = client.inference(address, tuple((kubemo.Text(t),) for t in data))
        return [out[0].decode() for out in outputs]

    return call, lambda: None


def echo_call(address: str, batch: int):
    _family, (host, port) = parse_address(address)
    sock = socket.create_connection((host, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    wire = mip.encode(Inference.request([[Item.text(t)] for t in texts(batch)]))
    size = len(wire)
    buf = bytearray(size)
    view = memoryview(buf)

    def call():
        sock.sendall(wire)
        got = 0
        while got < size:
            n = sock.recv_into(view[got:])
            assert n, "echo server closed"
            got += n
        return [it.as_text() for it in mip.decode(io.BytesIO(buf).getbuffer()).items]

    return call, sock.close


CONTENDERS = ["fast", "kubemo", "baseline"]


# One test function per batch size, so a benchmark's id is just its contender (ratios.py).
@pytest.mark.parametrize("who", CONTENDERS)
def test_round_trip_batch_1(benchmark, servers, who):
    round_trip(benchmark, servers, who, 1)


@pytest.mark.parametrize("who", CONTENDERS)
def test_round_trip_batch_32(benchmark, servers, who):
    round_trip(benchmark, servers, who, 32)


def round_trip(benchmark, servers, who, batch):
    benchmark.group = f"mip round trip batch {batch}"
    make = {"fast": wirekit_call, "kubemo": kubemo_call, "baseline": echo_call}[who]
    call, close = make(servers[who], batch)
    try:
        assert call() == texts(batch)  # warm the connection; same answer from everyone
        result = benchmark(call)
    finally:
        close()
    assert result == texts(batch)
    data = sorted(benchmark.stats.stats.data)
    benchmark.extra_info.update(
        requests_per_s=len(data) / sum(data),
        p50_us=data[len(data) // 2] * 1e6,
        p99_us=data[min(len(data) - 1, int(len(data) * 0.99))] * 1e6,
        rounds=len(data),
    )


# --------------------------------------------------------------------------- under load
# CLIENTS clients at once, each sending PER_CLIENT requests one after the other (one in
# flight per client): what a small fleet of callers sees.  A round is all of them; requests/s
# is requests over elapsed time, latencies are per request.

CLIENTS = 8
PER_CLIENT = 10


class _EchoClient(asyncio.Protocol):
    """A minimal asyncio client for the raw echo: write the bytes, wait for as many back."""

    def __init__(self) -> None:
        self.transport = None
        self.buf = bytearray()
        self.want = 0
        self.waiter = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.buf += data
        if len(self.buf) >= self.want and self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            waiter.set_result(bytes(self.buf))
            self.buf.clear()

    async def call(self, wire: bytes) -> bytes:
        self.want = len(wire)
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(wire)
        return await self.waiter


class AsyncFleet:
    """CLIENTS persistent async clients on a private loop; ``round()`` runs one load round."""

    def __init__(self, who: str, address: str, batch: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.who = who
        self.batch = [[t] for t in texts(batch)]
        self.wire = mip.encode(Inference.request([[Item.text(t)] for t in texts(batch)]))
        self.latencies: list[float] = []
        self.clients = self.loop.run_until_complete(self._connect(address))

    async def _connect(self, address: str):
        if self.who == "fast":
            clients = [AsyncClient(address) for _ in range(CLIENTS)]
            for client in clients:
                await client.connect()
            return clients
        _family, (host, port) = parse_address(address)
        loop = asyncio.get_running_loop()
        return [(await loop.create_connection(_EchoClient, host, port))[1] for _ in range(CLIENTS)]

    async def _one(self, client) -> list[str]:
        timer, lat = time.perf_counter, self.latencies
        out: list[str] = []
        for _ in range(PER_CLIENT):
            start = timer()
            if self.who == "fast":
                out = [o[0].as_text() for o in await client.infer(self.batch)]
            else:
                out = [it.as_text() for it in mip.decode(await client.call(self.wire)).items]
            lat.append(timer() - start)
        return out

    async def _all(self) -> list[list[str]]:
        return await asyncio.gather(*(self._one(client) for client in self.clients))

    def round(self) -> list[str]:
        results = self.loop.run_until_complete(self._all())
        assert all(r == results[0] for r in results)
        return results[0]

    def close(self) -> None:
        async def shut():
            for client in self.clients:
                if self.who == "fast":
                    await client.close()
                else:
                    client.transport.close()

        self.loop.run_until_complete(shut())
        self.loop.close()


class KubemoFleet:
    """CLIENTS threads, each with KubeMo's client (one connection per request)."""

    def __init__(self, address: str, batch: int) -> None:
        self.address = address
        self.data = texts(batch)
        self.latencies: list[float] = []

    def _one(self, results: list) -> None:
        client, timer = kubemo.Client(), time.perf_counter
        out: list[str] = []
        for _ in range(PER_CLIENT):
            start = timer()
            outputs = client.inference(self.address, tuple((kubemo.Text(t),) for t in self.data))
            out = [o[0].decode() for o in outputs]
            self.latencies.append(timer() - start)
        results.append(out)

    def round(self) -> list[str]:
        results: list = []
        threads = [threading.Thread(target=self._one, args=(results,)) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(results) == CLIENTS and all(r == results[0] for r in results)
        return results[0]

    def close(self) -> None:
        pass


@pytest.mark.parametrize("who", CONTENDERS)
def test_load_8_clients_batch_1(benchmark, servers, who):
    under_load(benchmark, servers, who, 1)


@pytest.mark.parametrize("who", CONTENDERS)
def test_load_8_clients_batch_32(benchmark, servers, who):
    under_load(benchmark, servers, who, 32)


def under_load(benchmark, servers, who, batch):
    benchmark.group = f"mip {CLIENTS} clients batch {batch}"
    fleet = (
        KubemoFleet(servers[who], batch)
        if who == "kubemo"
        else AsyncFleet(who, servers[who], batch)
    )
    try:
        if who != "kubemo":  # warm up (KubeMo's rounds stall for seconds: no extra one)
            assert fleet.round() == texts(batch)
            fleet.latencies.clear()
        result = benchmark(fleet.round)
    finally:
        fleet.close()
    assert result == texts(batch)
    data = benchmark.stats.stats.data
    lat = sorted(fleet.latencies)
    benchmark.extra_info.update(
        requests_per_s=len(data) * CLIENTS * PER_CLIENT / sum(data),
        p50_us=lat[len(lat) // 2] * 1e6,
        p99_us=lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6,
        rounds=len(data),
    )
