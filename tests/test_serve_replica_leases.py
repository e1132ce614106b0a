"""Replica leases on one PostgreSQL store (issue 26): a replica that dies leaves nothing in
flight.

Each replica renews a lease (a row of ``replica_leases``); once a replica's lease has
expired, the leader ends the replica's ``queued`` rows ``lost``.  In process, on a real
PostgreSQL: only expired leases are adopted, only by the leader, once; a replica that comes
back replays its journal over the rows the leader ended -- a journaled answer replaces
``lost``, nothing is counted twice.  Through real processes (``wirekit serve`` replicas, a
``wirekit mip serve`` backend, blocking MIP clients through the MIP lane and the general
path, both twins): a replica killed with ``kill -9`` and not restarted has its rows ended
``lost`` by the leader and they leave the survivor's ``/stats``; a replica killed again and
again at random moments, sometimes restarted at once and sometimes after the leader ended
its rows, leaves exactly one row in a final state for every request that reached the
backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from serve_handlers import RECEIVED_ENV
from serve_support import ROOT, TIMEOUT, BackendProcess, DispatcherProcess, deployment
from support.rows import rows_by_text
from support.rows import select as sql

from wirekit import mip
from wirekit.mip.client import Client
from wirekit.mip.runtime import ConnectionLost
from wirekit.serve.config import ConfigError, parse_config
from wirekit.serve.record.pgsync import LeaderLock, NotLeader, ReplicaLease, adopt_expired
from wirekit.serve.record.store import RequestStore
from wirekit.serve.record.storedb import LOST_REASON

#: the end states a row may have once nothing is in flight (``queued`` is not one)
FINAL = {"ok", "error", "failed", "abandoned", "lost"}
#: short leases, so that the tests wait seconds, not the default 10 s + 2 s
LEASE, PERIOD = 1.0, 0.25
#: the test that restarts a replica: a lease longer than a restart takes, so that a restart
#: "at once" comes before the leader's sweep
RESTART_LEASE, RESTART_PERIOD = 3.0, 0.5


def wait_until(predicate, what: str, limit: float = 20.0) -> None:
    """Call ``predicate()`` until it is true (AssertionError after ``limit`` seconds)."""
    until = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > until:
            raise AssertionError(f"not within {limit} s: {what}")
        time.sleep(0.02)


def rows_of(url: str, replica: str) -> dict[str, str]:
    """id -> status of the rows ``replica`` wrote."""
    return dict(sql(url, "SELECT id, status FROM requests WHERE replica = %s", (replica,)))


def new_store(tmp_path: Path, url: str, replica: str, lease: float) -> RequestStore:
    store = RequestStore(tmp_path / f"{replica}.db", url=url, replica=replica)
    store.lease = ReplicaLease(url, replica, lease=lease)
    return store


def test_only_the_leader_ends_only_the_expired_replicas_rows_and_once(tmp_path, pg_url):
    a = new_store(tmp_path, pg_url, "a", lease=0.3)
    b = new_store(tmp_path, pg_url, "b", lease=60.0)
    leader, other = LeaderLock(pg_url), LeaderLock(pg_url)

    async def arrive() -> None:
        a.arrival("a1", "m", "c", 1.0, 3)
        a.arrival("a2", "k", "c", 1.0, 3)
        b.arrival("b1", "m", "c", 1.0, 3)
        await a.flush()
        await b.flush()

    a.open()
    b.open()
    try:
        asyncio.run(arrive())
        assert leader.poll() and not other.poll()
        with pytest.raises(NotLeader):
            adopt_expired(other, "other")
        ended: list = []
        wait_until(lambda: ended.extend(adopt_expired(leader, "the-leader")) or ended, "adopted")
        assert sorted(ended) == [("a", "k", 1), ("a", "m", 1)]
        assert adopt_expired(leader, "the-leader") == []  # nothing ended twice
        assert rows_of(pg_url, "a") == {"a1": "lost", "a2": "lost"}
        assert rows_of(pg_url, "b") == {"b1": "queued"}  # its lease lives
        (reason, ended_at, expired_at) = sql(
            pg_url,
            "SELECT r.reason, r.time_out, EXTRACT(EPOCH FROM l.expires)::float8"
            " FROM requests r JOIN replica_leases l USING (replica) WHERE r.id = 'a1'",
        )[0]
        assert reason.startswith(f"{LOST_REASON}: its lease expired at ")
        assert reason.endswith(", ended by the-leader")
        assert ended_at >= expired_at  # never before the lease expired
        # replica a was alive after all (a pause longer than its lease): its next renewal
        # says so, and its answer replaces the leader's lost, reason and all
        assert a.lease.renew() == "it had expired"
        assert a.lease.lapses == 1
        assert a.lease.renew() is None

        async def answer() -> None:
            a.completion("a1", "n/0/m", 5.0, "ok", 1, model="m", client="c", time_in=1.0, size=3)
            await a.flush()

        asyncio.run(answer())
        assert sql(pg_url, "SELECT status, reason FROM requests WHERE id = 'a1'") == [("ok", None)]
        assert adopt_expired(leader, "the-leader") == []  # nothing of a is queued any more
    finally:
        a.close()
        b.close()
        for lock in (leader, other):
            lock.close()
        for store in (a, b):
            store.lease.close()


_DIES = """
import asyncio, os, sys
from wirekit.serve.record.pgsync import ReplicaLease
from wirekit.serve.record.store import RequestStore

