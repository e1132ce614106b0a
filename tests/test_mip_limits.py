"""Issue 13 defect 7: what ``wirekit mip serve`` does against hostile peers, by default and
with small limits -- a trickle (slowloris), idle connections, many connections holding
partial requests, a request of millions of empty items, random bytes.

The limits themselves are decided sans-IO by :mod:`wirekit.mip.limits` (unit tests first,
with the time passed in); then real loopback sockets, where every wait is bounded and passing
never depends on how long something took, only on what happened.
"""

from __future__ import annotations

import asyncio
import random
import select
import socket
import struct
import time

import pytest
from mip_net import TIMEOUT, CliServer, raw_connection, read_message

from wirekit import mip
from wirekit.errors import DecodeError
from wirekit.mip import ErrorCode, ErrorReply, Inference, Item, Ping
from wirekit.mip.cli import main as mip_main
from wirekit.mip.client import AsyncClient, Client
from wirekit.mip.limits import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_BUFFERED,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_WRITE_STALL_TIMEOUT,
    BufferBudget,
    Guard,
    Limits,
    OverBudget,
)
from wirekit.mip.server import Server, ServerThread

HEADER = struct.Struct(">BBBBI")


def upper(batch):
    return [[sample[0].as_text().upper()] for sample in batch]


# --------------------------------------------------------------------------- sans-IO


def test_defaults_are_the_documented_ones():
    limits = Limits()
    assert limits.request_timeout == DEFAULT_REQUEST_TIMEOUT == 30.0
    assert limits.idle_timeout == DEFAULT_IDLE_TIMEOUT == 300.0
    assert limits.max_message_size == mip.DEFAULT_MAX_MESSAGE_SIZE == 64 << 20
    assert limits.max_items == mip.DEFAULT_MAX_ITEMS == 65536
    assert limits.max_buffered == limits.memory_budget == DEFAULT_MAX_BUFFERED == 256 << 20
    assert limits.write_stall_timeout == DEFAULT_WRITE_STALL_TIMEOUT == 30.0
    server = Server(upper)
    assert server.limits == limits  # the server's defaults are the same
    assert server.idle_timeout == DEFAULT_IDLE_TIMEOUT  # idle connections are dropped


def test_limits_are_checked():
    with pytest.raises(ValueError, match="request_timeout must be > 0"):
        Limits(request_timeout=0)
    with pytest.raises(ValueError, match="max_items must be >= 1"):
        Limits(max_items=0)
    with pytest.raises(ValueError, match=r"memory_budget .* must be at least max_message_size"):
        Limits(max_message_size=2048, max_buffered=1024)
    with pytest.raises(ValueError, match="write_stall_timeout must be > 0"):
        Limits(write_stall_timeout=0)
    with pytest.raises(ValueError, match=r"old name max_buffered .* disagree"):
        Limits(memory_budget=1 << 30, max_buffered=1 << 29)


def test_request_deadline_runs_from_the_first_byte_not_the_last():
    guard = Guard(Limits(request_timeout=3.0, idle_timeout=None), BufferBudget(1 << 30), 0.0)
    assert guard.received(10.0, 1, True, False) is True  # the first byte: a deadline starts
    assert guard.next_check(10.0) == 13.0
    for k in range(1, 30):  # a byte every 0.1 s does not move it
        assert guard.received(10.0 + k / 10, 1 + k, True, False) is False
        assert guard.next_check(10.0 + k / 10) == 13.0
    assert guard.expired(12.99, False, False) is None
    assert guard.expired(13.0, False, False) == "request incomplete 3.0 s after its first byte"


def test_a_completed_request_ends_its_deadline_and_the_next_one_starts_its_own():
    guard = Guard(Limits(request_timeout=3.0, idle_timeout=None), BufferBudget(1 << 30), 0.0)
    guard.received(1.0, 5, True, False)
    assert guard.received(2.5, 7, True, True) is True  # one completed, the next one started
    assert guard.expired(4.5, False, False) is None
    assert guard.expired(5.5, False, False) is not None
    guard.received(6.0, 0, False, True)  # complete, nothing left: no request deadline
    assert guard.expired(1000.0, False, False) is None


