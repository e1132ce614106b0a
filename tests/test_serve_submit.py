"""``Dispatcher.submit`` -- the awaiting doors' way in (HTTP, gRPC) -- goes the way of
``Dispatcher.start`` (issue 36): its first attempt on the backend's open connection with the
reply in a callback, every request counted on the door it names, and, for a model with
adaptive batching, joined with the other requests of its loop pass -- each answered with
its own reply and recorded as its own row (in process, real backends on loopback; the MIP
lane plays no part, so the pure one serves)."""

from __future__ import annotations

import asyncio
from collections import Counter

from serve_support import run, tagged
from support.rows import select
from test_serve_lane import lane_service

from wirekit import mip
from wirekit.serve.dispatch import lane as pure_lane
from wirekit.serve.dispatch.payload import Payload


def _request(text: str) -> Payload:
    return Payload(mip.encode(mip.Inference.request([[mip.Item.text(text)]])))


def _answer_text(outcome) -> str:
    msg = outcome.response.message
    return msg.items[0][1].decode()


def test_submitted_requests_are_answered_on_the_callback_path_and_counted_by_door(tmp_path):
    n = 24

    async def main():
        async with lane_service(pure_lane, tmp_path / "r.db", [tagged("A")]) as (service, _):
            d = service.dispatcher
            doors = ["oip-rest" if k % 2 else "tfserving" for k in range(n)]
            outcomes = await asyncio.gather(
                *(
                    d.submit("m", _request(f"q{k}"), "test", door=door)
                    for k, door in enumerate(doors)
                )
            )
            assert [o.status for o in outcomes] == ["ok"] * n
            assert [_answer_text(o) for o in outcomes] == [f"A:Q{k}" for k in range(n)]
            assert len({o.id for o in outcomes}) == n
            assert not d.tasks  # no attempt loop: every first attempt went by callback
            assert (d.active, d.submitting) == (0, 0)
            series = service.metrics.series[("m", "n/0")]
            by_door = {door: sum(s.states.values()) for door, s in series.doors.items()}
            assert by_door == {"oip-rest": n // 2, "tfserving": n // 2}

    run(main())
    rows = select(tmp_path / "r.db", "SELECT status, count(*) FROM requests GROUP BY status")
    assert Counter(dict(rows)) == Counter(ok=n)


def test_submitted_requests_to_a_batching_model_are_joined_and_split_back(tmp_path):
    n = 12

    async def main():
        async with lane_service(
            pure_lane, tmp_path / "r.db", [tagged("B")], model={"timeout": 5, "max_batch": 8}
        ) as (service, _):
            d = service.dispatcher
            outcomes = await asyncio.gather(
                *(d.submit("m", _request(f"b{k}"), "test") for k in range(n))
            )
            assert [_answer_text(o) for o in outcomes] == [f"B:B{k}" for k in range(n)]
            assert d.batches >= 1  # requests of one loop pass went as joined batches
            assert d.active == 0

    run(main())
    rows = select(tmp_path / "r.db", "SELECT status, count(*) FROM requests GROUP BY status")
    assert Counter(dict(rows)) == Counter(ok=n)
