"""Adaptive batching (a model's ``max_batch``): requests to one device are joined into one MIP
batch and the reply split back per request -- over real sockets, to wirekit's MIP server and
KubeMo's, with error replies, timeouts, the store and the metrics checked per request."""

from __future__ import annotations

import asyncio
import socket

import pytest
from mip_net import KubemoServer, kubemo_echo
from serve_support import answer_of, deployment, run, start_backend, tagged
from support.service import start_service, stop_service
from test_serve_e2e import assert_stats_match, direct_stats

from wirekit import mip
from wirekit.mip import Decoder, ErrorCode, ErrorReply, Inference, Item
from wirekit.mip.client import AsyncClient
from wirekit.serve.config import ConfigError, parse_config
from wirekit.serve.dispatch.dispatcher import join_requests, split_reply

IO_TIMEOUT = 10.0


def recording(tag: str, sizes: list[int], *, fail_on: str | None = None):
    """A tagged handler that records each batch's size and fails a batch holding
    ``fail_on`` (the server answers it INTERNAL)."""
    inner = tagged(tag)

    async def handler(batch):
        sizes.append(len(batch))
        if fail_on is not None and any(s[0].as_text() == fail_on for s in batch):
            raise RuntimeError("this batch holds a bad input")
        return await inner(batch)

    return handler


