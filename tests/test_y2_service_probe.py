"""The y2 communication service tells a probe from a worker (issue 39).

A node ends when the worker that received its NodeIndex and spoke the protocol (sent a
Delta, Runtime or Finished) goes.  A connection to the worker port that closes before any
valid message -- a port probe (``nc -z``, a load balancer's check, a test's wait-for-port),
one that reads the NodeIndex and goes, a truncated message -- or that sends garbage is logged
(one line per burst) and closed, and the service waits for its worker: the next real worker
gets the same NodeIndex, the Deltas kept for it, and the cluster finishes.

Real ``wirekit y2 client`` / ``wirekit y2 service`` processes on loopback (the codec they
use follows ``WIREKIT_PURE``: run this file with and without it), wirekit's
:class:`~wirekit.y2.worker.WorkerLink` as the workers.
"""

from __future__ import annotations

import json
import queue
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pytest

from wirekit import y2
from wirekit._logging import BURST_QUIET
from wirekit.y2.service import (
    INDEX,
    STATUS,
    CloseNewcomer,
    CloseWorker,
    NodeActivity,
    NodeSession,
    NodeState,
    TakeNewcomer,
    ToClient,
    ToPeers,
)
from wirekit.y2.worker import WorkerLink

TIMEOUT = 60.0  # a bound for a hang, not a threshold: every wait ends early on success
PROBES = 3  # probes in a row: one log line (a burst), every one counted
DELTAS = 5
PROBE_LINE = "closed before any y2 message (a port probe?); the node waits for its worker"
BAD_LINK_LINE = "; closing the link"
CLOSED_LINE = "worker link: closed ("  # INFO, on every close of a worker link


class _Proc:
    """A ``wirekit y2`` command as a process; its output lines read as they come."""

    def __init__(self, *args: str) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-m", "wirekit.cli", "y2", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: queue.Queue[str | None] = queue.Queue()
        self.err_lines: list[str] = []
        self._ended: tuple[int, list[str]] | None = None
        self._err_seen = threading.Condition()
        self._threads = [
            threading.Thread(target=self._pump, args=(self.p.stdout, self.out.put), daemon=True),
            threading.Thread(target=self._pump, args=(self.p.stderr, self._err), daemon=True),
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream, put: Callable[[str | None], None]) -> None:
        for line in stream:
            put(line)
        put(None)

    def _err(self, line: str | None) -> None:
        with self._err_seen:
            if line is not None:
                self.err_lines.append(line)
            self._err_seen.notify_all()

    def line(self, prefix: str) -> str:
        """The next line of standard output, which starts with ``prefix``: the rest."""
        try:
            line = self.out.get(timeout=TIMEOUT)
        except queue.Empty:
            line = None
        assert line is not None and line.startswith(prefix), (line, self.stderr)
        return line[len(prefix) :].strip()

    def wait_for_err(self, text: str, count: int) -> None:
        """Wait until ``count`` lines of standard error hold ``text`` (bounded)."""
        with self._err_seen:
            ok = self._err_seen.wait_for(
                lambda: self.count(text) >= count or self.p.poll() is not None, TIMEOUT
            )
        assert ok and self.count(text) >= count, (text, count, self.stderr)

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.err_lines))

    @property
    def stderr(self) -> str:
        return "".join(self.err_lines)

    def finish(self) -> tuple[int, list[str]]:
        """Wait for the process to exit by itself: its exit code and standard output."""
        if self._ended is None:
            code = self.p.wait(TIMEOUT)
            for t in self._threads:
                t.join(TIMEOUT)
            lines = []
            while (line := self.out.get_nowait()) is not None:
                lines.append(line)
            self._ended = code, lines
        return self._ended

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        for t in self._threads:
            t.join(TIMEOUT)
        for stream in (self.p.stdout, self.p.stderr):
            stream.close()


@dataclass
class _Cluster:
    client: _Proc
    #: per service name (n0, n1): the process and its worker address
    services: dict[str, tuple[_Proc, tuple[str, int]]] = field(default_factory=dict)


