"""What several ``wirekit serve`` replicas on one PostgreSQL store coordinate with (issue 17).

* :class:`LeaderLock` -- exactly one replica leads (the controller acts once): a PostgreSQL
  session-level advisory lock, held by one dedicated connection.  The server releases it
  when that session ends, so a leader that dies (``kill -9``, a lost network) is replaced
  at the next :meth:`LeaderLock.poll` of another replica: within ``retry`` seconds plus
  the time the server takes to notice the dead session (at once for a process that died
  on the same machine; TCP keepalives bound it otherwise, see ``keepalive``).  Work done
  as leader is committed *on the lock's session* (:meth:`LeaderLock.execute`): if the
  session is gone, so is the lock, and the write fails -- a replica that lost the lead
  without knowing cannot record a decision, so no decision is taken twice.
* :class:`Listener` -- ``LISTEN`` on a channel in a thread of its own, a callback per
  notification (``NOTIFY`` is delivered to every listening session within milliseconds,
  on commit); :func:`notify` sends one.  The models metadata's changes reach every
  replica's routing this way.

Both use one dedicated connection each (psycopg 3, autocommit) and never the event loop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .storedb import StoreUnavailable, redact

log = logging.getLogger("wirekit.serve")

#: the advisory lock key of the controller's leadership ("wkleader" in ASCII, as int)
LEADER_KEY = 0x776B6C6561646572 & 0x7FFFFFFFFFFFFFFF
#: the channel the models metadata's changes are told on
CATALOG_CHANNEL = "wirekit_catalog"


def _connect(url: str, keepalive: float) -> Any:
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
        )
    except psycopg.OperationalError as exc:
        why = " ".join(str(exc).split())
        raise StoreUnavailable(f"cannot reach the store at {redact(url)}: {why}") from None


class LeaderLock:
    """Leadership among replicas (see the module docstring).

    ``poll()`` (from a timer or a loop, every ``retry`` seconds) tries to take the lock
    when not leading and checks the session when leading; it returns whether this replica
    leads now.  ``release()`` gives the lead up (``close()`` too)."""

    def __init__(
        self, url: str, key: int = LEADER_KEY, *, retry: float = 0.5, keepalive: float = 5.0
    ) -> None:
        self.url = url
        self.key = key
        self.retry = retry  #: seconds between two polls of a replica that does not lead
        self.keepalive = keepalive  #: seconds of TCP silence before the server is probed
        self._conn: Any = None
        self._lock = threading.Lock()
        self.leader = False  #: whether this replica held the lock at the last poll
        self.terms = 0  #: times this replica became leader

    def _session(self) -> Any:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._drop()
            self._conn = _connect(self.url, self.keepalive)
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None
        self.leader = False

    def poll(self) -> bool:
        """Take the lead if it is free; confirm it if held.  Never raises for a lost
        database: this replica then does not lead."""
        with self._lock:
            try:
                conn = self._session()
                if self.leader:
                    conn.execute("SELECT 1")  # the session (and so the lock) still lives
                else:
                    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
                    if row[0]:
                        self.leader = True
                        self.terms += 1
            except Exception as exc:  # psycopg.Error, StoreUnavailable: no lead
                if self.leader:
                    log.warning("wirekit serve: lost the controller lead: %s", exc)
                self._drop()
            return self.leader

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Run ``sql`` on the lock's session, in a transaction, only while leading: raises
        :class:`NotLeader` when this replica does not hold the lock (or the session died
        meanwhile: then nothing was written)."""
        with self._lock:
            if not self.leader or self._conn is None:
                raise NotLeader("this replica does not lead")
            conn = self._conn
            try:
                with conn.transaction():
                    cur = conn.execute(sql, params)
                    return cur.fetchall() if cur.description else []
            except Exception as exc:
                if conn.closed or conn.broken:
                    self._drop()
                    raise NotLeader(f"the lead was lost: {exc}") from None
                raise

    def backend_pid(self) -> int | None:
        """The server process of the lock's session (None when not connected)."""
        conn = self._conn
        return None if conn is None else int(conn.info.backend_pid)

    def release(self) -> None:
        """Give the lead up (the lock and its session)."""
        with self._lock:
            self._drop()

    close = release


class NotLeader(RuntimeError):
    """Work meant for the leader was asked of a replica that does not lead."""


def notify(conn: Any, channel: str, payload: str) -> None:
    """``NOTIFY channel, payload`` on ``conn`` (delivered when its transaction commits;
    at once in autocommit)."""
    conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


class Listener:
    """``LISTEN channel`` on a connection of its own; ``callback(payload)`` in the listener
    thread for every notification.  Reconnects (after ``retry`` seconds) when the
    connection breaks; ``on_reconnect()`` is then called, for the owner to reload what it
    may have missed.  ``ready`` is set once listening."""

    def __init__(
        self,
        url: str,
        channel: str,
        callback: Callable[[str], None],
        *,
        on_reconnect: Callable[[], None] | None = None,
        retry: float = 0.5,
    ) -> None:
        if not channel.replace("_", "").isalnum() or not channel.isascii():
            raise ValueError(f"a channel name is letters, digits and _: {channel!r}")
        self.url = url
        self.channel = channel
        self.callback = callback
        self.on_reconnect = on_reconnect
        self.retry = retry
        self.ready = threading.Event()
        self.received = 0  #: notifications handled
        self._stop = threading.Event()
        self._conn: Any = None
        self._thread: threading.Thread | None = None

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
                log.warning("wirekit serve: listening on %s: %s", self.channel, exc)
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
