"""``wirekit conform clipper frontend``: wirekit plays model containers for a frontend.

TARGET is where the frontend under test takes containers (its ROUTER).  The cases connect
DEALERs there and register as containers of model ``conform``.  A frontend only sends
requests when someone asks it for a prediction: with ``--query ADDRESS`` (the query socket
of ``wirekit clipper frontend``) the request cases ask it themselves; without, they skip.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import zmq

from wirekit import clipper
from wirekit._vocabulary import tcp_address
from wirekit.clipper import (
    Generation,
    Heartbeat,
    HeartbeatReply,
    HeartbeatType,
    InputType,
    NewContainer,
    PredictRequest,
    PredictResponse,
)
from wirekit.errors import DecodeError

from ..core.cases import Failed, Level, Skipped, Suite
from ..core.net import Deadline
from ..core.options import SuiteOptions
from .clipper_container import CLIPPER, add_generation

SUITE = Suite("clipper", "frontend", "Clipper frontend", always=("handshake",))
MUST, SHOULD, WIREKIT = Level.MUST, Level.SHOULD, Level.WIREKIT

SPEC = "specs/clipper.md"
FRAMES = f"{SPEC}#frames"
BAD_INPUT = f"{SPEC}#what-the-runtimes-do-with-bad-input"
MODEL = "conform"
_OTHER = {Generation.G2016: Generation.V3, Generation.G2017: Generation.V3,
          Generation.V3: Generation.G2017}  # fmt: skip


class FrontendSide:
    """The containers' side: DEALERs to the frontend's ROUTER, and its query socket."""

    def __init__(self, address: str, generation: Generation, query: str | None) -> None:
        self.address = address
        self.generation = generation
        self.query_address = query
        self.context = zmq.Context()
        self.sockets: list[zmq.Socket] = []
        self.container: zmq.Socket | None = None  #: the registered container
        self.pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="conform-query")
        self.received = bytearray()

    def __str__(self) -> str:
        query = f", queries at {self.query_address}" if self.query_address else ""
        return f"{self.address} ({self.generation.value}){query}"

    def begin_case(self) -> None:
        self.received = bytearray()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        for sock in self.sockets:
            sock.close(0)
        self.context.destroy(linger=0)

    def dealer(self) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        self.sockets.append(sock)
        return sock

    def encode(self, msg: Any, generation: Generation | None = None) -> list[bytes]:
        return clipper.encode(msg, generation or self.generation)

    def recv(self, sock: zmq.Socket, deadline: Deadline, waiting_for: str) -> Any:
        """The frontend's next message to ``sock``, decoded."""
        if not sock.poll(int(deadline.remaining() * 1000)):
            raise Failed(waiting_for, f"nothing within {deadline.seconds:g} s")
        frames = sock.recv_multipart()
        self.received += b"".join(frames)
        try:
            return clipper.decode(frames, self.generation, "to_container")
        except DecodeError as exc:
            raise Failed(waiting_for, f"a malformed message: {exc}", self.received) from None

    def expect_heartbeat_reply(self, sock: zmq.Socket, deadline: Deadline,
                               kind: HeartbeatType) -> None:  # fmt: skip
        want = f"a heartbeat reply {kind.name}"
        msg = self.recv(sock, deadline, want)
        if msg != HeartbeatReply(kind):
            raise Failed(want, repr(msg), self.received)

    def register(self, sock: zmq.Socket, deadline: Deadline, input_type: InputType) -> None:
        """Register ``sock`` as a container of model ``conform`` (2017/v3: heartbeat,
        metadata request, registration, keep-alive)."""
        rpc_version = 3 if self.generation is Generation.V3 else None
        registration = NewContainer(MODEL, "1", input_type, rpc_version)
        if self.generation is not Generation.G2016:
            sock.send_multipart(self.encode(Heartbeat()))
            self.expect_heartbeat_reply(sock, deadline, HeartbeatType.REQUEST_CONTAINER_METADATA)
        sock.send_multipart(self.encode(registration))
        if self.generation is not Generation.G2016:
            sock.send_multipart(self.encode(Heartbeat()))
            self.expect_heartbeat_reply(sock, deadline, HeartbeatType.KEEPALIVE)

    def require(self) -> zmq.Socket:
        if self.container is None:
            raise Skipped("no container registered (the handshake failed)")
        return self.container

    def ask(self, inputs: list[Any], timeout: float) -> concurrent.futures.Future:
        """A prediction asked of the frontend's query socket, in the background."""
        if self.query_address is None:
            raise Skipped("give --query (the frontend's query socket) to drive predictions")
        from wirekit.clipper.frontend import query

        return self.pool.submit(query, self.query_address, MODEL, inputs, "doubles", timeout,
                                self.context)  # fmt: skip

    def asked(
        self, inputs: list[Any], deadline: Deadline
    ) -> tuple[zmq.Socket, concurrent.futures.Future, PredictRequest]:
        """A prediction asked (:meth:`ask`) and the request it made the frontend send to
        the registered container: (the container's socket, the query, the request)."""
        sock = self.require()
        future = self.ask(inputs, deadline.remaining())
        return sock, future, self.next_request(sock, deadline)

    def outputs(self, *lengths: int) -> list[Any]:
        """The conformance outputs for inputs of these lengths, as this generation sends
        them (2016: float32 numbers; 2017/v3: text)."""
        if self.generation is Generation.G2016:
            return [float(n) for n in lengths]
        return [str(n) for n in lengths]

    def next_request(self, sock: zmq.Socket, deadline: Deadline) -> PredictRequest:
        want = "a predict request"
        while True:
            msg = self.recv(sock, deadline, want)
            if type(msg) is PredictRequest:
                return msg
            if type(msg) is not HeartbeatReply:
                raise Failed(want, repr(msg), self.received)