@contextmanager
def _cluster(n: int = 2) -> Iterator[_Cluster]:
    """A client (``--json``) and ``n`` services (``--json``, INFO logs), all processes."""
    client = _Proc("client", "--nodes", str(n), "--listen", "tcp://127.0.0.1:*", "--json")
    procs = [client]
    try:
        address = client.line("client listening on ")
        cluster = _Cluster(client)
        for k in range(n):
            args = ("--client", address, "--worker-listen", "127.0.0.1:0", "--name", f"n{k}")
            procs.append(_Proc("service", *args, "--json", "--log-level", "info"))
        for k, p in enumerate(procs[1:]):
            host, port = p.line("worker link on ").rsplit(":", 1)
            p.line("inbox ")
            cluster.services[f"n{k}"] = (p, (host, int(port)))
        yield cluster
    finally:
        for p in procs:
            p.stop()


def _delta(sender: int, seq: int) -> bytes:
    return y2.encode(y2.Delta(y2.pack([sender] * 3, [1] * 3, [seq] * 3, [0] * 3)))


def _senders_and_seqs(deltas: list[y2.Delta]) -> list[tuple[int, int]]:
    out = []
    for d in deltas:
        layer, _, index, _ = y2.unpack(np.asarray(d.words))
        out.append((int(layer[0]), int(index[0])))
    return out


# ------------------------------------------------------------------ the session (both twins)


def _session(codec, **kw) -> NodeSession:
    s = NodeSession("tcp://127.0.0.1:7001", codec=codec, **kw)
    peers = [f"tcp://x:{7000 + i}".encode() for i in range(2)]
    s.client_message([INDEX, codec.encode(y2.NodeIndex(1, 2)), *peers])
    return s


def _d(codec, sender: int, seq: int) -> bytes:
    return codec.encode(y2.Delta(codec.pack([sender] * 3, [1] * 3, [seq] * 3, [0] * 3)))


def _state(events) -> NodeState:
    [status] = [e for e in events if isinstance(e, ToClient) and e.frames[0] == STATUS]
    return NodeActivity.from_bytes(status.frames[2]).state


def _written(s: NodeSession) -> bytes:
    out = b"".join(bytes(b) for b in s.buffers_to_worker())
    s.worker_sent(len(out))
    return out


@pytest.mark.parametrize("ending", ["close", "garbage"])
def test_session_a_probe_takes_nothing_from_the_worker(y2_codec, ending):
    s = _session(y2_codec)
    index = y2_codec.encode(y2.NodeIndex(1, 2))
    kept = [_d(y2_codec, 0, k) for k in range(3)]
    for d in kept:
        assert s.peer_message([(0).to_bytes(4, "big"), d])
    s.worker_connected()
    assert _written(s) == index + b"".join(kept)  # the probe's socket took it all
    if ending == "garbage":
        [close] = s.worker_data(b"GET / HTTP/1.1\r\n")
        assert isinstance(close, CloseWorker) and close.error.field == "type"
    events = s.worker_closed()
    assert _state(events) is NodeState.WAITING  # not ended
    assert (s.counters.worker_probes, s.counters.worker_errors) == (
        (1, 0) if ending == "close" else (0, 1)
    )
    assert s.counters.deltas_dropped == 0
    s.worker_connected()  # the real worker: the same index and every Delta kept for it
    assert _written(s) == index + b"".join(kept)
    s.worker_data(_d(y2_codec, 1, 0))
    assert s.worker_spoke and s.worker_buffered == 0
    assert _state(s.worker_closed()) is NodeState.ENDED  # it spoke: its going ends the node


def test_session_a_link_that_reads_a_whole_buffer_without_a_word_is_the_worker(y2_codec):
    d = _d(y2_codec, 0, 0)
    s = _session(y2_codec, max_worker_buffer=3 * len(d))
    s.worker_connected()
    for _ in range(3):
        assert s.peer_message([(0).to_bytes(4, "big"), d])
        _written(s)
    assert s.accepts_peer_input and s.worker_buffered == 0
    s.worker_closed()
    s.worker_connected()  # what the reader took stays taken: only the index again
    assert _written(s) == y2_codec.encode(y2.NodeIndex(1, 2))


def _speaking_worker(codec) -> NodeSession:
    s = _session(codec)
    s.worker_connected()
    _written(s)
    [sent] = s.worker_data(_d(codec, 1, 0))
    assert isinstance(sent, ToPeers) and s.takes_newcomers
    return s


