"""Issue 13 defect 7 against ``wirekit serve``'s MIP front door: the same limits as
``wirekit mip serve`` (the config's ``mip`` table, decided by the same
:class:`wirekit.mip.limits.Guard`), with both twins of the MIP lane; and issue 14 defect 2,
a malformed header followed by more bytes in the same read.

Real loopback sockets to an in-process service with a real MIP backend; every wait is
bounded, and passing depends on what happened, never on how long it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct

import pytest
from serve_support import TIMEOUT, answer_of, deployment, run, start_backend, tagged
from support.service import running_service
from twins import load_lane

from wirekit import mip
from wirekit.mip import ErrorCode, ErrorReply, Item, Ping
from wirekit.mip.client import AsyncClient
from wirekit.mip.limits import DEFAULT_IDLE_TIMEOUT, Limits
from wirekit.serve.config import ConfigError, parse_config

HEADER = struct.Struct(">BBBBI")
CAP = 64 * 1024
LIMITS = {
    "request_timeout": 0.5,
    "idle_timeout": 0.5,
    "max_message_size": 16 * 1024,
    "max_items": 100,
    "max_buffered": CAP,
}


@pytest.fixture(scope="module", params=["fast", "pure"])
def lane(request):
    """Each twin of the lane (the compiled one fails, not skips, when it is not built)."""
    return load_lane(request.param)


@contextlib.asynccontextmanager
async def limited_service(lane, path, **mip_limits):
    """Model ``m`` on one wirekit MIP backend, the front door with ``mip_limits``; yields
    the service and the front door's (host, port)."""
    backend, port = await start_backend(tagged("A"))
    doc = deployment(
        path / "r.db",
        {"m": {"timeout": 5}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [port]}],
        cache={"max_entries": 0},
        mip=mip_limits,
    )
    async with running_service(doc, backends=[backend], connect_lane=True, lane=lane) as service:
        yield service, ("127.0.0.1", service.addresses()["mip"]["m"])


def request_wire(text: str) -> bytes:
    return mip.encode(mip.Inference.request([[Item.text(text)]]))


