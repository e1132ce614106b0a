"""Replicas on one PostgreSQL store under real faults (issue 38 item 1): the lead is a lease.

In process, on a real PostgreSQL: a stale term is refused and writes nothing, a leader that
stops renewing steps down before its lease expires on the server, and the sweep never ends
the sweeper's own rows.  Through real processes (``wirekit serve`` replicas, a ``wirekit
mip serve`` backend, real PostgreSQL, SIGSTOP/SIGCONT, ``kill -9``):

* a leader paused past its lease is replaced within lease + period, its queued rows end
  ``lost`` (by the new leader) within lease + period, and once it resumes it does nothing a
  leader does: it does not lead, it ends no row ``lost`` (its own least of all), and its
  ``/metrics`` count each of its requests once (on main it kept the lead -- a session-level
  advisory lock that a stopped process keeps --, nobody swept, and on resuming it swept its
  own live requests, counting them twice);
* several pause/resume and kill/restart cycles of leader and follower at random moments
  (seeded, the seed printed) under a light load: at every sampled moment at most one
  replica acts as leader (the one holding the ``leadership`` row's term), every request
  that reached the backend has exactly one final row once the cluster settles, no
  replica's series count a request twice, and a replica paused past lease + period has
  no row left ``queued``.

The leadership code is the same on both twins (no compiled twin): these run on the
compiled suite only; the event loop varies (asyncio and uvloop).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from serve_handlers import RECEIVED_ENV
from serve_support import TIMEOUT, BackendProcess, DispatcherProcess, deployment
from support.loops import LOOPS
from support.rows import rows_by_text
from support.rows import select as sql

from wirekit.mip.client import Client
from wirekit.mip.runtime import ConnectionLost

pytestmark = pytest.mark.skipif(
    os.environ.get("WIREKIT_PURE") == "1",
    reason="the leadership code has no compiled twin: run on the compiled suite only",
)

FINAL = {"ok", "error", "failed", "abandoned", "lost"}
#: the regression's lease and period (the issue's: 3 s, 1 s)
LEASE, PERIOD = 3.0, 1.0
#: what the sweep and the takeover take beyond the bound (a poll's own time, on a busy
#: machine): checked against the server's times, printed
SLACK = 0.75


def wait_until(predicate, what: str, limit: float = 30.0, step: float = 0.05) -> float:
    """Call ``predicate()`` until true; the seconds it took (AssertionError past ``limit``)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > limit:
            raise AssertionError(f"not within {limit} s: {what}")
        time.sleep(step)
    return time.monotonic() - start


def replica_config(
    tmp_path: Path, name: str, url: str, port: int, lease: float, period: float
) -> Path:
    store = tmp_path / f"{name}.db"
    doc = deployment(
        store,
        {"m": {"timeout": 60}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1.0], "ports": [port]}],
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


