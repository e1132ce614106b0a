"""Leader election and change notification among replicas on one PostgreSQL (issue 17):
:mod:`wirekit.serve.record.pgsync`, against a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from serve_support import ROOT, TIMEOUT

from wirekit.serve.record.pgsync import LeaderLock, Listener, NotLeader, notify

DECISIONS = "CREATE TABLE decisions (n SERIAL PRIMARY KEY, who TEXT NOT NULL)"


def polls_until(predicate, lock: LeaderLock, limit: int = 200) -> int:
    """Poll ``lock`` (every ``lock.retry`` seconds) until ``predicate()``; how many polls
    it took (``limit`` at most)."""
    stop = threading.Event()
    for n in range(1, limit + 1):
        lock.poll()
        if predicate():
            return n
        stop.wait(lock.retry)
    return limit + 1


def test_one_leader_and_only_the_leader_records(pg_url):
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(DECISIONS)
    a, b = LeaderLock(pg_url, retry=0.05), LeaderLock(pg_url, retry=0.05)
    try:
        assert a.poll() is True
        assert b.poll() is False
        assert a.poll() is True  # still leading
        a.execute("INSERT INTO decisions (who) VALUES (%s)", ("a",))
        with pytest.raises(NotLeader):
            b.execute("INSERT INTO decisions (who) VALUES (%s)", ("b",))
        a.release()
        assert polls_until(lambda: b.leader, b) <= 2  # free at once: the next poll takes it
        b.execute("INSERT INTO decisions (who) VALUES (%s)", ("b",))
        assert a.poll() is False
    finally:
        a.close()
        b.close()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT who FROM decisions ORDER BY n").fetchall() == [("a",), ("b",)]


def test_a_leader_whose_session_died_cannot_record(pg_url):
    """The leader's session is killed under it (as a network partition would): it cannot
    renew, so it stops leading at its local deadline (before its lease expires); another
    replica takes over once the lease has expired, under the next term, and the old
    leader's next decision fails and writes nothing (issue 38: the lead is a lease)."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(DECISIONS)
    a = LeaderLock(pg_url, lease=1.0, retry=0.05)
    b = LeaderLock(pg_url, lease=1.0, retry=0.05)
    try:
        assert a.poll() and not b.poll()
        term = a.term
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (a.backend_pid(),))
        assert polls_until(lambda: b.leader, b) <= 200
        assert not a.leader  # it stepped down before b could take over...
        with pytest.raises(NotLeader):
            a.execute("INSERT INTO decisions (who) VALUES (%s)", ("a",))
        assert a.poll() is False  # ...and its next poll finds b leading
        assert b.term == term + 1
        b.execute("INSERT INTO decisions (who) VALUES (%s)", ("b",))
    finally:
        a.close()
        b.close()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT who FROM decisions").fetchall() == [("b",)]


_HOLD = """
import sys, time
from wirekit.serve.record.pgsync import LeaderLock
lock = LeaderLock(sys.argv[1], lease=1.0)
assert lock.poll()
print("leading", flush=True)
time.sleep(600)
"""


def test_the_leader_process_killed_another_takes_over(pg_url):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, pg_url], stdout=subprocess.PIPE, text=True, env=env
    )
    b = LeaderLock(pg_url, lease=1.0, retry=0.05)  # the lease of a dead leader expires
    try:
        assert proc.stdout.readline().strip() == "leading"
        assert b.poll() is False
        proc.kill()
        proc.wait(TIMEOUT)
        polls = polls_until(lambda: b.leader, b)
        assert polls <= 200, "the lock of a dead session was not released"
        assert b.terms == 1
    finally:
        b.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
        proc.stdout.close()


def test_listener_gets_every_notification_and_survives_a_reset(pg_url):
    import psycopg

    got: list[str] = []
    arrived = threading.Condition()
    reconnects: list[int] = []

    def on_note(payload: str) -> None:
        with arrived:
            got.append(payload)
            arrived.notify_all()

    def wait_for(n: int) -> bool:
        with arrived:
            return arrived.wait_for(lambda: len(got) >= n, TIMEOUT)

    listener = Listener(
        pg_url, "wirekit_test", on_note, on_reconnect=lambda: reconnects.append(1), retry=0.05
    ).start()
    try:
        assert listener.ready.wait(TIMEOUT)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for k in range(5):
                notify(conn, "wirekit_test", f"change {k}")
            assert wait_for(5)
            assert got == [f"change {k}" for k in range(5)]
            # the listening session is killed: it listens again and says so
            listener.ready.clear()
            conn.execute("SELECT pg_terminate_backend(%s)", (listener.backend_pid(),))
            assert listener.ready.wait(TIMEOUT)
            assert reconnects == [1]
            notify(conn, "wirekit_test", "after")
            assert wait_for(6) and got[-1] == "after"
    finally:
        listener.stop()
    with pytest.raises(ValueError, match="channel name"):
        Listener(pg_url, 'x"; DROP TABLE requests; --', on_note)