def test_idle_timeout_counts_from_the_last_activity_and_not_while_replies_are_owed():
    guard = Guard(Limits(request_timeout=None, idle_timeout=5.0), BufferBudget(1 << 30), 0.0)
    assert guard.next_check(0.0) == 5.0
    guard.received(3.0, 0, False, True)
    assert guard.expired(7.0, False, False) is None
    assert guard.expired(8.0, False, True) is None  # a reply is owed: not idle
    assert guard.next_check(8.0) == 13.0  # due but held off: look again later
    guard.sent(9.0)
    assert guard.expired(13.9, False, False) is None
    assert guard.expired(14.0, False, False) == "idle for 5.0 s"


def test_pause_of_the_servers_making_stops_the_request_clock():
    guard = Guard(Limits(request_timeout=3.0), BufferBudget(1 << 30), 0.0)
    guard.received(1.0, 5, True, False)
    assert guard.expired(10.0, True, True) is None  # paused by flow control
    guard.resumed(10.0)
    assert guard.expired(12.0, False, False) is None
    assert guard.expired(13.0, False, False) is not None


def test_budget_is_server_wide_and_refuses_growth_past_the_limit():
    budget = BufferBudget(100)
    limits = Limits(max_message_size=50, max_buffered=100)
    a, b = Guard(limits, budget, 0.0), Guard(limits, budget, 0.0)
    a.received(0.0, 60, True, False)
    with pytest.raises(OverBudget, match="past its memory budget of 100"):
        b.received(0.0, 41, True, False)
    assert budget.total == 60 and b.held == 0  # the refused growth is not counted
    b.received(0.0, 40, True, False)
    assert budget.total == 100
    a.received(0.0, 10, True, False)  # shrinking is always fine
    a.release()
    b.release()
    assert budget.total == 0


# --------------------------------------------------------------------------- helpers


def closed_within(sock: socket.socket, timeout: float = TIMEOUT) -> bytes | None:
    """Everything the server sent until it closed ``sock``, or None if it did not close it
    within ``timeout`` seconds (a bound for a hung test, not a pass criterion)."""
    sock.settimeout(timeout)
    chunks = []
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return b"".join(chunks)
        except TimeoutError:
            return None
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def trickle(sock: socket.socket, data: bytes, interval: float) -> int:
    """Send ``data`` a byte every ``interval`` seconds until the server closes the connection;
    return how many bytes went out before it did (``len(data)`` if it never did)."""
    for k in range(len(data)):
        readable, _, _ = select.select([sock], [], [], interval)
        if readable:
            try:
                if sock.recv(65536) == b"":
                    return k
            except ConnectionResetError:
                return k
        try:
            sock.send(data[k : k + 1])
        except (BrokenPipeError, ConnectionResetError):
            return k
    return len(data)


def read_messages(sock: socket.socket, n: int) -> list[mip.Message]:
    """Read exactly ``n`` MIP messages (they may come in one read)."""
    decoder = mip.Decoder()
    got: list[mip.Message] = []
    while True:
        got.extend(decoder)
        if len(got) >= n:
            assert len(got) == n and decoder.buffered == 0
            return got
        data = sock.recv(65536)
        assert data, "connection closed before the replies arrived"
        decoder.feed(data)


def request_wire(text: str) -> bytes:
    return mip.encode(Inference.request([[Item.text(text)]]))


def empty_items_request(n_input: int, batch: int) -> bytes:
    """A request of ``n_input × batch`` empty items, built without building the items."""
    count = n_input * batch
    return (
        HEADER.pack(0, 2, 0, 0, 4 + 8 * count)
        + bytes([n_input, 0])
        + batch.to_bytes(2, "big")
        + b"\x00\x00\x00\x01\x00\x00\x00\x00" * count
    )


# --------------------------------------------------------------------------- the server


def test_trickle_is_dropped_a_request_timeout_after_its_first_byte():
    """The old server restarted the timeout on every byte: a byte every 0.1 s with a 0.5 s
    timeout kept the connection open for as long as the trickle lasted (here 10 s)."""
    with ServerThread(upper, timeout=0.5) as running:
        request = request_wire("x" * 100)
        with raw_connection(running.address) as slow:
            sent = trickle(slow, request, 0.1)
        assert sent < len(request)  # dropped before the request was complete
        with Client(running.address) as client:
            assert client.infer([["still here"]]) == [(Item.text("STILL HERE"),)]


