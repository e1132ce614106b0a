"""What several ``wirekit serve`` replicas on one PostgreSQL store coordinate with (issue 17).

* :class:`LeaderLock` -- exactly one replica leads (the controller acts once, the expired
  leases are swept once): the leader is whoever holds an unexpired **lease** on the row
  of ``leadership`` (issue 38) -- ``holder``, ``term``, ``renewed``, ``expires``, on the
  database server's clock.  :meth:`LeaderLock.poll` renews it while held and takes it
  once it has expired, with ``term`` + 1, in one statement; a replica that cannot renew
  (paused, cut off, its loop stuck, its session gone) stops acting as leader at its own
  deadline -- ``lease - margin`` after its last renewal was *sent*, on its monotonic clock
  --, before the lease can expire on the server and anyone else can take it.  Every
  leader action (:meth:`LeaderLock.execute`: the sweep, the controller's decisions, the
  change log's appends ``via`` the lock) runs in one transaction that first locks the
  row under its term (``holder``, ``term``, ``expires > now()``, ``FOR UPDATE``): a stale
  term is refused with :class:`NotLeader` and nothing is written, and a takeover waits
  until an action under way has committed.  A leader paused half-way through such a
  transaction is cut by the server (``idle_in_transaction_session_timeout``, one period)
  so that its row lock cannot keep the others out.  A paused or partitioned leader is
  thus replaced within ``lease`` + one poll period; when it resumes it finds its term over
  and does nothing a leader does.  Until issue 38 leadership was a session-level advisory
  lock, which a stopped process keeps: nobody else led, nobody swept.
* :class:`Listener` -- ``LISTEN`` on a channel in a thread of its own, a callback per
  notification (``NOTIFY`` is delivered to every listening session within milliseconds,
  on commit); :func:`notify` sends one.
* :class:`ChangeLog` -- the models metadata's changes as an ordered table
  (``catalog_changes``); :meth:`ChangeLog.append` inserts one and notifies in the same
  transaction (on the leader's session when the controller decides), and
  :meth:`ChangeLog.follow` hands every replica the changes of the others, in order, on each
  notification -- and after a reconnect, so a notification missed while disconnected loses
  nothing.  Appends are serialized by an advisory lock taken before the ``seq`` is drawn,
  so changes commit in ``seq`` order (a follower never passes over one still in flight).
  :meth:`ChangeLog.compact` folds the old changes into a snapshot (:func:`fold`,
  ``catalog_snapshots``) and deletes them; a follower behind the newest snapshot gets it
  first, as a change of kind ``"snapshot"``.
* :class:`ReplicaLease` -- each replica's lease: a heartbeat row (``replica_leases``) it
  renews every period, expiring ``lease`` seconds after the last renewal (the server's
  clock).  The leader ends the ``queued`` rows of a replica whose lease has expired as
  ``lost`` (:func:`adopt_expired`, fenced by its term), so a replica that died and does not
  come back leaves nothing in flight -- never its own rows: a leader whose own lease lapsed
  while it was paused still has those requests to answer.  specs/replicas.md says why a
  row rather than an advisory lock.

Each uses one dedicated connection (psycopg 3, autocommit) and never the event loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..doors.fdwatch import BurstLog
from ..logs import serve_logger
from .storedb import LEADERSHIP_SCHEMA, LOST_REASON, MIGRATION_LOCK, StoreUnavailable, redact

log = serve_logger()

#: the ``leadership`` row of the replicas' leader (the controller, the sweep)
LEADER_ROLE = "leader"
#: the channel the models metadata's changes are told on
CATALOG_CHANNEL = "wirekit_catalog"
#: the advisory lock key that orders the change log's appends ("wkappend")
APPEND_KEY = 0x776B617070656E64 & 0x7FFFFFFFFFFFFFFF
#: the advisory lock key of the change log's compaction ("wkcompac")
COMPACT_KEY = 0x776B636F6D706163 & 0x7FFFFFFFFFFFFFFF


def _connect(url: str, keepalive: float, name: str = "wirekit") -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the pg extra is missing
        raise StoreUnavailable(
            "a postgresql:// store needs the 'pg' extra: pip install 'wirekit[pg]'"
        ) from exc
    idle = max(1, int(keepalive))
    try:
        return psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=10,
            keepalives=1,
            keepalives_idle=idle,
            keepalives_interval=idle,
            keepalives_count=3,
            application_name=name[:63],
        )
    except psycopg.OperationalError as exc:
        why = " ".join(str(exc).split())
        raise StoreUnavailable(f"cannot reach the store at {redact(url)}: {why}") from None


class _OwnSession:
    """One connection of its own (autocommit), opened on first use and again once it broke;
    :meth:`_close_session` closes it for good.  The subclass holds ``_lock`` around both."""

    def __init__(self, url: str, what: str, *, keepalive: float = 5.0, name: str = "wirekit"):
        self.url = url
        self._what = what  # what it is, for "the ... is closed"
        self._keepalive = keepalive
        self._name = name
        self._conn: Any = None
        self._lock = threading.Lock()
        self._closed = False

    def _session(self) -> Any:
        if self._closed:
            raise StoreUnavailable(f"the {self._what} is closed")
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
            self._conn = _connect(self.url, self._keepalive, self._name)
        return self._conn

    def _close_session(self) -> None:
        self._closed = True
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


class LeaderLock:
    """Leadership among replicas: a lease on a row of ``leadership`` (see the module
    docstring).  Keeps the name of the advisory lock it replaced; the contract is the same.

    ``poll()`` (every ``period`` seconds while leading -- :class:`ReplicaSync
    <wirekit.serve.record.replicas.ReplicaSync>` polls every ``store.lease_period`` --, every
    ``retry`` seconds otherwise) renews the lease when held, takes it when it has expired
    (its ``term`` + 1), and returns whether this replica leads now.  :attr:`leader` is also
    false once the local deadline of the last renewal has passed (``lease - margin`` after
    it was sent: before the lease can expire on the server), so a replica that could not
    renew -- paused, cut off, its loop stuck -- stops acting as leader before anyone else
    can take over.  :meth:`execute` runs a leader action fenced by the term.  ``release()``
    gives the lead up (it expires at once), ``close()`` for good."""

    def __init__(
        self,
        url: str,
        role: str = LEADER_ROLE,
        *,
        lease: float = 10.0,
        period: float | None = None,
        margin: float | None = None,
        retry: float = 0.5,
        keepalive: float = 5.0,
        name: str = "wirekit",
        replica: str = "",
    ) -> None:
        self.url = url
        self.name = name  #: the session's application_name (pg_stat_activity)
        self.role = role  #: the ``leadership`` row this lock leads by
        self.lease = float(lease)  #: seconds a renewal lasts (the server's clock)
        #: seconds between two renewals while leading (the caller's polls)
        self.period = float(period) if period is not None else self.lease / 4
        if not 0 < self.period < self.lease:
            raise ValueError(f"the period ({self.period} s) must be in (0, lease={lease} s)")
        #: this replica stops acting as leader ``lease - margin`` seconds after the last
        #: renewal was sent (default: one period, or half what the lease leaves beyond a
        #: period when that is less -- the next renewal must come before the deadline)
        default = min(self.period, (self.lease - self.period) / 2)
        self.margin = float(margin) if margin is not None else default
        if not 0 <= self.margin < self.lease:
            raise ValueError(f"the margin ({self.margin} s) must be in [0, lease={lease} s)")
        self.retry = retry  #: seconds between two polls of a replica that does not lead
        self.keepalive = keepalive  #: seconds of TCP silence before the server is probed
        #: this replica's name: the sweep (:func:`adopt_expired`) never ends its rows
        self.replica = replica
        #: who holds the lease, in the row: unique to this object (a process that restarts
        #: is another holder)
        self.holder = f"{name} {socket.gethostname()}#{os.getpid()}-{os.urandom(4).hex()}"
        self._conn: Any = None
        self._lock = threading.Lock()
        self._closed = False
        self._term: int | None = None
        self._deadline = 0.0  # time.monotonic() past which this replica does not lead
        self.terms = 0  #: times this replica became leader
        self.stepped_down = 0  #: times it stopped leading (lost, expired, refused)

    @property
    def leader(self) -> bool:
        """Whether this replica leads now: it took or renewed the lease, and the local
        deadline of that renewal has not passed."""
        return self._term is not None and time.monotonic() < self._deadline

    @property
    def term(self) -> int | None:
        """The term this replica leads under (None when it does not lead)."""
        return self._term if self.leader else None

    def _session(self) -> Any:
        if self._closed:
            raise StoreUnavailable("the leader lock is closed")
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._drop()
            conn = _connect(self.url, self.keepalive, self.name)
            try:
                # a fenced transaction stuck half-way (its process paused) holds the row
                # lock: the server ends it after a period idle; a takeover waits for a
                # lock at most a lease, then polls again
                idle = max(1000, int(self.period * 1000))
                conn.execute(f"SET idle_in_transaction_session_timeout = {idle}")
                conn.execute(f"SET lock_timeout = {max(1000, int(self.lease * 1000))}")
                _ensure_leadership_table(conn)
            except BaseException:
                with contextlib.suppress(Exception):
                    conn.close()
                raise
            self._conn = conn
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None
        self._step_down()

    def _step_down(self) -> None:
        if self._term is not None:
            self.stepped_down += 1
        self._term = None
        self._deadline = 0.0

    def poll(self) -> bool:
        """Renew the lease when held, take it when expired; return whether this replica
        leads now.  Never raises for a lost database: this replica then does not lead."""
        with self._lock:
            if self._closed:
                return False
            was = self._term if time.monotonic() < self._deadline else None
            if self._term is not None and was is None:
                log.warning(
                    "wirekit serve: the lead (term %d) was not renewed in time: stepped down",
                    self._term,
                )
                self._step_down()
            try:
                conn = self._session()
                sent = time.monotonic()
                row = conn.execute(
                    _TAKE,
                    {"role": self.role, "holder": self.holder, "lease": self.lease},
                ).fetchone()
            except Exception as exc:  # psycopg.Error, StoreUnavailable: no lead
                if was is not None:
                    log.warning("wirekit serve: lost the lead (term %d): %s", was, exc)
                self._drop()
                return False
            if row is None:  # another replica holds an unexpired lease
                if was is not None:
                    log.warning("wirekit serve: lost the lead (term %d): taken over", was)
                self._step_down()
                return False
            term = int(row[0])
            if term != was:
                self.terms += 1
                if was is not None:  # expired and taken again: a new term
                    log.warning("wirekit serve: the lead (term %d) lapsed, now term %d", was, term)
            self._term = term
            self._deadline = sent + self.lease - self.margin
            return self.leader

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[tuple]:
        """Run ``sql`` as the leader, fenced: in one transaction that first checks (and
        locks until commit) that this replica still holds the lease under its term,
        unexpired on the server's clock.  Raises :class:`NotLeader`, writing nothing, when
        it does not lead, its local deadline passed, its term is stale or its session
        died."""
        with self._lock:
            term = self._term
            if term is None or time.monotonic() >= self._deadline or self._conn is None:
                raise NotLeader("this replica does not lead")
            conn = self._conn
            try:
                with conn.transaction():
                    held = conn.execute(
                        _FENCE, {"role": self.role, "holder": self.holder, "term": term}
                    ).fetchone()
                    if held is None:
                        raise _Stale()
                    cur = conn.execute(sql, params)
                    return cur.fetchall() if cur.description else []
            except _Stale:
                self._step_down()
                raise NotLeader(f"term {term} is over: another replica leads") from None
            except Exception as exc:
                if conn.closed or conn.broken:
                    self._drop()
                    raise NotLeader(f"the lead was lost: {exc}") from None
                raise

    def backend_pid(self) -> int | None:
        """The server process of the lock's session (None when not connected)."""
        conn = self._conn
        return None if conn is None else int(conn.info.backend_pid)

    def _give_up(self) -> None:
        term = self._term
        if term is not None and self._conn is not None:
            # expire the lease now, so that another replica takes over at its next poll
            with contextlib.suppress(Exception):
                self._conn.execute(
                    _RELEASE, {"role": self.role, "holder": self.holder, "term": term}
                )
        self._step_down()

    def release(self) -> None:
        """Give the lead up (the lease expires now); the next :meth:`poll` may take it
        again, under a new term."""
        with self._lock:
            self._give_up()

    def close(self) -> None:
        """Give the lead up for good: a :meth:`poll` afterwards (one already on its way from
        another thread included) returns False and opens no session."""
        with self._lock:
            self._closed = True
            self._give_up()
            self._drop()


