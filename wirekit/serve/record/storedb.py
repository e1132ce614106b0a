"""The database under the requests store: one interface, a SQLite and a PostgreSQL backend.

:class:`~wirekit.serve.record.store.RequestStore` owns the request path (a list of pending rows and
the journal); everything it asks of a database goes through :class:`StoreDB`:

* :meth:`StoreDB.migrate` -- the versioned schema (``MIGRATIONS_*`` below), applied on open,
  idempotent; on PostgreSQL under an advisory transaction lock, so replicas that start at
  once apply each migration exactly once;
* :meth:`StoreDB.write` -- one hand-over of the writer thread in one transaction;
* :meth:`StoreDB.replay` -- completions read back from a journal after a crash, inserted or
  updated by request id (idempotent: replaying twice counts nothing twice);
* :meth:`StoreDB.end_lost` -- rows a previous run of this replica left ``queued``, ended
  ``lost``;
* :meth:`StoreDB.status_counts`, :meth:`StoreDB.ok_times`, :meth:`StoreDB.rows` -- what the
  metrics (:mod:`wirekit.serve.control.metrics`) and ``wirekit serve stats`` read.

A store is a file path (SQLite, the embedded default) or a ``postgresql://`` URL (several
``wirekit serve`` replicas sharing one store, issue 17).  Driver: psycopg 3 -- synchronous
connections suit the writer *thread* the store already has (asyncpg is asyncio-only and would
put the database on the event loop), ``COPY`` makes batched inserts cheap, and its
``executemany`` pipelines the updates in one round trip; ``psycopg_pool`` keeps the readers'
connections.  Each replica's rows carry its name (``replica``) so that a replica that
restarts ends only its own unanswered rows ``lost``, never a peer's; a peer's are ended by
the leader once that peer's lease expired (:data:`ADOPT_EXPIRED`, specs/replicas.md).
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

QUEUED, OK, ERROR, FAILED, ABANDONED = "queued", "ok", "error", "failed", "abandoned"
#: the end of a request whose dispatcher (process) died before answering it -- set when the
#: same replica starts again, or by the leader of a shared store once the dead replica's
#: lease expired; ``abandoned`` is a client that went away
LOST = "lost"
#: the reason of a ``lost`` row: its request arrived (its arrival row, or its journaled
#: arrival record) but no answer was recorded before the dispatcher stopped
LOST_REASON = "the dispatcher stopped before answering"

#: the PostgreSQL advisory lock key under which migrations run ("wirekit" in ASCII, as int)
MIGRATION_LOCK = 0x7769726B6974

#: columns of an INSERT row, in the order :func:`wirekit.serve.record.writer.merge_ops` makes them
INSERT_COLUMNS = (
    "id",
    "model",
    "client",
    "time_in",
    "payload_size",
    "payload",
    "device",
    "time_out",
    "status",
    "attempts",
)
#: columns of a replayed journal row (the journal line's order)
REPLAY_COLUMNS = (
    "id",
    "model",
    "client",
    "device",
    "time_in",
    "time_out",
    "status",
    "payload_size",
    "attempts",
    "payload",
    "reason",
)

#: columns of a decision -- the controller's or an operator's (``metrics``: JSON text of
#: what the policy saw; ``replica``: the replica that decided; ``by``: who decided,
#: ``"controller"`` or ``"operator@<peer>"``; ``kind``: ``quota``, ``add``, ``remove`` or
#: ``set``; ``before``/``after``: JSON text of the values before and after, see
#: :mod:`~wirekit.serve.record.decisions`)
DECISION_COLUMNS = (
    "time",
    "node",
    "device",
    "device_type",
    "model",
    "old",
    "new",
    "status",
    "reason",
    "error",
    "metrics",
    "replica",
    "by",
    "kind",
    "before",
    "after",
)

# -- the schema, one list per backend: version n is MIGRATIONS[n - 1] ---------------------

MIGRATIONS_SQLITE: tuple[str, ...] = (
    # 1: the requests table (the schema of wirekit 0.1; IF NOT EXISTS: files made before
    # versioning existed start at version 0 and pass through it unchanged)
    """
    CREATE TABLE IF NOT EXISTS requests (
        id            TEXT PRIMARY KEY,
        model         TEXT NOT NULL,
        client        TEXT NOT NULL,
        device        TEXT,
        time_in       REAL NOT NULL,
        time_out      REAL,
        status        TEXT NOT NULL,
        payload_size  INTEGER NOT NULL,
        attempts      INTEGER NOT NULL DEFAULT 0,
        payload       BLOB
    );
    CREATE INDEX IF NOT EXISTS requests_model_status ON requests (model, status);
    """,
    # 2: why a request failed (issue 21), which replica wrote the row (issue 17)
    """
    ALTER TABLE requests ADD COLUMN reason TEXT;
    ALTER TABLE requests ADD COLUMN replica TEXT;
    """,
    # 3: the controller's decisions (issue 16; the columns its first version created, plus
    # who decided)
    """
    CREATE TABLE IF NOT EXISTS decisions (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        time         REAL NOT NULL,
        node         TEXT NOT NULL,
        device       INTEGER NOT NULL,
        device_type  TEXT NOT NULL,
        model        TEXT NOT NULL,
        old          REAL NOT NULL,
        new          REAL NOT NULL,
        status       TEXT NOT NULL,
        reason       TEXT NOT NULL,
        error        TEXT,
        metrics      TEXT NOT NULL
    );
    ALTER TABLE decisions ADD COLUMN replica TEXT;
    """,
    # 4: who decided and what (issue 38): the operator's changes through the admin API are
    # decisions too (kind add/remove/set besides quota), with the values before and after
    # (JSON text); the rows stored before are the quota changes of the controller or, with
    # reason ``admin``, of an operator
    """
    ALTER TABLE decisions ADD COLUMN by TEXT;
    ALTER TABLE decisions ADD COLUMN kind TEXT;
    ALTER TABLE decisions ADD COLUMN before TEXT;
    ALTER TABLE decisions ADD COLUMN after TEXT;
    UPDATE decisions SET
        by = CASE WHEN reason = 'admin' THEN 'operator' ELSE 'controller' END,
        kind = 'quota', before = CAST(old AS TEXT), after = CAST(new AS TEXT)
    WHERE kind IS NULL;
    """,
)

#: the leadership table (schema version 9; :class:`~wirekit.serve.record.pgsync.LeaderLock`
#: also creates it on a database the store's migrations have not reached)
LEADERSHIP_SCHEMA = """
    CREATE TABLE IF NOT EXISTS leadership (
        role     TEXT PRIMARY KEY,
        holder   TEXT NOT NULL,
        term     BIGINT NOT NULL,
        renewed  TIMESTAMPTZ NOT NULL,
        expires  TIMESTAMPTZ NOT NULL
    );
    """

MIGRATIONS_PG: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS requests (
        id            TEXT PRIMARY KEY,
        model         TEXT NOT NULL,
        client        TEXT NOT NULL,
        device        TEXT,
        time_in       DOUBLE PRECISION NOT NULL,
        time_out      DOUBLE PRECISION,
        status        TEXT NOT NULL,
        payload_size  BIGINT NOT NULL,
        attempts      INTEGER NOT NULL DEFAULT 0,
        payload       BYTEA
    );
    CREATE INDEX IF NOT EXISTS requests_model_status ON requests (model, status);
    """,
    """
    ALTER TABLE requests ADD COLUMN IF NOT EXISTS reason TEXT;
    ALTER TABLE requests ADD COLUMN IF NOT EXISTS replica TEXT;
    CREATE INDEX IF NOT EXISTS requests_replica_queued ON requests (replica)
        WHERE status = 'queued';
    """,
    """
    CREATE TABLE IF NOT EXISTS decisions (
        id           BIGSERIAL PRIMARY KEY,
        time         DOUBLE PRECISION NOT NULL,
        node         TEXT NOT NULL,
        device       INTEGER NOT NULL,
        device_type  TEXT NOT NULL,
        model        TEXT NOT NULL,
        old          DOUBLE PRECISION NOT NULL,
        new          DOUBLE PRECISION NOT NULL,
        status       TEXT NOT NULL,
        reason       TEXT NOT NULL,
        error        TEXT,
        metrics      TEXT NOT NULL,
        replica      TEXT
    );
    """,
    # 4: the models metadata's changes, in order (wirekit.serve.record.pgsync.ChangeLog): every
    # replica applies the changes of the others; NOTIFY only says that there are new ones
    """
    CREATE TABLE IF NOT EXISTS catalog_changes (
        seq     BIGSERIAL PRIMARY KEY,
        time    TIMESTAMPTZ NOT NULL DEFAULT now(),
        origin  TEXT NOT NULL,
        kind    TEXT NOT NULL,
        doc     TEXT NOT NULL
    );
    """,
    # 5: the recent window of every replica's requests (PostgresDB.recent: the leader's
    # controller sees the load of all replicas)
    """
    CREATE INDEX IF NOT EXISTS requests_time_out ON requests (time_out);
    """,
    # 6: the change log compacted (ChangeLog.compact): the models metadata folded up to
    # change ``upto``, whose changes are then deleted; a starting replica loads the newest
    # snapshot, then the changes after it
    """
    CREATE TABLE IF NOT EXISTS catalog_snapshots (
        upto  BIGINT PRIMARY KEY,
        time  TIMESTAMPTZ NOT NULL DEFAULT now(),
        doc   TEXT NOT NULL
    );
    """,
    # 7: every replica's lease (wirekit.serve.record.pgsync.ReplicaLease): renewed every
    # period while it runs; once ``expires`` has passed, the leader ends the replica's queued
    # rows ``lost`` (ADOPT_EXPIRED).  Times are the database server's clock.
    """
    CREATE TABLE IF NOT EXISTS replica_leases (
        replica  TEXT PRIMARY KEY,
        holder   TEXT NOT NULL,
        renewed  TIMESTAMPTZ NOT NULL,
        expires  TIMESTAMPTZ NOT NULL
    );
    """,
    # 8: who decided and what (issue 38; SQLite's 4)
    """
    ALTER TABLE decisions ADD COLUMN IF NOT EXISTS by TEXT;
    ALTER TABLE decisions ADD COLUMN IF NOT EXISTS kind TEXT;
    ALTER TABLE decisions ADD COLUMN IF NOT EXISTS before TEXT;
    ALTER TABLE decisions ADD COLUMN IF NOT EXISTS after TEXT;
    UPDATE decisions SET
        by = CASE WHEN reason = 'admin' THEN 'operator' ELSE 'controller' END,
        kind = 'quota', before = CAST(old AS TEXT), after = CAST(new AS TEXT)
    WHERE kind IS NULL;
    """,
    # 9: leadership on a lease (wirekit.serve.record.pgsync.LeaderLock): one row per role,
    # who holds it, under which term (raised at every takeover) and until when; every
    # leader action checks its term against it in its own transaction (fencing)
    LEADERSHIP_SCHEMA,
)


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One row of the store, as read back."""

    id: str
    model: str
    client: str
    device: str | None
    time_in: float
    time_out: float | None
    status: str
    payload_size: int
    attempts: int

    @property
    def response_time(self) -> float | None:
        return None if self.time_out is None else self.time_out - self.time_in


class StoreDB(Protocol):
    """What the store, the metrics and the CLI need of a database (see the module doc)."""

    kind: str  #: "sqlite" or "postgresql"
    chunk: int  #: rows per INSERT statement that :meth:`write` wants flattened together

    def migrate(self) -> int:
        """Bring the schema to the newest version; returns it."""
        ...

    def write(
        self,
        chunks: list[tuple],
        rest: list[tuple],
        updates: list[tuple],
        reasons: list[tuple[str, str]],
    ) -> None:
        """One hand-over in one transaction: the INSERT rows of
        :func:`~wirekit.serve.record.writer.merge_ops` (``chunks``: many rows flattened per tuple,
        ``rest``: one row per tuple), the UPDATEs ``(device, time_out, status, attempts,
        id)``, then the ``(reason, id)`` of failed rows."""
        ...

    def replay(self, rows: list[tuple]) -> None:
        """Insert or update journal rows (:data:`REPLAY_COLUMNS`) by id, in one
        transaction; a stored payload is kept when the row has none."""
        ...

    def end_lost(self, time_out: float) -> dict[str, int]:
        """End the rows this replica left ``queued`` (a previous run that died) as ``lost``
        at ``time_out``, with :data:`LOST_REASON`; returns how many per model."""
        ...

    def status_counts(self) -> list[tuple[str, str, int]]:
        """``(model, status, rows)`` for every model and status."""
        ...

    def ok_times(self) -> list[tuple[str, int, float, float, float]]:
        """``(model, count, sum, min, max)`` of the response times of the ``ok`` rows."""
        ...

    def rows(self) -> Iterator[RequestRow]:
        """Every row, oldest first."""
        ...

    def record_decision(self, values: Sequence[Any]) -> None:
        """Store one decision (:data:`DECISION_COLUMNS`), in its own transaction."""
        ...

    def decisions(self, limit: int) -> list[dict[str, Any]]:
        """The last ``limit`` decisions, oldest first, as dicts of
        :data:`DECISION_COLUMNS` (``metrics``, ``before``, ``after`` still JSON text)."""
        ...

    def close(self) -> None: ...


class StoreUnavailable(RuntimeError):
    """The store cannot be opened (a database that cannot be reached, a journal in use)."""


class ExtraMissing(StoreUnavailable):
    """The store needs an extra that is not installed (``pg`` for ``postgresql://``): the
    command cannot run as installed, a usage error rather than a store that failed."""


def is_row_error(exc: BaseException) -> bool:
    """Whether a write failed because of the values of a row (a type or a text the database
    cannot hold, a constraint), not because the database is away or busy: what the journal's
    replay quarantines a record for rather than stopping."""
    if isinstance(exc, ValueError | TypeError | OverflowError):  # UnicodeEncodeError too
        return True
    if isinstance(exc, sqlite3.Error):
        return not isinstance(exc, sqlite3.OperationalError)  # locked, I/O, full: not a row's
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.DataError | psycopg.IntegrityError)


def _text(raw: bytes) -> str:
    """SQLite text as str: text that is not UTF-8 (written by something else) is read with
    U+FFFD for each bad byte rather than failing the whole query."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace")