def test_idle_connection_is_dropped_after_idle_timeout():
    with ServerThread(upper, idle_timeout=0.3) as running:
        with raw_connection(running.address) as idle:
            assert closed_within(idle) == b""
        with raw_connection(running.address) as used:
            used.sendall(mip.encode(Ping()))
            assert read_message(used) == Ping(True)
            assert closed_within(used) == b""  # idle again after its reply: dropped too
        assert running.call(lambda: running.server.connection_count) == 0


def test_cli_defaults_drop_idle_clients():
    """``wirekit mip serve``'s flags default to the Limits defaults (the idle timeout used
    to default to 0, off)."""
    from wirekit.cli import build_parser

    args = build_parser().parse_args(["mip", "serve", "--handler", "x:y"])
    assert args.idle_timeout == DEFAULT_IDLE_TIMEOUT
    assert args.request_timeout == DEFAULT_REQUEST_TIMEOUT
    assert args.max_items == mip.DEFAULT_MAX_ITEMS
    assert args.memory_budget == DEFAULT_MAX_BUFFERED == DEFAULT_MEMORY_BUDGET
    assert args.write_stall_timeout == DEFAULT_WRITE_STALL_TIMEOUT == 30.0
    old = build_parser().parse_args(
        ["mip", "serve", "--handler", "x:y", "--timeout", "2", "--max-buffered", "99999999"]
    )
    assert old.request_timeout == 2.0  # the old flag names still work
    assert old.memory_budget == 99999999


def test_cli_rejects_a_buffer_cap_below_the_message_limit(capsys):
    code = mip_main(
        [
            "serve",
            "--handler",
            "wirekit.mip.runtime:echo",
            "--listen",
            "tcp://127.0.0.1:0",
            "--max-message-size",
            "2048",
            "--max-buffered",
            "1024",
        ]
    )
    assert code == 2
    assert "memory_budget (1024) must be at least max_message_size" in capsys.readouterr().err


def _hold_partials(address: str, n: int, partial: bytes) -> list[socket.socket]:
    family_host, port = address.removeprefix("tcp://").rsplit(":", 1)
    socks = []
    for _ in range(n):
        sock = socket.create_connection((family_host, int(port)), timeout=TIMEOUT)
        sock.sendall(partial)
        socks.append(sock)
    return socks


def _refused(socks: list[socket.socket], held_bytes, per_conn: int, deadline: float):
    """Collect the MEMORY refusals until every connection is either refused or holding its
    partial request on the server (or ``deadline``); return the refused sockets."""
    refused: dict[socket.socket, bytes] = {}
    while time.monotonic() < deadline:
        if held_bytes() // per_conn + len(refused) == len(socks):
            break
        waiting = [s for s in socks if s not in refused]
        readable, _, _ = select.select(waiting, [], [], 0.05)
        for sock in readable:
            refused[sock] = closed_within(sock, TIMEOUT) or b""
    return refused


def test_many_connections_holding_partial_requests_stay_under_the_buffer_cap():
    """A server-wide cap: connections that would take the server past ``max_buffered`` are
    answered MEMORY and closed; those within hold their bytes; whole requests are served."""
    cap, n = 64 * 1024, 200
    # A request of one 7988-byte item, its first 1008 bytes.
    partial = (
        HEADER.pack(0, 2, 0, 0, 8000)
        + b"\x01\x00\x00\x01"
        + struct.pack(">II", 1, 7988)
        + b"p" * 988
    )
    with ServerThread(upper, max_message_size=16 * 1024, max_buffered=cap) as running:
        socks = _hold_partials(running.address, n, partial)
        try:
            held = lambda: running.call(lambda: running.server.buffered_bytes)  # noqa: E731
            refused = _refused(socks, held, len(partial), time.monotonic() + 3 * TIMEOUT)
            assert held() <= cap
            assert held() // len(partial) == n - len(refused)
            assert len(refused) >= n - cap // len(partial)  # 65 fit under the cap
            assert set(refused.values()) == {mip.encode(ErrorReply(ErrorCode.MEMORY))}
            # the others still get served, on new connections
            with Client(running.address) as client:
                assert client.infer([["served"]]) == [(Item.text("SERVED"),)]
            # a connection that held its partial request can still finish it
            holder = next(s for s in socks if s not in refused)
            holder.sendall(b"p" * (8000 - 1000))
            reply = read_message(holder)
            # answered; or refused if its rest came in pieces over the full budget
            assert reply == ErrorReply(ErrorCode.MEMORY) or reply.items[0].as_text() == ("P" * 7988)
        finally:
            for sock in socks:
                sock.close()