def _answer(future: concurrent.futures.Future, deadline: Deadline) -> tuple[Any, str | None]:
    """The query's outputs, or (None, its error)."""
    try:
        return future.result(timeout=deadline.remaining()), None
    except concurrent.futures.TimeoutError:
        return None, f"no answer within {deadline.seconds:g} s"
    except Exception as exc:
        return None, str(exc)


# --------------------------------------------------------------------------- cases


@SUITE.case(
    "handshake",
    FRAMES,
    MUST,
    send="a container's greeting: 2017/v3 a heartbeat, then (asked for it) a registration "
    "and a heartbeat; 2016 a registration",
    expect="2017/v3: a metadata request to the first heartbeat, a keep-alive to the one "
    "after the registration",
)
def handshake(side: FrontendSide, deadline: Deadline) -> None:
    sock = side.dealer()
    side.register(sock, deadline, InputType.DOUBLES)
    side.container = sock


@SUITE.case(
    "request.format",
    FRAMES,
    MUST,
    send="(a query for 2 inputs of doubles, through --query) the outputs ['2', '1']",
    expect="a well-formed predict request of those inputs; the query answered with the outputs",
)
def request_format(side: FrontendSide, deadline: Deadline) -> None:
    sock, future, request = side.asked([[1.0, 2.0], [3.0]], deadline)
    got = [np.asarray(x).tolist() for x in request.inputs]
    if request.input_type != InputType.DOUBLES or got != [[1.0, 2.0], [3.0]]:
        raise Failed("inputs [[1.0, 2.0], [3.0]] (doubles)", f"{got} ({request.input_type.name})",
                     side.received)  # fmt: skip
    outputs = side.outputs(2, 1)
    sock.send_multipart(side.encode(PredictResponse(request.msg_id, outputs)))
    answer, error = _answer(future, deadline)
    if error is not None or [str(a) for a in answer] != [str(o) for o in outputs]:
        raise Failed(f"the query answered {outputs}", error or repr(answer), side.received)