class _Stale(Exception):
    """The fence found the term over (inside :meth:`LeaderLock.execute`)."""


def _ensure_leadership_table(conn: Any) -> None:
    """Create ``leadership`` on a database the store's migrations have not reached yet
    (under the migrations' lock: never beside one)."""
    if conn.execute("SELECT to_regclass('leadership')").fetchone()[0] is not None:
        return
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(LEADERSHIP_SCHEMA)


#: take or renew the lease (one statement, autocommit): a row held by this holder is
#: renewed (its term kept while unexpired); one expired is taken with term + 1; one held by
#: another holder, unexpired, is left alone (no row returned)
_TAKE = (
    "INSERT INTO leadership AS l (role, holder, term, renewed, expires)"
    " VALUES (%(role)s, %(holder)s, 1, now(), now() + make_interval(secs => %(lease)s))"
    " ON CONFLICT (role) DO UPDATE SET holder = excluded.holder,"
    " term = CASE WHEN l.holder = excluded.holder AND l.expires > now() THEN l.term"
    " ELSE l.term + 1 END,"
    " renewed = excluded.renewed, expires = excluded.expires"
    " WHERE l.expires <= now() OR l.holder = excluded.holder"
    " RETURNING l.term"
)
#: the fence of every leader action: the lease still held by this holder, under its term,
#: unexpired (the row locked until the action commits: a takeover waits for it)
_FENCE = (
    "SELECT term FROM leadership WHERE role = %(role)s AND holder = %(holder)s"
    " AND term = %(term)s AND expires > now() FOR UPDATE"
)
_RELEASE = (
    "UPDATE leadership SET expires = now()"
    " WHERE role = %(role)s AND holder = %(holder)s AND term = %(term)s"
)


