"""``wirekit conform y2 service``: wirekit plays the client service, the worker and the
other node for a y2 communication service under test.

Start the service with ``--client`` pointing at ``--listen`` (wirekit binds the client's
ROUTER there); TARGET is the service's worker link (``tcp://HOST:PORT``).  The cluster has
two nodes: the service under test is node 0, wirekit node 1 (its own inbox, a PULL).  The
cases share that cluster and run in order, from the registration to ``done``.
"""

from __future__ import annotations

import argparse
import contextlib
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import zmq

from wirekit import y2
from wirekit.errors import DecodeError
from wirekit.y2 import Delta, Finished, NodeIndex, Runtime
from wirekit.y2.service import FINISHED, STATUS

from ..core.cases import Failed, Level, NothingConnected, Skipped, Suite
from ..core.net import Deadline, Stream
from ..core.options import SuiteOptions, add_connect_timeout, add_listen

SUITE = Suite("y2", "service", "y2 communication service", always=("register", "node-index"))
#: the command prints the address it listens on (the service under test connects to it)
LISTENS = True
MUST, WIREKIT = Level.MUST, Level.WIREKIT

SPEC = "specs/y2.md"
LINK = f"{SPEC}#worker-link-framing"
SERVICES = f"{SPEC}#the-communication-services-wirekit-y2-client-wirekit-y2-service"
MESSAGES = f"{SPEC}#the-zeromq-messages"
LIMITS = f"{SPEC}#limits-back-pressure-and-bad-input"
NODES = 2


def deltas_of_every_size() -> list[Delta]:
    """Deltas of 0, 1 and 1000 words, and one over the 1 MiB a service forwards at once."""
    sizes = (0, 1, 1000, 300_000)
    return [Delta(np.arange(k, k + n, dtype=np.uint32)) for k, n in enumerate(sizes)]


def i32(value: int) -> bytes:
    return struct.pack(">i", value)


class ClusterSide:
    """The client's ROUTER, node 1's inbox and PUSH, and the worker's links."""

    def __init__(self, listen: str, worker_address: str, connect_timeout: float) -> None:
        self.worker_address = worker_address
        self.connect_timeout = connect_timeout
        self.context = zmq.Context()
        self.client = self._socket(zmq.ROUTER)
        self.client.bind(listen)
        self.address = self.client.getsockopt_string(zmq.LAST_ENDPOINT)
        self.inbox = self._socket(zmq.PULL)
        self.inbox.bind("tcp://127.0.0.1:*")
        self.push: zmq.Socket | None = None
        self.client_identity = b""  #: the service's routing id at the client (its name)
        self.worker: Stream | None = None
        self.decoder = y2.Decoder()
        self.received = bytearray()

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        return sock

    def __str__(self) -> str:
        return f"worker link {self.worker_address}, client at {self.address}"

    def timeout_for(self, case: Any, seconds: float) -> float:
        return self.connect_timeout + seconds if case.id == "register" else seconds

    def begin_case(self) -> None:
        self.received = bytearray()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        self.context.destroy(linger=0)

    # -- the client and node 1

    def from_service(self, deadline: Deadline, waiting_for: str) -> list[bytes]:
        """The service's next message to the client (without its routing id), its progress
        reports (``[status][node id][activity]``, sent whenever its worker's counts move or
        its worker comes or goes) read past: they may come between any two others."""
        while True:
            if not self.client.poll(int(deadline.remaining() * 1000)):
                raise Failed(waiting_for, f"nothing within {deadline.seconds:g} s")
            frames = self.client.recv_multipart()
            self.client_identity = frames[0]
            if frames[1:2] == [STATUS]:
                continue
            self.received += b"".join(frames[1:])
            return frames[1:]

    def from_peer(self, deadline: Deadline, waiting_for: str) -> list[bytes]:
        if not self.inbox.poll(int(deadline.remaining() * 1000)):
            raise Failed(waiting_for, f"nothing within {deadline.seconds:g} s")
        frames = self.inbox.recv_multipart()
        self.received += b"".join(frames)[:256]
        return frames

    # -- the worker

    def require(self) -> None:
        if self.push is None:
            raise Skipped("the service did not register")

    def connect_worker(self, deadline: Deadline) -> Stream:
        if self.worker is not None:
            self.worker.close()
        self.worker = Stream(self.worker_address, deadline)
        self.decoder = y2.Decoder()
        return self.worker

    @property
    def link_bytes(self) -> bytes:
        """The last bytes the service wrote on the current worker link."""
        return b"" if self.worker is None else bytes(self.worker.received[-64:])

    def from_worker_link(self, deadline: Deadline, waiting_for: str) -> Any:
        """The next message the service writes on the worker link."""
        worker = self.worker
        assert worker is not None
        worker.deadline = deadline
        while True:
            try:
                msg = self.decoder.next_message()
            except DecodeError as exc:
                raise Failed(waiting_for, f"a malformed message: {exc}", worker.received) from None
            if msg is not None:
                return msg
            data = worker.recv(waiting_for)
            if not data:
                raise Failed(waiting_for, "the link closed", worker.received[-64:])
            self.decoder.feed(data)


