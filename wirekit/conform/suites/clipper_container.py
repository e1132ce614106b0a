"""``wirekit conform clipper container``: wirekit plays Clipper for a model container.

wirekit binds Clipper's ROUTER on ``--listen``; the container under test connects its DEALER
there (start it before or after the command: the first case waits ``--connect-timeout``
seconds for it).  The container serves the conformance model
(:func:`wirekit.conform.models.clipper_model`: each input answered with its length).

The cases share the one container and run in order: the handshake first (``--case``
always includes it), the Clipper restart after the requests, and the two cases that feed
it what Clipper's own containers die of (a feedback request, a request of the wrong input
type) last (``may_end_target``).  After each of them the runner checks that the container
still serves: a MUST case left when it does not fails ("the target stopped serving after
case X"), unless conform runs the container itself (``--target-cmd``) and restarts it.
"""

from __future__ import annotations

import argparse
import contextlib
import struct
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import zmq

from wirekit import clipper
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

from ..core.cases import Case, Failed, Level, NothingConnected, Skipped, Suite
from ..core.net import Deadline
from ..core.options import Group, SuiteOptions, add_connect_timeout, add_listen

SUITE = Suite("clipper", "container", "Clipper model container", always=("handshake",))
#: the command prints the address it listens on (the peer under test connects to it)
LISTENS = True
MUST, SHOULD, WIREKIT = Level.MUST, Level.SHOULD, Level.WIREKIT
#: the options of the Clipper suites (container and frontend)
CLIPPER = Group("clipper")

SPEC = "specs/clipper.md"
FORMAT = f"{SPEC}#frames"
FRAMES = f"{SPEC}#frames"
INPUTS = f"{SPEC}#request-inputs"
BAD_INPUT = f"{SPEC}#what-the-runtimes-do-with-bad-input"
V3_NOTES = f"{SPEC}#v3-9f25e3fc"
G2017_NOTES = f"{SPEC}#2017-9f396e0e"

#: Clipper expires a container silent this long (2017, v3)
ACTIVITY_TIMEOUT = 30.0
_BIND_RETRY = 5.0  # seconds to get the address back after closing the old ROUTER


