"""``kill -9`` of the dispatcher while requests are at the backend: after the restart with
the same store, every request that reached the backend has exactly one row, in a final
state (issue 26: an arrival is journaled before the request leaves the dispatcher).

Real processes throughout: a ``wirekit mip serve`` backend that writes each input it
receives to a file and holds it a while (``serve_handlers:record_slow``), ``wirekit serve``
killed with SIGKILL at a random moment just after the backend received a request, and
blocking MIP clients -- through the MIP lane (a model without batching) and through the
dispatcher's general path (a model with adaptive batching) at once.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from serve_handlers import RECEIVED_ENV
from serve_support import TIMEOUT, BackendProcess, DispatcherProcess, deployment

from wirekit import mip
from wirekit.mip.client import Client
from wirekit.mip.runtime import ConnectionLost
from wirekit.serve.record.store import connect, journal_files

#: the end states a row may have after the restart (``queued`` is not one)
FINAL = {"ok", "error", "failed", "abandoned"}
MODELS = ("lane", "general")  # no batching: the MIP lane; max_batch 4: the general path
CLIENTS_PER_MODEL = 3
KILLS = 3


def rows_by_input(store: Path) -> dict[str, list[tuple[str, str | None]]]:
    """request text -> [(status, reason)] of every row (a list: a text stored twice shows)."""
    conn = connect(store, readonly=True)
    try:
        out: dict[str, list[tuple[str, str | None]]] = {}
        for payload, status, reason in conn.execute("SELECT payload, status, reason FROM requests"):
            text = mip.decode(payload).items[0].as_text()
            out.setdefault(text, []).append((status, reason))
        return out
    finally:
        conn.close()


def received_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _load(address: str, prefix: str, stop: threading.Event, errors: list[BaseException]) -> None:
    """One blocking client sending ``<prefix>-<k>`` until the dispatcher is gone."""
    try:
        with Client(address, timeout=TIMEOUT) as client:
            for k in range(100_000):
                if stop.is_set():
                    return
                try:
                    client.infer_one(f"{prefix}-{k}")
                except (ConnectionLost, OSError):
                    return  # killed
    except (ConnectionLost, OSError):
        return
    except BaseException as exc:  # anything else is a failure of the test
        errors.append(exc)


@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure"])
def test_kill9_keeps_every_request_that_reached_the_backend(tmp_path, monkeypatch, pure):
    if pure:
        monkeypatch.setenv("WIREKIT_PURE", "1")
    else:
        monkeypatch.delenv("WIREKIT_PURE", raising=False)
    received = tmp_path / "received.txt"
    monkeypatch.setenv(RECEIVED_ENV, str(received))
    store = tmp_path / "crash.db"
    rng = random.Random()
    with BackendProcess("serve_handlers:record_slow") as backend:
        doc = deployment(
            store,
            {"lane": {"timeout": 10}, "general": {"timeout": 10, "max_batch": 4}},
            [
                {
                    "id": "n",
                    "devices": ["CPU"],
                    "models": list(MODELS),
                    "quotas": [0.5, 0.5],
                    "ports": [backend.port, backend.port],
                }
            ],
            store={"path": str(store), "payloads": True},
            cache={"max_entries": 0},
        )
        for kill in range(KILLS):
            stop = threading.Event()
            errors: list[BaseException] = []
            with DispatcherProcess.of(doc, tmp_path) as proc:
                threads = [
                    threading.Thread(
                        target=_load,
                        args=(proc.mip_address(model), f"k{kill}-{model}-{n}", stop, errors),
                    )
                    for model in MODELS
                    for n in range(CLIENTS_PER_MODEL)
                ]
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
    for model in MODELS:
        assert any(f"-{model}-" in text for text in sent), f"no request of {model} was sent"
    rows = rows_by_input(store)
    missing = [text for text in sent if text not in rows]
    assert not missing, f"{len(missing)} of {len(sent)} requests at the backend have no row"
    twice = {text: rows[text] for text in sent if len(rows[text]) != 1}
    assert not twice, twice
    unfinished = {text: rows[text] for text in sent if rows[text][0][0] not in FINAL}
    assert not unfinished, unfinished
    # those the dying dispatcher had not answered are abandoned, and say why
    for text in sent:
        status, reason = rows[text][0]
        if status == "abandoned":
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