def expect_node_index(side: ClusterSide, deadline: Deadline) -> None:
    want = f"NodeIndex(0, {NODES}) first on the worker link"
    msg = side.from_worker_link(deadline, want)
    if msg != NodeIndex(0, NODES):
        raise Failed(want, repr(msg), side.link_bytes)


# --------------------------------------------------------------------------- cases


@SUITE.case(
    "register",
    SERVICES,
    MUST,
    send="(as the client) the index for 2 nodes after the service's hello",
    expect="[hello][its inbox endpoint] from the service; then it takes the index",
)
def register(side: ClusterSide, deadline: Deadline) -> None:
    try:
        frames = side.from_service(deadline, "[hello] [inbox endpoint]")
    except Failed:
        raise NothingConnected(
            f"no y2 service registered at {side.address} within {deadline.seconds:g} s "
            f"(--connect-timeout {side.connect_timeout:g} s and the case's time): "
            "no case was run"
        ) from None
    if len(frames) != 2 or frames[0] != b"hello":
        raise Failed("[hello] [inbox endpoint]", f"{len(frames)} frames: {frames[:2]!r}",
                     side.received)  # fmt: skip
    inbox = frames[1].decode("utf-8", "replace")
    mine = side.inbox.getsockopt_string(zmq.LAST_ENDPOINT)
    side.push = side._socket(zmq.PUSH)
    side.push.connect(inbox)
    identity = side.client_identity
    index = y2.encode(NodeIndex(0, NODES))
    side.client.send_multipart([identity, b"index", index, inbox.encode(), mine.encode()])


@SUITE.case(
    "node-index",
    LINK,
    MUST,
    send="(as the worker) a connection to the worker link",
    expect="NodeIndex(0, 2): 00000000 00000008 00000000 00000002",
)
def node_index(side: ClusterSide, deadline: Deadline) -> None:
    side.require()
    side.connect_worker(deadline)
    expect_node_index(side, deadline)


@SUITE.case(
    "deltas.to-peers",
    MESSAGES,
    MUST,
    send="(as the worker) Deltas of 0, 1, 1000 and 300000 words",
    expect="at node 1's inbox: [sender 0][whole Deltas], all four, in order",
)
def deltas_to_peers(side: ClusterSide, deadline: Deadline) -> None:
    side.require()
    assert side.worker is not None
    deltas = deltas_of_every_size()
    side.worker.send(b"".join(y2.encode(d) for d in deltas))
    got: list[Any] = []
    while len(got) < len(deltas):
        frames = side.from_peer(deadline, f"{len(deltas)} Deltas from node 0")
        if len(frames) != 2 or frames[0] != i32(0):
            raise Failed("[sender id 0] [Deltas]", f"{len(frames)} frames: {frames[0][:8]!r}",
                         side.received)  # fmt: skip
        wire, pos = frames[1], 0
        while pos < len(wire):
            try:
                msg, pos = y2.decode_prefix(wire, pos)
            except DecodeError as exc:
                raise Failed("whole Delta messages", str(exc), wire[:64]) from None
            got.append(msg)
    if got != deltas:
        raise Failed(repr(deltas), repr(got), side.received)


@SUITE.case(
    "deltas.to-worker",
    MESSAGES,
    MUST,
    send="(as node 1) Deltas of 0, 1, 1000 and 300000 words to the service's inbox",
    expect="the same Deltas on the worker link, in order",
)
def deltas_to_worker(side: ClusterSide, deadline: Deadline) -> None:
    side.require()
    assert side.push is not None
    deltas = deltas_of_every_size()
    for delta in deltas:
        side.push.send_multipart([i32(1), y2.encode(delta)])
    for k, delta in enumerate(deltas):
        msg = side.from_worker_link(deadline, f"Delta {k} of {len(deltas)}")
        if msg != delta:
            raise Failed(repr(delta), repr(msg), side.link_bytes)


