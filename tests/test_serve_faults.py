"""Faults: timeouts and refusals are resubmitted, a backend killed mid-run loses no request,
and after ``kill -9`` of the dispatcher every completed request is in the store."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter

import aiohttp
import pytest
from mip_net import CliServer
from serve_support import (
    TIMEOUT,
    BackendProcess,
    DispatcherProcess,
    answer_of,
    deployment,
    run,
    start_backend,
    tagged,
)
from support.ports import free_port
from support.rows import rows_by_text, store_rows
from support.service import start_service, stop_service

from wirekit import mip
from wirekit.mip.client import AsyncClient, Client
from wirekit.mip.runtime import ConnectionLost


def payload_inputs(path):
    """request text -> (status, device) for every row, from the stored payloads."""
    out = {}
    for text, found in rows_by_text(path, "status, device, time_out").items():
        assert len(found) == 1, f"{text} stored twice"
        out[text] = found[0]
    return out


def test_timeout_and_refusal_are_resubmitted_and_answered_once(tmp_path):
    store = tmp_path / "r.db"

    async def main():
        release = asyncio.Event()
        slow, slow_port = await start_backend(tagged("S", gate=release))
        fast, fast_port = await start_backend(tagged("F"))
        doc = deployment(
            store,
            {"m": {"timeout": 0.2, "attempts": 3}, "lonely": {"timeout": 0.2, "attempts": 3}},
            [
                {
                    "id": "n1",
                    "devices": ["CPU", "CPU", "CPU"],
                    "models": ["m"],
                    "quotas": [0.4, 0.3, 0.3],
                    "ports": [slow_port, free_port(), fast_port],
                },
                {
                    "id": "n2",
                    "devices": ["CPU"],
                    "models": ["lonely"],
                    "quotas": [1],
                    "ports": [slow_port],
                },
            ],
            backoff=60,
            cache={"max_entries": 0},
        )
        service = await start_service(doc)
        try:
            ports = service.addresses()
            async with AsyncClient(f"tcp://127.0.0.1:{ports['mip']['m']}", timeout=10) as c:
                for k in range(40):  # one at a time: every answer belongs to its request
                    (item,) = await c.infer_one(f"r{k}")
                    assert item.as_text() == f"F:R{k}"
            # both bad devices were tried once, then kept out of rotation
            assert service.router.backed_off() == ["n1/0/m", "n1/1/m"]
            assert service.dispatcher.resubmissions == 2
            # the only device of `lonely` times out: one failed answer, no second one
            async with AsyncClient(f"tcp://127.0.0.1:{ports['mip']['lonely']}", timeout=10) as c:
                reply = await c.request(mip.Inference.request([[mip.Item.text("z")]]))
                assert reply == mip.ErrorReply(int(mip.ErrorCode.INTERNAL))
                base = f"http://127.0.0.1:{ports['http']}"
                timeout = aiohttp.ClientTimeout(total=10)
                async with aiohttp.ClientSession(timeout=timeout) as http:
                    async with http.post(
                        f"{base}/v1/models/lonely:predict", json={"instances": ["z2"]}
                    ) as r:
                        assert r.status == 504
                        assert "no device answered" in (await r.json())["error"]
                    async with http.post(f"{base}/lonely/predict", json={"input": "z3"}) as r:
                        doc = await r.json()
                        assert doc["default"] is True and doc["output"] is None
                # late replies from the slow device are dropped, never delivered twice
                release.set()
                await asyncio.sleep(0.1)
                assert await c.ping() >= 0
            await service.store.flush()
            rows = store_rows(store)
            by_status = Counter((r.model, r.status) for r in rows)
            assert by_status == {("m", "ok"): 40, ("lonely", "failed"): 3}
            assert all(r.device == "n1/2/m" for r in rows if r.model == "m")
            assert sum(r.attempts for r in rows if r.model == "m") == 40 + 2
        finally:
            release.set()
            await stop_service(service, [slow, fast])

    run(main())


def test_backend_killed_mid_run_loses_no_request(tmp_path):
    store = tmp_path / "k.db"
    clients, per_client = 8, 60

    with (
        CliServer(handler="serve_handlers:tag_a") as a,
        CliServer(handler="serve_handlers:tag_b") as b,
    ):

        async def main():
            doc = deployment(
                store,
                {"m": {"timeout": 5, "attempts": 3}},
                [
                    {
                        "id": "n",
                        "devices": ["CPU", "CPU"],
                        "models": ["m"],
                        "quotas": [0.5, 0.5],
                        "ports": [
                            int(a.address.rsplit(":", 1)[1]),
                            int(b.address.rsplit(":", 1)[1]),
                        ],
                    }
                ],
                backoff=60,
                cache={"max_entries": 0},
                store={"path": str(store), "payloads": True},
            )
            service = await start_service(doc)
            answered = 0
            killed = asyncio.Event()
            answers: dict[str, str] = {}

            async def client(n):
                nonlocal answered
                address = f"tcp://127.0.0.1:{service.addresses()['mip']['m']}"
                async with AsyncClient(address, timeout=20) as c:
                    for k in range(per_client):
                        text = f"c{n}-{k}"
                        (item,) = await c.infer_one(text)
                        assert text not in answers
                        answers[text] = item.as_text()
                        answered += 1
                        if answered == 120:
                            a.proc.kill()  # SIGKILL: no goodbye to anyone
                            killed.set()

            try:
                await asyncio.gather(*(client(n) for n in range(clients)))
                assert killed.is_set()
                await service.store.flush()
                return answers, service.dispatcher.resubmissions, service.router.backed_off()
            finally:
                await service.stop()

        answers, resubmissions, backed_off = run(main())
        a.proc.communicate(timeout=TIMEOUT)  # reap the killed backend, close its pipes
    assert len(answers) == clients * per_client
    for text, answer in answers.items():
        tag, value = answer_of(answer)
        assert value == text.upper() and tag in ("A", "B")
    assert resubmissions >= 1
    assert backed_off == ["n/0/m"]
    stored = payload_inputs(store)
    assert set(stored) == set(answers)
    assert all(status == "ok" for status, _device, _t in stored.values())


@pytest.mark.parametrize("payloads", [True, False], ids=["payloads", "journal-lines"])
def test_dispatcher_kill9_keeps_every_completed_request(tmp_path, payloads):
    """With payloads, each completed request is found by its text; without (the MIP
    lane writes the journal lines itself), by the count of answered rows."""
    store = tmp_path / "crash.db"
    with CliServer(handler="serve_handlers:tag_fast") as backend:
        port = int(backend.address.rsplit(":", 1)[1])
        config = tmp_path / "deploy.json"
        config.write_text(
            json.dumps(
                deployment(
                    store,
                    {"m": {"timeout": 5}},
                    [
                        {
                            "id": "n",
                            "devices": ["CPU"],
                            "models": ["m"],
                            "quotas": [1],
                            "ports": [port],
                        }
                    ],
                    store={"path": str(store), "payloads": payloads},
                    cache={"max_entries": 0},
                )
            )
        )
        completed: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()
        errors: list[BaseException] = []

        with DispatcherProcess(config) as proc:
            address = proc.mip_address("m")

            def client(n: int) -> None:
                with Client(address, timeout=TIMEOUT) as c:
                    for k in range(100_000):
                        if stop.is_set():
                            return
                        text = f"c{n}-{k}"
                        try:
                            (item,) = c.infer_one(text)
                        except (ConnectionLost, OSError):
                            return  # the dispatcher is gone
                        except BaseException as exc:
                            errors.append(exc)
                            return
                        assert item.as_text() == f"F:{text.upper()}"
                        with lock:
                            completed.append(text)

            threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 30
            while len(completed) < 300 and time.monotonic() < deadline and not errors:
                time.sleep(0.01)
            proc.kill9()
            stop.set()
            for t in threads:
                t.join(TIMEOUT)
            assert not any(t.is_alive() for t in threads)
        assert not errors, errors
        assert len(completed) >= 300

        # restart: the journal is replayed, rows the crash left queued end lost,
        # and the service works again
        with DispatcherProcess(config) as proc, Client(proc.mip_address("m"), timeout=TIMEOUT) as c:
            assert c.infer_one("after")[0].as_text() == "F:AFTER"
        rows = store_rows(store)
        assert not [r for r in rows if r.status == "queued"]
        if not payloads:
            answered = [r for r in rows if r.status == "ok" and r.time_out is not None]
            assert len(answered) >= len(completed) + 1  # + "after"
            return
        after = payload_inputs(store)
        assert after["after"][0] == "ok"
        for text in completed:
            status, _device, t_out = after[text]
            assert status == "ok" and t_out is not None, text


def _http_json(url: str, method: str = "GET", headers: dict | None = None) -> dict:
    import urllib.request

    req = urllib.request.Request(url, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=TIMEOUT * 3) as resp:
        return json.loads(resp.read())


def _read_reply(sock: socket.socket) -> mip.Message:
    """One MIP message from ``sock`` (bounded by the socket's timeout)."""
    buf = b""
    while True:
        size = mip.frame_size(buf, 0) if len(buf) >= 12 else None
        if size is not None and len(buf) >= size:
            return mip.decode(buf[:size])
        chunk = sock.recv(65536)
        assert chunk, "the dispatcher closed the connection"
        buf += chunk


@pytest.mark.parametrize("twin", ["compiled", "pure"])
@pytest.mark.parametrize("path", ["lane", "general"])
def test_a_mip_client_gone_with_requests_in_flight_leaves_nothing_queued(tmp_path, path, twin):
    """Issue 26: a raw MIP client pipelines requests to a backend that holds them
    (``held_when_slow``: 3 s), then closes its connection.  Through the MIP lane and through
    the general path (adaptive batching: no lane), on both twins: the queue goes back to 0
    at once, every row ends (``abandoned``), and removing the model drains at once (its
    drain timeout, 2 s, is shorter than the backend's hold)."""
    n = 6
    store = tmp_path / "requests.db"
    model: dict = {"timeout": 30}
    if path == "general":
        model["max_batch"] = 8  # adaptive batching: the lane does not serve it
    with BackendProcess("serve_handlers:held_when_slow") as backend:
        doc = deployment(
            store,
            {"m": model},
            [
                {
                    "id": "n1",
                    "devices": ["CPU"],
                    "models": ["m"],
                    "quotas": [1],
                    "ports": [backend.port],
                }
            ],
            admin={"drain_timeout": 2},
            cache={"max_entries": 0},
        )
        env = {"WIREKIT_PURE": "1"} if twin == "pure" else {}
        with DispatcherProcess.of(doc, tmp_path, env=env) as proc:
            host, port = proc.mip_address("m")[len("tcp://") :].rsplit(":", 1)
            request = lambda text: mip.encode(  # noqa: E731
                mip.Inference.request([[mip.Item.text(text)]])
            )
            with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
                # one answered first: the backend connection is open, the lane sends on it
                sock.sendall(request("warm"))
                assert _read_reply(sock).items[0].as_text() == "H:WARM"
                sock.sendall(b"".join(request(f"slow{k}") for k in range(n)))
                until = time.monotonic() + TIMEOUT
                while _http_json(proc.http + "/stats")["models"]["m"]["requests"] < n + 1:
                    assert time.monotonic() < until, "the requests did not arrive"
                    time.sleep(0.02)
                stats = _http_json(proc.http + "/stats")
                assert stats["models"]["m"]["queue"] == n  # held by the backend
                if path == "lane":
                    assert stats["lane_requests"] >= n
                else:
                    assert stats["lane_requests"] == 0
            until = time.monotonic() + TIMEOUT
            while (stats := _http_json(proc.http + "/stats"))["queue"] != 0:
                assert time.monotonic() < until, f"still queued: {stats['models']['m']}"
                time.sleep(0.02)
            assert stats["models"]["m"]["statuses"] == {"ok": 1, "abandoned": n}
            removed = _http_json(proc.http + "/admin/models/m", "DELETE", proc.admin_headers)
            assert removed == {"removed": "m", "drained": True, "in_flight_at_timeout": 0}
    rows = store_rows(store)
    assert Counter(r.status for r in rows) == {"ok": 1, "abandoned": n}
    assert all(r.time_out is not None for r in rows)