class NotLeader(RuntimeError):
    """Work meant for the leader was asked of a replica that does not lead."""


#: the leader's sweep (one statement, fenced by the lead's term): every ``queued`` row of
#: another replica (``me``: the sweeper's own are never ended) whose lease has expired ends
#: ``lost`` at the server's time, with why (the expiry, and who ended it: parameter
#: ``leader``); returns ``(replica, model, rows)``
ADOPT_EXPIRED = (
    "WITH ended AS ("
    " UPDATE requests AS r SET status = 'lost',"
    " time_out = EXTRACT(EPOCH FROM now())::float8,"
    " reason = %(reason)s || ': its lease expired at '"
    " || to_char(l.expires AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
    " || ', ended by ' || %(leader)s"
    " FROM replica_leases AS l"
    " WHERE r.status = 'queued' AND r.replica = l.replica AND l.expires < now()"
    " AND r.replica <> %(me)s"
    " RETURNING r.replica, r.model)"
    " SELECT replica, model, COUNT(*) FROM ended GROUP BY replica, model"
)
#: the leases expired for longer than this (seconds) are deleted by the leader's sweep:
#: their rows were all ended long ago (a replica that comes back takes a new one)
LEASE_KEPT = 86400.0
FORGET_EXPIRED = (
    "DELETE FROM replica_leases WHERE expires < now() - make_interval(secs => %(kept)s)"
)


