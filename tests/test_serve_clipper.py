"""End to end to Clipper containers: wirekit's Clipper containers connect to the dispatcher's
own Clipper RPC port (the embedded frontend) and are routed to by quota like any device."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import aiohttp
import numpy as np
import pytest
from serve_support import answer_of, deployment, run
from support.rows import store_rows
from support.service import start_service

from wirekit.clipper.container import ModelContainer
from wirekit.mip.client import AsyncClient

WAIT = 10.0


def tagger(tag):
    def predict(inputs):
        return [f"{tag}:{x.upper()}" for x in inputs]

    return predict


def summer(inputs):
    return [repr(float(np.sum(x))) for x in inputs]


def test_clipper_containers_behind_both_front_doors(tmp_path):
    store = tmp_path / "c.db"
    doc = deployment(
        store,
        {"words": {"backend": "clipper", "timeout": 5}, "sum": {"backend": "clipper"}},
        [
            {
                "id": "n1",
                "devices": ["CPU", "GPU"],
                "models": ["words", "sum"],
                "quotas": [0.5, 0.5, 1, 0],
                "ports": ["words-cpu", None, "words-gpu", None],
            },
        ],
        cache={"max_entries": 0},
    )
    doc["listen"]["clipper_rpc_port"] = 0

    async def main():
        service = await start_service(doc)
        containers = []
        try:
            rpc = f"tcp://127.0.0.1:{service.addresses()['clipper_rpc']}"
            for fn, name, itype in (
                (tagger("C"), "words-cpu", "strings"),
                (tagger("G"), "words-gpu", "strings"),
                (summer, "sum", "doubles"),
            ):
                containers.append(
                    ModelContainer(fn, name, "1", itype, rpc, poll_interval=0.05).start()
                )
            deadline = time.monotonic() + WAIT
            while len(service.clipper.replicas()) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert len(service.clipper.replicas()) == 3
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['words']}"
            async with AsyncClient(address, timeout=10) as c:
                outs = await asyncio.gather(*(c.infer_one(f"w{k}") for k in range(90)))
            tags = Counter()
            for k, (item,) in enumerate(outs):
                tag, value = answer_of(item.as_text())
                assert value == f"W{k}"
                tags[tag] += 1
            # quotas 0.5 (CPU) and 1 (GPU): both used, the GPU more often
            assert set(tags) == {"C", "G"}
            base = f"http://127.0.0.1:{service.addresses()['http']}"
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                async with http.post(f"{base}/sum/predict", json={"input": [1.0, 2.5]}) as r:
                    doc_ = await r.json()
                assert doc_["default"] is False and float(doc_["output"]) == 3.5
                async with http.post(
                    f"{base}/v1/models/words:predict", json={"instances": ["a", "b"]}
                ) as r:
                    outs_ = (await r.json())["predictions"]
                assert [answer_of(o)[1] for o in outs_] == ["A", "B"]
            await service.store.flush()
            rows = store_rows(store)
            assert Counter(r.status for r in rows) == {"ok": 90 + 2}
            assert {r.device for r in rows} == {"n1/0/words", "n1/1/words", "n1/0/sum"}
        finally:
            for c in containers:
                c.stop()
            await service.stop()

    run(main())


def test_inputs_a_model_does_not_take_are_the_clients_error_and_a_closed_port_is_503(tmp_path):
    """Issue 29: text for a Clipper model that takes doubles is a 400 over HTTP that says so
    in HTTP terms and a SHAPE error over MIP (the model never ran: not INTERNAL), is answered
    at once (not resubmitted, the device not backed off), and ends ``error``; a device whose
    port is closed is a 503 (nothing could be reached), not a 504 (it took too long).  The
    old code answered 504 "no device answered" for both, INTERNAL over MIP."""
    from wirekit.errors import WirekitError
    from wirekit.mip import ErrorCode

    store = tmp_path / "c.db"
    doc = deployment(
        store,
        {
            "sum": {"backend": "clipper", "timeout": 5, "attempts": 3},
            "gone": {"timeout": 5, "attempts": 2},
        },
        [
            {
                "id": "n1",
                "devices": ["CPU"],
                "models": ["sum", "gone"],
                "quotas": [0.5, 0.5],
                "ports": ["sum-cpu", 1],  # nothing listens on port 1
            },
        ],
        cache={"max_entries": 0},
    )
    doc["listen"]["clipper_rpc_port"] = 0

    async def main():
        service = await start_service(doc)
        container = None
        try:
            rpc = f"tcp://127.0.0.1:{service.addresses()['clipper_rpc']}"
            container = ModelContainer(summer, "sum-cpu", "1", "doubles", rpc, poll_interval=0.05)
            container.start()
            deadline = time.monotonic() + WAIT
            while not service.clipper.replicas() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            base = f"http://127.0.0.1:{service.addresses()['http']}"
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
                async with http.post(
                    f"{base}/v1/models/sum:predict", json={"inputs": [["hello"]]}
                ) as r:
                    status, body = r.status, await r.json()
                assert status == 400, body
                assert "takes doubles inputs; these inputs are strings" in body["error"]
                async with http.post(
                    f"{base}/v1/models/sum:predict", json={"inputs": [["a"], ["b", "c"]]}
                ) as r:
                    status, body = r.status, await r.json()
                assert status == 400 and "entry 1 has 2, entry 0 has 1" in body["error"]
                async with http.post(
                    f"{base}/v1/models/gone:predict", json={"inputs": [["x"]]}
                ) as r:
                    status, body = r.status, await r.json()
                assert status == 503, body
                async with http.post(
                    f"{base}/v1/models/sum:predict", json={"inputs": [[[1.0, 2.0]]]}
                ) as r:  # the device was not backed off for the client's error
                    status, body = r.status, await r.json()
                assert status == 200 and float(body["outputs"][0][0]) == 3.0
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['sum']}"
            async with AsyncClient(address, timeout=10) as c:
                with pytest.raises(WirekitError) as caught:
                    await c.infer_one("hello")
            assert getattr(caught.value, "code", None) == ErrorCode.SHAPE, caught.value
            await service.store.flush()
            rows = {(r.model, r.status, r.attempts) for r in store_rows(store)}
            assert ("sum", "error", 1) in rows  # answered at once, one attempt
            assert ("gone", "failed", 1) in rows or ("gone", "failed", 2) in rows
        finally:
            if container is not None:
                container.stop()
            await service.stop()

    run(main())
