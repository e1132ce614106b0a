"""The wirekit MIP server and clients on real loopback sockets (TCP and Unix).

Every error kind is produced by the server in its situation and seen by a client; ordering,
pipelining, timeouts, disconnects, shutdown and restart are checked by what happens, in order,
never by how long it took.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import struct
import threading
import time

import pytest
from mip_net import TIMEOUT, raw_connection, read_eof, read_message

from wirekit import mip
from wirekit.errors import EncodeError
from wirekit.mip import ErrorCode, ErrorReply, Inference, Item, ItemType, Ping
from wirekit.mip.client import (
    AsyncClient,
    Client,
    ClientTimeout,
    ConnectionLost,
    ServerError,
)
from wirekit.mip.server import Server, ServerThread

HEADER = struct.Struct(">BBBBI")


def upper(batch):
    """Sync handler: one output per sample, its first input upper-cased."""
    return [[sample[0].as_text().upper()] for sample in batch]


async def async_upper(batch):
    return upper(batch)


@pytest.fixture(params=["tcp", "unix"])
def listen(request, tmp_path):
    return "tcp://127.0.0.1:0" if request.param == "tcp" else f"unix://{tmp_path}/mip.sock"


# --------------------------------------------------------------------------- basics


@pytest.mark.parametrize("handler", [upper, async_upper], ids=["sync", "async"])
def test_ping_and_infer_on_one_persistent_connection(listen, handler):
    with ServerThread(handler, listen) as running, Client(running.address) as client:
        assert client.ping() > 0
        for k in range(20):
            assert client.infer([[f"x{k}"], ["y"]]) == [(Item.text(f"X{k}"),), (Item.text("Y"),)]
        assert running.call(lambda: running.server.connection_count) == 1


def test_typed_inputs_and_outputs_round_trip():
    big = bytes(range(256)) * 4096  # 1 MiB: decoded as a view, not copied

    def typed(batch):
        (text, doc, image, raw) = batch[0]
        assert (text.type, doc.type, image.type, raw.type) == (1, 2, 3, 77)
        return [[text.as_text(), doc.as_json(), image.as_bytes(), raw, Item.json("s")]]

    with ServerThread(typed) as running, Client(running.address) as client:
        (out,) = client.infer([["héllo", {"a": [1, None]}, big, Item(77, b"\x00\x01")]])
    assert out == (
        Item(ItemType.TEXT, "héllo".encode()),
        Item(ItemType.JSON, b'{"a":[1,null]}'),
        Item(ItemType.IMAGE, big),
        Item(77, b"\x00\x01"),
        Item(ItemType.JSON, b'"s"'),
    )


def test_bare_output_values_and_empty_batch():
    def bare(batch):
        return [s[0].as_text() for s in batch]

    with ServerThread(bare) as running, Client(running.address) as client:
        assert client.infer([["a"], ["b"]]) == [(Item.text("a"),), (Item.text("b"),)]
        assert client.infer([]) == []
        assert client.infer_one("c") == (Item.text("c"),)


def test_sync_handlers_run_off_the_loop_async_on_it():
    seen = {}

    def sync_handler(batch):
        seen["sync"] = threading.current_thread()
        return batch

    async def async_handler(batch):
        seen["async"] = threading.current_thread()
        return batch

    for name, handler in (("sync", sync_handler), ("async", async_handler)):
        with ServerThread(handler) as running, Client(running.address) as client:
            client.infer([["x"]])
            loop_thread = running._thread
        assert (seen[name] is loop_thread) == (name == "async")
    # inline=True: a sync handler is called on the loop (no thread hop)
    with ServerThread(sync_handler, inline=True) as running, Client(running.address) as client:
        assert client.infer([["y"], ["z"]]) == [(Item.text("y"),), (Item.text("z"),)]
        assert seen["sync"] is running._thread


def test_replies_come_in_request_order_when_handlers_finish_out_of_order():
    async def slow_first(batch):
        n = int(batch[0][0].as_text())
        await asyncio.sleep(0.001 * (20 - n % 20))  # later requests finish first
        return [[str(n)]]

    with ServerThread(slow_first) as running, raw_connection(running.address) as sock:
        wire = b"".join(mip.encode(Inference.request([[Item.text(str(n))]])) for n in range(60))
        sock.sendall(wire)  # all pipelined in one write
        decoder = mip.Decoder()
        replies = []
        while len(replies) < 60:
            data = sock.recv(65536)
            assert data
            decoder.feed(data)
            replies.extend(decoder)
    assert [r.items[0].as_text() for r in replies] == [str(n) for n in range(60)]


def test_concurrent_blocking_clients_in_threads(listen):
    errors = []

    def work(k):
        try:
            with Client(running.address) as client:
                for i in range(100):
                    out = client.infer([[f"c{k}-{i}"]])
                    assert out == [(Item.text(f"C{k}-{i}"),)], out
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    with ServerThread(upper, listen) as running:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT * 6)
        assert not any(t.is_alive() for t in threads)
    assert errors == []


# --------------------------------------------------------------------------- error kinds


def raw_exchange(address, wire):
    with raw_connection(address) as sock:
        sock.sendall(wire)
        reply = read_message(sock)
        # The connection is still usable if a ping gets its pong; else the server closed it.
        try:
            sock.sendall(mip.encode(Ping()))
            rest = sock.recv(65536)
        except (BrokenPipeError, ConnectionResetError):
            rest = b""
    return reply, rest


@pytest.mark.parametrize(
    ("name", "wire", "code", "usable"),
    [
        ("bad version", HEADER.pack(1, 1, 0, 0, 0), ErrorCode.PROTOCOL, False),
        ("reserved byte set", HEADER.pack(0, 1, 0, 9, 0), ErrorCode.PROTOCOL, False),
        ("ping response", HEADER.pack(0, 1, 1, 0, 0), ErrorCode.SUBTYPE, True),
        ("inference response", mip.encode(Inference.reply([[Item.text("a")]])), 1, True),
        ("unknown subtype", HEADER.pack(0, 2, 7, 0, 0), ErrorCode.SUBTYPE, True),
        ("unknown kind", HEADER.pack(0, 9, 0, 0, 3) + b"abc", ErrorCode.METHOD, True),
        ("error kind request", HEADER.pack(0, 0, 0, 0, 0), ErrorCode.METHOD, True),
        ("ping with payload", HEADER.pack(0, 1, 0, 0, 2) + b"xx", ErrorCode.SHAPE, True),
        (
            "items overrun payload",
            HEADER.pack(0, 2, 0, 0, 12) + b"\x01\x00\x00\x01" + struct.pack(">II", 1, 50),
            ErrorCode.SHAPE,
            True,
        ),
    ],
)
def test_protocol_error_replies(name, wire, code, usable):
    with ServerThread(upper) as running:
        reply, rest = raw_exchange(running.address, wire)
        assert reply == ErrorReply(code), name
        if usable:
            assert rest == mip.encode(Ping(True))
        else:
            assert rest == b""  # closed after the error
        with Client(running.address) as client:  # and the server is fine
            assert client.ping() > 0


@pytest.fixture
def server_codec(mip_codec, monkeypatch):
    """The server's connections decode with ``mip_codec`` (each twin in turn)."""
    for name in ("encode", "decode", "decode_prefix", "check_header", "frame_size"):
        monkeypatch.setattr(mip, name, getattr(mip_codec, name))
    return mip_codec