path, url = sys.argv[1], sys.argv[2]
store = RequestStore(path, url=url, replica="a", flush_interval=60)
store.lease = ReplicaLease(url, "a", lease=0.3)
store.open()

async def run():
    for rid in ("a1", "a2", "a3"):
        store.arrival(rid, "m", "c", 1.0, 3)
    await store.flush()  # in the store, queued
    store.arrival("a4", "m", "c", 2.0, 3)  # journaled only
    store.completion("a2", "n/0/m", 3.0, "ok", 1, model="m", client="c", time_in=1.0, size=3)

asyncio.run(run())
os._exit(0)  # as a kill -9: nothing more is written
"""


def test_a_replica_back_after_the_leader_ended_its_rows_counts_nothing_twice(tmp_path, pg_url):
    """The leader ended a dead replica's queued rows lost; the replica then restarts with
    the same store.path: its journaled answer replaces lost (the answer wins), its arrival
    records leave the leader's rows alone, the arrival the store never got is inserted and
    ended lost by the replica -- one row per request, each ended once."""
    path = tmp_path / "a.db"
    done = subprocess.run(
        [sys.executable, "-c", _DIES, str(path), pg_url],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0, done.stderr
    assert rows_of(pg_url, "a") == {"a1": "queued", "a2": "queued", "a3": "queued"}
    leader = LeaderLock(pg_url)
    try:
        assert leader.poll()
        ended: list = []
        wait_until(lambda: ended.extend(adopt_expired(leader, "b")) or ended, "adopted")
        assert ended == [("a", "m", 3)]
    finally:
        leader.close()
    adopted = dict(sql(pg_url, "SELECT id, reason FROM requests"))
    again = new_store(tmp_path, pg_url, "a", lease=60.0)
    again.open()
    again.close()
    again.lease.close()
    assert again.replayed_at_open == 1  # a2's answer
    assert (again.lost_at_open, again.lost_by_model) == (1, {"m": 1})  # a4 only
    rows = sql(pg_url, "SELECT id, status, time_out, reason FROM requests ORDER BY id")
    assert [r[0] for r in rows] == ["a1", "a2", "a3", "a4"]  # one row each
    by_id = {r[0]: r[1:] for r in rows}
    assert by_id["a1"] == ("lost", by_id["a1"][1], adopted["a1"])  # the leader's end kept
    assert by_id["a3"] == ("lost", by_id["a3"][1], adopted["a3"])
    assert by_id["a2"] == ("ok", 3.0, None)  # its answer, without the leader's reason
    assert by_id["a4"][0] == "lost" and by_id["a4"][2] == LOST_REASON


def test_the_lease_period_is_below_the_lease(tmp_path):
    def store_of(**keys):
        node = {"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1.0], "ports": [1]}
        doc = deployment(tmp_path / "s.db", {"m": {}}, [node])
        doc["store"].update(keys)
        return parse_config(doc).store

    url = "postgresql://h/db"
    with pytest.raises(ConfigError, match=r"store\.lease_period.*must be below store\.lease"):
        store_of(url=url, lease=1.0, lease_period=1.0)
    with pytest.raises(ConfigError, match=r"store\.lease: must be > 0"):
        store_of(url=url, lease=0)
    assert (store_of(url=url, lease=1.0).lease_period) == 0.5  # half a short lease
    assert (store_of().lease, store_of().lease_period) == (10.0, 2.0)


# -- through real processes -------------------------------------------------------------

MODELS = ("lane", "general")  # no batching: the MIP lane; max_batch 4: the general path


def replica_doc(
    tmp_path: Path, name: str, url: str, port: int, lease: float = LEASE, period: float = PERIOD
) -> Path:
    """The config of replica ``name``: both models on the backend at ``port``, the shared
    store with short leases, payloads kept (a row's request text is read back)."""
    store = tmp_path / f"{name}.db"
    doc = deployment(
        store,
        {"lane": {"timeout": 10}, "general": {"timeout": 10, "max_batch": 4}},
        [
            {
                "id": "n",
                "devices": ["CPU"],
                "models": list(MODELS),
                "quotas": [0.5, 0.5],
                "ports": [port, port],
            }
        ],
        store={
            "path": str(store),
            "url": url,
            "replica": name,
            "payloads": True,
            "flush_interval": 0.02,
            "lease": lease,
            "lease_period": period,
        },
        cache={"max_entries": 0},
    )
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps(doc))
    return config


