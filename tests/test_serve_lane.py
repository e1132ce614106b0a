"""The dispatcher's MIP lane (``wirekit.serve.lane`` and its compiled twin
``wirekit._fast.servelane``): the frame check agrees with the codec, every request taken by
the lane is answered once and recorded as answered, a crash replays exactly the rows a clean
stop writes, and timeouts, error replies and refused slots go through the attempt loop."""

from __future__ import annotations

import asyncio
import importlib
import shutil
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from serve_support import answer_of, deployment, run, start_backend, tagged
from strategies import mip_messages, mutated
from test_serve_e2e import assert_stats_match, direct_stats

from wirekit import mip
from wirekit._impl import pure_requested
from wirekit.errors import DecodeError
from wirekit.mip.client import AsyncClient
from wirekit.serve.config import parse_config
from wirekit.serve.service import Service
from wirekit.serve.store import RequestStore, connect, read_rows


@pytest.fixture(scope="module", params=["fast", "pure"])
def lane(request):
    """Each twin of the lane (the compiled one fails, not skips, when it is not built)."""
    if request.param == "fast":
        if pure_requested():
            pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
        return importlib.import_module("wirekit._fast.servelane")
    return importlib.import_module("wirekit.serve.lane")


def expected_size(buf: bytes, pos: int, end: int, subtype: int) -> int:
    """The oracle: what the codec says about the message at ``buf[pos:end]``."""
    try:
        msg, stop = mip.decode_prefix(buf[:end], pos)
    except (DecodeError, IndexError):
        return -1
    if type(msg) is mip.Inference and msg.response == bool(subtype):
        return stop - pos
    return -1


@given(
    st.one_of(mip_messages.map(mip.encode), mip_messages.map(mip.encode).flatmap(mutated)),
    st.binary(max_size=3),
    st.binary(max_size=20),
)
def test_frame_check_accepts_exactly_what_the_codec_decodes(lane, wire, before, after):
    buf = before + wire + after
    for subtype in (0, 1):
        for end in (len(before) + len(wire), len(buf)):
            got = lane.inference_size(buf, len(before), end, subtype)
            assert got == expected_size(buf, len(before), end, subtype)
        assert lane.inference_size(bytearray(buf), len(before), len(buf), subtype) == (
            expected_size(buf, len(before), len(buf), subtype)
        )


def _two_devices(path, ports, **top):
    return deployment(
        path,
        {"m": {"timeout": 5}},
        [{"id": "n", "devices": ["CPU", "CPU"], "models": ["m"], "quotas": [0.5, 0.5],
          "ports": ports}],
        cache={"max_entries": 0},
        **top,
    )


async def _connect_backends(service):
    """Open every backend connection now, so that the lane takes the first request too."""
    for backend in service.dispatcher.backends.values():
        await backend.lane_client.connect()


def _rows(path):
    conn = connect(path, readonly=True)
    try:
        return list(read_rows(conn))
    finally:
        conn.close()


@pytest.mark.parametrize("payloads", [False, True], ids=["journal-lines", "payloads"])
def test_pipelined_requests_through_the_lane_are_answered_and_recorded(lane, tmp_path, payloads):
    store = tmp_path / "r.db"
    n = 300

    async def main():
        a, a_port = await start_backend(tagged("A"))
        b, b_port = await start_backend(tagged("B"))
        doc = _two_devices(store, [a_port, b_port], store={"path": str(store),
                                                           "payloads": payloads})
        service = Service(parse_config(doc), lane=lane)
        await service.start()
        try:
            await _connect_backends(service)
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['m']}"
            async with AsyncClient(address, timeout=10, max_in_flight=64) as c:
                outs = await asyncio.gather(*(c.infer_one(f"q{k}") for k in range(n)))
            answers = {f"q{k}": answer_of(o[0].as_text()) for k, o in enumerate(outs)}
            assert all(value == text.upper() for text, (_tag, value) in answers.items())
            stats = service.stats()
            assert stats["lane_requests"] == n
            assert stats["queue"] == 0
            await service.store.flush()
            _rows_now, direct = direct_stats(store)
            assert_stats_match(service.metrics.snapshot(), direct)
        finally:
            await service.stop()
            await a.shutdown()
            await b.shutdown()
        return answers

    answers = run(main())
    rows = _rows(store)
    assert len(rows) == n and len({r.id for r in rows}) == n
    tag_of = {"n/0/m": "A", "n/1/m": "B"}
    request_size = len(mip.encode(mip.Inference.request([[mip.Item.text("q0")]])))
    for r in rows:
        assert (r.status, r.attempts, r.model) == ("ok", 1, "m")
        assert r.client.startswith("mip:127.0.0.1:")
        assert r.time_out >= r.time_in
        assert r.payload_size >= request_size
    assert Counter(tag_of[r.device] for r in rows) == Counter(t for t, _v in answers.values())
    if payloads:  # each row is the request it says, answered by the device that answered it
        conn = connect(store, readonly=True)
        try:
            for payload, device in conn.execute("SELECT payload, device FROM requests"):
                text = mip.decode(payload).items[0].as_text()
                assert answers[text][0] == tag_of[device]
        finally:
            conn.close()