def read_messages(sock, n):
    decoder = mip.Decoder()
    got = []
    while len(got) < n:
        data = sock.recv(65536)
        assert data, "the server closed the connection"
        decoder.feed(data)
        got.extend(decoder)
    assert len(got) == n and decoder.buffered == 0
    return got


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        (bytes.fromhex("0009000000000000"), ErrorCode.METHOD),  # unknown kind
        (HEADER.pack(0, 1, 0, 0, 2) + b"xx", ErrorCode.SHAPE),  # a ping with a payload
    ],
    ids=["unknown-kind", "ping-payload"],
)
def test_bad_header_then_a_valid_request_in_the_same_write(server_codec, bad, code):
    """Issue 14 defect 2 against ``wirekit mip serve``: the error reply, then the valid
    request's reply, and the connection goes on."""
    with ServerThread(upper) as running, raw_connection(running.address) as sock:
        sock.sendall(bad + mip.encode(Inference.request([[Item.text("valid")]])))
        error, reply = read_messages(sock, 2)
        assert error == ErrorReply(code)
        assert reply.items[0].as_text() == "VALID"
        sock.sendall(mip.encode(Ping()))
        assert read_messages(sock, 1) == [Ping(True)]


def test_memory_is_answered_from_the_header_then_closed():
    with ServerThread(upper, max_message_size=1024) as running:
        with raw_connection(running.address) as sock:
            sock.sendall(HEADER.pack(0, 2, 0, 0, 2**31))  # no payload follows, ever
            assert read_message(sock) == ErrorReply(ErrorCode.MEMORY)
            assert read_eof(sock) == b""
        with Client(running.address) as client:
            with pytest.raises(ServerError) as info:
                client.infer([[b"x" * 5000]])  # sent in full, answered, connection closed
            assert info.value.code == ErrorCode.MEMORY
            assert client.infer([["ok"]]) == [(Item.text("OK"),)]  # reconnects