_RENEW = (
    "INSERT INTO replica_leases (replica, holder, renewed, expires)"
    " VALUES (%(replica)s, %(holder)s, now(), now() + make_interval(secs => %(lease)s))"
    " ON CONFLICT (replica) DO UPDATE SET holder = excluded.holder,"
    " renewed = excluded.renewed, expires = excluded.expires"
)


class ReplicaLease(_OwnSession):
    """This replica's lease in the shared store: its row of ``replica_leases``, which says
    until when it is alive.  :meth:`renew` every period (the first call takes it, before the
    replica writes a row); it expires ``lease`` seconds after the last renewal, on the
    database server's clock (no replica's clock is compared with another's).  Once expired,
    the leader ends the replica's ``queued`` rows ``lost`` (:func:`adopt_expired`);
    :meth:`release` at a clean stop expires it at once.  One connection of its own."""

    def __init__(
        self,
        url: str,
        replica: str,
        *,
        lease: float = 10.0,
        holder: str = "",
        keepalive: float = 5.0,
    ) -> None:
        super().__init__(url, "replica lease", keepalive=keepalive, name=f"wirekit lease {replica}")
        self.replica = replica  #: the replica's name: the ``replica`` of the rows it writes
        self.lease = lease  #: seconds a renewal lasts
        #: this process, in the row (another process holding the name shows there)
        self.holder = holder or f"{socket.gethostname()}#{os.getpid()}"
        self.renewals = 0  #: renewals so far (the first one takes the lease)
        #: renewals that found the lease expired or held by another process: the leader may
        #: have ended this replica's queued rows ``lost`` meanwhile (their answers replace it)
        self.lapses = 0

    def renew(self) -> str | None:
        """Take or extend the lease (it expires ``lease`` seconds from now).  Returns, after
        the first renewal, why the lease had lapsed -- it had expired, or another process
        held it -- else None.  Raises :class:`StoreUnavailable` (or the driver's error) when
        the store cannot be reached: the lease then runs out unless a later renewal comes in
        time."""
        params = {"replica": self.replica, "holder": self.holder, "lease": float(self.lease)}
        with self._lock:
            conn = self._session()
            with conn.transaction():
                found = conn.execute(
                    "SELECT holder, expires < now() FROM replica_leases WHERE replica = %s"
                    " FOR UPDATE",
                    (self.replica,),
                ).fetchone()
                conn.execute(_RENEW, params)
            first = self.renewals == 0
            self.renewals += 1
        if first:
            return None
        if found is None or found[1]:
            why = "it had expired"
        elif found[0] != self.holder:
            why = f"{found[0]} held it (another process with this store.replica?)"
        else:
            return None
        self.lapses += 1
        return why

    def release(self) -> None:
        """A clean stop: expire the lease now (if this process holds it), so the leader ends
        whatever this replica left queued at its next sweep."""
        with self._lock:
            if self.renewals == 0:
                return
            self._session().execute(
                "UPDATE replica_leases SET expires = now() WHERE replica = %s AND holder = %s",
                (self.replica, self.holder),
            )

    def close(self) -> None:
        """Close the session (the lease row stays: it expires by itself); a call afterwards
        raises :class:`StoreUnavailable`."""
        with self._lock:
            self._close_session()