class ClipperSide:
    """Clipper's side of the wire: a ROUTER on ``address`` and the container that
    registered on it (its identity, name, version and input type)."""

    def __init__(self, address: str, generation: Generation, connect_timeout: float) -> None:
        self.generation = generation
        self.connect_timeout = connect_timeout
        self.context = zmq.Context()
        self.router: zmq.Socket | None = None
        self.address = address
        self.identity: bytes | None = None
        self.registration: NewContainer | None = None
        self._next_id = 1000
        self.received = bytearray()  #: the frames of the current case, back to back
        self.bind(address)

    def __str__(self) -> str:
        text = f"{self.address} ({self.generation.value})"
        reg = self.registration
        if reg is not None:
            text += f", model {reg.model_name}:{reg.model_version} ({reg.input_type.name.lower()})"
        return text

    def timeout_for(self, case: Case, seconds: float) -> float:
        """The handshake waits ``connect_timeout`` for the container, then as any case."""
        return self.connect_timeout + seconds if case.id == "handshake" else seconds

    def begin_case(self) -> None:
        """A case starts: what it shows on a failure are the frames received from now."""
        self.received = bytearray()

    # -- sockets

    def bind(self, address: str) -> None:
        """Bind a new ROUTER on ``address`` (retrying while the old one's port is freed)."""
        end = time.monotonic() + _BIND_RETRY
        while True:
            sock = self.context.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                sock.bind(address)
            except zmq.ZMQError:
                sock.close(0)
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)
                continue
            break
        self.router = sock
        self.address = sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def restart(self) -> None:
        """Close the ROUTER and bind a new one on the same address, forgetting the
        container (as a restarted Clipper does)."""
        assert self.router is not None
        self.router.close(0)
        self.router = None
        self.identity = None
        self.bind(self.address)

    def close(self) -> None:
        if self.router is not None:
            self.router.close(0)
        self.context.destroy(linger=0)

    # -- messages

    def new_msg_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def recv(self, deadline: Deadline, waiting_for: str) -> tuple[bytes, list[bytes]]:
        """The next message on the ROUTER: (identity, frames as the container sent them)."""
        assert self.router is not None
        if not self.router.poll(int(deadline.remaining() * 1000)):
            got = f"nothing within {deadline.seconds:g} s"
            raise Failed(waiting_for, got)  # no bytes: what came earlier answered another wait
        frames = self.router.recv_multipart()
        self.received += b"".join(frames[1:])
        identity, body = clipper.from_router(frames)
        return identity, body

    def send(self, identity: bytes, frames: Sequence[bytes]) -> None:
        assert self.router is not None
        self.router.send_multipart(clipper.to_router(identity, list(frames)))

    def send_request(self, identity: bytes, msg_id: int, itype: InputType, inputs: Any) -> None:
        self.send(identity, clipper.encode(PredictRequest(msg_id, itype, inputs), self.generation))

    def keepalive(self, identity: bytes) -> None:
        """Answer a heartbeat of the registered container, as Clipper does."""
        self.send(
            identity, clipper.encode(HeartbeatReply(HeartbeatType.KEEPALIVE), self.generation)
        )

    def decode(self, frames: list[bytes], waiting_for: str) -> Any:
        try:
            return clipper.decode(frames, self.generation, "to_clipper")
        except DecodeError as exc:
            raise Failed(waiting_for, f"a malformed message: {exc}", self.received) from None

    def next_message(self, deadline: Deadline, waiting_for: str) -> Any:
        """The container's next message other than a heartbeat.  Heartbeats are answered
        as Clipper answers them: a keep-alive to the registered container, a metadata
        request to any other peer; a registration makes its sender the container."""
        while True:
            identity, frames = self.recv(deadline, waiting_for)
            msg = self.decode(frames, waiting_for)
            if type(msg) is Heartbeat:
                kind = (
                    HeartbeatType.KEEPALIVE
                    if identity == self.identity
                    else HeartbeatType.REQUEST_CONTAINER_METADATA
                )
                self.send(identity, clipper.encode(HeartbeatReply(kind), self.generation))
                continue
            if type(msg) is NewContainer:  # (Clipper does not answer a registration)
                self.identity = identity
                self.registration = msg
            return msg

    def wait_registration(self, deadline: Deadline) -> NewContainer:
        want = "a registration (name, version, input type)"
        while True:
            msg = self.next_message(deadline, want)
            if type(msg) is NewContainer:
                return msg
            raise Failed(want, f"a {type(msg).__name__} first", self.received)

    def require_container(self) -> tuple[bytes, InputType]:
        if self.identity is None or self.registration is None:
            raise Skipped("no container registered (the handshake or a restart failed)")
        return self.identity, self.registration.input_type

    def predict(
        self,
        deadline: Deadline,
        inputs: Any,
        *,
        input_type: InputType | None = None,
        msg_id: int | None = None,
    ) -> PredictResponse:
        """Send one predict request; the container's response to it."""
        identity, own_type = self.require_container()
        msg_id = self.new_msg_id() if msg_id is None else msg_id
        request = PredictRequest(msg_id, own_type if input_type is None else input_type, inputs)
        self.send(identity, clipper.encode(request, self.generation))
        return self.response_to(deadline, msg_id, len(inputs))

    def response_to(self, deadline: Deadline, msg_id: int, n: int) -> PredictResponse:
        want = f"the response to msg_id {msg_id} ({n} outputs)"
        msg = self.next_message(deadline, want)
        if type(msg) is not PredictResponse:
            raise Failed(want, f"a {type(msg).__name__}", self.received)
        if msg.msg_id != msg_id:
            raise Failed(want, f"a response to msg_id {msg.msg_id}", self.received)
        return msg

    def outputs_of(self, response: PredictResponse) -> list[str]:
        """The response's outputs as text (2016's float32 values as integers' text)."""
        outs = response.outputs
        if self.generation is Generation.G2016:
            return [f"{float(v):g}" for v in np.asarray(outs).ravel()]
        return [o if isinstance(o, str) else bytes(o).decode("utf-8", "replace") for o in outs]

    def check(self, deadline: Deadline, inputs: Any, **kw: Any) -> None:
        """A request of ``inputs``; the conformance model's answer must come back."""
        response = self.predict(deadline, inputs, **kw)
        expected = [str(len(x)) for x in inputs]
        got = self.outputs_of(response)
        if got != expected:
            raise Failed(f"outputs {expected}", f"outputs {got}", self.received)

    def is_serving(self, deadline: Deadline) -> bool:
        """Whether the registered container still answers a request (the runner's check
        after a case that may have ended it)."""
        if self.identity is None or self.registration is None:
            return False
        try:
            self.check(deadline, inputs_of(self.registration.input_type, [2]))
        except (Failed, Skipped):
            return False
        return True

    def restarted(self, deadline: Deadline) -> bool:
        """After conform restarted the container (--target-cmd): it registers again and
        serves a request."""
        self.identity = None
        try:
            while type(self.next_message(deadline, "a registration")) is not NewContainer:
                pass
        except Failed:
            return False
        return self.is_serving(deadline)

    def serving(self, deadline: Deadline) -> None:
        """Skip the case unless the container still answers a request."""
        _, own_type = self.require_container()
        try:
            self.check(deadline, inputs_of(own_type, [2]))
        except Failed as exc:
            raise Skipped(f"the container does not serve before the case ({exc.got})") from None
        self.received = bytearray()  # the probe's answer is not the case's