def in_flight_at_backend(url: str, replica: str, received: Path) -> bool:
    """Whether the store has a queued row of ``replica`` whose request reached the backend
    (so that a kill now leaves one the leader must end)."""
    sent = set(received_lines(received))
    rows = sql(
        url, "SELECT payload FROM requests WHERE replica = %s AND status = 'queued'", (replica,)
    )
    return any(mip.decode(bytes(p)).items[0].as_text() in sent for (p,) in rows)


def received_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=TIMEOUT) as resp:
        return json.loads(resp.read())


def lost_in_metrics(base: str) -> float:
    """``wirekit_serve_requests_total{state="lost"}`` summed over models and devices."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{base}/metrics", timeout=TIMEOUT) as resp:
        text = resp.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "wirekit_serve_requests_total" and s.labels.get("state") == "lost"
    )


class Load:
    """Blocking MIP clients sending ``<prefix>-<k>`` to some models of a replica, each
    until its replica is gone or :meth:`stop`."""

    def __init__(self, proc: DispatcherProcess, prefix: str, clients: int) -> None:
        self.stop_event = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._run, args=(proc.mip_address(m), f"{prefix}-{m}-{n}"))
            for m in MODELS
            for n in range(clients)
        ]
        for t in self.threads:
            t.start()

    def _run(self, address: str, prefix: str) -> None:
        try:
            with Client(address, timeout=TIMEOUT) as client:
                for k in range(100_000):
                    if self.stop_event.is_set():
                        return
                    client.infer_one(f"{prefix}-{k}")
        except (ConnectionLost, OSError):
            return  # its replica was killed
        except BaseException as exc:  # anything else fails the test
            self.errors.append(exc)

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(TIMEOUT)
        assert not any(t.is_alive() for t in self.threads)
        assert not self.errors, self.errors


@contextlib.contextmanager
def started(*procs: DispatcherProcess) -> Iterator[None]:
    """``procs`` started at once (each start is mostly the interpreter's: in parallel they
    take half the time), stopped on leaving."""
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(len(procs)) as pool:
        futures = [pool.submit(proc.__enter__) for proc in procs]
        for proc, future in zip(procs, futures, strict=True):
            try:
                future.result(timeout=TIMEOUT * 6)
            finally:
                stack.push(proc.__exit__)
        yield


def twin(monkeypatch, pure: bool) -> None:
    if pure:
        monkeypatch.setenv("WIREKIT_PURE", "1")
    else:
        monkeypatch.delenv("WIREKIT_PURE", raising=False)


def kill_in_flight(proc: DispatcherProcess, url: str, received: Path, rng: random.Random) -> None:
    """``kill -9`` of replica ``a`` at a random moment under load, once the store holds a
    queued row of it whose request is at the backend."""
    time.sleep(rng.uniform(0.2, 0.8))
    wait_until(lambda: in_flight_at_backend(url, "a", received), "a request of a at the backend")
    proc.kill9()


@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure"])
def test_a_dead_replica_that_does_not_come_back_has_its_rows_ended_lost(
    tmp_path, monkeypatch, pg_url, pure
):
    twin(monkeypatch, pure)
    received = tmp_path / "received.txt"
    monkeypatch.setenv(RECEIVED_ENV, str(received))
    with BackendProcess("serve_handlers:record_slow") as backend:
        b_cfg = replica_doc(tmp_path, "b", pg_url, backend.port)
        a_cfg = replica_doc(tmp_path, "a", pg_url, backend.port)
        b, a = DispatcherProcess(b_cfg), DispatcherProcess(a_cfg)
        with started(b, a):
            load = Load(a, "a", clients=3)
            kill_in_flight(a, pg_url, received, random.Random())
            load.stop()
            # the survivor's /stats counts the dead replica's requests in the queue...
            assert get_json(f"{b.http}/stats")["queue"] >= 1
            # ...until its lease has expired and the leader (b: the only one left) ended them
            wait_until(lambda: "queued" not in rows_of(pg_url, "a").values(), "a's rows ended")
            stats = get_json(f"{b.http}/stats")
            with Client(b.mip_address("lane"), timeout=TIMEOUT) as client:
                assert client.infer_one("still")[0].as_text() == "R:STILL"  # b serves on
            lost_counted = lost_in_metrics(b.http)
    rows = rows_by_text(pg_url, "status, reason, replica")
    lost = {t: r for t, r in rows.items() if r[0][0] == "lost"}
    assert lost, "no request of a was in flight"
    assert all(len(r) == 1 and r[0][2] == "a" for r in lost.values())
    assert stats["queue"] == 0
    assert sum(m["statuses"].get("lost", 0) for m in stats["models"].values()) == len(lost)
    assert lost_counted == len(lost)  # the leader counted what it ended
    (expired_at,) = sql(
        pg_url, "SELECT EXTRACT(EPOCH FROM expires)::float8 FROM replica_leases WHERE replica = 'a'"
    )[0]
    ended = sql(pg_url, "SELECT time_out, reason FROM requests WHERE status = 'lost'")
    for ended_at, reason in ended:
        assert ended_at >= expired_at  # never before the lease expired
        assert reason.startswith(f"{LOST_REASON}: its lease expired at ")
    # what the bound (lease + one period) is checked against, for the record: -rs shows it
    late = max(ended_at - expired_at for ended_at, _ in ended)
    print(f"ended {late:.3f} s after the lease expired (period {PERIOD} s)")


KILLS = 3


@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure"])
def test_a_replica_killed_again_and_again_leaves_one_final_row_per_request(
    tmp_path, monkeypatch, pg_url, pure
):
    """Replica a killed with ``kill -9`` at random moments under load, ``KILLS`` times: once
    restarted at once (its replay first), once after the leader ended its rows ``lost``
    (the leader first), then as chance has it; b serves throughout."""
    twin(monkeypatch, pure)
    received = tmp_path / "received.txt"
    monkeypatch.setenv(RECEIVED_ENV, str(received))
    rng = random.Random()
    orders = ["replay first", "leader first"] + [
        rng.choice(["replay first", "leader first"]) for _ in range(KILLS - 2)
    ]
    with BackendProcess("serve_handlers:record_slow") as backend:
        b_cfg = replica_doc(tmp_path, "b", pg_url, backend.port, RESTART_LEASE, RESTART_PERIOD)
        a_cfg = replica_doc(tmp_path, "a", pg_url, backend.port, RESTART_LEASE, RESTART_PERIOD)
        b, a = DispatcherProcess(b_cfg), DispatcherProcess(a_cfg)
        with started(b, a):
            load_b = Load(b, "b", clients=1)
            for kill, order in enumerate(orders):
                with contextlib.ExitStack() as this_round:
                    if kill:  # a restarts (the first one started with b)
                        a = this_round.enter_context(DispatcherProcess(a_cfg))
                    load_a = Load(a, f"a{kill}", clients=2)
                    kill_in_flight(a, pg_url, received, rng)
                    load_a.stop()
                if order == "leader first":
                    wait_until(
                        lambda: "queued" not in rows_of(pg_url, "a").values(), "a's rows ended"
                    )
            with (
                DispatcherProcess(a_cfg) as a,
                Client(a.mip_address("lane"), timeout=TIMEOUT) as client,
            ):
                assert client.infer_one("after")[0].as_text() == "R:AFTER"
            load_b.stop()
    sent = received_lines(received)
    rows = rows_by_text(pg_url, "status, reason, replica")
    for kill in range(KILLS):
        assert any(text.startswith(f"a{kill}-") for text in sent), f"round {kill} sent nothing"
    missing = [text for text in sent if text not in rows]
    assert not missing, f"{len(missing)} of {len(sent)} requests at the backend have no row"
    twice = {text: rows[text] for text in sent if len(rows[text]) != 1}
    assert not twice, twice
    unfinished = {text: rows[text] for text in rows if rows[text][0][0] not in FINAL}
    assert not unfinished, unfinished
    assert any(r[0][0] == "lost" for r in rows.values())
    # who ended them, for the record (-rs shows it): the leader, or a's replay
    by_leader = sum(1 for r in rows.values() if "its lease expired" in (r[0][1] or ""))
    by_replay = sum(1 for r in rows.values() if r[0][1] == LOST_REASON)
    print(f"orders {orders}: {by_leader} ended lost by the leader, {by_replay} by a's replay")
    assert all(r[0][0] == "ok" for t, r in rows.items() if t.startswith("b-"))  # b's answered