def get_json(url: str, timeout: float = TIMEOUT) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def requests_total(base: str) -> dict[str, float]:
    """``wirekit_serve_requests_total`` of a replica's ``/metrics``, summed per state."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{base}/metrics", timeout=TIMEOUT) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "wirekit_serve_requests_total":
                out[s.labels["state"]] = out.get(s.labels["state"], 0.0) + s.value
    return out


def leading(proc: DispatcherProcess, timeout: float = TIMEOUT) -> tuple[bool, int | None]:
    """A replica's own view of the lead (``/stats``' ``leader``)."""
    view = get_json(f"{proc.http}/stats", timeout)["leader"]
    return bool(view["leading"]), view["term"]


def leadership_row(url: str) -> tuple[str, int, float, float, bool] | None:
    """``(holder, term, renewed, expires, unexpired)`` of the leader's lease (server times
    as epoch seconds)."""
    rows = sql(
        url,
        "SELECT holder, term, EXTRACT(EPOCH FROM renewed)::float8,"
        " EXTRACT(EPOCH FROM expires)::float8, expires > now() FROM leadership",
    )
    return rows[0] if rows else None


def ended_at_start(url: str, replica: str, since: float) -> int:
    """The rows of ``replica`` its own start (at ``since`` or later) ended ``lost``: what its
    previous run left queued (the reason of an end at start)."""
    from wirekit.serve.record.storedb import LOST_REASON

    return int(
        sql(
            url,
            "SELECT COUNT(*) FROM requests WHERE replica = %s AND status = 'lost'"
            " AND reason = %s AND time_out >= %s",
            (replica, LOST_REASON, since),
        )[0][0]
    )


def holder_pid(holder: str) -> int:
    """The process id in a ``leadership.holder`` (``<name> <host>#<pid>-<tag>``)."""
    return int(holder.rsplit("#", 1)[1].split("-", 1)[0])


def holder_replica(holder: str) -> str:
    """The replica name in a ``leadership.holder``."""
    return holder.split(" ")[2].split("#")[0]


def leader_name(url: str) -> str | None:
    """The replica that holds the lead, read from the store (on a wirekit before issue 38,
    which has no ``leadership`` table: the holder of the advisory lock, by its session's
    name -- so that this test fails there where it should, not on a missing key)."""
    import psycopg

    try:
        row = leadership_row(url)
    except psycopg.errors.UndefinedTable:
        names = sql(
            url,
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND l.granted"
            " AND a.application_name LIKE 'wirekit leader %%'",
        )
        return names[0][0].split(" ")[2].split("#")[0] if names else None
    return holder_replica(row[0]) if row is not None and row[4] else None


def term_now(url: str) -> int:
    """The leadership row's term (0: none, or a wirekit before issue 38)."""
    import psycopg

    try:
        row = leadership_row(url)
    except psycopg.errors.UndefinedTable:
        return 0
    return 0 if row is None else int(row[1])


def queued_of(url: str, replica: str) -> int:
    return int(
        sql(
            url,
            "SELECT COUNT(*) FROM requests WHERE replica = %s AND status = 'queued'",
            (replica,),
        )[0][0]
    )


@contextlib.contextmanager
def started(*procs: DispatcherProcess) -> Iterator[None]:
    """``procs`` started at once, stopped on leaving (continued first if stopped)."""
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(len(procs)) as pool:
        futures = [pool.submit(proc.__enter__) for proc in procs]
        for proc, future in zip(procs, futures, strict=True):
            try:
                future.result(timeout=TIMEOUT * 6)
            finally:
                stack.callback(proc.__exit__, None, None, None)
                stack.callback(resume, proc)
        yield


def resume(proc: DispatcherProcess) -> None:
    if proc.proc is not None and proc.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.proc.pid, signal.SIGCONT)


def lost_by_log(proc: DispatcherProcess) -> dict[str, int]:
    """replica -> requests this process logged it ended ``lost`` as the leader."""
    out: dict[str, int] = {}
    for line in list(proc.log_lines):
        if "lease expired:" in line and "ended lost" in line:
            who = line.split("replica ", 1)[1].split("'s lease expired", 1)[0]
            n = int(line.split("lease expired: ", 1)[1].split(" ", 1)[0])
            out[who] = out.get(who, 0) + n
    return out


# -- the lease, in process --------------------------------------------------------------


def test_a_stale_term_is_refused_and_writes_nothing_a_leader_steps_down_before_expiry(pg_url):
    """The fence: a leader whose lease expired and was taken over (as when paused) cannot
    write under its old term -- :class:`NotLeader`, nothing written -- and it stopped
    claiming the lead at its local deadline, before the server's expiry."""
    import psycopg

    from wirekit.serve.record.pgsync import LeaderLock, NotLeader

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE acts (who TEXT NOT NULL, term BIGINT NOT NULL)")
    a = LeaderLock(pg_url, lease=1.0, period=0.25, name="a")
    b = LeaderLock(pg_url, lease=1.0, period=0.25, name="b")
    try:
        assert a.poll() and not b.poll()
        term = a.term
        assert term is not None
        a.execute("INSERT INTO acts VALUES ('a', %s)", (term,))
        # a stops renewing (paused): its own view ends at its deadline, before the server's
        # expiry (one machine: the wall clock is the server's)
        step_down = time.time() + (a._deadline - time.monotonic())
        holder, _, renewed, expires, _ = leadership_row(pg_url) or ("", 0, 0.0, 0.0, False)
        assert holder == a.holder and step_down < expires
        print(f"a steps down {step_down - renewed:.2f} s after its renewal (lease 1 s)")
        wait_until(lambda: not a.leader, "a steps down", limit=5, step=0.01)
        wait_until(b.poll, "b takes over", limit=5, step=0.05)
        assert b.term == term + 1
        # as a leader resumed from a pause: its local state forced back to "leading"
        a._term, a._deadline = term, time.monotonic() + 60  # the fence's test
        with pytest.raises(NotLeader, match=f"term {term} is over"):
            a.execute("INSERT INTO acts VALUES ('a-stale', %s)", (term,))
        assert not a.leader
        b.execute("INSERT INTO acts VALUES ('b', %s)", (b.term,))
        assert a.poll() is False  # b holds an unexpired lease
    finally:
        a.close()
        b.close()
    assert sql(pg_url, "SELECT who, term FROM acts") == [("a", term), ("b", term + 1)]