def test_session_a_probe_beside_the_worker_leaves_it_alone(y2_codec):
    s = _speaking_worker(y2_codec)
    index = y2_codec.encode(y2.NodeIndex(1, 2))
    for _ in range(2):
        assert s.newcomer_connected() == []
        assert bytes(s.newcomer_data_to_write()) == index  # a worker waits for its index
        s.newcomer_sent(3)
        assert bytes(s.newcomer_data_to_write()) == index[3:]
        s.newcomer_closed()
    assert s.newcomer_connected() == []
    [close] = s.newcomer_data(b"\x00\x00\x00\x09" + bytes(4))
    assert isinstance(close, CloseNewcomer) and not s.has_newcomer
    assert (s.counters.worker_probes, s.counters.worker_errors) == (2, 1)
    assert s.worker_attached and s.counters.worker_replaced == 0
    d = _d(y2_codec, 0, 1)
    assert s.peer_message([(0).to_bytes(4, "big"), d])
    assert _written(s) == d  # the worker is served as before


def test_session_a_newcomer_that_speaks_is_the_worker(y2_codec):
    s = _speaking_worker(y2_codec)
    d0, d1 = _d(y2_codec, 0, 1), _d(y2_codec, 0, 2)
    assert s.peer_message([(0).to_bytes(4, "big"), d0])
    s.worker_sent(5)  # the old link went in the middle of a Delta
    s.newcomer_connected()
    s.newcomer_sent(16)
    mine = _d(y2_codec, 1, 1)
    rt = y2_codec.encode(y2.Runtime(1, 2, 3, 4))
    events = s.newcomer_data(mine[:7]) + s.newcomer_data(mine[7:] + rt)
    assert isinstance(events[0], TakeNewcomer) and events[1] == ToPeers(
        ((1).to_bytes(4, "big"), mine)
    )
    assert events[2].frames[0] == b"runtime"
    assert s.counters.worker_replaced == 1 and s.counters.deltas_dropped == 1
    assert s.peer_message([(0).to_bytes(4, "big"), d1])
    assert _written(s) == d1  # the new worker: its index was written already


def test_session_the_old_link_going_hands_over_to_the_newcomer(y2_codec):
    s = _speaking_worker(y2_codec)
    index = y2_codec.encode(y2.NodeIndex(1, 2))
    s.newcomer_connected()
    s.newcomer_sent(10)
    events = s.worker_closed()
    assert isinstance(events[0], TakeNewcomer)
    assert _state(events) is NodeState.RUNNING  # not ended: its worker came back
    assert _written(s) == index[10:]
    assert _state(s.worker_closed()) is NodeState.ENDED  # the first link spoke


# ------------------------------------------------------------------ what comes to the port


def _connect_and_close(address: tuple[str, int]) -> None:
    """``nc -z``, a load balancer's TCP check, a test's wait-for-port."""
    socket.create_connection(address, timeout=TIMEOUT).close()


def _reset(address: tuple[str, int]) -> None:
    """Connect and abort (RST, not FIN)."""
    sock = socket.create_connection(address, timeout=TIMEOUT)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _read_index_and_close(address: tuple[str, int]) -> None:
    """Take the NodeIndex the service hands out on connect, then go."""
    with socket.create_connection(address, timeout=TIMEOUT) as sock:
        got = b""
        while len(got) < 16 and (chunk := sock.recv(16 - len(got))):
            got += chunk
        assert isinstance(y2.decode(got), y2.NodeIndex)


def _sender(data: bytes) -> Callable[[tuple[str, int]], None]:
    def send(address: tuple[str, int]) -> None:
        # send, then read until the service closes: it has read every byte (a close with
        # its NodeIndex unread would reset the connection, maybe before it read them)
        with socket.create_connection(address, timeout=TIMEOUT) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(4096):
                pass

    return send


_RANDOM = random.Random(39).randbytes(64)
assert int.from_bytes(_RANDOM[:4], "big") > 3  # not a y2 message type: garbage at byte 0

#: name -> (what it does, whether the service sees it as malformed input)
VISITORS: dict[str, tuple[Callable[[tuple[str, int]], None], bool]] = {
    "connect-and-close": (_connect_and_close, False),
    "reset": (_reset, False),
    "read-index-and-close": (_read_index_and_close, False),
    "truncated-header": (_sender(_delta(0, 0)[:5]), False),  # closes before a whole message
    "truncated-delta": (_sender(_delta(0, 0)[:-1]), False),
    "random-bytes": (_sender(_RANDOM), True),
    "http-check": (_sender(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), True),
}