@SUITE.case(
    "runtime",
    MESSAGES,
    MUST,
    send="(as the worker) a Runtime of 4 fields and one of 5 (with the loss)",
    expect="[runtime][node id 0][the Runtime] at the client, for each",
)
def runtime(side: ClusterSide, deadline: Deadline) -> None:
    side.require()
    assert side.worker is not None
    reports = [Runtime(6000, 12, 3400, 25), Runtime(6000, 11, 3300, 24, 1234)]
    for report in reports:
        side.worker.send(y2.encode(report))
        want = f"[runtime] [00000000] [{report}]"
        frames = side.from_service(deadline, want)
        if frames != [b"runtime", i32(0), y2.encode(report)]:
            raise Failed(want, repr(frames)[:200], side.received)


@SUITE.case(
    "worker.gone",
    SERVICES,
    MUST,
    send="(as the worker) a close without Finished; Deltas from node 1 meanwhile; a new "
    "worker connection",
    expect="the new worker gets NodeIndex(0, 2) again, then the Deltas sent while it was away",
)
def worker_gone(side: ClusterSide, deadline: Deadline) -> None:
    side.require()
    assert side.worker is not None and side.push is not None
    side.worker.close()
    kept = Delta(np.array([7, 8, 9], dtype=np.uint32))
    side.push.send_multipart([i32(1), y2.encode(kept)])
    side.connect_worker(deadline)
    expect_node_index(side, deadline)
    msg = side.from_worker_link(deadline, "the Delta sent while the worker was away")
    if msg != kept:
        raise Failed(repr(kept), repr(msg), side.link_bytes)


@SUITE.case(
    "worker.malformed",
    LIMITS,
    WIREKIT,
    send="(as the worker) a handshake of type 9",
    expect="the link closed; a new connection gets NodeIndex(0, 2)",
)
def worker_malformed(side: ClusterSide, deadline: Deadline) -> None:
    side.require()
    assert side.worker is not None
    worker = side.worker
    worker.send(i32(9) + i32(0))
    if not worker.closed_by_peer(deadline.remaining()):
        raise Failed("the link closed", "still open", worker.received[-64:])
    side.connect_worker(deadline)
    expect_node_index(side, deadline)


@SUITE.case(
    "finished",
    SERVICES,
    MUST,
    send="(as the worker) Finished; then (as the client) done",
    expect="[finished][node id 0][activity] at the client; after done the worker link closes",
)
def finished(side: ClusterSide, deadline: Deadline) -> None:
    side.require()
    assert side.worker is not None
    side.worker.send(y2.encode(Finished()))
    want = "[finished] [00000000] [the node's activity]"
    frames = side.from_service(deadline, want)
    if frames[:2] != [FINISHED, i32(0)] or len(frames) != 3:
        raise Failed(want, repr(frames)[:200], side.received)
    side.client.send_multipart([side.client_identity, b"done"])
    if not side.worker.closed_by_peer(deadline.remaining()):
        raise Failed("the worker link closed after done", "still open", side.received)


# --------------------------------------------------------------------------- the command


def add_arguments(options: SuiteOptions) -> None:
    """TARGET (parsed as the command's default, then required to be ``tcp://``: see
    :func:`check_arguments`), ``--listen`` (the client's ROUTER) and ``--connect-timeout``."""
    add_listen(options)
    add_connect_timeout(options)


def check_arguments(args: argparse.Namespace) -> str | None:
    if not args.target or not args.target.startswith("tcp://"):
        return "y2 service: give the service's worker link: tcp://HOST:PORT"
    if not args.listen or not args.listen.startswith("tcp://"):
        return "y2 service: give where the client listens: --listen tcp://HOST:PORT"
    return None


@contextlib.contextmanager
def open_target(args: argparse.Namespace) -> Iterator[ClusterSide]:
    try:
        side = ClusterSide(args.listen, args.target, args.connect_timeout)
    except zmq.ZMQError as exc:
        raise OSError(f"cannot listen on {args.listen}: {exc}") from None
    try:
        yield side
    finally:
        side.close()