def inputs_of(input_type: InputType, lengths: Sequence[int]) -> list[Any]:
    """Inputs of ``input_type`` with these lengths (elements; ASCII characters)."""
    if input_type == InputType.STRINGS:
        return ["".join(chr(97 + (k + j) % 26) for j in range(n)) for k, n in enumerate(lengths)]
    dtype = {
        InputType.BYTES: np.uint8,
        InputType.INTS: np.int32,
        InputType.FLOATS: np.float32,
        InputType.DOUBLES: np.float64,
    }[input_type]
    return [np.arange(k, k + n).astype(dtype) for k, n in enumerate(lengths)]


def u32(value: int) -> bytes:
    return struct.pack("<I", value)


# --------------------------------------------------------------------------- cases


@SUITE.case(
    "handshake",
    FRAMES,
    MUST,
    send="nothing: wirekit waits (--connect-timeout); 2017/v3: its heartbeat answered with a "
    "metadata request",
    expect="a registration: a name, a version, an input type 0..4 (v3: RPC version 3); "
    "2017/v3: after a first heartbeat",
)
def handshake(side: ClipperSide, deadline: Deadline) -> None:
    first = "a heartbeat" if side.generation is not Generation.G2016 else "a registration"
    try:
        identity, frames = side.recv(deadline, f"{first} from a container")
    except Failed:
        raise NothingConnected(
            f"no container came to {side.address} within {deadline.seconds:g} s "
            f"(--connect-timeout {side.connect_timeout:g} s and the case's time): no case was run"
        ) from None
    msg = side.decode(frames, first)
    if side.generation is not Generation.G2016:
        if type(msg) is not Heartbeat:
            raise Failed("a heartbeat first", f"a {type(msg).__name__}", side.received)
        reply = HeartbeatReply(HeartbeatType.REQUEST_CONTAINER_METADATA)
        side.send(identity, clipper.encode(reply, side.generation))
        msg = side.wait_registration(deadline)
    elif type(msg) is NewContainer:
        side.identity, side.registration = identity, msg
    else:
        raise Failed("a registration", f"a {type(msg).__name__}", side.received)
    if not msg.model_name:
        raise Failed("a model name", "an empty name", side.received)


@SUITE.case(
    "heartbeat.idle",
    G2017_NOTES,
    MUST,
    send="nothing (2017/v3)",
    expect="a heartbeat from the idle container before Clipper's 30 s activity timeout",
    timeout=ACTIVITY_TIMEOUT + 5,
)
def heartbeat_idle(side: ClipperSide, deadline: Deadline) -> None:
    if side.generation is Generation.G2016:
        raise Skipped("2016 has no heartbeats")
    identity, _ = side.require_container()
    bound = Deadline(min(ACTIVITY_TIMEOUT, deadline.remaining()))
    while True:
        try:
            sender, frames = side.recv(bound, "a heartbeat")
        except Failed:
            raise Failed(
                f"a heartbeat within {ACTIVITY_TIMEOUT:g} s", "silence", side.received
            ) from None
        msg = side.decode(frames, "a heartbeat")
        if type(msg) is Heartbeat and sender == identity:
            side.keepalive(identity)
            return


@SUITE.case(
    "predict.one",
    INPUTS,
    MUST,
    send="a batch of one input of the container's type",
    expect="one output, its length, with the request's msg_id",
)
def predict_one(side: ClipperSide, deadline: Deadline) -> None:
    side.check(deadline, inputs_of(side.require_container()[1], [3]))


