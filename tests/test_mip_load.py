"""Load: 8 concurrent clients × 10,000 requests against ``wirekit mip serve`` in a subprocess,
while a stalled client sits on the server and an over-limit request is refused.

Counts and correctness are asserted, never durations (the suite runs on shared 2-core
machines).  Each client pipelines its requests on one connection, which is what makes 80,000
requests a few seconds of work.
"""

from __future__ import annotations

import asyncio
import struct

import pytest
from mip_net import TIMEOUT, CliServer

from wirekit.mip import ErrorCode, ErrorReply
from wirekit.mip.client import AsyncClient
from wirekit.mip.decoder import Decoder

CLIENTS = 8
REQUESTS = 10_000
WORKERS = 32  # concurrent calls per client, pipelined on its connection
HEADER = struct.Struct(">BBBBI")


async def run_client(address: str, c: int, requests: int) -> int:
    correct = 0

    async with AsyncClient(address, timeout=TIMEOUT * 6, max_in_flight=WORKERS) as client:

        async def worker(w: int) -> None:
            nonlocal correct
            for i in range(w, requests, WORKERS):
                text = f"client {c} request {i}"
                (out,) = await client.infer([[text]])
                assert out[0].as_text() == text[::-1], (c, i, out)
                correct += 1

        await asyncio.gather(*(worker(w) for w in range(WORKERS)))
    return correct


async def read_reply_then_eof(reader: asyncio.StreamReader) -> tuple[object, bytes]:
    decoder = Decoder()
    while (msg := decoder.next_message()) is None:
        data = await reader.read(65536)
        assert data, "closed before the reply"
        decoder.feed(data)
    return msg, await reader.read()


@pytest.mark.parametrize("handler", ["reverse", "reverse_sync"])
def test_eight_clients_ten_thousand_requests_each(handler):
    # The thread-pool path costs a thread hop per request: a tenth of the load covers it.
    requests = REQUESTS if handler == "reverse" else REQUESTS // 10
    with CliServer(
        "--listen",
        "tcp://127.0.0.1:0",
        "--max-message-size",
        "65536",
        "--timeout",
        "300",
        handler=f"mip_handlers:{handler}",
    ) as server:
        host, port = server.address.removeprefix("tcp://").rsplit(":", 1)

        async def main():
            # A client that sends half a header and then nothing, for the whole run.
            stalled_reader, stalled = await asyncio.open_connection(host, int(port))
            stalled.write(HEADER.pack(0, 2, 0, 0, 64)[:5])
            await stalled.drain()

            clients = (run_client(server.address, c, requests) for c in range(CLIENTS))
            counts = await asyncio.wait_for(asyncio.gather(*clients), TIMEOUT * 30)

            # Over the limit: MEMORY from the header alone, then the connection is closed.
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(HEADER.pack(0, 2, 0, 0, 1 << 30))
            reply, rest = await asyncio.wait_for(read_reply_then_eof(reader), TIMEOUT)
            writer.close()

            # The server is still up, and the stalled client is still waiting, unanswered.
            async with AsyncClient(server.address, timeout=TIMEOUT) as client:
                pong = await client.ping()
            # Neither data nor EOF has come for it (either would end this read at once).
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(stalled_reader.read(1), 0.05)
            stalled.close()
            return counts, reply, rest, pong

        counts, reply, rest, pong = asyncio.run(main())
        status, log = server.stop(), server.log
    assert counts == [requests] * CLIENTS
    assert reply == ErrorReply(ErrorCode.MEMORY) and rest == b""
    assert pong > 0
    assert status == 0, log
    assert "exceeds the limit" in log and "Traceback" not in log