def test_the_sweep_never_ends_the_sweepers_own_rows(tmp_path, pg_url):
    """A leader whose own replica lease lapsed (paused) does not end its own queued rows
    ``lost`` when it sweeps: only the other expired replicas'."""
    import asyncio

    from wirekit.serve.record.pgsync import LeaderLock, ReplicaLease, adopt_expired
    from wirekit.serve.record.store import RequestStore

    stores = {}
    for name in ("me", "other"):
        store = RequestStore(tmp_path / f"{name}.db", url=pg_url, replica=name)
        store.lease = ReplicaLease(pg_url, name, lease=0.2)
        stores[name] = store
        store.open()

    async def arrive() -> None:
        for name, store in stores.items():
            store.arrival(f"{name}-1", "m", "c", 1.0, 3)
            await store.flush()

    lock = LeaderLock(pg_url, lease=5.0, replica="me")
    try:
        asyncio.run(arrive())
        assert lock.poll()
        ended: list = []
        wait_until(lambda: ended.extend(adopt_expired(lock, "me#1")) or ended, "swept", limit=5)
        assert ended == [("other", "m", 1)]
        assert adopt_expired(lock, "me#1") == []
        statuses = dict(sql(pg_url, "SELECT id, status FROM requests"))
        assert statuses == {"me-1": "queued", "other-1": "lost"}
    finally:
        lock.close()
        for store in stores.values():
            store.close()
            store.lease.close()


