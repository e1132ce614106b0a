"""``kill -9`` of the dispatcher while requests are at the backend: after the restart with
the same store, every request that reached the backend has exactly one row, in a final
state (issue 26: an arrival is journaled before the request leaves the dispatcher).

Real processes throughout: a ``wirekit mip serve`` backend that writes each input it
receives to a file and holds it a while (``serve_handlers:record_slow``), ``wirekit serve``
killed with SIGKILL at a random moment just after the backend received a request, and
blocking clients on every way in at once: MIP clients through the MIP lane (a model without
batching), through adaptive batching (``max_batch`` 4) and through the dispatcher's general
path (a model whose backend takes one request at a time, which the lane does not serve), and
HTTP clients through the HTTP door (``POST /v1/models/lane:predict``).  The arrivals of the
general path and the HTTP door are journaled a loop pass at a time (group commit).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from serve_handlers import JOURNAL_ENV, RECEIVED_ENV
from serve_support import TIMEOUT, BackendProcess, DispatcherProcess, deployment
from support.rows import rows_by_text

from wirekit.mip.client import Client
from wirekit.mip.runtime import ConnectionLost
from wirekit.serve.record.replay import journal_files

#: the end states a row may have after the restart (``queued`` is not one)
FINAL = {"ok", "error", "failed", "abandoned", "lost"}
#: the MIP front doors: the lane (no batching), adaptive batching (max_batch 4), and the
#: general path (a one-at-a-time backend: the lane does not serve it)
MODELS = ("lane", "batching", "one")
#: every way in a client takes: (name, kind, model)
LOADS = (*((m, "mip", m) for m in MODELS), ("http", "http", "lane"))
CLIENTS_PER_LOAD = 3
KILLS = 3


def received_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _http_load(
    address: str,
    model: str,
    prefix: str,
    stop: threading.Event,
    errors: list[BaseException],
    tag: str = "R",
    count: int = 100_000,
) -> None:
    """One blocking HTTP client (a keep-alive connection) sending ``<prefix>-<k>`` to the
    HTTP door (``count`` times, or until the dispatcher is gone), each answer checked
    (``<tag>:<INPUT UPPERCASED>``)."""
    host, port = address.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    try:
        for k in range(count):
            if stop.is_set():
                return
            text = f"{prefix}-{k}"
            try:
                conn.request(
                    "POST",
                    f"/v1/models/{model}:predict",
                    json.dumps({"inputs": [[text]]}),
                    {"Content-Type": "application/json"},
                )
                resp = conn.getresponse()
                doc = json.loads(resp.read())
            except (http.client.HTTPException, OSError):
                return  # killed
            assert (resp.status, doc["outputs"]) == (200, [[f"{tag}:{text.upper()}"]]), doc
    except BaseException as exc:  # anything else is a failure of the test
        errors.append(exc)
    finally:
        conn.close()


def _load(
    address: str,
    prefix: str,
    stop: threading.Event,
    errors: list[BaseException],
    tag: str = "R",
    count: int = 100_000,
) -> None:
    """One blocking MIP client sending ``<prefix>-<k>`` (``count`` times, or until the
    dispatcher is gone), each answer checked (``<tag>:<INPUT UPPERCASED>``)."""
    try:
        with Client(address, timeout=TIMEOUT) as client:
            for k in range(count):
                if stop.is_set():
                    return
                text = f"{prefix}-{k}"
                try:
                    (item,) = client.infer_one(text)
                except (ConnectionLost, OSError):
                    return  # killed
                assert item.as_text() == f"{tag}:{text.upper()}", item.as_text()
    except (ConnectionLost, OSError):
        return
    except BaseException as exc:  # anything else is a failure of the test
        errors.append(exc)


def _deployment(store: Path, port: int) -> dict:
    """The three MIP models of :data:`MODELS` on one backend at ``port``, payloads stored
    (the journal's arrival records carry the request), the cache off."""
    return deployment(
        store,
        {
            "lane": {"timeout": 10},
            "batching": {"timeout": 10, "max_batch": 4},
            "one": {"timeout": 10, "backend": "kubemo"},
        },
        [
            {
                "id": "n",
                "devices": ["CPU"],
                "models": list(MODELS),
                "quotas": [0.4, 0.3, 0.3],
                "ports": [port] * len(MODELS),
            }
        ],
        store={"path": str(store), "payloads": True},
        cache={"max_entries": 0},
    )


def _clients(
    proc: DispatcherProcess, prefix: str, stop, errors, only: str = "", **kw
) -> list[threading.Thread]:
    """:data:`CLIENTS_PER_LOAD` client threads (not started) for each of :data:`LOADS` (or
    for the one named ``only``)."""
    return [
        threading.Thread(
            target=_load,
            args=(proc.mip_address(model), f"{prefix}-{name}-{n}", stop, errors),
            kwargs=kw,
        )
        if kind == "mip"
        else threading.Thread(
            target=_http_load,
            args=(proc.http, model, f"{prefix}-{name}-{n}", stop, errors),
            kwargs=kw,
        )
        for name, kind, model in LOADS
        if name == only or not only
        for n in range(CLIENTS_PER_LOAD)
    ]


def _twin(monkeypatch, pure: bool) -> None:
    if pure:
        monkeypatch.setenv("WIREKIT_PURE", "1")
    else:
        monkeypatch.delenv("WIREKIT_PURE", raising=False)


@pytest.mark.parametrize("load", [name for name, _kind, _model in LOADS])
@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure"])
def test_every_arrival_is_journaled_before_it_reaches_the_backend(
    tmp_path, monkeypatch, pure, load
):
    """The backend reads the dispatcher's journal as each request reaches it: the request's
    arrival record is already there, on each way in (the lane, batching, the general path,
    the HTTP door) -- one at a time, so that no other traffic writes the journal meanwhile
    -- with several clients, so that arrivals share loop passes."""
    _twin(monkeypatch, pure)
    store = tmp_path / "seen.db"
    monkeypatch.setenv(JOURNAL_ENV, str(store))
    stop = threading.Event()
    errors: list[BaseException] = []
    with (
        BackendProcess("serve_handlers:journal_seen") as backend,
        DispatcherProcess.of(_deployment(store, backend.port), tmp_path) as proc,
    ):
        threads = _clients(proc, "j", stop, errors, tag="J", count=25, only=load)
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT * 3)
        stop.set()
        assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:3]