def adopt_expired(
    leader: LeaderLock, by: str, *, me: str | None = None
) -> list[tuple[str, str, int]]:
    """The leader's sweep: end every ``queued`` row of each replica whose lease has expired
    as ``lost`` (time out: now, on the server's clock; reason :data:`LOST_REASON`, the
    expiry and ``by``), and forget the leases expired for longer than
    :data:`LEASE_KEPT`.  Never the rows of replica ``me`` (default: the lock's
    :attr:`~LeaderLock.replica`): a replica never sweeps itself -- its own lease lapsed
    while it was paused, its requests are still its own to answer.  Fenced by the lock's
    term (:meth:`LeaderLock.execute`): raises :class:`NotLeader`, ending nothing, without
    the lead.  Returns ``(replica, model, rows ended)``; running it again ends nothing
    twice (only ``queued`` rows are ended)."""
    mine = leader.replica if me is None else me
    rows = leader.execute(ADOPT_EXPIRED, {"reason": LOST_REASON, "leader": by, "me": mine})
    leader.execute(FORGET_EXPIRED, {"kept": LEASE_KEPT})
    return [(str(replica), str(model), int(n)) for replica, model, n in rows]


def notify(conn: Any, channel: str, payload: str) -> None:
    """``NOTIFY channel, payload`` on ``conn`` (delivered when its transaction commits;
    at once in autocommit)."""
    conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