@pytest.mark.parametrize(
    "outputs",
    [
        lambda batch: [["a"]],  # one sample for a batch of two
        lambda batch: [["a"], ["b", "c"]],  # ragged
        lambda batch: 42,  # not a sequence
        lambda batch: [["x"] * 256] * len(batch),  # more outputs than n_output can say
    ],
    ids=["batch", "ragged", "scalar", "too-wide"],
)
@pytest.mark.parametrize("inline", [False, True], ids=["pool", "inline"])
def test_outputs_not_matching_the_batch_get_shape(outputs, inline):
    with ServerThread(outputs, inline=inline) as running, Client(running.address) as client:
        with pytest.raises(ServerError) as info:
            client.infer([["a"], ["b"]])
        assert info.value.code == ErrorCode.SHAPE
        assert client.ping() > 0  # same connection, still in step


@pytest.mark.parametrize("mode", ["pool", "inline", "async", "async-at-once"])
def test_handler_exception_gets_internal_and_is_logged(caplog, mode):
    def fail(batch):
        if batch[0][0].as_text() == "boom":
            raise RuntimeError("model exploded")
        return batch

    async def afail(batch):
        await asyncio.sleep(0)
        return fail(batch)

    async def afail_at_once(batch):  # raises before it ever suspends
        return fail(batch)

    handler = {"async": afail, "async-at-once": afail_at_once}.get(mode, fail)
    caplog.set_level(logging.ERROR, logger="wirekit.mip.server")
    with ServerThread(handler, inline=mode == "inline") as running, Client(running.address) as c:
        with pytest.raises(ServerError) as info:
            c.infer([["boom"]])
        assert info.value.code == ErrorCode.INTERNAL
        assert "INTERNAL" in str(info.value)
        assert c.infer([["fine"]]) == [(Item.text("fine"),)]
    failures = [r for r in caplog.records if r.exc_info]
    assert failures and "model exploded" in str(failures[0].exc_info[1])


def test_request_returns_raw_error_replies():
    with ServerThread(upper) as running, Client(running.address) as client:
        assert client.request(Ping(True)) == ErrorReply(ErrorCode.SUBTYPE)
        assert client.request(ErrorReply(0)) == ErrorReply(ErrorCode.METHOD)
        assert client.request(Ping()) == Ping(True)


# --------------------------------------------------------------------------- robustness


def test_stalled_client_does_not_block_others():
    with (
        ServerThread(upper, timeout=60.0) as running,
        raw_connection(running.address) as stalled,
    ):
        stalled.sendall(HEADER.pack(0, 2, 0, 0, 100)[:4])  # half a header, then nothing

        async def others():
            async with AsyncClient(running.address) as client:
                got = await asyncio.gather(*(client.infer([[f"o{k}"]]) for k in range(50)))
            return [g[0][0].as_text() for g in got]

        assert asyncio.run(others()) == [f"O{k}" for k in range(50)]
        with Client(running.address) as client:
            assert client.ping() > 0
        # All that happened while the stalled request was still pending, unanswered:
        stalled.setblocking(False)
        with pytest.raises(BlockingIOError):
            stalled.recv(1)


def test_stalled_client_is_timed_out(caplog):
    caplog.set_level(logging.INFO, logger="wirekit.mip.server")
    with ServerThread(upper, timeout=0.2) as running:
        with raw_connection(running.address) as stalled:
            stalled.sendall(HEADER.pack(0, 2, 0, 0, 100)[:4])
            assert read_eof(stalled) == b""  # dropped, nothing answered
        with Client(running.address) as client:
            assert client.ping() > 0
    assert any("after its first byte" in r.getMessage() for r in caplog.records)