@SUITE.case(
    "predict.equal",
    INPUTS,
    MUST,
    send="a batch of 4 inputs of equal length",
    expect="4 outputs, in order",
)
def predict_equal(side: ClipperSide, deadline: Deadline) -> None:
    side.check(deadline, inputs_of(side.require_container()[1], [5, 5, 5, 5]))


@SUITE.case(
    "predict.unequal",
    INPUTS,
    MUST,
    send="a batch of 3 inputs of lengths 1, 7, 2",
    expect="3 outputs, in order",
)
def predict_unequal(side: ClipperSide, deadline: Deadline) -> None:
    side.check(deadline, inputs_of(side.require_container()[1], [1, 7, 2]))


@SUITE.case(
    "predict.many",
    INPUTS,
    MUST,
    send="a batch of 100 inputs of lengths 1..100",
    expect="100 outputs, in order",
)
def predict_many(side: ClipperSide, deadline: Deadline) -> None:
    side.check(deadline, inputs_of(side.require_container()[1], range(1, 101)))


@SUITE.case(
    "predict.msg-id",
    FRAMES,
    MUST,
    send="requests with msg_id 0 and 2147483647",
    expect="each response carries its request's msg_id",
)
def predict_msg_id(side: ClipperSide, deadline: Deadline) -> None:
    itype = side.require_container()[1]
    for msg_id in (0, 2**31 - 1):
        side.check(deadline, inputs_of(itype, [1]), msg_id=msg_id)


@SUITE.case(
    "predict.interleaved",
    FRAMES,
    MUST,
    send="3 requests sent before any answer",
    expect="3 responses, each with its own msg_id and outputs (any order)",
)
def predict_interleaved(side: ClipperSide, deadline: Deadline) -> None:
    identity, itype = side.require_container()
    wanted = {}
    for n in (1, 2, 3):
        msg_id = side.new_msg_id()
        wanted[msg_id] = [str(n)] * n
        side.send_request(identity, msg_id, itype, inputs_of(itype, [n] * n))
    while wanted:
        want = f"responses to msg_id {sorted(wanted)}"
        msg = side.next_message(deadline, want)
        if type(msg) is not PredictResponse or msg.msg_id not in wanted:
            got = f"a {type(msg).__name__}" + (
                f" to msg_id {msg.msg_id}" if type(msg) is PredictResponse else ""
            )
            raise Failed(want, got, side.received)
        expected = wanted.pop(msg.msg_id)
        if side.outputs_of(msg) != expected:
            raise Failed(f"outputs {expected}", f"outputs {side.outputs_of(msg)}", side.received)


@SUITE.case(
    "restart",
    FRAMES,
    MUST,
    send="Clipper restarts: its ROUTER closed, a new one bound on the same address (2017/v3)",
    expect="the container registers again on the new socket (heartbeat, metadata request, "
    "registration) and serves a request",
    timeout=ACTIVITY_TIMEOUT + 10,
    may_end_target=True,
)
def restart(side: ClipperSide, deadline: Deadline) -> None:
    if side.generation is Generation.G2016:
        raise Skipped("2016 has no heartbeats: see restart.legacy")
    _restart(side, deadline)


@SUITE.case(
    "restart.legacy",
    FRAMES,
    WIREKIT,
    send="Clipper restarts: its ROUTER closed, a new one bound on the same address (2016)",
    expect="the container notices the lost connection, registers again and serves a request",
    timeout=5.0,
    may_end_target=True,
)
def restart_legacy(side: ClipperSide, deadline: Deadline) -> None:
    if side.generation is not Generation.G2016:
        raise Skipped("2017/v3: see restart")
    _restart(side, deadline)


def _restart(side: ClipperSide, deadline: Deadline) -> None:
    _, itype = side.require_container()
    side.restart()
    side.wait_registration(deadline)
    side.check(deadline, inputs_of(itype, [4, 1]))