# -- item 1: a paused leader ------------------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
def test_a_paused_leader_is_replaced_and_on_resuming_does_nothing_a_leader_does(
    tmp_path, pg_url, loop
):
    """Two replicas (lease 3 s, period 1 s); the leader is SIGSTOPped ~9 s with 5 requests
    in flight to a slow backend.  The other replica leads within lease + period and ends
    the paused leader's rows ``lost`` within lease + period (its ``/stats``); after SIGCONT
    the old leader does not lead, ends nothing ``lost``, answers its 5 requests (the
    answers replace ``lost``) and its ``/metrics`` count 5 requests, not 10."""
    with BackendProcess("serve_handlers:held_when_slow") as backend:
        procs = {
            name: DispatcherProcess(
                replica_config(tmp_path, name, pg_url, backend.port, LEASE, PERIOD),
                args=("--loop", loop),
            )
            for name in ("a", "b")
        }
        with started(*procs.values()):
            name = ""

            def one_leads() -> bool:
                nonlocal name
                name = leader_name(pg_url) or ""
                return bool(name)

            wait_until(one_leads, "one replica leads", limit=LEASE * 4)
            old, new = procs[name], procs["b" if name == "a" else "a"]
            old_term = term_now(pg_url)
            answers: list[str] = []
            errors: list[BaseException] = []

            def send(k: int) -> None:
                try:
                    with Client(old.mip_address("m"), timeout=60) as client:
                        answers.append(client.infer_one(f"slow-{k}")[0].as_text())
                except BaseException as exc:  # reported by the test
                    errors.append(exc)

            senders = [threading.Thread(target=send, args=(k,)) for k in range(5)]
            for t in senders:
                t.start()
            wait_until(lambda: queued_of(pg_url, name) == 5, "5 requests queued in the store")
            assert old.proc is not None
            os.kill(old.proc.pid, signal.SIGSTOP)
            paused = time.monotonic()
            try:
                # the rows of the paused leader leave the queue: ended lost by the other,
                # seen in the other's /stats
                def swept() -> bool:
                    stats = get_json(f"{new.http}/stats")
                    return (
                        stats["queue"] == 0 and stats["models"]["m"]["statuses"].get("lost", 0) == 5
                    )

                took = wait_until(swept, "the paused leader's rows ended lost", limit=4 * LEASE)
                print(f"rows ended lost {took:.2f} s after the pause (bound {LEASE + PERIOD})")
                is_leading, new_term = leading(new)
                assert is_leading and new_term is not None and new_term > old_term
                holder, term, *_ = leadership_row(pg_url) or ("", 0, 0, 0, 0)
                assert term == new_term and holder_replica(holder) != name
                # on the server's clock: the takeover came after the old lease expired, and
                # the paused leader's rows were ended within lease + period of its last
                # renewal (its lease row is frozen since the pause)
                (last_renewal, lease_expired) = sql(
                    pg_url,
                    "SELECT EXTRACT(EPOCH FROM renewed)::float8,"
                    " EXTRACT(EPOCH FROM expires)::float8 FROM replica_leases"
                    " WHERE replica = %s",
                    (name,),
                )[0]
                ended = [
                    t
                    for (t,) in sql(
                        pg_url,
                        "SELECT time_out FROM requests WHERE replica = %s AND status = 'lost'",
                        (name,),
                    )
                ]
                assert len(ended) == 5
                assert min(ended) >= lease_expired  # never before the lease expired
                late = max(ended) - last_renewal
                print(f"ended {late:.2f} s after the paused leader's last renewal")
                assert late <= LEASE + PERIOD + SLACK
                assert took <= LEASE + PERIOD + PERIOD + SLACK + 1.0  # + the pause's phase
                # hold the pause to ~9 s
                time.sleep(max(0.0, 9.0 - (time.monotonic() - paused)))
            finally:
                os.kill(old.proc.pid, signal.SIGCONT)
            for t in senders:
                t.join(60)
            assert not errors, errors
            assert sorted(answers) == sorted(f"H:SLOW-{k}" for k in range(5))
            # a few periods for the old leader to poll: it does not lead
            time.sleep(3 * PERIOD)
            assert leading(old) == (False, None)
            assert leading(new) == (True, new_term)
            totals = requests_total(old.http)
            new_totals = requests_total(new.http)
        log = old.log
    assert "ended lost" not in log, log  # it swept nothing: its own rows least of all
    assert lost_by_log(new) == {name: 5}
    assert totals.get("lost", 0) == 0, totals
    assert sum(totals.values()) == 5, totals  # each of its 5 requests counted once
    assert new_totals.get("lost", 0) == 5, new_totals
    # its answers replaced the leader's lost: one row each, answered
    rows = rows_by_text(pg_url, "status, replica")
    assert {t: r for t, r in rows.items()} == {f"slow-{k}": [("ok", name)] for k in range(5)}


# -- the randomized cycles --------------------------------------------------------------

CYCLE_LEASE, CYCLE_PERIOD = 2.0, 0.5
CYCLES = 5


class Replica:
    """One replica of the randomized test: its process (replaced on restart), its load and
    its state for the sampler."""

    def __init__(self, name: str, config: Path) -> None:
        self.name = name
        self.config = config
        self.proc: DispatcherProcess | None = None
        self.generation = 0
        self.paused = False
        self.answered: dict[int, int] = {}  # generation -> requests answered
        self.stop_load = threading.Event()
        self.load: threading.Thread | None = None
        self.errors: list[BaseException] = []
        self.finished: list[DispatcherProcess] = []
        self.started_at = 0.0

    def start(self, loop: str) -> None:
        self.generation += 1
        self.started_at = time.time()
        self.proc = DispatcherProcess(self.config, args=("--loop", loop)).start()
        self.stop_load = threading.Event()
        self.load = threading.Thread(target=self._send, args=(self.proc, self.generation))
        self.load.start()

    def _send(self, proc: DispatcherProcess, generation: int) -> None:
        self.answered[generation] = 0
        try:
            with Client(proc.mip_address("m"), timeout=60) as client:
                for k in range(100_000):
                    if self.stop_load.is_set():
                        return
                    text = f"{self.name}{generation}-{k}"
                    assert client.infer_one(text)[0].as_text() == f"R:{text.upper()}"
                    self.answered[generation] += 1
                    time.sleep(0.02)
        except (ConnectionLost, OSError):
            return  # its process was killed
        except BaseException as exc:  # anything else fails the test
            self.errors.append(exc)

    def kill(self) -> None:
        assert self.proc is not None and self.load is not None
        self.proc.kill9()
        self.proc.close()  # its pipes (its log is kept)
        self.load.join(TIMEOUT)
        self.finished.append(self.proc)
        self.proc = None

    def stop(self) -> None:
        self.stop_load.set()
        if self.load is not None:
            self.load.join(60)
            assert not self.load.is_alive()