def test_idle_timeout_closes_idle_connections_and_client_reconnects():
    with ServerThread(upper, idle_timeout=0.1) as running, Client(running.address) as client:
        assert client.ping() > 0
        deadline = time.monotonic() + TIMEOUT
        while running.call(lambda: running.server.connection_count) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.02)
        assert running.call(lambda: running.server.connection_count) == 0
        assert client.infer([["again"]]) == [(Item.text("AGAIN"),)]


def test_client_disconnecting_mid_request_loses_only_its_request():
    entered, release = threading.Event(), threading.Event()
    calls = []

    def handler(batch):
        text = batch[0][0].as_text()
        calls.append(text)
        if text == "wait":
            entered.set()
            release.wait(TIMEOUT)
        return batch

    with ServerThread(handler) as running:
        with raw_connection(running.address) as half:
            half.sendall(mip.encode(Inference.request([[Item.text("never")]]))[:13])
        with raw_connection(running.address) as gone:
            gone.sendall(mip.encode(Inference.request([[Item.text("wait")]])))
            assert entered.wait(TIMEOUT)
        with Client(running.address) as client:  # meanwhile, others are served
            assert client.ping() > 0
            release.set()
            assert client.infer([["next"]]) == [(Item.text("next"),)]
    assert calls == ["wait", "next"]  # the half-sent request never reached the handler


def test_graceful_shutdown_finishes_in_flight_requests():
    entered, release = threading.Event(), threading.Event()

    def handler(batch):
        entered.set()
        release.wait(TIMEOUT)
        return [["done"]]

    running = ServerThread(handler).start()
    address = running.address
    result = {}

    def call():
        with Client(address) as client:
            result["out"] = client.infer([["x"]])

    caller = threading.Thread(target=call)
    caller.start()
    assert entered.wait(TIMEOUT)
    stopper = threading.Thread(target=running.stop)
    stopper.start()
    running.call(lambda: None)  # runs after shutdown began: the listener is closed
    with pytest.raises(ConnectionLost):
        Client(address, timeout=2).ping()
    release.set()
    caller.join(TIMEOUT)
    stopper.join(TIMEOUT * 3)
    assert result["out"] == [(Item.text("done"),)]
    assert not stopper.is_alive()


def test_restart_binds_the_same_port_at_once():
    with ServerThread(upper) as first, Client(first.address) as client:
        address = first.address
        port = int(address.rsplit(":", 1)[1])
        assert client.ping() > 0
        first.stop()  # the server closes the connection first: its port sits in TIME_WAIT
        plain = socket.socket()
        with pytest.raises(OSError) as info:
            plain.bind(("127.0.0.1", port))  # without SO_REUSEADDR the port is taken
        plain.close()
        assert info.value.errno == errno.EADDRINUSE
    with ServerThread(upper, address) as second, Client(second.address) as client:
        assert second.address == address
        assert client.infer([["back"]]) == [(Item.text("BACK"),)]


# --------------------------------------------------------------------------- clients


def test_client_errors_are_typed():
    with pytest.raises(ConnectionLost):
        Client("tcp://127.0.0.1:1", timeout=2).ping()
    with pytest.raises(ValueError, match="scheme"):
        Client("http://127.0.0.1:5000")
    with pytest.raises(EncodeError, match="sample 1 has 2 inputs"):
        Client("tcp://127.0.0.1:1").infer([["a"], ["b", "c"]])
    # A server that accepts and closes without a word: not retried on a fresh connection.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]

        def accept_and_close():
            conn, _ = listener.accept()
            conn.recv(100)
            conn.close()

        t = threading.Thread(target=accept_and_close)
        t.start()
        with pytest.raises(ConnectionLost, match="without replying"):
            Client(f"tcp://127.0.0.1:{port}", timeout=TIMEOUT).ping()
        t.join(TIMEOUT)


def test_blocking_client_timeout_then_recovers():
    release = threading.Event()

    def handler(batch):
        if batch[0][0].as_text() == "slow":
            release.wait(TIMEOUT)
        return batch

    with ServerThread(handler) as running, Client(running.address, timeout=0.2) as client:
        with pytest.raises(ClientTimeout):
            client.infer([["slow"]])
        release.set()
        assert client.infer([["quick"]]) == [(Item.text("quick"),)]