#: the URL schemes of a PostgreSQL store (any other target is a SQLite file)
POSTGRESQL_SCHEMES = ("postgresql://", "postgres://")


def is_url(target: Any) -> bool:
    """Whether a store target names a PostgreSQL database (a ``postgresql://`` or
    ``postgres://`` URL) rather than a SQLite file: the one test of it, the config's too."""
    return isinstance(target, str) and target.startswith(POSTGRESQL_SCHEMES)


def open_db(
    target: str | Path, *, replica: str = "", readonly: bool = False, chunk: int = 32
) -> StoreDB:
    """A connection to a store: a ``postgresql://`` URL, else a SQLite file path (created
    unless ``readonly``).  Does not migrate: :meth:`StoreDB.migrate` does."""
    if is_url(target):
        return PostgresDB(str(target), replica=replica)
    return SqliteDB(target, readonly=readonly, replica=replica, chunk=chunk)


def redact(url: str) -> str:
    """A URL without its password (for messages and logs)."""
    head, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    cred, _, host = rest.rpartition("@")
    user = cred.split(":", 1)[0]
    return f"{head}://{user}:***@{host}" if ":" in cred else url


# -- SQLite --------------------------------------------------------------------------------


def connect_sqlite(path: str | Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection to a store file (WAL; migrated to the newest schema unless
    ``readonly``)."""
    if readonly:
        uri = Path(path).resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        conn.text_factory = _text
        return conn
    if not Path(path).parent.is_dir():
        raise StoreUnavailable(
            f"store {str(path)!r}: its directory {str(Path(path).parent)!r} does not exist"
        )
    try:
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    except sqlite3.OperationalError as exc:
        raise StoreUnavailable(f"store {str(path)!r}: cannot open it: {exc}") from None
    conn.text_factory = _text
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    _migrate_sqlite(conn)
    return conn


def _migrate_sqlite(conn: sqlite3.Connection) -> int:
    """Apply the migrations a file lacks (``PRAGMA user_version`` is its version), each in
    a write transaction (``BEGIN IMMEDIATE``: one process at a time)."""
    newest = len(MIGRATIONS_SQLITE)
    if conn.execute("PRAGMA user_version").fetchone()[0] >= newest:
        return newest
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        for n in range(version, newest):
            for statement in MIGRATIONS_SQLITE[n].split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {max(version, newest)}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return newest


#: the reason a replayed completion leaves: its own, else the stored one -- but not a
#: ``lost`` row's (the journal's answer replaces the leader's presumption, reason and all)
_REPLAYED_REASON = (
    "CASE WHEN requests.status = 'lost' THEN excluded.reason"
    " ELSE COALESCE(excluded.reason, requests.reason) END"
)
_SQLITE_REPLAY = (
    f"INSERT INTO requests ({', '.join(REPLAY_COLUMNS)}, replica)"
    f" VALUES ({', '.join('?' * (len(REPLAY_COLUMNS) + 1))})"
    " ON CONFLICT (id) DO UPDATE SET device = excluded.device, time_out = excluded.time_out,"
    " status = excluded.status, attempts = excluded.attempts,"
    f" reason = {_REPLAYED_REASON},"
    " payload = COALESCE(excluded.payload, requests.payload)"
    # an arrival record only fills in a missing row: it never takes an answer back
    " WHERE excluded.status <> 'queued'"
)
_UPDATE = "UPDATE requests SET device = ?, time_out = ?, status = ?, attempts = ? WHERE id = ?"
_REASON = "UPDATE requests SET reason = ? WHERE id = ?"
_COUNTS = "SELECT model, status, COUNT(*) FROM requests GROUP BY model, status"
_OK_TIMES = (
    "SELECT model, COUNT(*), SUM(time_out - time_in), MIN(time_out - time_in),"
    " MAX(time_out - time_in) FROM requests WHERE status = 'ok' GROUP BY model"
)
_ROWS = (
    "SELECT id, model, client, device, time_in, time_out, status, payload_size, attempts"
    " FROM requests"
)


class SqliteDB:
    """The embedded store: one SQLite file in WAL mode (one writer, readers alongside)."""

    kind = "sqlite"

    def __init__(
        self,
        path: str | Path,
        *,
        readonly: bool = False,
        replica: str = "",
        chunk: int = 32,
        conn: sqlite3.Connection | None = None,
    ) -> None:
        self.path = Path(path)
        self.replica = replica
        self.chunk = chunk  #: rows per many-row INSERT statement
        self.conn = conn if conn is not None else connect_sqlite(path, readonly=readonly)
        cols = ", ".join(INSERT_COLUMNS)
        one = "(" + ", ".join("?" * len(INSERT_COLUMNS)) + ")"
        self._insert_row = f"INSERT INTO requests ({cols}) VALUES {one}"
        self._insert_chunk = f"INSERT INTO requests ({cols}) VALUES " + ", ".join([one] * chunk)

    def migrate(self) -> int:
        return _migrate_sqlite(self.conn)

    def write(self, chunks, rest, updates, reasons) -> None:
        conn = self.conn
        conn.execute("BEGIN")
        try:
            if chunks:
                conn.executemany(self._insert_chunk, chunks)
            if rest:
                conn.executemany(self._insert_row, rest)
            if updates:
                conn.executemany(_UPDATE, updates)
            if reasons:
                conn.executemany(_REASON, reasons)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def replay(self, rows: list[tuple]) -> None:
        conn = self.conn
        conn.execute("BEGIN")
        try:
            conn.executemany(_SQLITE_REPLAY, [(*r, self.replica or None) for r in rows])
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def end_lost(self, time_out: float) -> dict[str, int]:
        # one file, one dispatcher: every queued row is this one's
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            counts = conn.execute(
                "SELECT model, COUNT(*) FROM requests WHERE status = ? GROUP BY model", (QUEUED,)
            ).fetchall()
            conn.execute(
                "UPDATE requests SET status = ?, time_out = ?, reason = COALESCE(reason, ?)"
                " WHERE status = ?",
                (LOST, time_out, LOST_REASON, QUEUED),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return {str(model): int(n) for model, n in counts}

    def status_counts(self) -> list[tuple[str, str, int]]:
        return list(self.conn.execute(_COUNTS))

    def ok_times(self) -> list[tuple[str, int, float, float, float]]:
        return list(self.conn.execute(_OK_TIMES))

    def rows(self) -> Iterator[RequestRow]:
        for row in self.conn.execute(_ROWS + " ORDER BY time_in, rowid"):
            yield RequestRow(*row)

    def record_decision(self, values: Sequence[Any]) -> None:
        marks = ", ".join("?" * len(DECISION_COLUMNS))
        self.conn.execute(
            f"INSERT INTO decisions ({', '.join(DECISION_COLUMNS)}) VALUES ({marks})",
            tuple(values),
        )

    def decisions(self, limit: int) -> list[dict[str, Any]]:
        cur = self.conn.execute(
            f"SELECT {', '.join(DECISION_COLUMNS)} FROM decisions ORDER BY id DESC LIMIT ?",
            (limit,),
        )
        return [dict(zip(DECISION_COLUMNS, row, strict=True)) for row in cur][::-1]

    def close(self) -> None:
        self.conn.close()


# -- PostgreSQL ----------------------------------------------------------------------------


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the pg extra is missing
        raise ExtraMissing(
            "a postgresql:// store needs the 'pg' extra: pip install 'wirekit[pg]'"
        ) from exc
    return psycopg


#: the PostgreSQL types of :data:`INSERT_COLUMNS` and ``replica``, for a binary COPY
_COPY_TYPES = (
    "text",
    "text",
    "text",
    "float8",
    "int8",
    "bytea",
    "text",
    "float8",
    "text",
    "int4",
    "text",
)


class PostgresDB:
    """A shared store on PostgreSQL: one connection (the writer thread's, or a reader's).

    Writes: arrivals and completed rows by ``COPY`` (one stream per hand-over), the
    completions of earlier arrivals by a pipelined ``executemany``; one transaction.  A
    broken connection is reopened at the next hand-over (the writer tries a failed one once
    more at once); a read whose connection breaks under it is tried once more on a new one
    (:meth:`_query`: the ``/stats`` reader after a restart of the database).
    """

    kind = "postgresql"
    #: rows per INSERT statement of :func:`~wirekit.serve.record.writer.merge_ops`: COPY takes them
    #: one by one, so none are flattened into chunks
    chunk = 1 << 30

    def __init__(self, url: str, *, replica: str = "", connect_timeout: float = 10.0) -> None:
        self.url = url
        self.replica = replica
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()  # readers may share one PostgresDB across threads
        self._closed = False
        self.conn = self._connect()

    def _connect(self) -> Any:
        psycopg = _psycopg()
        try:
            return psycopg.connect(
                self.url, autocommit=True, connect_timeout=max(1, int(self.connect_timeout))
            )
        except psycopg.OperationalError as exc:
            why = " ".join(str(exc).split())  # one line
            raise StoreUnavailable(f"cannot reach the store at {redact(self.url)}: {why}") from None

    def _live(self) -> Any:
        """The connection, reopened if it broke (not once :meth:`close` was called: a query
        still on its way from another thread then raises, and opens nothing)."""
        if self._closed:
            raise StoreUnavailable(f"the store at {redact(self.url)} is closed")
        if self.conn.closed or self.conn.broken:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = self._connect()
            if self._closed:  # close() ran meanwhile: it may have closed the old one
                self.conn.close()
                raise StoreUnavailable(f"the store at {redact(self.url)} is closed")
        return self.conn

    def migrate(self) -> int:
        conn = self._live()
        with self._lock, conn.transaction():
            # every replica takes this lock first: the one that gets it migrates, the others
            # then find the versions applied
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS wirekit_schema ("
                " version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM wirekit_schema").fetchone()
            version = int(row[0])
            for n in range(version, len(MIGRATIONS_PG)):
                conn.execute(MIGRATIONS_PG[n])
                conn.execute("INSERT INTO wirekit_schema (version) VALUES (%s)", (n + 1,))
        return max(version, len(MIGRATIONS_PG))

    def write(self, chunks, rest, updates, reasons) -> None:
        conn = self._live()
        width = len(INSERT_COLUMNS)
        replica = self.replica or None
        with self._lock, conn.transaction(), conn.cursor() as cur:
            if chunks or rest:
                cols = ", ".join((*INSERT_COLUMNS, "replica"))
                with cur.copy(f"COPY requests ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
                    copy.set_types(_COPY_TYPES)
                    write_row = copy.write_row
                    for flat in chunks:
                        for i in range(0, len(flat), width):
                            write_row((*flat[i : i + width], replica))
                    for row in rest:
                        write_row((*row, replica))
            if updates:
                # a row the leader ended lost meanwhile (this replica's lease had expired)
                # takes its answer, without the leader's reason
                cur.executemany(
                    "UPDATE requests SET device = %s, time_out = %s, status = %s,"
                    " attempts = %s, reason = CASE WHEN status = 'lost' THEN NULL ELSE reason"
                    " END WHERE id = %s",
                    updates,
                )
            if reasons:
                cur.executemany("UPDATE requests SET reason = %s WHERE id = %s", reasons)

    def replay(self, rows: list[tuple]) -> None:
        conn = self._live()
        cols = ", ".join((*REPLAY_COLUMNS, "replica"))
        marks = ", ".join(["%s"] * (len(REPLAY_COLUMNS) + 1))
        sql = (
            f"INSERT INTO requests ({cols}) VALUES ({marks})"
            " ON CONFLICT (id) DO UPDATE SET device = excluded.device,"
            " time_out = excluded.time_out, status = excluded.status,"
            " attempts = excluded.attempts,"
            f" reason = {_REPLAYED_REASON},"
            " payload = COALESCE(excluded.payload, requests.payload)"
            " WHERE excluded.status <> 'queued'"  # an arrival never takes an answer back
        )
        replica = self.replica or None
        with self._lock, conn.transaction(), conn.cursor() as cur:
            cur.executemany(sql, [(*r, replica) for r in rows])

    def end_lost(self, time_out: float) -> dict[str, int]:
        conn = self._live()
        with self._lock:
            rows = conn.execute(
                "WITH ended AS (UPDATE requests SET status = %s, time_out = %s,"
                " reason = COALESCE(reason, %s) WHERE status = %s AND replica = %s"
                " RETURNING model) SELECT model, COUNT(*) FROM ended GROUP BY model",
                (LOST, time_out, LOST_REASON, QUEUED, self.replica),
            ).fetchall()
        return {str(model): int(n) for model, n in rows}

    def _query(self, sql: str, params: Any = None) -> list[Any]:
        """The rows of a read.  A connection that breaks during it (the server restarted,
        an administrator ended the session) is reopened and the read tried once more; a
        store that cannot be reached then raises (:class:`StoreUnavailable`)."""
        with self._lock:
            try:
                return self._live().execute(sql, params).fetchall()
            except Exception:
                if self._closed or not (self.conn.closed or self.conn.broken):
                    raise  # not the connection's fault
            return self._live().execute(sql, params).fetchall()

    def status_counts(self) -> list[tuple[str, str, int]]:
        return [(m, s, int(n)) for m, s, n in self._query(_COUNTS)]

    def ok_times(self) -> list[tuple[str, int, float, float, float]]:
        return [(m, int(n), t, lo, hi) for m, n, t, lo, hi in self._query(_OK_TIMES)]

    def rows(self) -> Iterator[RequestRow]:
        for row in self._query(_ROWS + " ORDER BY time_in, id"):
            yield RequestRow(*row)

    def recent(self, since: float) -> dict[str, dict[str, Any]]:
        """Per model, the figures of the requests of every replica since ``since`` (unix
        time): ``requests`` arrived, ``ok`` and ``errors`` (error or failed) finished,
        ``queue`` waiting or being processed now, and the response times of the ``ok``
        ones: ``avg``, ``p50``, ``p95``, ``p99`` (continuous percentiles), ``max`` (None
        when none was answered)."""
        return self._recent(since, by_device=False)

    def recent_rows(self, since: float) -> dict[str, dict[str, Any]]:
        """The same per row -- the ``device`` column, ``node/device/model`` -- over the
        requests a device finished since ``since``: ``requests`` is the number it finished
        (ok or not), ``queue`` None (a request has no device until it is answered);
        answers from the cache and requests that failed without a device are on no row."""
        return self._recent(since, by_device=True)

    def _recent(self, since: float, *, by_device: bool) -> dict[str, dict[str, Any]]:
        ok = "status = 'ok' AND time_out >= %(since)s"
        rt = "time_out - time_in"
        if by_device:
            group = "device"
            requests = "COUNT(*)"  # every row here finished since then
            queue = "NULL"
            where = "time_out >= %(since)s AND device IS NOT NULL AND device <> 'cache'"
        else:
            group = "model"
            requests = "COUNT(*) FILTER (WHERE time_in >= %(since)s)"
            queue = "COUNT(*) FILTER (WHERE status = 'queued')"
            where = "time_out >= %(since)s OR status = 'queued'"
        sql = (
            f"SELECT {group}, {requests},"
            f" COUNT(*) FILTER (WHERE {ok}),"
            " COUNT(*) FILTER (WHERE status IN ('error', 'failed') AND time_out >= %(since)s),"
            f" {queue},"
            f" AVG({rt}) FILTER (WHERE {ok}),"
            f" percentile_cont(0.5) WITHIN GROUP (ORDER BY {rt}) FILTER (WHERE {ok}),"
            f" percentile_cont(0.95) WITHIN GROUP (ORDER BY {rt}) FILTER (WHERE {ok}),"
            f" percentile_cont(0.99) WITHIN GROUP (ORDER BY {rt}) FILTER (WHERE {ok}),"
            f" MAX({rt}) FILTER (WHERE {ok})"
            f" FROM requests WHERE {where} GROUP BY {group}"
        )
        rows = self._query(sql, {"since": since})
        names = ("requests", "ok", "errors", "queue", "avg", "p50", "p95", "p99", "max")
        return {
            row[0]: {
                k: (None if v is None else int(v) if i < 4 else float(v))
                for i, (k, v) in enumerate(zip(names, row[1:], strict=True))
            }
            for row in rows
        }

    def last_decisions(self, since: float) -> dict[tuple[str, int, str], float]:
        """The time of the last controller decision (the operator's, reason ``admin``,
        aside) of each ``(node, device, model)`` row since ``since`` (unix time)."""
        rows = self._query(
            "SELECT node, device, model, MAX(time) FROM decisions"
            " WHERE time >= %s AND reason <> 'admin' GROUP BY node, device, model",
            (since,),
        )
        return {(n, int(d), m): float(t) for n, d, m, t in rows}

    def record_decision(self, values: Sequence[Any]) -> None:
        marks = ", ".join(["%s"] * len(DECISION_COLUMNS))
        with self._lock:
            self._live().execute(
                f"INSERT INTO decisions ({', '.join(DECISION_COLUMNS)}) VALUES ({marks})",
                tuple(values),
            )

    def decisions(self, limit: int) -> list[dict[str, Any]]:
        rows = self._query(
            f"SELECT {', '.join(DECISION_COLUMNS)} FROM decisions ORDER BY id DESC LIMIT %s",
            (limit,),
        )
        return [dict(zip(DECISION_COLUMNS, row, strict=True)) for row in rows][::-1]

    def close(self) -> None:
        self._closed = True  # first: a reconnect under way sees it (_live)
        with contextlib.suppress(Exception):
            self.conn.close()


def as_db(source: StoreDB | sqlite3.Connection) -> StoreDB:
    """A :class:`StoreDB` for a SQLite connection (what older callers hold), else as is."""
    if isinstance(source, sqlite3.Connection):
        return SqliteDB("", conn=source)
    return source