def test_a_request_of_8_million_empty_items_is_refused_without_memory_growth():
    """The old server decoded 8.4 M empty items of a 64 MiB request into ~750 MB of objects
    (12x the message).  With the default limits it answers MEMORY from the item count; the
    server's peak memory grows by a small multiple of the message (its buffer), measured as
    the peak RSS of ``wirekit mip serve`` in a subprocess."""
    wire = empty_items_request(128, 65535)  # 8,388,480 items, just under 64 MiB
    assert len(wire) <= mip.DEFAULT_MAX_MESSAGE_SIZE
    with CliServer(handler="wirekit.mip.runtime:echo") as server:
        status = f"/proc/{server.proc.pid}/status"

        def peak_rss() -> int:
            with open(status) as f:
                line = next(x for x in f if x.startswith("VmHWM:"))
            return int(line.split()[1]) * 1024

        with Client(server.address) as client:
            assert client.ping() > 0
        before = peak_rss()
        with raw_connection(server.address, timeout=3 * TIMEOUT) as sock:
            sock.sendall(wire)
            assert read_message(sock) == ErrorReply(ErrorCode.MEMORY)
            sock.sendall(request_wire("after"))  # the stream is still in step
            reply = read_message(sock)
            assert reply.items[0].as_text() == "after"
        grown = peak_rss() - before
    assert grown < 3 * len(wire), f"peak RSS grew by {grown / len(wire):.1f}x the message"


@pytest.mark.parametrize("seed", range(12))
def test_random_bytes_never_stop_the_server(seed):
    rng = random.Random(seed)
    with ServerThread(upper, timeout=2.0, idle_timeout=2.0) as running:
        for _ in range(4):
            junk = rng.randbytes(rng.randrange(1, 4096))
            if rng.random() < 0.5:  # a valid header start, so the payload is looked at
                junk = HEADER.pack(0, 2, 0, 0, len(junk) + rng.randrange(-4, 5)) + junk
            with raw_connection(running.address) as sock:
                try:
                    sock.sendall(junk)
                    sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                replies = closed_within(sock)
                assert replies is not None  # answered and/or closed, within the timeouts
                dec = mip.Decoder()
                dec.feed(replies)
                assert all(type(m) in (ErrorReply, Inference) for m in dec)

        async def others():
            async with AsyncClient(running.address) as client:
                return await asyncio.gather(*(client.infer([[f"o{k}"]]) for k in range(5)))

        got = asyncio.run(others())
        assert [g[0][0].as_text() for g in got] == [f"O{k}" for k in range(5)]


def test_bad_header_then_a_valid_request_in_one_write():
    with ServerThread(upper) as running, raw_connection(running.address) as sock:
        sock.sendall(bytes.fromhex("0009000000000000") + request_wire("ok"))
        error, reply = read_messages(sock, 2)
        assert error == ErrorReply(ErrorCode.METHOD)
        assert reply.items[0].as_text() == "OK"


def test_clients_refuse_replies_over_their_item_limit():
    """Replies decode with the same limit (a client's ``max_items``, default 65536)."""

    def fan_out(batch):  # three outputs per input
        return [[s[0], s[0], s[0]] for s in batch]

    with ServerThread(fan_out, inline=True) as running:
        with Client(running.address, max_items=5) as client:
            assert len(client.infer([["a"]])[0]) == 3
            with pytest.raises(DecodeError, match="6 items exceed the limit of 5"):
                client.infer([["a"], ["b"]])

        async def main():
            async with AsyncClient(running.address, max_items=5) as client:
                with pytest.raises(DecodeError, match="6 items exceed the limit of 5"):
                    await client.infer([["a"], ["b"]])
                return await client.infer([["c"]])

        assert len(asyncio.run(main())[0]) == 3