def test_async_client_timeout_keeps_the_connection_in_step():
    release = asyncio.Event()
    loop_of_server = {}

    async def handler(batch):
        if batch[0][0].as_text() == "slow":
            loop_of_server["loop"] = asyncio.get_running_loop()
            await release.wait()
        return batch

    with ServerThread(handler) as running:

        async def main():
            async with AsyncClient(running.address, timeout=0.2) as client:
                with pytest.raises(ClientTimeout):
                    await client.infer([["slow"]])
                running.call(release.set)
                client.timeout = TIMEOUT
                # The late reply to "slow" is discarded; this call gets its own.
                return await client.infer([["mine"]])

        assert asyncio.run(main()) == [(Item.text("mine"),)]


def test_async_client_honours_each_call_deadline_and_in_flight_limit():
    # One timer per connection: a later call with a shorter timeout than the calls before
    # it still times out on its own deadline; a call waiting for an in-flight slot times out
    # too; and the slots are all given back (the client works afterwards).
    release = asyncio.Event()
    seen = {}

    async def handler(batch):
        if batch[0][0].as_text() == "slow":
            seen["loop"] = asyncio.get_running_loop()
            await release.wait()
        return batch

    with ServerThread(handler) as running:

        async def main():
            async with AsyncClient(running.address, timeout=60, max_in_flight=2) as client:
                slow = asyncio.ensure_future(client.infer([["slow"]]))
                await asyncio.sleep(0)
                client.timeout = 0.2
                with pytest.raises(ClientTimeout, match="no reply"):
                    # bounded far above 0.2 s, far below the slow call's 60 s
                    await asyncio.wait_for(client.infer([["behind"]]), 30)
                client.timeout = 60
                blocker = asyncio.ensure_future(client.infer([["slow"]]))
                await asyncio.sleep(0.05)
                client.timeout = 0.2  # both slots are taken: this one waits for a slot
                with pytest.raises(ClientTimeout, match="still in flight"):
                    await asyncio.wait_for(client.infer([["queued"]]), 30)
                running.call(release.set)
                client.timeout = TIMEOUT
                first, second = await asyncio.gather(slow, blocker)
                again = await client.infer([["again"]])
                return first, second, again, client.in_flight

        first, second, again, in_flight = asyncio.run(main())
    assert first == second == [(Item.text("slow"),)]
    assert again == [(Item.text("again"),)]
    assert in_flight == 0


def test_async_client_pipelines_many_calls(listen):
    async def main(address):
        async with AsyncClient(address, max_in_flight=16) as client:
            outs = await asyncio.gather(*(client.infer([[f"p{k}"], ["q"]]) for k in range(300)))
            pongs = await asyncio.gather(*(client.ping() for _ in range(10)))
        return outs, pongs

    with ServerThread(async_upper, listen) as running:
        outs, pongs = asyncio.run(main(running.address))
        assert running.call(lambda: running.server.requests_served) == 300
    assert outs == [[(Item.text(f"P{k}"),), (Item.text("Q"),)] for k in range(300)]
    assert all(p > 0 for p in pongs)


def test_server_runs_in_a_plain_asyncio_program(tmp_path):
    async def main():
        server = Server(async_upper)
        await server.start("tcp://127.0.0.1:0", f"unix://{tmp_path}/s.sock")
        async with server, AsyncClient(server.addresses[1]) as client:
            out = await client.infer_one("u")
        return out, server.addresses

    out, addresses = asyncio.run(main())
    assert out == (Item.text("U"),)
    assert addresses[0].startswith("tcp://127.0.0.1:") and addresses[1].startswith("unix://")
    assert not (tmp_path / "s.sock").exists()  # removed at shutdown


def test_a_connection_lost_before_the_first_send_fails_the_call_cleanly():
    # regression: a backend reset right after accepting can end the connection between
    # `connect` returning it and the first send; the send then raised AttributeError
    # (transport None) instead of a lost connection (seen once in the dispatcher, in
    # test_backend_killed_mid_run_loses_no_request).
    async def main():
        with ServerThread(upper) as running:
            client = AsyncClient(running.address, timeout=TIMEOUT)
            await client.connect()
            dead = client._conn
            dead.transport.abort()
            for _ in range(100):  # until its connection_lost has run
                if dead.transport is None:
                    break
                await asyncio.sleep(0.01)
            assert dead.transport is None

            async def connection(deadline):  # the race: connect returned a lost connection
                return dead

            client._connection = connection
            with pytest.raises(ConnectionLost):
                await client.ping()
            await client.close()

    asyncio.run(main())