def migrated(url: str) -> None:
    from wirekit.serve.record.storedb import open_db

    db = open_db(url)
    try:
        db.migrate()
    finally:
        db.close()


def test_change_log_hands_each_replica_the_others_changes_in_order(pg_url):
    from wirekit.serve.record.pgsync import ChangeLog

    migrated(pg_url)
    a, b = ChangeLog(pg_url, "a"), ChangeLog(pg_url, "b")
    early = a.append("quota", {"model": "m", "share": 0.1})  # before b follows: not lost
    seen: dict[str, list] = {"a": [], "b": []}
    arrived = threading.Condition()

    def into(name):
        def apply(changes):
            with arrived:
                seen[name].extend((c.seq, c.origin, c.kind, c.doc) for c in changes)
                arrived.notify_all()

        return apply

    def wait_for(name, n):
        with arrived:
            return arrived.wait_for(lambda: len(seen[name]) >= n, TIMEOUT)

    try:
        b.follow(into("b"))
        a.follow(into("a"), after=a.last())
        assert wait_for("b", 1)
        seqs = [a.append("quota", {"model": "m", "share": s / 10}) for s in range(2, 5)]
        mine = b.append("remove", {"model": "k"})
        assert wait_for("b", 4) and wait_for("a", 1)
        assert seen["b"] == [(early, "a", "quota", {"model": "m", "share": 0.1})] + [
            (q, "a", "quota", {"model": "m", "share": s / 10})
            for q, s in zip(seqs, range(2, 5), strict=True)
        ]
        assert seen["a"] == [(mine, "b", "remove", {"model": "k"})]  # never its own
        # a change the leader makes goes through the lock's session: without the lead,
        # nothing is logged
        lock = LeaderLock(pg_url, retry=0.05)
        try:
            assert lock.poll()
            via = a.append("quota", {"model": "m", "share": 0.9}, via=lock)
            lock.release()
            with pytest.raises(NotLeader):
                a.append("quota", {"model": "m", "share": 1.0}, via=lock)
        finally:
            lock.close()
        assert wait_for("b", 5)
        assert [c[0] for c in seen["b"]][-1] == via
        assert a.last() == via
    finally:
        a.close()
        b.close()


def test_compaction_while_changes_are_made_loses_none(pg_url):
    """Two writers append quota changes while a third session compacts the log again and
    again (keeping nothing): a follower that folds what it is handed, and a reader that
    starts afterwards, both end with every row's last share."""
    from wirekit.serve.record.pgsync import ChangeLog, fold

    migrated(pg_url)
    writers = [ChangeLog(pg_url, name) for name in ("x", "y")]
    compactor, follower, late = (ChangeLog(pg_url, n) for n in ("c", "f", "late"))
    folded: list[dict | None] = [None]
    kinds: list[str] = []
    arrived = threading.Condition()
    done = threading.Event()
    compacted: list[int] = []

    def apply(changes) -> None:
        with arrived:
            kinds.extend(c.kind for c in changes)
            folded[0] = fold(folded[0], changes)
            arrived.notify_all()

    def write(log: ChangeLog) -> None:
        for k in range(150):
            doc = {"model": f"m{k % 5}", "node": log.origin, "device": 0, "share": k / 1000}
            log.append("quota", doc)

    def compact() -> None:
        while not done.is_set():
            upto = compactor.compact(keep=0)
            if upto:
                compacted.append(upto)

    expected = {
        json.dumps([f"m{k}", w, 0]): {"model": f"m{k}", "node": w, "device": 0, "share": s}
        for w in ("x", "y")
        for k, s in ((k, (145 + k) / 1000) for k in range(5))
    }
    try:
        follower.follow(apply)
        threads = [threading.Thread(target=write, args=(w,)) for w in writers]
        squeezer = threading.Thread(target=compact)
        squeezer.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT * 3)
        done.set()
        squeezer.join(TIMEOUT)
        assert not squeezer.is_alive() and not any(t.is_alive() for t in threads)
        assert compacted, "no compaction ran while the changes were made"
        last = compactor.last()
        assert last >= max(compacted)
        with arrived:
            assert arrived.wait_for(lambda: follower.applied == last, TIMEOUT)
            assert folded[0]["quotas"] == expected
        assert "quota" in kinds
        assert fold(None, late.since(0))["quotas"] == expected
        assert late.since(0)[0].kind in ("snapshot", "quota")
    finally:
        for log in (*writers, compactor, follower, late):
            log.close()