@SUITE.case(
    "response.unknown-id",
    FRAMES,
    SHOULD,
    send="a response with a msg_id the frontend never sent, then the right one",
    expect="the stray response dropped; the query answered",
)
def response_unknown_id(side: FrontendSide, deadline: Deadline) -> None:
    sock, future, request = side.asked([[5.0]], deadline)
    outputs = side.outputs(1)
    stray = (request.msg_id + 7919) % 2**31
    sock.send_multipart(side.encode(PredictResponse(stray, outputs)))
    sock.send_multipart(side.encode(PredictResponse(request.msg_id, outputs)))
    _, error = _answer(future, deadline)
    if error is not None:
        raise Failed("the query answered", error, side.received)


@SUITE.case(
    "response.wrong-count",
    FRAMES,
    WIREKIT,
    send="one output for a request of two inputs",
    expect="the query fails with an error (no hang, no answer made up)",
)
def response_wrong_count(side: FrontendSide, deadline: Deadline) -> None:
    sock, future, request = side.asked([[1.0], [2.0]], deadline)
    outputs = side.outputs(1)
    sock.send_multipart(side.encode(PredictResponse(request.msg_id, outputs)))
    answer, error = _answer(future, deadline)
    if error is None:
        raise Failed("the query to fail", f"answered {answer!r}", side.received)
    if error.startswith("no answer within"):
        raise Failed("the query to fail at once", error, side.received)


@SUITE.case(
    "malformed",
    BAD_INPUT,
    WIREKIT,
    send="frames no generation decodes, from the registered container",
    expect="the frontend goes on: a heartbeat answered (2017/v3), a query served",
)
def malformed(side: FrontendSide, deadline: Deadline) -> None:
    sock = side.require()
    if side.generation is Generation.G2016 and side.query_address is None:
        # no heartbeat to answer and no query to serve: nothing would show it went on
        raise Skipped("2016 without --query: nothing to observe after the frames")
    sock.send_multipart([b"", b"\xff\xff\xff", b"not clipper"])
    if side.generation is not Generation.G2016:
        sock.send_multipart(side.encode(Heartbeat()))
        side.expect_heartbeat_reply(sock, deadline, HeartbeatType.KEEPALIVE)
    if side.query_address is not None:
        request_format(side, deadline)


@SUITE.case(
    "version-mismatch",
    BAD_INPUT,
    WIREKIT,
    send="a second container's registration in another generation",
    expect="it is not registered (no metadata request, no request routed to it); the first "
    "container still served",
)
def version_mismatch(side: FrontendSide, deadline: Deadline) -> None:
    side.require()
    other = _OTHER[side.generation]
    stranger = side.dealer()
    reg = NewContainer(MODEL, "2", InputType.DOUBLES, 3 if other is Generation.V3 else None)
    stranger.send_multipart(side.encode(reg, other))
    if side.query_address is not None:
        for _ in range(2):  # with the stranger registered, one of these would go to it
            request_format(side, deadline)
    if stranger.poll(200):
        frames = stranger.recv_multipart()
        raise Failed("nothing to the other generation's container", f"frames {frames!r}",
                     b"".join(frames))  # fmt: skip


# --------------------------------------------------------------------------- the command


def add_arguments(options: SuiteOptions) -> None:
    """TARGET (parsed as the command's default, then required to be ``tcp://``: see
    :func:`check_arguments`), ``--gen`` and ``--query``."""
    add_generation(options)
    options.add_argument(
        "--query",
        group=CLIPPER,
        type=tcp_address,
        metavar="ADDRESS",
        help="clipper frontend: its query socket (wirekit clipper frontend --query), which "
        "the request cases use to make it send requests (without: they skip)",
    )


def check_arguments(args: argparse.Namespace) -> str | None:
    if not args.target or not args.target.startswith("tcp://"):
        return "clipper frontend: give the frontend's container address: tcp://HOST:PORT"
    if not args.gen:
        return "clipper frontend: give the generation: --gen 2016|2017|v3"
    return None


@contextlib.contextmanager
def open_target(args: argparse.Namespace) -> Iterator[FrontendSide]:
    side = FrontendSide(args.target, Generation(args.gen), args.query)
    try:
        yield side
    finally:
        side.close()
