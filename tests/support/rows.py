"""The rows of a requests store, read straight from its database (a SQLite file, read
only, or a ``postgresql://`` URL), for the tests to compare with what the dispatcher said.

Every connection is closed before the function returns."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

from wirekit import mip
from wirekit.serve.record.storedb import RequestRow, connect_sqlite, is_url, open_db


def store_rows(target: str | Path) -> list[RequestRow]:
    """Every row of the store at ``target`` (a SQLite file or a PostgreSQL URL), oldest
    first."""
    db = open_db(target, readonly=True)
    try:
        return list(db.rows())
    finally:
        db.close()


def select(target: str | Path, query: str, params: tuple[Any, ...] = ()) -> list[tuple]:
    """What ``query`` selects in the store at ``target`` (a SQLite file, opened read only,
    or a PostgreSQL URL; the placeholders are the driver's: ``?`` or ``%s``)."""
    if is_url(target):
        import psycopg

        with psycopg.connect(str(target), autocommit=True) as pg:
            return pg.execute(query, params).fetchall()
    conn = connect_sqlite(target, readonly=True)
    with contextlib.closing(conn):
        return conn.execute(query, params).fetchall()


def rename_table(target: str | Path, old: str, new: str) -> None:
    """Rename table ``old`` of the store at ``target`` (a SQLite file or a PostgreSQL URL)
    to ``new``: the tests' way to make the store's writes fail, and work again, while the
    database itself stays up."""
    if is_url(target):
        import psycopg

        with psycopg.connect(str(target), autocommit=True) as pg:
            pg.execute(f"ALTER TABLE {old} RENAME TO {new}")
        return
    conn = sqlite3.connect(target)  # a plain connection: nothing migrated or set up
    with contextlib.closing(conn):
        conn.execute(f"ALTER TABLE {old} RENAME TO {new}")
        conn.commit()


def rows_by_text(target: str | Path, columns: str) -> dict[str, list[tuple]]:
    """request text (of the stored payload) -> ``columns`` of every row holding it (a list:
    a text stored twice shows twice)."""
    out: dict[str, list[tuple]] = {}
    for payload, *values in select(target, f"SELECT payload, {columns} FROM requests"):
        text = mip.decode(bytes(payload)).items[0].as_text()
        out.setdefault(text, []).append(tuple(values))
    return out