def test_fold_gives_what_the_changes_give():
    from wirekit.serve.record.pgsync import Change, fold

    def q(model, share):
        return Change(0, "o", "quota", {"model": model, "node": "n", "device": 0, "share": share})

    def add(model, share):
        return Change(0, "o", "add", {"model": {"name": model}, "rows": [{"quota": share}]})

    def remove(model):
        return Change(0, "o", "remove", {"model": model})

    state = fold(None, [q("a", 0.1), add("k", 0.2), q("k", 0.3), q("a", 0.4), remove("k")])
    assert state["models"] == {"k": {"removed": True, "add": None}}
    assert [d["share"] for d in state["quotas"].values()] == [0.4]  # k's quotas are moot
    state = fold(state, [add("k", 0.5), add("k", 0.6), q("k", 0.7)])
    assert state["models"]["k"] == {"removed": True, "add": add("k", 0.5).doc}
    assert sorted(d["share"] for d in state["quotas"].values()) == [0.4, 0.7]
    snap = Change(9, "", "snapshot", {"models": {}, "quotas": {}})
    assert fold(state, [snap, q("b", 0.1)])["models"] == {}


def test_change_log_appends_commit_in_seq_order(pg_url):
    """An append waits while another one is in flight: a later seq never commits before an
    earlier one, so a follower that read past a seq cannot miss a change drawn before it."""
    import psycopg

    from wirekit.serve.record.pgsync import APPEND_KEY, ChangeLog

    migrated(pg_url)
    log = ChangeLog(pg_url, "b")
    held = psycopg.connect(pg_url, autocommit=True)
    got: list[int] = []
    try:
        with held.transaction():
            # an append in flight, as ChangeLog.append makes it: the lock, then the seq
            held.execute("SELECT pg_advisory_xact_lock(%s)", (APPEND_KEY,))
            first = held.execute(
                "INSERT INTO catalog_changes (origin, kind, doc) VALUES ('a', 'quota', '{}')"
                " RETURNING seq"
            ).fetchone()[0]
            t = threading.Thread(target=lambda: got.append(log.append("quota", {})))
            t.start()
            # the second append waits on the append lock while the first is uncommitted
            waiting = "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            with psycopg.connect(pg_url, autocommit=True) as probe:
                for _ in range(400):
                    if probe.execute(waiting).fetchone():
                        break
                    t.join(0.025)
                else:
                    raise AssertionError("the second append did not wait")
            assert got == []
        t.join(TIMEOUT)
        assert got and got[0] > first
    finally:
        held.close()
        log.close()


_COUNTER = "wirekit-test-session-count"


def other_sessions(url: str, settle: bool = False, expect: int = 0) -> int:
    """The sessions to the database of ``url`` besides this counter's own (those of its
    earlier calls included: a server process ends a moment after its client closed the
    connection).  ``settle``: wait (TIMEOUT at most) until there are ``expect`` -- the
    sessions other code closed may be ending too; one left open never goes."""
    import psycopg

    with psycopg.connect(url, autocommit=True, application_name=_COUNTER) as conn:
        for _ in range(400):
            n = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name <> %s",
                (_COUNTER,),
            ).fetchone()[0]
            if n == expect or not settle:
                return n
            threading.Event().wait(TIMEOUT / 400)
        return n


def test_closed_means_closed_a_call_after_close_opens_no_session(pg_url):
    """Regression (a psycopg connection left open, a ResourceWarning in a later test): a
    call that reached a ChangeLog, LeaderLock or PostgresDB after ``close()`` -- an append
    still queued on the replica's writer thread, a poll or a window query on their way from
    a cancelled task -- reconnected, and the new session was never closed.  Now it raises
    (or, for ``poll``, does not lead) and opens nothing."""
    from wirekit.serve.record.pgsync import ChangeLog
    from wirekit.serve.record.storedb import PostgresDB, StoreUnavailable

    migrated(pg_url)
    log, lock, db = ChangeLog(pg_url, "a"), LeaderLock(pg_url), PostgresDB(pg_url)
    try:
        assert log.append("quota", {"model": "m", "share": 0.5}) == 1
        assert lock.poll() is True
        assert db.recent(0.0) == {}
        # the three (the migration's session may still be ending)
        assert other_sessions(pg_url, settle=True, expect=3) == 3
    finally:
        log.close()
        lock.close()
        db.close()
    assert other_sessions(pg_url, settle=True) == 0
    with pytest.raises(StoreUnavailable, match="the change log is closed"):
        log.append("quota", {"model": "m", "share": 0.25})
    with pytest.raises(StoreUnavailable, match="the change log is closed"):
        log.last()
    assert lock.poll() is False
    with pytest.raises(NotLeader):
        lock.execute("SELECT 1")
    with pytest.raises(StoreUnavailable, match="is closed"):
        db.recent(0.0)
    assert other_sessions(pg_url) == 0  # the closed ones' calls opened none
    reader = ChangeLog(pg_url, "b")
    try:
        assert [c.doc["share"] for c in reader.since(0)] == [0.5]  # the one before close
    finally:
        reader.close()


def test_a_released_lead_can_be_taken_again_a_closed_one_cannot(pg_url):
    """``release()`` gives the lead up for now (the next poll may take it again);
    ``close()`` for good."""
    lock = LeaderLock(pg_url)
    try:
        assert lock.poll() is True
        lock.release()
        assert lock.poll() is True and lock.terms == 2
    finally:
        lock.close()
    assert lock.poll() is False and lock.terms == 2