class Listener:
    """``LISTEN channel`` on a connection of its own; ``callback(payload)`` in the listener
    thread for every notification.  Reconnects (after ``retry`` seconds) when the
    connection breaks; ``on_reconnect()`` is then called, for the owner to reload what it
    may have missed.  ``on_listen()`` is called (in that thread) each time listening
    starts, the first time included.  ``ready`` is set once listening."""

    def __init__(
        self,
        url: str,
        channel: str,
        callback: Callable[[str], None],
        *,
        on_reconnect: Callable[[], None] | None = None,
        on_listen: Callable[[], None] | None = None,
        retry: float = 0.5,
    ) -> None:
        if not channel.replace("_", "").isalnum() or not channel.isascii():
            raise ValueError(f"a channel name is letters, digits and _: {channel!r}")
        self.url = url
        self.channel = channel
        self.callback = callback
        self.on_reconnect = on_reconnect
        self.on_listen = on_listen
        self.retry = retry
        self.ready = threading.Event()
        self.received = 0  #: notifications handled
        self._stop = threading.Event()
        self._conn: Any = None
        self._thread: threading.Thread | None = None
        #: a database outage is one WARNING per burst, not one per retry
        self._broken = BurstLog(log)

    def start(self) -> Listener:
        self._thread = threading.Thread(target=self._run, name="wirekit-listen", daemon=True)
        self._thread.start()
        return self

    def backend_pid(self) -> int | None:
        """The server process of the listening session (None when not connected)."""
        conn = self._conn
        return None if conn is None else int(conn.info.backend_pid)

    def _run(self) -> None:
        first = True
        while not self._stop.is_set():
            try:
                self._conn = conn = _connect(self.url, 5.0)
                conn.execute(f'LISTEN "{self.channel}"')
                if not first and self.on_reconnect is not None:
                    self.on_reconnect()
                first = False
                if self.on_listen is not None:
                    self.on_listen()
                self.ready.set()
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=0.2, stop_after=64):
                        self.received += 1
                        try:
                            self.callback(note.payload)
                        except Exception:
                            log.exception("wirekit serve: a %s notification failed", self.channel)
            except Exception as exc:  # the connection broke: listen again
                if self._stop.is_set():
                    return
                why = " ".join(str(exc).split())  # one line
                self._broken.event(
                    time.monotonic(), "wirekit serve: listening on %s: %s", self.channel, why
                )
                time.sleep(self.retry)
            finally:
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        self._conn.close()
                    self._conn = None

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


@dataclass(frozen=True, slots=True)
class Change:
    """One change of the models metadata, as logged."""

    seq: int
    origin: str  #: the replica that made it ("" for a snapshot)
    #: "quota", "add", "remove", "settings" (the catalog's kinds); "snapshot": every change up to
    #: ``seq`` folded (``doc`` as :func:`fold` returns it)
    kind: str
    doc: dict[str, Any]


# the append lock is taken by the sub-select, before the INSERT draws the seq: the lock is
# held until commit, so changes commit in seq order
_APPEND = (
    "WITH c AS (INSERT INTO catalog_changes (origin, kind, doc)"
    " SELECT %s, %s, %s FROM (SELECT pg_advisory_xact_lock(%s)) AS l"
    " RETURNING seq) SELECT seq, pg_notify(%s, seq::text) FROM c"
)


def _row_key(doc: dict[str, Any]) -> str:
    return json.dumps([doc["model"], doc["node"], doc["device"]])