async def read_messages(reader: asyncio.StreamReader, n: int) -> list[mip.Message]:
    decoder = mip.Decoder()
    got: list[mip.Message] = []
    while len(got) < n:
        data = await asyncio.wait_for(reader.read(65536), TIMEOUT)
        assert data, "connection closed before the replies arrived"
        decoder.feed(data)
        got.extend(decoder)
    assert len(got) == n
    return got


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the front door sent until it closed the connection (bounded by TIMEOUT)."""
    chunks = []
    try:
        while data := await asyncio.wait_for(reader.read(65536), TIMEOUT):
            chunks.append(data)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


async def served(address: tuple[str, int], text: str = "ok") -> str:
    async with AsyncClient(f"tcp://{address[0]}:{address[1]}", timeout=TIMEOUT) as client:
        (item,) = await client.infer_one(text)
    return item.as_text()


# --------------------------------------------------------------------------- config


def test_config_mip_table_has_the_limits_defaults_and_checks_them(tmp_path):
    doc = deployment(
        tmp_path / "r.db",
        {"m": {}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [1]}],
    )
    dep = parse_config(doc)
    assert dep.mip == Limits()
    assert dep.mip.idle_timeout == DEFAULT_IDLE_TIMEOUT  # idle connections dropped by default
    dep = parse_config({**doc, "mip": {**LIMITS, "request_timeout": 0, "idle_timeout": None}})
    assert dep.mip == Limits(**{**LIMITS, "request_timeout": None, "idle_timeout": None})
    with pytest.raises(ConfigError, match=r"mip\.max_buffered: memory_budget \(10\) must be"):
        parse_config({**doc, "mip": {"max_message_size": 20, "max_buffered": 10}})
    # the process's memory budget is a top-level key; mip.max_buffered is its old name
    assert parse_config({**doc, "memory_budget": 1 << 30}).mip.memory_budget == 1 << 30
    with pytest.raises(ConfigError, match=r"^memory_budget: memory_budget \(10\) must be"):
        parse_config({**doc, "memory_budget": 10, "mip": {"max_message_size": 20}})
    with pytest.raises(ConfigError, match=r"mip\.max_buffered: is the old name"):
        parse_config({**doc, "memory_budget": 1 << 30, "mip": {"max_buffered": 1 << 30}})
    dep = parse_config({**doc, "mip": {"write_stall_timeout": 2.5}})
    assert dep.mip.write_stall_timeout == 2.5
    assert parse_config({**doc, "mip": {"write_stall_timeout": 0}}).mip.write_stall_timeout is None
    with pytest.raises(ConfigError, match=r"mip\.timeout: unknown key"):
        parse_config({**doc, "mip": {"timeout": 1}})
    with pytest.raises(ConfigError, match=r"mip\.max_items: must be between"):
        parse_config({**doc, "mip": {"max_items": 0}})


# --------------------------------------------------------------------------- the front door


def test_bad_header_then_a_valid_request_in_the_same_read(lane, tmp_path):
    """Issue 14 defect 2: the header-error branch rebound the name ``take`` (the lane's
    method) to an int, and the next message of the read died with a TypeError, taking the
    connection with it."""

    async def main():
        async with limited_service(lane, tmp_path) as (_service, (host, port)):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(bytes.fromhex("0009000000000000") + request_wire("valid"))
                error, reply = await read_messages(reader, 2)
                assert error == ErrorReply(ErrorCode.METHOD)
                assert answer_of(reply.items[0].as_text()) == ("A", "VALID")
                writer.write(mip.encode(Ping()))  # and the connection goes on
                assert await read_messages(reader, 1) == [Ping(True)]
            finally:
                writer.close()

    run(main())


def test_trickle_is_dropped_a_request_timeout_after_its_first_byte(lane, tmp_path):
    async def main():
        async with limited_service(lane, tmp_path, **LIMITS) as (_service, address):
            reader, writer = await asyncio.open_connection(*address)
            wire = request_wire("x" * 100)
            sent = 0
            try:
                for sent in range(len(wire)):  # a byte every 0.1 s: 11 s if never dropped
                    with contextlib.suppress(asyncio.TimeoutError):
                        if await asyncio.wait_for(reader.read(1), 0.1) == b"":
                            break
                    writer.write(wire[sent : sent + 1])
                    # meanwhile, the others are served
                    if sent == 2:
                        assert answer_of(await served(address, "other")) == ("A", "OTHER")
                else:
                    sent = len(wire)
            except ConnectionResetError:
                pass
            finally:
                writer.close()
            assert sent < len(wire)  # dropped before the trickle completed the request
            assert answer_of(await served(address)) == ("A", "OK")

    run(main())


def test_idle_connection_is_dropped(lane, tmp_path):
    async def main():
        async with limited_service(lane, tmp_path, **LIMITS) as (_service, address):
            reader, writer = await asyncio.open_connection(*address)
            try:
                writer.write(mip.encode(Ping()))
                assert await read_messages(reader, 1) == [Ping(True)]
                assert await until_closed(reader) == b""  # idle after its reply: dropped
            finally:
                writer.close()

    run(main())


def test_many_connections_holding_partial_requests_stay_under_the_buffer_cap(lane, tmp_path):
    n = 200
    partial = (  # the first 1008 bytes of a request of one 7988-byte item
        HEADER.pack(0, 2, 0, 0, 8000)
        + b"\x01\x00\x00\x01"
        + struct.pack(">II", 1, 7988)
        + b"p" * 988
    )
    memory = mip.encode(ErrorReply(ErrorCode.MEMORY))

    async def main():
        limits = {**LIMITS, "request_timeout": 30, "idle_timeout": 30}
        async with limited_service(lane, tmp_path, **limits) as (service, address):
            conns = []
            try:
                for _ in range(n):
                    reader, writer = await asyncio.open_connection(*address)
                    writer.write(partial)
                    conns.append((reader, writer))
                budget = service.budget
                refused: list[bytes] = []
                pending = {asyncio.ensure_future(until_closed(r)) for r, _w in conns}
                while budget.total // len(partial) + len(refused) < n:
                    done, pending = await asyncio.wait(
                        pending, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED
                    )
                    assert done, "neither held nor refused"
                    refused.extend(t.result() for t in done)
                assert budget.total <= CAP
                assert budget.total // len(partial) == n - len(refused)
                assert len(refused) >= n - CAP // len(partial)
                assert set(refused) == {memory}
                assert answer_of(await served(address)) == ("A", "OK")  # others are served
                for task in pending:
                    task.cancel()
            finally:
                for _r, writer in conns:
                    writer.close()
            for _ in range(100):  # the closed connections give their bytes back
                if not service.budget.total:
                    break
                await asyncio.sleep(0.05)
            assert service.budget.total == 0

    run(main())


def test_request_over_max_items_is_answered_memory_and_the_connection_goes_on(lane, tmp_path):
    count = 101
    wire = (
        HEADER.pack(0, 2, 0, 0, 4 + 8 * count)
        + bytes([1, 0])
        + count.to_bytes(2, "big")
        + struct.pack(">II", 1, 0) * count
    )

    async def main():
        async with limited_service(lane, tmp_path, **LIMITS) as (_service, (host, port)):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(wire + request_wire("next"))
                error, reply = await read_messages(reader, 2)
                assert error == ErrorReply(ErrorCode.MEMORY)
                assert answer_of(reply.items[0].as_text()) == ("A", "NEXT")
            finally:
                writer.close()

    run(main())


@pytest.mark.parametrize("seed", range(6))
def test_random_bytes_never_stop_the_front_door(lane, tmp_path, seed):
    rng = random.Random(seed)

    async def main():
        async with limited_service(lane, tmp_path, **LIMITS) as (_service, address):
            for _ in range(4):
                junk = rng.randbytes(rng.randrange(1, 4096))
                if rng.random() < 0.5:  # a valid header start, so the payload is looked at
                    junk = HEADER.pack(0, 2, 0, 0, len(junk) + rng.randrange(-4, 5)) + junk
                reader, writer = await asyncio.open_connection(*address)
                try:
                    writer.write(junk)
                    replies = await until_closed(reader)  # answered, then closed or dropped
                finally:
                    writer.close()
                decoder = mip.Decoder()
                decoder.feed(replies)
                assert all(type(m) in (ErrorReply, mip.Inference) for m in decoder)
            assert answer_of(await served(address)) == ("A", "OK")

    run(main())