def test_a_crash_replays_exactly_the_rows_a_clean_stop_writes(lane, tmp_path):
    store = tmp_path / "r.db"
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    n = 120

    async def main():
        a, a_port = await start_backend(tagged("A"))
        b, b_port = await start_backend(tagged("B"))
        # nothing reaches SQLite before the stop: the journal alone holds the answers
        doc = _two_devices(store, [a_port, b_port], store={
            "path": str(store), "flush_interval": 60, "batch_max": 1_000_000})
        service = Service(parse_config(doc), lane=lane)
        await service.start()
        try:
            await _connect_backends(service)
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['m']}"
            async with AsyncClient(address, timeout=10, max_in_flight=32) as c:
                await asyncio.gather(*(c.infer_one(f"q{k}") for k in range(n)))
            assert service.dispatcher.lane_requests == n
            # the state a kill -9 would leave now
            for path in tmp_path.glob("r.db*"):
                shutil.copy(path, crashed / path.name)
        finally:
            await service.stop()
            await a.shutdown()
            await b.shutdown()

    run(main())
    clean = _rows(store)
    recovered = RequestStore(crashed / "r.db")
    recovered.open()
    try:
        assert recovered.replayed_at_open == n
        assert recovered.abandoned_at_open == 0
    finally:
        recovered.close()
    assert len(clean) == n
    by_id = {r.id: r for r in clean}
    assert {r.id: r for r in _rows(crashed / "r.db")} == by_id  # exact times included


def test_timeouts_and_error_replies_leave_the_lane_for_the_attempt_loop(lane, tmp_path):
    store = tmp_path / "r.db"
    n = 40

    async def main():
        release = asyncio.Event()
        slow, slow_port = await start_backend(tagged("S", gate=release))

        async def fussy(batch):
            texts = [s[0].as_text() for s in batch]
            if any(t.startswith("bad") for t in texts):
                raise ValueError("a bad input")
            return [[f"F:{t.upper()}"] for t in texts]

        fast, fast_port = await start_backend(fussy)
        doc = deployment(
            store,
            {"m": {"timeout": 0.3, "attempts": 2}},
            [{"id": "n", "devices": ["CPU", "CPU"], "models": ["m"], "quotas": [0.5, 0.5],
              "ports": [slow_port, fast_port]}],
            cache={"max_entries": 0},
            backoff=60,
        )
        service = Service(parse_config(doc), lane=lane)
        await service.start()
        try:
            await _connect_backends(service)
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['m']}"
            async with AsyncClient(address, timeout=10, max_in_flight=64) as c:
                outs = await asyncio.gather(*(c.infer_one(f"q{k}") for k in range(n)))
                assert [o[0].as_text() for o in outs] == [f"F:Q{k}" for k in range(n)]
                bad = await c.request(mip.Inference.request([[mip.Item.text("bad1")]]))
                assert bad == mip.ErrorReply(int(mip.ErrorCode.INTERNAL))
                # the late replies of the slow device are dropped, never answered twice
                release.set()
                await asyncio.sleep(0.1)
                again = await c.infer_one("after")
                assert again[0].as_text() == "F:AFTER"
            stats = service.stats()
            assert stats["lane_requests"] >= n  # all of the first burst went by the lane
            assert service.router.backed_off() == ["n/0/m"]
            resubmitted = service.dispatcher.resubmissions
            await service.store.flush()
        finally:
            release.set()
            await service.stop()
            await slow.shutdown()
            await fast.shutdown()
        return resubmitted

    resubmitted = run(main())
    rows = _rows(store)
    assert Counter(r.status for r in rows) == {"ok": n + 1, "error": 1}
    assert all(r.device == "n/1/m" for r in rows)
    assert resubmitted >= 1  # the quota sent some of the burst to the slow device
    assert sum(r.attempts for r in rows if r.status == "ok") == n + 1 + resubmitted