def fold(state: dict[str, Any] | None, changes: Sequence[Change]) -> dict[str, Any]:
    """The models metadata's changes folded into one document (what a snapshot holds):
    ``{"models": {name: {"removed": bool, "add": doc | None[, "settings": doc]}}, "quotas":
    {row: doc}}``.  Applying it over a catalog (``removed``: remove the model if present;
    ``add``: add it if absent, with its ``settings`` when given; then every row's last
    quota, and the last ``settings`` of every model present) gives what applying the
    changes in order gives.  ``state``: an earlier fold (None: none); a ``"snapshot"``
    change replaces what was folded so far.  A change whose document is not shaped as
    its kind says is left out."""
    models: dict[str, dict[str, Any]] = dict(state["models"]) if state else {}
    quotas: dict[str, dict[str, Any]] = dict(state["quotas"]) if state else {}
    for change in changes:
        try:
            doc = change.doc
            if change.kind == "snapshot":
                models, quotas = dict(doc["models"]), dict(doc["quotas"])
            elif change.kind == "quota":
                quotas[_row_key(doc)] = doc
            elif change.kind == "add":
                seen = models.get(doc["model"]["name"])
                if seen is None or seen["add"] is None:  # a second add of a model is refused
                    entry = {"removed": bool(seen and seen["removed"]), "add": doc}
                    if seen is not None and "settings" in seen:  # of a model left in place
                        entry["settings"] = seen["settings"]
                    models[doc["model"]["name"]] = entry
            elif change.kind == "settings":  # the model's live settings, all of them: the last wins
                name = doc["model"]
                models[name] = {**models.get(name, {"removed": False, "add": None}),
                                "settings": doc["settings"]}  # fmt: skip
            elif change.kind == "remove":
                name = doc["model"]
                models[name] = {"removed": True, "add": None}
                quotas = {k: q for k, q in quotas.items() if q["model"] != name}
        except (KeyError, TypeError, AttributeError, IndexError):
            continue  # a change not shaped as its kind says: not folded (each step of a
            # kind reads everything it needs before it changes anything)
    return {"models": models, "quotas": quotas}