@pytest.mark.parametrize("visitor", list(VISITORS))
def test_a_probe_or_garbage_does_not_end_the_node_and_the_worker_is_served(visitor):
    visit, malformed = VISITORS[visitor]
    with _cluster(2) as c:
        (first, first_addr), (other, other_addr) = c.services["n0"], c.services["n1"]
        with WorkerLink(other_addr, connect_timeout=TIMEOUT) as done:
            # the other node's worker comes first, sends its Deltas and finishes: once node
            # n0 ends, the client is done and every service exits (what a probe did)
            done_index = done.node_index(TIMEOUT)
            assert done_index is not None and done_index.node_count == 2
            done.send_raw(b"".join(_delta(done_index.node_id, k) for k in range(DELTAS)))
            done.send(y2.Runtime(DELTAS, 1, 2, 3, 7))
            done.send(y2.Finished())
            started = time.monotonic()
            for k in range(PROBES):
                visit(first_addr)
                first.wait_for_err(CLOSED_LINE, k + 1)  # its service has seen it go
            burst = time.monotonic() - started < BURST_QUIET
            assert first.p.poll() is None, first.stderr  # the service goes on
            # the real worker: the same NodeIndex, the Deltas kept for it, served as usual
            with WorkerLink(first_addr, connect_timeout=10) as worker:
                index = worker.node_index(TIMEOUT)
                assert index == y2.NodeIndex(1 - done_index.node_id, 2), first.stderr
                got = worker.deltas(DELTAS, TIMEOUT)
                assert _senders_and_seqs(got) == [(done_index.node_id, k) for k in range(DELTAS)]
                worker.send_raw(b"".join(_delta(index.node_id, k) for k in range(DELTAS)))
                seen = _senders_and_seqs(done.deltas(DELTAS, TIMEOUT))
                assert seen == [(index.node_id, k) for k in range(DELTAS)]
                worker.send(y2.Runtime(DELTAS, 1, 2, 3, 8))
                worker.send(y2.Finished())
                code, out = c.client.finish()  # done: both nodes finished
        assert code == 0, c.client.stderr
        summary = json.loads(out[-1])
        assert summary["outcome"] == "finished"
        assert {n["state"] for n in summary["nodes"]} == {"finished"}
        node = next(n for n in summary["nodes"] if n["node_id"] == index.node_id)
        assert node["activity"]["worker_connections"] == PROBES + 1
        assert node["activity"]["deltas_from_worker"] == DELTAS
        assert node["activity"]["deltas_to_worker"] == DELTAS
        for service in (first, other):  # every service exits 0 once the client says done
            code, out = service.finish()
            assert code == 0, service.stderr
        counters = json.loads(first.finish()[1][-1])["counters"]
        assert counters["worker_connections"] == PROBES + 1, counters
        if malformed:
            assert counters["worker_errors"] == PROBES and counters["worker_probes"] == 0
            logged, unlogged = BAD_LINK_LINE, PROBE_LINE
        else:
            assert counters["worker_errors"] == 0 and counters["worker_probes"] == PROBES
            logged, unlogged = PROBE_LINE, BAD_LINK_LINE
        # logged once for the burst (the next line would say how many were not)
        assert first.count(unlogged) == 0, first.stderr
        assert first.count(logged) == 1 if burst else first.count(logged) >= 1, first.stderr
        assert "ended without Finished" not in first.stderr


