"""Issue 38, item 3: a full disk under the journal is a refusal, not a crash.

A real ``wirekit serve`` runs in a subprocess on each event loop (plain asyncio, uvloop) and
the twin the suite runs (``WIREKIT_PURE``), its journal on a real 2 MiB tmpfs mounted for
the test (root only: skipped elsewhere).  The rows' database is a symbolic link off the
tmpfs (SQLite follows it: its file and WAL live elsewhere), so what is under test is the
journal alone -- as with a PostgreSQL store, whose journals are local files too; and once
(plain asyncio) on the same tmpfs, as the default deployment has it: its writes fail too
(then a refused request may have no row at all, and ``/readyz`` is ready again once a write
to the database succeeds).

A filler file fills the tmpfs while a client sends requests; then requests go to every
door -- the MIP door (through the MIP lane), the Clipper, TF Serving and Open Inference
Protocol REST routes (the last two through the lean path), the gRPC door.  Before the fix each got a
plain-text 500 and an ERROR traceback, a short write left half a record with the next one
appended to it (both quarantined "not JSON" at the next start), and rows stayed ``queued``
after a clean stop.  Now:

* a request whose arrival cannot be journaled is refused before it is sent anywhere: 503
  with a JSON ``{"error": ...}`` at the HTTP routes, UNAVAILABLE at the gRPC door, the
  MIP error reply of a failed request (INTERNAL) at the MIP door; its row ends ``failed``
  with why;
* the log has no traceback and no ERROR, and a few WARNINGs (one per burst, not one per
  request); ``wirekit_serve_refused_total{reason="journal"}`` counts the refusals;
* the process stays up, ``/readyz`` is 503 while the journal cannot be written and 200
  again once the filler is gone (before any request), and requests are answered again;
* after a clean stop (SIGTERM) no row is ``queued``; the next start quarantines nothing and
  ends nothing ``lost``.

Every wait is bounded; what is asserted is what happened, not how long it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import http.client
import json
import os
import re
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from serve_support import TIMEOUT, BackendProcess, DispatcherProcess, deployment
from support.loops import LOOPS

from wirekit import mip
from wirekit.mip.client import Client, ServerError
from wirekit.serve.record.replay import read_journal

DISK_SIZE = "2m"  #: the tmpfs under the journal
REFUSED = "the request journal cannot be written"  #: in every refusal's message
#: requests sent once the disk is full, before the refusals must be steady (a journal's
#: last page may still hold a few records)
SETTLE = 200
STEADY = 12  #: refusals in a row that show the disk is full for the journal
WARNINGS_AT_MOST = 8  #: journal WARNINGs in the log, whatever the number of requests


@dataclass
class Served:
    """The dispatcher under test and where its files are."""

    process: DispatcherProcess
    doc: dict[str, Any]
    directory: Path
    disk: Path  #: the tmpfs
    database: Path  #: the SQLite file
    apart: bool = True  #: the SQLite file is off the tmpfs (else on it, with the journal)


def _mount_tmpfs(where: Path, size: str = DISK_SIZE) -> None:
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (root only): {done.stderr.strip()}")


def _umount(where: Path) -> None:
    done = subprocess.run(["umount", str(where)], capture_output=True, timeout=TIMEOUT)
    if done.returncode != 0:  # something still holds it: detach it at least
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=TIMEOUT)


#: (event loop, the database off the tmpfs): each loop with the journal alone on the full
#: disk, and plain asyncio with the database there too
SETUPS = [
    *(
        pytest.param((p, True), id=p)
        if isinstance(p, str)
        else pytest.param((p.values[0], True), id=str(p.values[0]), marks=p.marks)
        for p in LOOPS
    ),
    pytest.param(("asyncio", False), id="asyncio-database-on-the-disk"),
]


@pytest.fixture(scope="module", params=SETUPS)
def served(request, tmp_path_factory) -> Iterator[Served]:
    """``wirekit serve`` on one loop, model ``m`` (Clipper app ``app``) on a MIP echo
    backend, its journal on a fresh tmpfs (its database too unless ``apart``)."""
    loop, apart = request.param
    directory: Path = tmp_path_factory.mktemp(f"full-disk-{loop}")
    disk = directory / "disk"
    disk.mkdir()
    (directory / "db").mkdir()
    database = directory / "db" / "requests.db" if apart else disk / "requests.db"
    _mount_tmpfs(disk)
    try:
        if apart:
            (disk / "requests.db").symlink_to(database)
        with BackendProcess("wirekit.mip.runtime:echo") as echo:
            doc = deployment(
                disk / "requests.db",
                {"m": {"timeout": 5, "apps": ["app"]}},
                [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1],
                  "ports": [echo.port]}],
                store={"path": str(disk / "requests.db"), "flush_interval": 0.01},
                cache={"max_entries": 0},
                listen={"host": "127.0.0.1", "http_port": 0, "grpc_port": 0},
            )  # fmt: skip
            process = DispatcherProcess.of(
                doc, directory, env={"WIREKIT_LOOP": loop}, args=("--log-level", "info")
            )
            with process:
                yield Served(process, doc, directory, disk, database, apart)
    finally:
        _umount(disk)


# ---------------------------------------------------------------------- the doors


@dataclass
class Answer:
    door: str
    status: int  #: HTTP status (MIP: 200 answered, 503 its error reply)
    body: bytes
    content_type: str = ""

    @property
    def refused(self) -> bool:
        """A 503 with a JSON ``{"error": ...}`` saying the journal cannot be written (MIP:
        the error reply)."""
        if self.door in ("mip", "grpc"):  # MIP: its error reply; gRPC: UNAVAILABLE, why
            return self.status == 503
        if self.status != 503 or not self.content_type.startswith("application/json"):
            return False
        doc = json.loads(self.body)
        return isinstance(doc, dict) and REFUSED in str(doc.get("error"))


def _http(served: Served, method: str, path: str, doc: Any = None) -> tuple[int, bytes, str]:
    conn = http.client.HTTPConnection(
        "127.0.0.1", served.process.addresses["http"], timeout=TIMEOUT
    )
    try:
        body = None if doc is None else json.dumps(doc).encode()
        headers = {} if doc is None else {"Content-Type": "application/json"}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.getheader("Content-Type") or ""
    finally:
        conn.close()


#: each HTTP door's inference: (path, body)
HTTP_DOORS: dict[str, tuple[str, dict[str, Any]]] = {
    "clipper": ("/app/predict", {"input": "hi"}),
    "tfserving": ("/v1/models/m:predict", {"inputs": [["hi"]]}),
    "oip-rest": (
        "/v2/models/m/infer",
        {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]},
    ),
}
DOORS = [*HTTP_DOORS, "mip", "grpc"]


def infer(served: Served, door: str) -> Answer:
    """One inference through ``door``."""
    if door == "grpc":
        return _grpc_infer(served)
    if door == "mip":
        with Client(served.process.mip_address("m"), timeout=TIMEOUT) as client:
            try:
                client.infer_one(mip.Item.text("hi"))
            except ServerError as exc:
                return Answer(door, 503, str(exc).encode())
        return Answer(door, 200, b"")
    path, doc = HTTP_DOORS[door]
    status, body, ctype = _http(served, "POST", path, doc)
    if door == "clipper" and status == 200 and json.loads(body).get("default"):
        status = 599  # a Clipper default answer: not answered, not refused
    return Answer(door, status, body, ctype)


def _grpc_infer(served: Served) -> Answer:
    """ModelInfer over a bare channel (UNAVAILABLE with the reason: 503)."""
    import grpc

    from wirekit.oip.grpc import messages as pb

    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(b"hi")
    address = f"127.0.0.1:{served.process.addresses['grpc']}"
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            f"/{pb.SERVICE}/ModelInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        try:
            call(request, timeout=TIMEOUT)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""  # type: ignore[attr-defined]
            refused = code == grpc.StatusCode.UNAVAILABLE and REFUSED in details
            return Answer("grpc", 503 if refused else 500, details.encode())
    return Answer("grpc", 200, b"")


def readyz(served: Served) -> int:
    return _http(served, "GET", "/readyz")[0]


def refused_counted(served: Served) -> float:
    status, text, _ = _http(served, "GET", "/metrics")
    assert status == 200
    found = re.search(rb'^wirekit_serve_refused_total\{reason="journal"\} (\S+)$', text, re.M)
    assert found is not None, "wirekit_serve_refused_total{reason=journal} is not exported"
    return float(found.group(1))


def fill(disk: Path) -> Path:
    """A filler file that takes every byte left on ``disk``."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        chunk = b"\0" * 65536
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                if len(chunk) == 1:
                    return filler
                chunk = chunk[: len(chunk) // 16 or 1]
    finally:
        os.close(fd)


def _journal_log(served: Served) -> list[str]:
    return [line for line in served.process.log_lines if "request journal" in line]


def _rows(database: Path) -> list[tuple[str, str | None]]:
    with contextlib.closing(sqlite3.connect(database, timeout=TIMEOUT)) as conn:
        return conn.execute("SELECT status, reason FROM requests").fetchall()


# ---------------------------------------------------------------------- the test


def test_a_full_disk_refuses_requests_then_they_are_served_again(served: Served) -> None:
    proc = served.process
    for door in DOORS:  # all well before the disk fills
        assert infer(served, door).status == 200, door
    assert readyz(served) == 200

    # the disk fills while a client sends requests: each is answered or refused, never 500
    answers: list[Answer] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def client() -> None:
        try:
            while not stop.is_set():
                answers.append(infer(served, "tfserving"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    sender = threading.Thread(target=client, daemon=True)
    sender.start()
    try:
        filler = fill(served.disk)
    finally:
        stop.set()
        sender.join(TIMEOUT)
    assert not errors, errors
    assert all(a.status == 200 or a.refused for a in answers), [
        (a.status, a.body[:200]) for a in answers if a.status != 200 and not a.refused
    ]

    # requests until the refusals are steady (the journal's last page may hold a few)
    streak = sent = 0
    while streak < STEADY:
        sent += 1
        assert sent <= SETTLE, f"no steady refusals after {SETTLE} requests: {proc.log}"
        answer = infer(served, DOORS[sent % len(DOORS)])
        assert answer.status == 200 or answer.refused, (answer.status, answer.body[:200])
        streak = streak + 1 if answer.refused else 0
    for door in DOORS:  # every door refuses, in its own way
        for _ in range(5):
            answer = infer(served, door)
            assert answer.refused, (door, answer.status, answer.body[:200])
    assert readyz(served) == 503
    assert refused_counted(served) >= STEADY + 5 * len(DOORS)
    assert proc.proc is not None and proc.proc.poll() is None  # still up

    # space comes back: ready again before any request (the journal alone: its write is
    # tried at each /readyz), then every door answers
    filler.unlink()
    if served.apart:
        assert readyz(served) == 200, _http(served, "GET", "/readyz")[1]
    for door in DOORS:
        for _ in range(3):
            assert infer(served, door).status == 200, door
    if not served.apart:  # ready once a write to the database succeeds
        until = time.monotonic() + TIMEOUT
        while readyz(served) != 200:
            assert time.monotonic() < until, _http(served, "GET", "/readyz")[1]
            time.sleep(0.02)

    log = proc.log
    assert "Traceback" not in log, log
    assert " ERROR " not in log and "ERROR:" not in log, log
    warnings = _journal_log(served)
    assert 1 <= len(warnings) <= WARNINGS_AT_MOST, warnings

    # the journal holds whole records only: nothing torn, nothing glued to a torn one
    journals = sorted(served.disk.glob("requests.db.journal.[0-9]*"))
    assert journals
    for path in journals:
        assert not read_journal(path)[1], path.read_bytes()[-2000:]
        assert path.read_bytes().endswith(b"\n") or not path.stat().st_size

    # a clean stop leaves no row queued; the refused ones ended failed, saying why
    assert proc.stop() == 0, proc.log
    rows = _rows(served.database)
    assert not [r for r in rows if r[0] == "queued"], "rows left queued"
    refused = [r for r in rows if r[1] and REFUSED in r[1]]
    assert {r[0] for r in refused} <= {"failed"}, refused[:3]
    if served.apart:  # (else the database's writes of that time failed too)
        assert refused
    assert not list(served.disk.glob("requests.db.journal.*")), "journals left behind"

    # the next start replays nothing torn: nothing quarantined, nothing ended lost
    again = DispatcherProcess(proc.config, env={"WIREKIT_LOOP": _loop_of(proc)}, args=proc.args)
    with again:
        again_served = Served(again, served.doc, *_paths(served), served.apart)
        assert infer(again_served, "tfserving").status == 200
        assert again.stop() == 0
    assert "quarantin" not in again.log, again.log
    assert not served.disk.joinpath("requests.db.journal.quarantine").exists()
    assert not [r for r in _rows(served.database) if r[0] in ("queued", "lost")]


def _loop_of(proc: DispatcherProcess) -> str:
    return proc.env["WIREKIT_LOOP"]


def _paths(served: Served) -> tuple[Path, Path, Path]:
    return served.directory, served.disk, served.database


# ---------------------------------------------------------------------- the store alone


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A fresh 64 KiB tmpfs, with ``r.db`` a link to a database off it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    _mount_tmpfs(disk, "64k")
    try:
        (disk / "r.db").symlink_to(tmp_path / "r.db")
        yield disk
    finally:
        _umount(disk)


def test_a_journal_write_that_does_not_fit_is_cut_back(small_disk: Path) -> None:
    """A write that fits in part is cut back to where it started and refused
    (JournalUnavailable); readiness says so; with the space back the next write goes on
    after the last whole record."""
    from wirekit.serve.record.store import JournalUnavailable, RequestStore

    store = RequestStore(small_disk / "r.db")
    store.open()
    try:
        store.arrival("first", "m", "c", 1.0, 3)
        (journal,) = small_disk.glob("r.db.journal.[0-9]*")
        filler = fill(small_disk)
        sizes = set()
        with pytest.raises(JournalUnavailable, match="No space left on device"):
            for i in range(10_000):  # the journal's last page takes a few, then none
                sizes.add(journal.stat().st_size)
                store.arrival(f"r{i}", "m" * 100, "c", 1.0, 3)
        assert journal.stat().st_size in sizes  # cut back: no part of the record stays
        assert store.journal_failures == 1
        entries, bad = read_journal(journal)
        assert not bad
        assert "cannot be written" in (store.write_problem() or "")
        filler.unlink()
        assert store.write_problem() is None  # ready again before any request
        store.arrival("after", "m", "c", 1.0, 3)
        entries, bad = read_journal(journal)
        assert not bad
        assert entries[-1][3][0] == "after"
    finally:
        store.close()


def test_every_dispatcher_path_refuses_an_arrival_it_cannot_journal(small_disk: Path) -> None:
    """In one process: requests in flight together -- the MIP door's adaptive batching
    (arrivals journaled when the batch leaves), the awaiting doors' group commit (the
    arrivals of one loop pass in one write) -- are refused, all of them, when their write
    fails; each has its final row, none is left ``queued``; with the space back they are
    answered again."""
    import aiohttp
    from serve_support import run, start_backend
    from support.service import running_service

    from wirekit.mip.client import AsyncClient
    from wirekit.mip.runtime import echo

    n = 8

    async def main() -> None:
        backend, port = await start_backend(echo)
        doc = deployment(
            small_disk / "r.db",
            {"batched": {"timeout": 5, "max_batch": 64}, "single": {"timeout": 5}},
            [{"id": f"n-{m}", "devices": ["CPU"], "models": [m], "quotas": [1],
              "ports": [port]} for m in ("batched", "single")],
            store={"path": str(small_disk / "r.db"), "flush_interval": 0.01},
            cache={"max_entries": 0},
        )  # fmt: skip
        async with running_service(doc, backends=[backend]) as service:
            mip_ports = service.addresses()["mip"]
            url = f"http://127.0.0.1:{service.addresses()['http']}/v1/models/single:predict"

            async def mip_burst() -> list[BaseException | tuple]:
                client = AsyncClient(f"tcp://127.0.0.1:{mip_ports['batched']}", timeout=TIMEOUT)
                try:
                    calls = [client.infer_one(mip.Item.text(f"q{i}")) for i in range(n)]
                    return await asyncio.gather(*calls, return_exceptions=True)
                finally:
                    await client.close()

            async def http_burst(session: aiohttp.ClientSession) -> list[tuple[int, Any]]:
                async def one(i: int) -> tuple[int, Any]:
                    async with session.post(url, json={"inputs": [[f"q{i}"]]}) as resp:
                        return resp.status, await resp.json(content_type=None)

                return await asyncio.gather(*(one(i) for i in range(n)))

            async with aiohttp.ClientSession() as session:
                assert all(not isinstance(a, BaseException) for a in await mip_burst())
                assert all(status == 200 for status, _ in await http_burst(session))
                filler = fill(small_disk)
                refusals = 0
                for _ in range(SETTLE):  # the journal's last page may take a few
                    mip_answers = await mip_burst()
                    http_answers = await http_burst(session)
                    if all(isinstance(a, ServerError) for a in mip_answers) and all(
                        status == 503 and REFUSED in doc["error"] for status, doc in http_answers
                    ):
                        refusals += 1
                        if refusals == 3:
                            break
                    else:
                        assert all(isinstance(a, (tuple, ServerError)) for a in mip_answers), (
                            mip_answers
                        )
                        assert all(s in (200, 503) for s, _ in http_answers), http_answers
                assert refusals == 3, "the refusals never became steady"
                filler.unlink()
                assert all(not isinstance(a, BaseException) for a in await mip_burst())
                assert all(status == 200 for status, _ in await http_burst(session))
            refused = service.dispatcher.refused["journal"]
            assert refused >= 3 * 2 * n
        # stopped cleanly: every request has its final row
        rows = _rows(small_disk.parent / "r.db")
        assert not [r for r in rows if r[0] == "queued"]
        assert len([r for r in rows if r[1] and REFUSED in r[1]]) >= refused

    run(main())


@pytest.fixture
def small_shared_disk(tmp_path: Path) -> Iterator[Path]:
    """A fresh 1 MiB tmpfs holding the journal *and* the database, as the default
    deployment has them."""
    disk = tmp_path / "disk"
    disk.mkdir()
    _mount_tmpfs(disk, "1m")
    try:
        yield disk
    finally:
        _umount(disk)


def test_rows_in_no_journal_reach_the_database_once_it_can_be_written(
    small_shared_disk: Path,
) -> None:
    """The database on the same full disk as the journal: an answer whose journal record
    was dropped, and a refused request (its arrival never journaled), are written by the
    writer once the disk has room again -- before, the first row stayed ``queued`` and the
    second was missing (the CI failure of ``asyncio-database-on-the-disk``)."""
    from wirekit.serve.record.store import JournalUnavailable, RequestStore

    disk = small_shared_disk

    async def main() -> None:
        store = RequestStore(disk / "r.db", payloads=True, flush_interval=0.01)
        store.open()
        try:
            store.arrival("answered", "m", "c", 1.0, 3)
            await store.flush()  # its arrival is stored, queued
            filler = fill(disk)
            big = b"x" * (256 << 10)  # its row needs pages the full disk cannot give
            with pytest.raises(JournalUnavailable):
                store.arrival("refused", "m", "c", 2.0, len(big), payload=big)
            store.completion(
                "refused", None, 2.5, "failed", 0, model="m", client="c", time_in=2.0,
                size=len(big), defer=True, reason=REFUSED,
            )  # fmt: skip
            store.completion(
                "answered", "d", 3.0, "ok", 1, model="m", client="c", time_in=1.0, size=3,
                payload=big, defer=True,
            )  # fmt: skip
            with pytest.raises(JournalUnavailable):
                store.write_journal()
            with pytest.raises(RuntimeError, match="request store write failed"):
                await store.flush()
            assert store.writer.kept >= 3  # in memory: the journals do not have them
            assert store.backlog == 2
            filler.unlink()
            await store.flush()  # the next hand-over writes them first
            assert store.writer.kept == 0 and store.backlog == 0
            assert store.writer.kept_dropped == 0
        finally:
            store.close()

    asyncio.run(main())
    with contextlib.closing(sqlite3.connect(disk / "r.db", timeout=TIMEOUT)) as conn:
        rows = dict(conn.execute("SELECT id, status FROM requests").fetchall())
        reason = conn.execute("SELECT reason FROM requests WHERE id = 'refused'").fetchone()
    assert rows == {"answered": "ok", "refused": "failed"}
    assert reason is not None and REFUSED in reason[0]
