"""Issue 38, items 4 and 5: bad HTTP requests are the client's fault, and said so quietly.

A real ``wirekit serve`` runs in a subprocess on each event loop (plain asyncio, uvloop)
and the twin the suite runs (``WIREKIT_PURE``); raw sockets send it malformed requests --
a bad request line, a bad header, a smuggling-style ``Content-Length`` with
``Transfer-Encoding``, an oversized header, bytes that are not HTTP at all -- each on its
own connection, in a burst.  Before the fix aiohttp logged each one as an ERROR with a
full traceback (2,000 bad requests: 2,000 records, 1.2 MB of log).  Now: each is answered
400 and closed, counted in ``wirekit_serve_http_bad_requests_total``, logged once per burst
at WARNING with no traceback, and other clients are served meanwhile.

``Expect: 100-continue`` with a ``Content-Length`` over ``http.max_body_size`` is answered
413 (JSON, as the door's other refusals) without ``100 Continue`` first; within the limit
the body is still invited.

Every wait is bounded (seconds); what is asserted is what happened (answers, log lines,
the counter), not how long it took.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_support import TIMEOUT, DispatcherProcess, deployment
from support.loops import LOOPS

MAX_BODY = 4096  #: http.max_body_size of the dispatcher under test
WARNING = "malformed HTTP request"
COUNTER = "wirekit_serve_http_bad_requests_total"

#: malformed requests, by what is wrong with them (the lean path's routes among them: it
#: hands them to aiohttp, whose refusal must be as quiet)
BAD_REQUESTS: dict[str, bytes] = {
    "request line": b"GET /a b c HTTP/1.1 extra\r\nHost: x\r\n\r\n",
    "version": b"GET / HTTP/9.Z\r\nHost: x\r\n\r\n",
    "header": b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\x01: v\r\n\r\n",
    "smuggling": (
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "two lengths": (
        b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
        b"Content-Length: 5\r\n\r\nabcd"
    ),
    "oversized header": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
    "not HTTP": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64) + b"\r\n\r\n",
}
ROUNDS = 30  #: each bad request is sent this many times in the burst
SENDERS = 4  #: threads sending the burst


@pytest.fixture(scope="module", params=LOOPS)
def dispatcher(request, tmp_path_factory) -> Iterator[DispatcherProcess]:
    """``wirekit serve`` on one loop: model ``m`` (its backend is never asked), a small
    ``http.max_body_size``, logging at INFO (so that a WARNING is not hidden by the level)."""
    tmp_path: Path = tmp_path_factory.mktemp(f"bad-{request.param}")
    doc = deployment(
        tmp_path / "r.db",
        {"m": {"timeout": 5}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [1]}],
        cache={"max_entries": 0},
        http={"max_body_size": MAX_BODY},
    )
    with DispatcherProcess.of(
        doc, tmp_path, env={"WIREKIT_LOOP": request.param}, args=("--log-level", "info")
    ) as proc:
        yield proc


def _connect(proc: DispatcherProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proc.addresses["http"]), timeout=TIMEOUT)


def _until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends on ``sock`` until it closes it (bounded: TIMEOUT)."""
    sock.settimeout(TIMEOUT)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _send_bad(proc: DispatcherProcess, wire: bytes) -> bytes:
    """``wire`` on a new connection: what the server answered before closing it."""
    with _connect(proc) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(wire)
        return _until_closed(sock)


def _get(proc: DispatcherProcess, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", proc.addresses["http"], timeout=TIMEOUT)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _bad_requests_counted(proc: DispatcherProcess) -> float | None:
    """The counter's value in ``/metrics`` (None: not there)."""
    status, text = _get(proc, "/metrics")
    assert status == 200
    found = re.search(rb"^" + COUNTER.encode() + rb" (\S+)$", text, re.M)
    return None if found is None else float(found.group(1))


def test_a_burst_of_malformed_requests_is_refused_counted_and_logged_once(dispatcher):
    """Each malformed request is answered 400 and its connection closed; the burst is one
    WARNING (a few at most), no ERROR, no traceback; the counter says how many; a
    well-behaved client is served throughout."""
    proc = dispatcher
    before = _bad_requests_counted(proc) or 0.0
    lines_before = len(proc.log_lines)
    wires = [wire for _ in range(ROUNDS) for wire in BAD_REQUESTS.values()]
    answers: list[bytes] = []
    errors: list[BaseException] = []
    served: list[int] = []
    done = threading.Event()

    def send(share: list[bytes]) -> None:
        try:
            for wire in share:
                answers.append(_send_bad(proc, wire))
        except BaseException as exc:  # reported below
            errors.append(exc)

    def well_behaved() -> None:
        try:
            while not done.is_set():
                served.append(_get(proc, "/healthz")[0])
                done.wait(0.02)
        except BaseException as exc:  # reported below
            errors.append(exc)

    steady = threading.Thread(target=well_behaved, daemon=True)
    steady.start()
    senders = [
        threading.Thread(target=send, args=(wires[k::SENDERS],), daemon=True)
        for k in range(SENDERS)
    ]
    for t in senders:
        t.start()
    for t in senders:
        t.join(6 * TIMEOUT)
    served.append(_get(proc, "/healthz")[0])  # and after
    done.set()
    steady.join(2 * TIMEOUT)
    assert not errors, errors
    assert len(answers) == len(wires)
    refused = [a for a in answers if re.match(rb"HTTP/1\.[01] 400 ", a)]  # aiohttp's: 1.0
    assert len(refused) == len(wires), {a[:40] for a in answers} - {a[:40] for a in refused}
    assert served and set(served) == {200}, served
    log = proc.log_lines[lines_before:]
    assert not [line for line in log if "ERROR" in line], "\n".join(log[:20])
    assert not [line for line in log if "Traceback" in line], "\n".join(log[:20])
    warnings = [line for line in log if WARNING in line]
    assert 1 <= len(warnings) <= 3, warnings
    assert all("WARNING" in line for line in warnings), warnings
    after = _bad_requests_counted(proc)
    assert after is not None, f"no {COUNTER} in /metrics"
    assert after - before == len(wires)


def _head_of(sock: socket.socket) -> bytes:
    """The first answer's status line and headers on ``sock`` (bounded: TIMEOUT)."""
    sock.settimeout(TIMEOUT)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_expect_continue_over_the_body_limit_is_refused_before_the_body(dispatcher):
    """``Expect: 100-continue`` with a Content-Length over ``http.max_body_size``: 413
    first (JSON), no ``100 Continue``, the connection closed; within the limit the body is
    still invited."""
    proc = dispatcher
    head = (
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n"
    )
    with _connect(proc) as sock:
        sock.sendall(head % (MAX_BODY + 1))
        first = _head_of(sock)
        assert not first.startswith(b"HTTP/1.1 100 "), first
        answer = first + _until_closed(sock)  # the body is never sent: the server closes
    assert b"100 Continue" not in answer, answer[:200]
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    head_bytes, _, body = answer.partition(b"\r\n\r\n")
    assert b"application/json" in head_bytes.lower()
    assert b"connection: close" in head_bytes.lower()
    assert json.loads(body) == {
        "error": f"a body of {MAX_BODY + 1} bytes is over the limit of {MAX_BODY}"
        " (http.max_body_size)"
    }
    with _connect(proc) as sock:  # within the limit: invited as before
        sock.sendall(head % 2)
        assert _head_of(sock).startswith(b"HTTP/1.1 100 Continue\r\n")