def test_probes_while_the_worker_runs_do_not_replace_it():
    # a load balancer checks the port every few seconds while the worker trains
    with _cluster(2) as c:
        (first, first_addr), (_other, other_addr) = c.services["n0"], c.services["n1"]
        with (
            WorkerLink(first_addr, connect_timeout=TIMEOUT) as worker,
            WorkerLink(other_addr, connect_timeout=TIMEOUT) as peer,
        ):
            index, peer_index = worker.node_index(TIMEOUT), peer.node_index(TIMEOUT)
            assert index is not None and peer_index is not None
            # it spoke (its service has read it: the peer has it): the node's worker
            worker.send_raw(_delta(index.node_id, 0))
            assert _senders_and_seqs(peer.deltas(1, TIMEOUT)) == [(index.node_id, 0)]
            started = time.monotonic()
            for k, visitor in enumerate(VISITORS):
                VISITORS[visitor][0](first_addr)
                first.wait_for_err("closed (", k + 1)
            burst = time.monotonic() - started < BURST_QUIET
            # the worker is still the node's: Deltas both ways, then the cluster finishes
            worker.send_raw(b"".join(_delta(index.node_id, k) for k in range(1, DELTAS)))
            peer.send_raw(b"".join(_delta(peer_index.node_id, k) for k in range(DELTAS)))
            got = _senders_and_seqs(worker.deltas(DELTAS, TIMEOUT))
            assert got == [(peer_index.node_id, k) for k in range(DELTAS)], first.stderr
            seen = _senders_and_seqs(peer.deltas(DELTAS - 1, TIMEOUT))
            assert seen == [(index.node_id, k) for k in range(1, DELTAS)]
            for link in (worker, peer):
                link.send(y2.Finished())
            code, out = c.client.finish()
        assert code == 0, c.client.stderr
        summary = json.loads(out[-1])
        assert summary["outcome"] == "finished"
        node = next(n for n in summary["nodes"] if n["node_id"] == index.node_id)
        assert node["activity"]["node_index_to_worker"] >= 1
        code, out = first.finish()
        assert code == 0, first.stderr
        counters = json.loads(out[-1])["counters"]
        garbage = sum(malformed for _, malformed in VISITORS.values())
        assert counters["worker_replaced"] == 0
        assert counters["worker_connections"] == 1 + len(VISITORS)
        assert counters["worker_errors"] == garbage
        assert counters["worker_probes"] == len(VISITORS) - garbage
        lines = first.count(PROBE_LINE), first.count(BAD_LINK_LINE)
        assert lines == (1, 1) if burst else min(lines) >= 1, first.stderr


@pytest.mark.parametrize("probe_first", [False, True], ids=["as-before", "after-a-probe"])
@pytest.mark.parametrize("sent", ["deltas", "runtime", "finished-then-stop"])
def test_y2s_own_ending_still_ends_the_node_and_the_services_exit(sent, probe_first):
    # y2's main.py queues the last Runtime and Finished and stops its link at once: what it
    # had sent before is all the service sees, then the connection closes.  A probe before
    # the worker changes nothing.
    with _cluster(2) as c:
        (first, first_addr), (other, other_addr) = c.services["n0"], c.services["n1"]
        if probe_first:
            _connect_and_close(first_addr)
            first.wait_for_err(CLOSED_LINE, 1)
        links = [WorkerLink(addr, connect_timeout=10) for addr in (first_addr, other_addr)]
        try:
            index = [link.node_index(TIMEOUT) for link in links]
            assert sorted(i.node_id for i in index) == [0, 1], first.stderr
            if sent == "deltas":
                for link, ix in zip(links, index, strict=True):
                    link.send_raw(b"".join(_delta(ix.node_id, k) for k in range(DELTAS)))
                for link in links:
                    assert len(link.deltas(DELTAS, TIMEOUT)) == DELTAS
            elif sent == "runtime":
                for link, ix in zip(links, index, strict=True):
                    link.send(y2.Runtime(1, 2, 3, 4, ix.node_id))
            else:  # wirekit's worker: Finished queued and the link stopped at once
                links[0].send(y2.Finished())
                links[1].send(y2.Runtime(1, 2, 3, 4, 5))
        finally:
            for link in links:
                link.close()
        code, out = c.client.finish()  # it ends by itself
        assert code == 0, c.client.stderr
        summary = json.loads(out[-1])
        states = {n["node_id"]: n["state"] for n in summary["nodes"]}
        if sent == "finished-then-stop":
            assert states == {index[0].node_id: "finished", index[1].node_id: "ended"}
        else:
            assert set(states.values()) == {"ended"}
        assert summary["done"] is True and summary["outcome"] == "ended"
        for service in (first, other):  # and so does every service, as before
            code, _ = service.finish()
            assert code == 0, service.stderr
        assert first.count(PROBE_LINE) == probe_first
        if sent != "finished-then-stop":
            assert first.count("ended without Finished") == 1, first.stderr