def test_no_free_slot_leaves_requests_to_the_general_path(lane, tmp_path):
    store = tmp_path / "r.db"
    n = 50

    async def main():
        backend, port = await start_backend(tagged("A"))
        doc = deployment(
            store,
            {"m": {"timeout": 5}},
            [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [port]}],
            cache={"max_entries": 0},
            connections=4,  # 4 requests in flight per backend: the rest wait for a slot
        )
        service = Service(parse_config(doc), lane=lane)
        await service.start()
        try:
            await _connect_backends(service)
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['m']}"
            async with AsyncClient(address, timeout=10, max_in_flight=n) as c:
                outs = await asyncio.gather(*(c.infer_one(f"q{k}") for k in range(n)))
            assert [o[0].as_text() for o in outs] == [f"A:Q{k}" for k in range(n)]
            taken = service.dispatcher.lane_requests
            await service.store.flush()
        finally:
            await service.stop()
            await backend.shutdown()
        return taken

    taken = run(main())
    assert 4 <= taken < n
    rows = _rows(store)
    assert len(rows) == n and all(r.status == "ok" and r.attempts == 1 for r in rows)


def test_malformed_messages_between_lane_requests_are_answered_in_order(lane, tmp_path):
    store = tmp_path / "r.db"
    good = [mip.encode(mip.Inference.request([[mip.Item.text(f"g{k}")]])) for k in range(3)]
    bad_item = bytearray(good[0])
    bad_item[19] += 1  # the item announces a byte more than the payload holds

    async def main():
        backend, port = await start_backend(tagged("A"))
        doc = deployment(
            store,
            {"m": {"timeout": 5}},
            [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [port]}],
            cache={"max_entries": 0},
        )
        service = Service(parse_config(doc), lane=lane)
        await service.start()
        try:
            await _connect_backends(service)
            port_m = service.addresses()["mip"]["m"]
            reader, writer = await asyncio.open_connection("127.0.0.1", port_m)
            ping = mip.encode(mip.Ping(False))
            writer.write(good[0] + bytes(bad_item) + ping + good[1] + good[2][:5])
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(good[2][5:])  # the rest of a request cut across two reads
            replies = []
            for _ in range(5):
                head = await reader.readexactly(8)
                replies.append(mip.decode(head + await reader.readexactly(
                    int.from_bytes(head[4:], "big"))))
            writer.close()
            await writer.wait_closed()
            taken = service.dispatcher.lane_requests
            await service.store.flush()
        finally:
            await service.stop()
            await backend.shutdown()
        return replies, taken

    replies, taken = run(main())
    texts = [r.items[0].as_text() if type(r) is mip.Inference else r for r in replies]
    assert texts == ["A:G0", mip.ErrorReply(int(mip.ErrorCode.SHAPE)), mip.Ping(True),
                     "A:G1", "A:G2"]
    assert taken == 3
    assert Counter(r.status for r in _rows(store)) == {"ok": 3}


def test_the_cache_answers_repeats_in_the_lane(lane, tmp_path):
    store = tmp_path / "r.db"
    n = 100

    async def main():
        backend, port = await start_backend(tagged("A"))
        doc = deployment(
            store,
            {"m": {"timeout": 5}},
            [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [port]}],
            cache={"max_entries": 1000, "ttl": 60},
        )
        service = Service(parse_config(doc), lane=lane)
        await service.start()
        try:
            await _connect_backends(service)
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['m']}"
            async with AsyncClient(address, timeout=10, max_in_flight=32) as c:
                first = await asyncio.gather(*(c.infer_one(f"q{k}") for k in range(n)))
                again = await asyncio.gather(*(c.infer_one(f"q{k}") for k in range(n)))
            assert [o[0].as_text() for o in first] == [f"A:Q{k}" for k in range(n)]
            assert again == first
            stats = service.stats()
            assert stats["lane_requests"] == 2 * n
            assert (stats["cache"]["hits"], stats["cache"]["misses"]) == (n, n)
            await service.store.flush()
            _rows_now, direct = direct_stats(store)
            assert_stats_match(service.metrics.snapshot(), direct)
        finally:
            await service.stop()
            await backend.shutdown()

    run(main())
    rows = _rows(store)
    assert Counter((r.device, r.attempts, r.status) for r in rows) == {
        ("n/0/m", 1, "ok"): n, ("cache", 0, "ok"): n}
