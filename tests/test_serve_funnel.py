"""One funnel where a request ends (issue 35): every end state of every path -- the MIP lane
(both twins), the MIP door's general path with adaptive batching and its fast first
attempt, the HTTP door's attempt loop, a door's refusal -- passes through
:meth:`Dispatcher.settle` (one request) or :meth:`Dispatcher.lane_answered` (the lane's
``ok`` answers, batched), and nowhere else: the calls counted per end state are exactly the
store's rows and the metrics' statuses."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import pytest
from serve_support import run, tagged
from support.rows import select
from test_serve_lane import lane, lane_service  # noqa: F401 - the twins

from wirekit import mip
from wirekit.mip.client import AsyncClient
from wirekit.serve.dispatch.dispatcher import Dispatcher
from wirekit.serve.record.store import ABANDONED

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=10)


def store_statuses(path) -> Counter:
    """How many rows of the store at ``path`` end in each state."""
    return Counter(dict(select(path, "SELECT status, count(*) FROM requests GROUP BY status")))


def store_rows(path, status: str) -> list[tuple]:
    """``(reason, device, attempts, client)`` of the rows of the store at ``path`` that end
    in ``status``."""
    query = "SELECT reason, device, attempts, client FROM requests WHERE status = ?"
    return select(path, query, (status,))


@pytest.fixture
def funnel(monkeypatch) -> Counter:
    """Counts per end state of the requests that end through the funnel (a job that ended
    ``abandoned`` already ends no second time: ``settle`` records nothing for it)."""
    counts: Counter = Counter()
    settle, lane_answered = Dispatcher.settle, Dispatcher.lane_answered

    def counting_settle(self, job, outcome, *args, **kwargs):
        if not job.abandoned or outcome.status == ABANDONED:
            counts[outcome.status] += 1
        return settle(self, job, outcome, *args, **kwargs)

    def counting_lane_answered(self, stats, model, client, t_out, total, lo, hi, rows, answers, *a):
        counts["ok"] += len(answers)
        return lane_answered(self, stats, model, client, t_out, total, lo, hi, rows, answers, *a)

    monkeypatch.setattr(Dispatcher, "settle", counting_settle)
    monkeypatch.setattr(Dispatcher, "lane_answered", counting_lane_answered)
    return counts


def mixed(gate: asyncio.Event):
    """A backend handler: ``err...`` fails (an error reply), ``slow...`` takes 1 s (longer
    than the model's timeout), ``hold...`` waits for ``gate``, the rest is answered."""

    async def handler(batch):
        texts = [sample[0].as_text() for sample in batch]
        if any(t.startswith("err") for t in texts):
            raise ValueError("refused")
        if any(t.startswith("slow") for t in texts):
            await asyncio.sleep(1.0)
        if any(t.startswith("hold") for t in texts):
            await gate.wait()
        return [[t.upper()] for t in texts]

    return handler


async def _wait_for(predicate, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def _mip_mix(service, address: str, gate: asyncio.Event) -> None:
    """ok (twice the same: the second from the cache), an error reply, a timeout, a client
    gone, over MIP; each request alone, then a burst (joined in a batch when batching)."""
    async with AsyncClient(address, timeout=10) as c:
        for text in ("a", "a", "b"):
            (item,) = await c.infer_one(text)
            assert item.as_text() == text.upper()
        assert isinstance(
            await c.request(mip.Inference.request([[mip.Item.text("err")]])), mip.ErrorReply
        )
        burst = await asyncio.gather(*(c.infer_one(f"x{k}") for k in range(12)))
        assert [o[0].as_text() for o in burst] == [f"X{k}" for k in range(12)]
        failed = await c.request(mip.Inference.request([[mip.Item.text("slow")]]))
        assert failed == mip.ErrorReply(int(mip.ErrorCode.INTERNAL))
    stats = service.metrics.stats("m")
    gone = AsyncClient(address, timeout=10)
    held = asyncio.ensure_future(gone.infer_one("hold"))
    await _wait_for(lambda: service.metrics.in_flight("m") == 1)
    await gone.close()
    held.cancel()
    await _wait_for(lambda: stats.statuses.get("abandoned") == 1)
    gate.set()
    await asyncio.sleep(0.05)  # the late reply records nothing


def _check(funnel: Counter, path, expected: set[str], metrics) -> None:
    stored = store_statuses(path)
    assert set(stored) == expected
    assert funnel == stored
    assert Counter(metrics.stats("m").statuses) == stored


def test_every_end_of_the_lane_passes_the_funnel(lane, tmp_path, funnel):  # noqa: F811
    """The MIP lane (each twin): ok (sent, and from the cache), error, failed, abandoned."""

    async def main():
        gate = asyncio.Event()
        async with lane_service(
            lane,
            tmp_path / "r.db",
            [mixed(gate)],
            model={"timeout": 0.3, "attempts": 1},
            cache={"max_entries": 100},
        ) as (service, address):
            lane_before = service.dispatcher.lane_requests
            await _mip_mix(service, address, gate)
            assert service.dispatcher.lane_requests > lane_before  # the lane took them
            metrics = service.metrics
        return metrics

    metrics = run(main())
    _check(funnel, tmp_path / "r.db", {"ok", "error", "failed", "abandoned"}, metrics)
    assert [r[1] for r in store_rows(tmp_path / "r.db", "ok")].count("cache") == 1


def test_every_end_of_the_batching_and_fast_path_passes_the_funnel(lane, tmp_path, funnel):  # noqa: F811
    """The MIP door's general path: adaptive batching (a burst joined), a request alone
    (the fast first attempt, a callback), the attempt loop after a timeout."""

    async def main():
        gate = asyncio.Event()
        async with lane_service(
            lane,
            tmp_path / "r.db",
            [mixed(gate)],
            model={"timeout": 0.3, "attempts": 1, "max_batch": 8},
            cache={"max_entries": 100},
        ) as (service, address):
            await _mip_mix(service, address, gate)
            assert service.dispatcher.batches >= 1  # the burst was joined
            assert service.dispatcher.lane_requests == 0  # the lane does not batch
            metrics = service.metrics
        return metrics

    metrics = run(main())
    _check(funnel, tmp_path / "r.db", {"ok", "error", "failed", "abandoned"}, metrics)


def test_every_end_over_http_passes_the_funnel(tmp_path, funnel):
    """The HTTP door (:meth:`Dispatcher.submit`): ok, from the cache, error, failed."""
    from wirekit.serve.dispatch import lane as pure_lane

    async def main():
        gate = asyncio.Event()
        async with lane_service(
            pure_lane,
            tmp_path / "r.db",
            [mixed(gate)],
            model={"timeout": 0.3, "attempts": 1},
            cache={"max_entries": 100},
        ) as (service, _address):
            url = f"http://127.0.0.1:{service.addresses()['http']}/v1/models/m:predict"
            async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
                for text, status in (("a", 200), ("a", 200), ("err", 502), ("slow", 504)):
                    async with http.post(url, json={"inputs": [[text]]}) as r:
                        assert r.status == status, await r.text()
            metrics = service.metrics
        return metrics

    metrics = run(main())
    _check(funnel, tmp_path / "r.db", {"ok", "error", "failed"}, metrics)
    assert [r[1] for r in store_rows(tmp_path / "r.db", "ok")].count("cache") == 1
    assert [r[0] for r in store_rows(tmp_path / "r.db", "failed")] == [
        "no device answered after 1 attempt(s): n/0/m: no answer within 0.3 s"
    ]


def test_a_request_refused_at_the_mip_door_for_a_removed_model_is_recorded(lane, tmp_path):  # noqa: F811
    """Regression (issue 35): a request that arrives on a MIP connection still open after
    its model was removed is answered METHOD -- and, like every request, gets its store row
    (``failed``, the reason the log gives) and is counted in the metrics (it had neither)."""

    async def main():
        gate = asyncio.Event()
        async with lane_service(lane, tmp_path / "r.db", [tagged("H", gate=gate)]) as (
            service,
            address,
        ):
            async with AsyncClient(address, timeout=10) as c:
                first = asyncio.ensure_future(c.infer_one("first"))
                await _wait_for(lambda: service.metrics.in_flight("m") == 1)
                removal = asyncio.ensure_future(service.remove_model("m"))
                await asyncio.sleep(0.05)
                assert not removal.done()  # draining: the connection is still open
                # answered in order on the connection: after the first, once the gate opens
                late = asyncio.ensure_future(
                    c.request(mip.Inference.request([[mip.Item.text("late")]]))
                )
                await asyncio.sleep(0.05)
                gate.set()
                (item,) = await first
                assert await late == mip.ErrorReply(int(mip.ErrorCode.METHOD))
                assert item.as_text() == "H:FIRST"
                await asyncio.wait_for(removal, 10)
            statuses = dict(service.metrics.snapshot()["models"]["m"]["statuses"])
            queue = service.metrics.snapshot()["models"]["m"]["queue"]
        return statuses, queue

    statuses, queue = run(main())
    assert statuses == {"ok": 1, "failed": 1}
    assert queue == 0
    rows = store_rows(tmp_path / "r.db", "failed")
    assert len(rows) == 1
    reason, device, attempts, client = rows[0]
    assert (reason, device, attempts) == ("model 'm' was removed", None, 0)
    assert client.startswith("mip:127.0.0.1:")
    assert store_statuses(tmp_path / "r.db") == Counter(ok=1, failed=1)


def test_the_refusal_row_is_written_before_the_answer(lane, tmp_path):  # noqa: F811
    """The refused request's row is in the journal when its answer goes out: the MIP door
    writes the journal before any answer, and the refusal's records are deferred to it."""

    async def main():
        async with (
            lane_service(lane, tmp_path / "r.db", [tagged("A")]) as (service, address),
            AsyncClient(address, timeout=10) as c,
        ):
            assert (await c.infer_one("one"))[0].as_text() == "A:ONE"
            service.dispatcher.drain("m")  # takes no new request; the door stays open
            late = await c.request(mip.Inference.request([[mip.Item.text("late")]]))
            assert late == mip.ErrorReply(int(mip.ErrorCode.METHOD))
            assert service.store.write_problem() is None
            stats = service.metrics.stats("m")
            assert (stats.statuses, stats.queue) == ({"ok": 1, "failed": 1}, 0)

    run(main())
    assert [r[0] for r in store_rows(tmp_path / "r.db", "failed")] == ["model 'm' was removed"]


def test_a_cancelled_request_passes_the_funnel(tmp_path, funnel, monkeypatch):
    """A request whose attempt loop is cancelled -- the HTTP door's ``submit``, a started
    job's task at shutdown -- ends ``failed`` ("cancelled before an answer") through the
    funnel too."""
    from wirekit.serve.dispatch import lane as pure_lane
    from wirekit.serve.dispatch.payload import Payload

    async def main():
        gate = asyncio.Event()
        async with lane_service(pure_lane, tmp_path / "r.db", [tagged("H", gate=gate)]) as (
            service,
            _address,
        ):
            d = service.dispatcher
            wire = mip.encode(mip.Inference.request([[mip.Item.text("x")]]))
            submitted = asyncio.ensure_future(d.submit("m", Payload(wire), "test"))
            await _wait_for(lambda: service.metrics.in_flight("m") == 1)
            submitted.cancel()
            with pytest.raises(asyncio.CancelledError):
                await submitted
            # no free slot for a callback: the attempt loop (a task) sends it
            monkeypatch.setattr(d.backends["n/0/m"], "send_nowait", lambda *args: False)
            answered: list = []
            d.start(d.new_job("m", wire, "test", 0.0, answered.append))
            await _wait_for(lambda: service.metrics.in_flight("m") == 1 and d.tasks)
            await asyncio.sleep(0.05)  # the task waits for the backend's answer
            for task in list(d.tasks):
                task.cancel()  # it stops once the backend's call returns
            gate.set()
            await _wait_for(lambda: answered)
            assert isinstance(answered[0].error, asyncio.CancelledError)
            assert answered[0].outcome is None
            assert service.metrics.in_flight("m") == 0

    run(main())
    assert funnel == store_statuses(tmp_path / "r.db") == Counter(failed=2)
    assert [r[0] for r in store_rows(tmp_path / "r.db", "failed")] == [
        "cancelled before an answer"
    ] * 2