def test_random_pauses_and_kills_keep_one_leader_and_one_final_row_per_request(
    tmp_path, pg_url, monkeypatch
):
    """Leader and follower paused (SIGSTOP, 0.3 s to 2 leases) or killed (``kill -9``,
    restarted after 0 to 1.5 leases) at random moments under a light load, ``CYCLES``
    times, the loop alternating asyncio/uvloop at each restart (seeded: the seed is
    printed).  Throughout, a sampler reads every running replica's own view of the lead
    between two reads of the ``leadership`` row: when the row's term did not change
    around a round, at most one replica claims the lead, and only its holder; a term is
    never claimed by two processes.  After each long pause the paused replica has no row
    left ``queued``.  Once settled: every request that reached the backend has exactly one
    row, in a final state; each live replica's ``/metrics`` count its own requests once
    (what it answered, plus what it ended ``lost`` for others as it logged); no replica
    ever ended its own rows."""
    seed = int(os.environ.get("WIREKIT_TEST_SEED", random.randrange(1 << 32)))
    print(f"seed {seed} (WIREKIT_TEST_SEED={seed} replays it)")
    rng = random.Random(seed)
    loops = [str(p if isinstance(p, str) else p.values[0]) for p in LOOPS]
    received = tmp_path / "received.txt"
    monkeypatch.setenv(RECEIVED_ENV, str(received))
    violations: list[str] = []
    claims: dict[int, set[tuple[str, int]]] = {}  # term -> (replica, pid) that claimed it
    rounds = [0, 0]  # sampled, strict
    guard = threading.Lock()  # held by the sampler's round and by every fault
    done = threading.Event()
    with BackendProcess("serve_handlers:record_slow") as backend:
        replicas = {
            n: Replica(
                n, replica_config(tmp_path, n, pg_url, backend.port, CYCLE_LEASE, CYCLE_PERIOD)
            )
            for n in ("a", "b")
        }

        def sample() -> None:
            while not done.is_set():
                with guard:
                    try:
                        before = leadership_row(pg_url)
                        seen = []
                        for r in replicas.values():
                            if r.proc is None or r.paused:
                                continue
                            is_leading, term = leading(r.proc, timeout=5)
                            seen.append((r.name, r.proc.proc.pid, is_leading, term))
                        after = leadership_row(pg_url)
                    except OSError:
                        continue  # a replica on its way out
                rounds[0] += 1
                for name, pid, is_leading, term in seen:
                    if is_leading:
                        claims.setdefault(term, set()).add((name, pid))
                if before is not None and after is not None and before[1] == after[1]:
                    rounds[1] += 1
                    holder = before[0]
                    claimants = [s for s in seen if s[2]]
                    if len(claimants) > 1:
                        violations.append(f"two replicas lead at once: {claimants} {before}")
                    for name, pid, _, term in claimants:
                        if term != before[1] or holder_pid(holder) != pid:
                            violations.append(f"{name} ({pid}) leads term {term}: {before}")
                time.sleep(0.05)

        for r in replicas.values():
            r.start(loops[0])
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            wait_until(lambda: leadership_row(pg_url) is not None, "a leader", limit=20)
            # at least one leader paused past lease + period and one leader killed; the rest
            # as chance has it
            plan = ["long pause", "kill leader"] + ["any"] * (CYCLES - 2)
            rng.shuffle(plan)
            for cycle, kind in enumerate(plan):
                time.sleep(rng.uniform(0.5, 2.0))
                row = leadership_row(pg_url)
                by_pid = {r.proc.proc.pid: r for r in replicas.values() if r.proc is not None}
                leader = None
                if row is not None and row[4]:  # an unexpired lease: its holder leads
                    leader = by_pid.get(holder_pid(row[0]))
                if (kind != "any" and leader is not None) or (
                    leader is not None and rng.random() < 0.6
                ):
                    target = leader
                else:
                    target = rng.choice(list(replicas.values()))
                role = "leader" if target is leader else "follower"
                assert target.proc is not None
                pid = target.proc.proc.pid
                if kind == "long pause" or (kind == "any" and rng.random() < 0.55):
                    pause = rng.uniform(0.3, 2 * CYCLE_LEASE)
                    if kind == "long pause":
                        pause = rng.uniform(
                            CYCLE_LEASE + CYCLE_PERIOD + SLACK + 0.2, 2.5 * CYCLE_LEASE
                        )
                    print(f"cycle {cycle}: pause {role} {target.name} {pause:.2f} s")
                    with guard:
                        target.paused = True
                        os.kill(pid, signal.SIGSTOP)
                    start = time.monotonic()
                    time.sleep(pause)
                    if time.monotonic() - start > CYCLE_LEASE + CYCLE_PERIOD + SLACK:
                        # the paused replica's rows were ended lost within lease + period
                        left = queued_of(pg_url, target.name)
                        if left:
                            violations.append(
                                f"{left} row(s) of {target.name} still queued"
                                f" {time.monotonic() - start:.2f} s into its pause"
                            )
                    os.kill(pid, signal.SIGCONT)
                    target.paused = False
                else:
                    wait_s = rng.uniform(0, 1.5 * CYCLE_LEASE)
                    loop = loops[(cycle + 1) % len(loops)]
                    print(f"cycle {cycle}: kill -9 {role} {target.name}, back after"
                          f" {wait_s:.2f} s on {loop}")  # fmt: skip
                    with guard:
                        target.kill()
                    time.sleep(wait_s)
                    target.start(loop)
            time.sleep(rng.uniform(0.5, 1.0))
        finally:
            for r in replicas.values():
                if r.proc is not None:
                    resume(r.proc)
                    r.paused = False
            for r in replicas.values():
                r.stop()
            done.set()
            sampler.join(30)
        # settle: every row final (a killed replica's rows end lost by the leader)
        wait_until(
            lambda: not sql(pg_url, "SELECT 1 FROM requests WHERE status = 'queued' LIMIT 1"),
            "every row final",
            limit=4 * CYCLE_LEASE + 10,
        )
        metrics = {
            r.name: (
                requests_total(r.proc.http),
                r.answered[r.generation],
                lost_by_log(r.proc),
                ended_at_start(pg_url, r.name, r.started_at),
            )
            for r in replicas.values()
            if r.proc is not None
        }
        logs = {r.name: [p.log for p in r.finished] for r in replicas.values()}
        for r in replicas.values():
            if r.proc is not None:
                r.proc.close()
                logs[r.name].append(r.proc.log)
    for r in replicas.values():
        assert not r.errors, r.errors
    print(f"{rounds[0]} rounds sampled, {rounds[1]} around an unchanged term;"
          f" terms {sorted(claims)}")  # fmt: skip
    assert not violations, violations
    shared = {t: who for t, who in claims.items() if len(who) > 1}
    assert not shared, f"a term claimed by two processes: {shared}"
    assert rounds[1] > 10
    sent = received.read_text(encoding="utf-8").splitlines() if received.exists() else []
    assert sent
    rows = rows_by_text(pg_url, "status, replica")
    missing = [t for t in sent if t not in rows]
    assert not missing, f"{len(missing)} of {len(sent)} requests at the backend have no row"
    twice = {t: r for t, r in rows.items() if len(r) != 1}
    assert not twice, twice
    unfinished = {t: r for t, r in rows.items() if r[0][0] not in FINAL}
    assert not unfinished, unfinished
    for name, (totals, answered, swept, at_start) in metrics.items():
        # this process's own requests once each (all answered: its load stopped cleanly),
        # plus the other replicas' rows it ended lost as the leader and its previous run's
        # that it ended lost at start
        assert name not in swept, f"{name} ended its own rows: {swept}"
        lost = sum(swept.values()) + at_start
        assert totals.get("lost", 0) == lost, (name, totals, swept, at_start)
        assert sum(totals.values()) - totals.get("lost", 0) == answered, (name, totals, answered)
    for name, texts in logs.items():
        for text in texts:
            assert f"replica {name}'s lease expired" not in text