@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure"])
def test_kill9_keeps_every_request_that_reached_the_backend(tmp_path, monkeypatch, pure):
    _twin(monkeypatch, pure)
    received = tmp_path / "received.txt"
    monkeypatch.setenv(RECEIVED_ENV, str(received))
    store = tmp_path / "crash.db"
    rng = random.Random()
    with BackendProcess("serve_handlers:record_slow") as backend:
        doc = _deployment(store, backend.port)
        for kill in range(KILLS):
            stop = threading.Event()
            errors: list[BaseException] = []
            with DispatcherProcess.of(doc, tmp_path) as proc:
                threads = _clients(proc, f"k{kill}", stop, errors)
                for t in threads:
                    t.start()
                # a random moment under load, then the first request the backend receives
                # after it: killed while that one (at least) is at the backend
                time.sleep(rng.uniform(0.4, 1.5))
                seen = len(received_lines(received))
                deadline = time.monotonic() + TIMEOUT
                while len(received_lines(received)) == seen and time.monotonic() < deadline:
                    time.sleep(0.001)
                proc.kill9()
                stop.set()
                for t in threads:
                    t.join(TIMEOUT)
                assert not any(t.is_alive() for t in threads)
                assert not errors, errors
        # the backend finishes what it read; then the restart replays the journals
        time.sleep(0.5)
        with (
            DispatcherProcess.of(doc, tmp_path) as proc,
            Client(proc.mip_address("lane"), timeout=TIMEOUT) as client,
        ):
            assert client.infer_one("after")[0].as_text() == "R:AFTER"
    sent = received_lines(received)
    assert sent, "nothing reached the backend"
    for name, _kind, _model in LOADS:
        assert any(f"-{name}-" in text for text in sent), f"no request of {name} was sent"
    rows = rows_by_text(store, "status, reason")
    missing = [text for text in sent if text not in rows]
    assert not missing, f"{len(missing)} of {len(sent)} requests at the backend have no row"
    twice = {text: rows[text] for text in sent if len(rows[text]) != 1}
    assert not twice, twice
    unfinished = {text: rows[text] for text in sent if rows[text][0][0] not in FINAL}
    assert not unfinished, unfinished
    # those the dying dispatcher had not answered are lost (not abandoned: their clients
    # did not go away), and say why
    assert any(rows[text][0][0] == "lost" for text in sent), "no request was in flight"
    for text in sent:
        status, reason = rows[text][0]
        assert status != "abandoned", text
        if status == "lost":
            assert reason == "the dispatcher stopped before answering", (text, reason)


def serve_stats(store: Path) -> tuple[dict, str]:
    """``wirekit serve stats --store STORE --json``: the figures, and what it said on stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "wirekit", "serve", "stats", "--store", str(store), "--json"],
        capture_output=True, text=True, timeout=TIMEOUT,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_stats_right_after_a_kill9_counts_the_journaled_answers(tmp_path):
    # the answers a killed dispatcher had journaled but not yet written to the store file:
    # `serve stats --store` counted them only after the next start had replayed them
    store = tmp_path / "requests.db"
    with BackendProcess("wirekit.mip.runtime:echo") as backend:
        doc = deployment(
            store,
            {"m": {}},
            [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1],
              "ports": [backend.port]}],
            # written to the file at most every minute: the answers stay in the journal
            store={"path": str(store), "flush_interval": 60},
            cache={"max_entries": 0},
        )  # fmt: skip
        with DispatcherProcess.of(doc, tmp_path) as proc:
            with Client(proc.mip_address("m"), timeout=TIMEOUT) as client:
                for k in range(5):
                    assert client.infer_one(f"q{k}")[0].as_text() == f"q{k}"
            (journal,) = journal_files(store)
            # a data file: not executable, the store file's own mode
            assert journal.stat().st_mode & 0o777 == store.stat().st_mode & 0o777
            assert not journal.stat().st_mode & 0o111
            proc.kill9()
        before = {p: p.read_bytes() for p in [store, *journal_files(store)]}
        stats, said = serve_stats(store)
        assert stats["models"]["m"]["requests"] == 5
        assert stats["models"]["m"]["response_time"]["count"] == 5
        assert stats["queue"] == 0
        assert "5 answered request(s) counted from the store's journal" in said
        # read only: neither the store file nor a journal changed
        assert {p: p.read_bytes() for p in before} == before
        assert journal_files(store) == list(before)[1:]
        # the restart writes them; counted once, and nothing more is said
        with DispatcherProcess.of(doc, tmp_path) as proc:
            assert proc.stop() == 0
        stats, said = serve_stats(store)
        assert stats["models"]["m"]["requests"] == 5
        assert stats["models"]["m"]["response_time"]["count"] == 5
        assert said == ""