def one_read(address: str, messages: list[mip.Message]) -> list[mip.Message]:
    """Send every message in one write (so the dispatcher reads them in one pass) and read
    one reply per message, in order."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=IO_TIMEOUT) as sock:
        sock.sendall(b"".join(mip.encode(m) for m in messages))
        decoder = Decoder()
        replies: list[mip.Message] = []
        while len(replies) < len(messages):
            data = sock.recv(65536)
            assert data, "the dispatcher closed the connection"
            decoder.feed(data)
            while (msg := decoder.next_message()) is not None:
                replies.append(msg)
    return replies


def text_request(*samples: str) -> Inference:
    return Inference.request([[Item.text(s)] for s in samples])


def test_join_and_split_are_inverse_on_the_wire():
    reqs = [text_request("a"), text_request("bb", "c"), text_request("ddd")]
    joined = mip.decode(join_requests([mip.encode(r) for r in reqs], 1, 4))
    assert joined == text_request("a", "bb", "c", "ddd")
    reply = Inference.reply(
        [
            [Item.text("A"), Item.json([1])],
            [Item.text("B")] * 2,
            [Item.text("C")] * 2,
            [Item.text("D"), Item(7, b"\x00")],
        ],
        n_input=1,
    )
    frame = mip.encode(reply)
    parts = split_reply(frame, reply, [1, 2, 1])
    assert [mip.decode(p) for p in parts] == [
        Inference.reply([reply.items[0:2]], n_input=1),
        Inference.reply([reply.items[2:4], reply.items[4:6]], n_input=1),
        Inference.reply([reply.items[6:8]], n_input=1),
    ]
    assert split_reply(frame, reply, [1, 1]) is None  # not the batch that was sent


def test_max_batch_is_validated():
    doc = {
        "models": {"m": {"max_batch": 0}},
        "nodes": [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [1]}],
    }
    with pytest.raises(ConfigError, match=r"models\.m\.max_batch"):
        parse_config(doc)
    doc["models"]["m"]["max_batch"] = 16
    assert parse_config(doc).models["m"].max_batch == 16
    del doc["models"]["m"]["max_batch"]
    assert parse_config(doc).models["m"].max_batch == 1  # off unless asked for


def test_pipelined_requests_are_joined_and_answered_each(tmp_path):
    store = tmp_path / "requests.db"
    sizes: list[int] = []

    async def main():
        backend, port = await start_backend(recording("A", sizes))
        service = await start_service(
            deployment(
                store,
                {"m": {"max_batch": 8}},
                [
                    {
                        "id": "n",
                        "devices": ["CPU"],
                        "models": ["m"],
                        "quotas": [1],
                        "ports": [port],
                    }
                ],
                cache={"max_entries": 0},
            )
        )
        try:
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['m']}"
            # One read holding 30 requests (one of them 2 samples): joined 8 samples at most.
            reqs = [text_request(f"x{k}") for k in range(29)] + [text_request("y", "z")]
            replies = await asyncio.to_thread(one_read, address, reqs)
            for k, reply in enumerate(replies[:29]):
                assert [answer_of(i.as_text()) for i in reply.items] == [("A", f"X{k}")]
            assert [i.as_text() for i in replies[29].items] == ["A:Y", "A:Z"]
            assert service.dispatcher.batches >= 3
            assert max(sizes) == 8 and sum(sizes) == 31
            # Byte for byte what the backend answers to the request alone.
            async with (
                AsyncClient(address, timeout=IO_TIMEOUT) as via,
                AsyncClient(backend.address, timeout=IO_TIMEOUT) as direct,
            ):
                wire = mip.encode(text_request("p", "q"))
                outs = await asyncio.gather(*(via.request_wire(wire) for _ in range(10)))
                alone, _msg = await direct.request_wire(wire)
                assert {o[0] for o in outs} == {alone}
                # and a pipelining client with concurrent calls gets its own answers
                got = await asyncio.gather(*(via.infer_one(f"c{k}") for k in range(100)))
                assert [g[0].as_text() for g in got] == [f"A:C{k}" for k in range(100)]
            await service.store.flush()
            stats = service.stats()
        finally:
            await stop_service(service, [backend])
        rows, direct = direct_stats(store)
        assert len(rows) == 140 and len({r.id for r in rows}) == 140
        assert {r.status for r in rows} == {"ok"} and {r.attempts for r in rows} == {1}
        assert {r.device for r in rows} == {"n/0/m"}
        assert_stats_match(stats, direct)
        assert stats["batches"]["sent"] >= 3 and stats["batches"]["retried"] == 0

    run(main())


def test_an_error_reply_to_a_batch_fails_only_the_bad_request(tmp_path):
    store = tmp_path / "requests.db"
    sizes: list[int] = []

    async def main():
        backend, port = await start_backend(recording("A", sizes, fail_on="boom"))
        service = await start_service(
            deployment(
                store,
                {"m": {"max_batch": 32}},
                [
                    {
                        "id": "n",
                        "devices": ["CPU"],
                        "models": ["m"],
                        "quotas": [1],
                        "ports": [port],
                    }
                ],
            )
        )
        try:
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['m']}"
            texts = [f"x{k}" for k in range(12)]
            texts[5] = "boom"
            replies = await asyncio.to_thread(one_read, address, [text_request(t) for t in texts])
            stats = service.stats()
            await service.store.flush()
        finally:
            await stop_service(service, [backend])
        for t, reply in zip(texts, replies, strict=True):
            if t == "boom":
                assert reply == ErrorReply(int(ErrorCode.INTERNAL))
            else:
                assert [i.as_text() for i in reply.items] == [f"A:{t.upper()}"]
        assert stats["batches"]["retried"] >= 1
        assert sizes[0] > 1 and sizes.count(1) >= 12  # the batch, then each alone
        rows, _direct = direct_stats(store)
        assert len(rows) == 12
        assert sorted(r.status for r in rows) == ["error"] + ["ok"] * 11

    run(main())


def test_a_batch_that_times_out_is_resubmitted_request_by_request(tmp_path):
    store = tmp_path / "requests.db"

    async def main():
        never = asyncio.Event()
        stuck, stuck_port = await start_backend(tagged("S", gate=never))
        good, good_port = await start_backend(tagged("G"))
        service = await start_service(
            deployment(
                store,
                {"m": {"max_batch": 16, "timeout": 0.3, "attempts": 2}},
                [
                    {
                        "id": "n",
                        "devices": ["CPU", "CPU"],
                        "models": ["m"],
                        "quotas": [1, 1],
                        "ports": [stuck_port, good_port],
                    }
                ],
                cache={"max_entries": 0},
                backoff=60,
            )
        )
        try:
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['m']}"
            replies = await asyncio.to_thread(
                one_read, address, [text_request(f"t{k}") for k in range(40)]
            )
            await service.store.flush()
            stats = service.stats()
        finally:
            never.set()
            await stop_service(service, [stuck, good])
        assert [r.items[0].as_text() for r in replies] == [f"G:T{k}" for k in range(40)]
        rows, direct = direct_stats(store)
        assert len(rows) == 40 and {r.status for r in rows} == {"ok"}
        assert {r.device for r in rows} == {"n/1/m"}
        assert any(r.attempts == 2 for r in rows)  # some went to the stuck device first
        assert stats["resubmissions"] == sum(r.attempts - 1 for r in rows)
        assert_stats_match(stats, direct)

    run(main())


def test_batches_to_kubemo_server(tmp_path):
    store = tmp_path / "requests.db"

    async def main():
        with KubemoServer(kubemo_echo) as km:
            port = int(km.address.rsplit(":", 1)[1])
            service = await start_service(
                deployment(
                    store,
                    {"km": {"backend": "kubemo", "max_batch": 8}},
                    [
                        {
                            "id": "n",
                            "devices": ["CPU"],
                            "models": ["km"],
                            "quotas": [1],
                            "ports": [port],
                        }
                    ],
                )
            )
            try:
                address = f"tcp://127.0.0.1:{service.addresses()['mip']['km']}"
                reqs = [
                    Inference.request([[Item.text(f"k{k}"), Item.json({"n": k})]])
                    for k in range(20)
                ]
                replies = await asyncio.to_thread(one_read, address, reqs)
                stats = service.stats()
            finally:
                await service.stop()
        for k, reply in enumerate(replies):
            assert reply.n_output == 2 and reply.batch_size == 1
            assert reply.items[0].as_text() == f"k{k}" and reply.items[1].as_json() == {"n": k}
        assert stats["batches"]["sent"] >= 3 and stats["batches"]["retried"] == 0
        assert stats["models"]["km"]["statuses"] == {"ok": 20}

    run(main())


def test_journal_line_made_ahead_equals_the_whole_line(tmp_path):
    from wirekit.serve.record.store import RequestStore

    store = RequestStore(tmp_path / "r.db")
    store.open()
    try:
        t_in, t_out = 1763790000.123456, 1763790000.1237891
        store.complete("id-1", "m", 'c"1', "n/0/m", t_in, t_out, "ok", 22, 1, None, True)
        head = store.line_head("id-1", "m", 'c"1', "n/0/m", t_in, 22)
        store.complete_head(head, "id-1", "n/0/m", t_out, "ok", 22, 1)
        whole, ahead = store._jbuf
        assert whole == ahead
        store.write_journal()
    finally:
        store.close()
    reopened = RequestStore(tmp_path / "r.db")
    reopened.open()  # nothing left to replay: close() committed the rows
    reopened.close()


def test_a_large_group_goes_as_two_batches(tmp_path):
    sizes: list[int] = []

    async def main():
        backend, port = await start_backend(recording("A", sizes))
        service = await start_service(
            deployment(
                tmp_path / "requests.db",
                {"m": {"max_batch": 64}},
                [
                    {
                        "id": "n",
                        "devices": ["CPU"],
                        "models": ["m"],
                        "quotas": [1],
                        "ports": [port],
                    }
                ],
            )
        )
        try:
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['m']}"
            reqs = [text_request(f"h{k}") for k in range(32)]
            replies = await asyncio.to_thread(one_read, address, reqs)
        finally:
            await stop_service(service, [backend])
        assert [r.items[0].as_text() for r in replies] == [f"A:H{k}" for k in range(32)]
        # one read of 32 requests: two batches of 16, so the first answers can go back
        # while the backend works on the second
        assert sizes == [16, 16]

    run(main())