class ChangeLog(_OwnSession):
    """The ordered log of the models metadata's changes (see the module docstring).  The
    table comes with the store's migrations (``RequestStore.open`` applies them)."""

    def __init__(self, url: str, origin: str, channel: str = CATALOG_CHANNEL) -> None:
        super().__init__(url, "change log")
        self.origin = origin
        self.channel = channel
        self._listener: Listener | None = None
        self.applied = 0  #: the last seq handed to the follower
        #: the seqs of the changes that cannot be read (skipped, reported once each)
        self.skipped: set[int] = set()

    def append(self, kind: str, doc: dict[str, Any], *, via: LeaderLock | None = None) -> int:
        """Log a change made here and tell the others; returns its seq.  ``via``: on the
        leader's session (raises :class:`NotLeader`, logging nothing, without the lead)."""
        params = (self.origin, kind, json.dumps(doc, sort_keys=True), APPEND_KEY, self.channel)
        if via is not None:
            return int(via.execute(_APPEND, params)[0][0])
        with self._lock:
            conn = self._session()
            with conn.transaction():
                return int(conn.execute(_APPEND, params).fetchone()[0])

    def last(self) -> int:
        """The seq of the newest change logged (0 for none), compacted ones included."""
        with self._lock:
            row = self._session().execute(
                "SELECT GREATEST((SELECT MAX(seq) FROM catalog_changes),"
                " (SELECT MAX(upto) FROM catalog_snapshots), 0)"
            )
            return int(row.fetchone()[0])

    def since(self, seq: int) -> list[Change]:
        """The changes after ``seq``, oldest first (every origin).  When changes after
        ``seq`` were compacted, the newest snapshot comes first (kind ``"snapshot"``, its
        ``seq`` the last change it folds), then the changes after it.  A change that cannot
        be read is skipped (see :meth:`_changes`)."""
        return self._since(seq)[0]

    def _since(self, seq: int) -> tuple[list[Change], int]:
        """:meth:`since`, and the highest seq read (``seq`` when none): the changes skipped
        as unreadable included, so a follower moves past them."""
        with self._lock:
            conn = self._session()
            with conn.transaction():
                # one view of both tables: a compaction commits whole or not at all
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                snap = conn.execute(
                    "SELECT upto, doc FROM catalog_snapshots WHERE upto > %s"
                    " ORDER BY upto DESC LIMIT 1",
                    (seq,),
                ).fetchone()
                rows = conn.execute(
                    "SELECT seq, origin, kind, doc FROM catalog_changes WHERE seq > %s"
                    " ORDER BY seq",
                    (seq if snap is None else snap[0],),
                ).fetchall()
        head = [] if snap is None else self._changes([(snap[0], "", "snapshot", snap[1])])
        last = max([seq, *(int(r[0]) for r in rows)] + ([int(snap[0])] if snap else []))
        return head + self._changes(rows), last

    def _changes(self, rows: Sequence[tuple[Any, Any, Any, Any]]) -> list[Change]:
        """The rows ``(seq, origin, kind, doc)`` read from the log as :class:`Change`\\ s,
        but for those that cannot be one (``doc`` not a JSON object, a kind that is not
        text): those are left in the log, skipped, and reported once each (by ``seq``) --
        a bad record never stops a replica from starting or following."""
        changes = []
        for seq, origin, kind, doc in rows:
            try:
                parsed = json.loads(doc)
                if not isinstance(parsed, dict) or not isinstance(kind, str):
                    raise ValueError("not a change document (a JSON object of a kind)")
            except (TypeError, ValueError, RecursionError) as exc:
                if seq not in self.skipped:
                    self.skipped.add(seq)
                    log.warning(
                        "wirekit serve: catalog change %s of %r cannot be read, skipped"
                        " (left in the log): %s",
                        seq,
                        origin,
                        exc,
                    )
                continue
            changes.append(Change(int(seq), origin, kind, parsed))
        return changes

    def compact(self, keep: float = 60.0) -> int:
        """Fold the changes logged more than ``keep`` seconds ago (and the newest snapshot)
        into a new snapshot, delete them and the older snapshots; one transaction, under
        an advisory lock (replicas that compact at once wait for each other).  Returns the
        seq of the last change folded (0: nothing to compact).  Changes younger than
        ``keep`` stay, for the live replicas to read them from the log."""
        with self._lock:
            conn = self._session()
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (COMPACT_KEY,))
                upto = conn.execute(
                    "SELECT MAX(seq) FROM catalog_changes"
                    " WHERE time < now() - make_interval(secs => %s)",
                    (float(keep),),
                ).fetchone()[0]
                if upto is None:
                    return 0
                snap = conn.execute(
                    "SELECT upto, doc FROM catalog_snapshots ORDER BY upto DESC LIMIT 1"
                ).fetchone()
                rows = conn.execute(
                    "SELECT seq, origin, kind, doc FROM catalog_changes"
                    " WHERE seq <= %s ORDER BY seq",
                    (upto,),
                ).fetchall()
                changes = self._changes(rows)
                state = fold(None if snap is None else json.loads(snap[1]), changes)
                conn.execute(
                    "INSERT INTO catalog_snapshots (upto, doc) VALUES (%s, %s)",
                    (upto, json.dumps(state, sort_keys=True)),
                )
                # a change that cannot be read stays in the log (kept, not folded)
                conn.execute(
                    "DELETE FROM catalog_changes WHERE seq <= %s AND NOT (seq = ANY(%s))",
                    (upto, [int(r[0]) for r in rows if r[0] in self.skipped]),
                )
                conn.execute("DELETE FROM catalog_snapshots WHERE upto < %s", (upto,))
                return int(upto)

    def follow(self, apply: Callable[[list[Change]], None], *, after: int = 0) -> Listener:
        """Call ``apply(changes)`` (in the listener's thread) with the other replicas'
        changes after seq ``after``, in order, whenever some are logged.  Returns the
        started :class:`Listener` (``ready`` once listening)."""
        self.applied = after

        def catch_up(_payload: str = "") -> None:
            changes, last = self._since(self.applied)
            if last <= self.applied:
                return
            theirs = [c for c in changes if c.origin != self.origin]
            try:
                if theirs:
                    apply(theirs)
            finally:
                # after the hand-over: whoever sees ``applied`` reach a seq knows the
                # changes up to it were handed to ``apply``
                self.applied = last

        # every call in the listener's thread: on each notification, and each time the
        # LISTEN starts (what was logged before it, or while disconnected)
        listener = Listener(self.url, self.channel, catch_up, on_listen=catch_up)
        self._listener = listener.start()
        return listener

    def close(self) -> None:
        """Stop following and close the session; a call afterwards (an append still on its
        way from another thread included) raises :class:`StoreUnavailable` and opens no
        session."""
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        with self._lock:
            self._close_session()