@SUITE.case(
    "feedback",
    V3_NOTES,
    SHOULD,
    send="a feedback request (request type 1, no body; 2017/v3)",
    expect="the container still serves the next predict request (an answer to the feedback "
    "is optional)",
    may_end_target=True,
)
def feedback(side: ClipperSide, deadline: Deadline) -> None:
    if side.generation is Generation.G2016:
        raise Skipped("2016 Clipper never sends feedback")
    side.serving(deadline)
    identity, itype = side.require_container()
    msg_id = side.new_msg_id()
    head = [b""] + ([u32(3)] if side.generation is Generation.V3 else [])
    side.send(identity, [*head, u32(1), u32(msg_id), u32(1)])
    after = side.new_msg_id()
    side.send_request(identity, after, itype, inputs_of(itype, [2, 3]))
    want = f"the response to msg_id {after}"
    while True:
        try:
            identity_, frames = side.recv(deadline, want)
        except Failed as exc:
            raise Failed(want, f"{exc.got} (the container stopped serving)", exc.received) from None
        try:
            msg = clipper.decode(frames, side.generation, "to_clipper")
        except DecodeError:
            continue  # its answer to the feedback, in whatever form: allowed
        if type(msg) is Heartbeat:
            side.keepalive(identity_)
            continue
        if type(msg) is PredictResponse and msg.msg_id == msg_id:
            continue  # an answer to the feedback
        if type(msg) is PredictResponse and msg.msg_id == after:
            if side.outputs_of(msg) != ["2", "3"]:
                raise Failed("outputs ['2', '3']", f"outputs {side.outputs_of(msg)}", side.received)
            return
        raise Failed(want, f"a {type(msg).__name__}", side.received)


@SUITE.case(
    "predict.wrong-type",
    BAD_INPUT,
    MUST,
    send="a request of another input type (strings; doubles to a strings container)",
    expect="the container still serves the next request (an answer to the wrong one must "
    "carry its msg_id)",
    may_end_target=True,
)
def predict_wrong_type(side: ClipperSide, deadline: Deadline) -> None:
    side.serving(deadline)
    identity, itype = side.require_container()
    wrong = InputType.DOUBLES if itype == InputType.STRINGS else InputType.STRINGS
    bad_id, good_id = side.new_msg_id(), side.new_msg_id()
    side.send_request(identity, bad_id, wrong, inputs_of(wrong, [2]))
    side.send_request(identity, good_id, itype, inputs_of(itype, [3]))
    want = f"the response to msg_id {good_id}"
    while True:
        try:
            msg = side.next_message(deadline, want)
        except Failed as exc:
            raise Failed(want, f"{exc.got} (the container stopped serving)", exc.received) from None
        if type(msg) is PredictResponse and msg.msg_id == bad_id:
            continue
        if type(msg) is PredictResponse and msg.msg_id == good_id:
            if side.outputs_of(msg) != ["3"]:
                raise Failed("outputs ['3']", f"outputs {side.outputs_of(msg)}", side.received)
            return
        got = f"a {type(msg).__name__}" + (
            f" to msg_id {msg.msg_id}" if type(msg) is PredictResponse else ""
        )
        raise Failed(want, got, side.received)


# --------------------------------------------------------------------------- the command


def add_generation(options: SuiteOptions) -> None:
    """``--gen 2016|2017|v3``: the Clipper generation the implementation speaks."""
    options.add_argument(
        "--gen",
        group=CLIPPER,
        choices=[g.value for g in Generation],
        help="the Clipper generation it speaks",
    )


def add_arguments(options: SuiteOptions) -> None:
    """No TARGET: ``--listen`` (where the container connects), ``--connect-timeout``,
    ``--gen``."""
    add_listen(options)
    add_connect_timeout(options)
    add_generation(options)


def check_arguments(args: argparse.Namespace) -> str | None:
    """A usage error in ``args``, or None."""
    if args.target:
        return "clipper container: give Clipper's address with --listen, not as TARGET"
    if not args.gen:
        return "clipper container: give the generation: --gen 2016|2017|v3"
    if not args.listen or not args.listen.startswith("tcp://"):
        return "clipper container: give where to listen: --listen tcp://HOST:PORT"
    if args.connect_timeout <= 0:
        return "--connect-timeout must be positive"
    return None


@contextlib.contextmanager
def open_target(args: argparse.Namespace) -> Iterator[ClipperSide]:
    try:
        side = ClipperSide(args.listen, Generation(args.gen), args.connect_timeout)
    except zmq.ZMQError as exc:
        raise OSError(f"cannot listen on {args.listen}: {exc}") from None
    try:
        yield side
    finally:
        side.close()
