"""``wirekit conform mip server``: wirekit plays a MIP client against a server under test.

The server must serve the conformance model (:func:`wirekit.conform.models.mip_model`:
each sample echoed; ``conform:first`` answers one output; ``conform:fail`` fails).  Every
case opens its own connections and closes them before it ends, so a server that serves one
connection at a time is not blocked by an earlier case.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import selectors
import socket
import struct
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from wirekit import mip
from wirekit._vocabulary import mip_address
from wirekit.errors import DecodeError
from wirekit.mip import ErrorCode, ErrorReply, Inference, Item, ItemType, Message, Ping

from ..core.cases import Failed, Level, Skipped, Suite
from ..core.net import Deadline, Stream, refused_connection
from ..core.options import SuiteOptions
from ..models import FAIL, FIRST_ONLY

SUITE = Suite("mip", "server", "MIP server")
MUST, SHOULD, MAY, WIREKIT = Level.MUST, Level.SHOULD, Level.MAY, Level.WIREKIT

SPEC = "specs/mip.md"
FORMAT = f"{SPEC}#messages"
ERRORS = f"{SPEC}#error-codes"
VALIDATES = f"{SPEC}#how-wirekit-validates-both-implementations-in-this-order"
CONNECTIONS = f"{SPEC}#server-connections"
DISCREPANCIES = f"{SPEC}#discrepancies-in-the-sources"

#: the largest batch_size the header can carry
MAX_BATCH = 0xFFFF
PING = mip.encode(Ping(False))


def _png() -> bytes:
    """A valid 1x1 PNG file (an IMAGE item is an encoded image file)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xc8\x0a\x1e")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


PNG = _png()


@dataclass
class MipServerTarget:
    """The server under test: its address and what the suite may ask of it."""

    address: str
    max_batch: int = MAX_BATCH
    #: the target's :class:`~wirekit.conform.core.target.TargetLifecycle` (--target-cmd)
    lifecycle: Any = None
    #: every case opens its own connections: one that timed out may run again
    repeatable_cases = True

    def __str__(self) -> str:
        return self.address

    def connect(self, deadline: Deadline) -> MipStream:
        return MipStream(self.address, deadline)

    def unreachable(self, seconds: float) -> str | None:
        """Why nothing takes a connection at the address (None: something does)."""
        return refused_connection(self.address, seconds)

    def is_serving(self, deadline: Deadline) -> bool:
        """Whether the server answers a ping on a new connection (the runner's check)."""
        try:
            still_serving(self, deadline, "the last case")
        except Failed:
            return False
        return True


class MipStream(Stream):
    """A connection to the server that reads MIP messages with wirekit's decoder."""

    def __init__(self, address: str, deadline: Deadline) -> None:
        super().__init__(address, deadline)
        self.decoder = mip.Decoder(max_items=MAX_BATCH * 255)

    def read_message(self, waiting_for: str) -> Message:
        """The next whole message the server sends; a malformed one, a close or silence
        past the deadline is a :class:`Failed` (expected ``waiting_for``)."""
        while True:
            try:
                msg = self.decoder.next_message()
            except DecodeError as exc:
                raise Failed(waiting_for, f"a malformed reply: {exc}", self.received) from None
            if msg is not None:
                return msg
            data = self.recv(waiting_for)
            if data:
                self.decoder.feed(data)
            else:
                got = "the connection closed" + (
                    f" after {len(self.received)} bytes" if self.received else " without a reply"
                )
                raise Failed(waiting_for, got, self.received)

    def expect(self, expected: Message) -> None:
        """Read one message; it must be ``expected`` (a response's ``n_input`` is not
        compared: the spec leaves it free)."""
        want = describe(expected)
        got = self.read_message(want)
        if _key(got) != _key(expected):
            raise Failed(want, describe(got) + internal_hint(expected, got), self.received)


#: what an INTERNAL answer to a plain echo most likely means (the conformance model only
#: returns its inputs, so the model itself had nothing to fail on)
ECHO_INTERNAL_HINT = (
    "; hint: the model only echoes its inputs, so the server likely failed to encode them "
    "as outputs (KubeMo 0.0.dev2: the Dynamic inputs it gives a model have no .kind, as "
    "Dynamic.__init__ skips Serial.__init__; return Text/Json/Image outputs)"
)


def internal_hint(expected: Message, got: Message) -> str:
    """:data:`ECHO_INTERNAL_HINT` when ``got`` is INTERNAL where ``expected`` is the echo of
    a non-empty batch of TEXT, JSON and IMAGE items (the model cannot have failed on it);
    else nothing."""
    plain = (ItemType.TEXT, ItemType.JSON, ItemType.IMAGE)
    if (
        isinstance(got, ErrorReply)
        and got.code == ErrorCode.INTERNAL
        and isinstance(expected, Inference)
        and expected.response
        and expected.items
        and all(item.type in plain for item in expected.items)
    ):
        return ECHO_INTERNAL_HINT
    return ""


def _key(msg: Message) -> object:
    if isinstance(msg, Inference):
        items = tuple((int(i.type), bytes(i.data)) for i in msg.items)
        width = msg.n_output if msg.response else msg.n_input
        return ("inference", msg.response, width, msg.batch_size, items)
    return msg


def describe(msg: Message) -> str:
    """A message in a few words (the report's expected/got)."""
    if isinstance(msg, Ping):
        return "a pong" if msg.response else "a ping request"
    if isinstance(msg, ErrorReply):
        try:
            return f"error {ErrorCode(msg.code).name}"
        except ValueError:
            return f"error code {msg.code}"
    shown = ", ".join(_describe_item(i) for i in msg.items[:3])
    more = f", ... ({len(msg.items)} items)" if len(msg.items) > 3 else ""
    if msg.response:
        return (
            f"an inference response: batch_size {msg.batch_size}, n_output {msg.n_output}, "
            f"items [{shown}{more}]"
        )
    return f"an inference request: batch_size {msg.batch_size}, n_input {msg.n_input}"


def _describe_item(item: Item) -> str:
    data = bytes(item.data)
    if item.type in (ItemType.TEXT, ItemType.JSON) and len(data) <= 24:
        return f"{item.type_name} {data.decode('utf-8', 'replace')!r}"
    return f"{item.type_name} {len(data)} bytes"


def echo_of(request: Inference) -> Inference:
    """The conformance model's answer to ``request``."""
    outputs = []
    for sample in request.samples:
        first = sample[0] if sample else None
        if first is not None and first.type == ItemType.TEXT and bytes(first.data) == FIRST_ONLY:
            outputs.append(sample[:1])
        else:
            outputs.append(sample)
    if not outputs:
        return Inference(True, 0, request.n_input, 0, ())
    return Inference.reply(outputs, n_input=request.n_input)


def request_of(samples: Sequence[Sequence[Item]]) -> Inference:
    return Inference.request([list(s) for s in samples])


def exchange(target: MipServerTarget, deadline: Deadline, request: Inference) -> None:
    """Send ``request`` on a new connection; the answer must be the model's."""
    with target.connect(deadline) as conn:
        conn.send(mip.encode(request))
        conn.expect(echo_of(request))


def still_serving(target: MipServerTarget, deadline: Deadline, after: str) -> None:
    """A ping on a new connection must be answered (the server survived ``after``)."""
    try:
        with target.connect(deadline) as conn:
            conn.send(PING)
            conn.expect(Ping(True))
    except Failed as exc:
        raise Failed(f"a pong on a new connection after {after}", exc.got, exc.received) from None


def error_case(target: MipServerTarget, deadline: Deadline, wire: bytes, code: ErrorCode) -> None:
    """Send ``wire``; the server must answer the error ``code``, then serve on."""
    with target.connect(deadline) as conn:
        conn.send(wire)
        conn.expect(ErrorReply(int(code)))
    still_serving(target, deadline, f"an error {code.name}")


def header(version: int, kind: int, subtype: int, reserved: int, remaining: int) -> bytes:
    return struct.pack(">BBBBI", version, kind, subtype, reserved, remaining)


# --------------------------------------------------------------------------- cases

TEXT_SAMPLE = [Item.text("conformance")]


@SUITE.case(
    "ping", FORMAT, MUST, send="a ping (kind 1, subtype 0)", expect="a pong (kind 1, subtype 1)"
)
def ping(target: MipServerTarget, deadline: Deadline) -> None:
    with target.connect(deadline) as conn:
        conn.send(PING)
        conn.expect(Ping(True))


@SUITE.case("infer.text", FORMAT, MUST, send="one sample, one TEXT item", expect="the item echoed")
def infer_text(target: MipServerTarget, deadline: Deadline) -> None:
    exchange(target, deadline, request_of([[Item.text("hello, MIP")]]))


@SUITE.case("infer.json", FORMAT, MUST, send="one sample, one JSON item", expect="the item echoed")
def infer_json(target: MipServerTarget, deadline: Deadline) -> None:
    exchange(target, deadline, request_of([[Item.json({"conform": [1, 2.5, None]})]]))


@SUITE.case(
    "infer.image", FORMAT, MUST, send="one sample, one IMAGE item (a PNG)", expect="the item echoed"
)
def infer_image(target: MipServerTarget, deadline: Deadline) -> None:
    exchange(target, deadline, request_of([[Item.image(PNG)]]))


@SUITE.case(
    "infer.other-type",
    FORMAT,
    WIREKIT,
    send="an item of type 7",
    expect="the item echoed (any type passes through)",
)
def infer_other_type(target: MipServerTarget, deadline: Deadline) -> None:
    exchange(target, deadline, request_of([[Item(7, b"\x00\x01opaque")]]))


@SUITE.case("batch.one", FORMAT, MUST, send="batch_size 1", expect="batch_size 1 echoed")
def batch_one(target: MipServerTarget, deadline: Deadline) -> None:
    exchange(target, deadline, request_of([TEXT_SAMPLE]))


@SUITE.case(
    "batch.many",
    FORMAT,
    MUST,
    send="batch_size 64, TEXT/JSON/IMAGE samples",
    expect="every sample echoed in order",
)
def batch_many(target: MipServerTarget, deadline: Deadline) -> None:
    samples = [[Item.text(f"s{k}")] if k % 3 == 0 else [Item.json({"k": k})] if k % 3 == 1
               else [Item.image(PNG)] for k in range(64)]  # fmt: skip
    exchange(target, deadline, request_of(samples))


@SUITE.case(
    "batch.max",
    FORMAT,
    MUST,
    send="batch_size 65535 (the largest the header holds; --max-batch)",
    expect="every sample echoed in order",
    timeout=20.0,
)
def batch_max(target: MipServerTarget, deadline: Deadline) -> None:
    exchange(target, deadline, request_of([[Item.text(f"{k}")] for k in range(target.max_batch)]))


@SUITE.case(
    "batch.empty",
    FORMAT,
    SHOULD,
    send="batch_size 0, no items",
    expect="a response with batch_size 0",
)
def batch_empty(target: MipServerTarget, deadline: Deadline) -> None:
    with target.connect(deadline) as conn:
        conn.send(mip.encode(Inference(False, 1, 0, 0, ())))
        msg = conn.read_message("a response with batch_size 0")
        if not (isinstance(msg, Inference) and msg.response and msg.batch_size == 0):
            raise Failed("a response with batch_size 0", describe(msg), conn.received)


@SUITE.case(
    "shape.n-input",
    FORMAT,
    MUST,
    send="4 samples of 3 inputs (TEXT, JSON, IMAGE)",
    expect="n_output 3, 12 items echoed sample-major",
)
def shape_n_input(target: MipServerTarget, deadline: Deadline) -> None:
    samples = [[Item.text(f"t{k}"), Item.json([k]), Item.image(PNG)] for k in range(4)]
    exchange(target, deadline, request_of(samples))


@SUITE.case(
    "shape.n-output",
    FORMAT,
    MUST,
    send="1 sample of 3 inputs; the model answers 1 output (conform:first)",
    expect="n_output 1 and 1 item (n_output counts the model's outputs, not the inputs)",
)
def shape_n_output(target: MipServerTarget, deadline: Deadline) -> None:
    sample = [Item(ItemType.TEXT, FIRST_ONLY), Item.json(0), Item.text("x")]
    exchange(target, deadline, request_of([sample]))


@SUITE.case(
    "shape.n-output-batch",
    FORMAT,
    MUST,
    send="3 samples of 3 inputs; the model answers 1 output each (conform:first)",
    expect="n_output 1 and 3 items",
)
def shape_n_output_batch(target: MipServerTarget, deadline: Deadline) -> None:
    samples = [[Item(ItemType.TEXT, FIRST_ONLY), Item.json(k), Item.text("x")] for k in range(3)]
    exchange(target, deadline, request_of(samples))


@SUITE.case(
    "error.protocol",
    ERRORS,
    MUST,
    send="a ping with version 1",
    expect="error PROTOCOL; a new connection still served",
)
def error_protocol(target: MipServerTarget, deadline: Deadline) -> None:
    error_case(target, deadline, header(1, 1, 0, 0, 0), ErrorCode.PROTOCOL)


@SUITE.case(
    "error.subtype",
    ERRORS,
    MUST,
    send="a pong (ping subtype 1: a response sent to the server)",
    expect="error SUBTYPE; a new connection still served",
)
def error_subtype(target: MipServerTarget, deadline: Deadline) -> None:
    error_case(target, deadline, header(0, 1, 1, 0, 0), ErrorCode.SUBTYPE)


@SUITE.case(
    "error.subtype-unknown",
    ERRORS,
    MUST,
    send="an inference with subtype 7",
    expect="error SUBTYPE; a new connection still served",
)
def error_subtype_unknown(target: MipServerTarget, deadline: Deadline) -> None:
    wire = bytearray(mip.encode(request_of([TEXT_SAMPLE])))
    wire[2] = 7
    error_case(target, deadline, bytes(wire), ErrorCode.SUBTYPE)


@SUITE.case(
    "error.method",
    ERRORS,
    MUST,
    send="kind 3, subtype 0, no payload",
    expect="error METHOD; a new connection still served",
)
def error_method(target: MipServerTarget, deadline: Deadline) -> None:
    error_case(target, deadline, header(0, 3, 0, 0, 0), ErrorCode.METHOD)


@SUITE.case(
    "error.method-error-kind",
    ERRORS,
    MUST,
    send="kind 0 (error) as a request, subtype 0",
    expect="error METHOD; a new connection still served",
)
def error_method_error_kind(target: MipServerTarget, deadline: Deadline) -> None:
    error_case(target, deadline, header(0, 0, 0, 0, 0), ErrorCode.METHOD)


@SUITE.case(
    "error.memory",
    ERRORS,
    SHOULD,
    send="an inference header announcing 4 GiB (remaining 0xfffffff0), then nothing",
    expect="error MEMORY from the header alone; a new connection still served",
)
def error_memory(target: MipServerTarget, deadline: Deadline) -> None:
    error_case(target, deadline, header(0, 2, 0, 0, 0xFFFFFFF0), ErrorCode.MEMORY)


@SUITE.case(
    "error.shape",
    ERRORS,
    WIREKIT,
    send="an inference whose item announces 100 data bytes past the end of remaining",
    expect="error SHAPE, wirekit's answer to a payload that does not match its header "
    "(KubeMo's text: remaining is the payload's size; it names no error for this); a new "
    "connection still served",
)
def error_shape(target: MipServerTarget, deadline: Deadline) -> None:
    payload = struct.pack(">BBH", 1, 0, 1) + struct.pack(">II", ItemType.TEXT, 100)
    error_case(target, deadline, header(0, 2, 0, 0, len(payload)) + payload, ErrorCode.SHAPE)


@SUITE.case(
    "error.shape-trailing",
    ERRORS,
    WIREKIT,
    send="an inference with 3 bytes left after its last item (within remaining)",
    expect="error SHAPE, wirekit's answer to a payload that does not match its header "
    "(KubeMo reads the items its header announces and ignores the rest); a new connection "
    "still served",
)
def error_shape_trailing(target: MipServerTarget, deadline: Deadline) -> None:
    wire = mip.encode(request_of([TEXT_SAMPLE])) + b"xyz"
    wire = header(0, 2, 0, 0, len(wire) - 8) + wire[8:]
    error_case(target, deadline, wire, ErrorCode.SHAPE)


@SUITE.case(
    "error.internal",
    ERRORS,
    MUST,
    send="a sample whose first input is TEXT conform:fail (the model fails)",
    expect="error INTERNAL; a new connection still served",
)
def error_internal(target: MipServerTarget, deadline: Deadline) -> None:
    error_case(
        target, deadline, mip.encode(request_of([[Item(ItemType.TEXT, FAIL)]])), ErrorCode.INTERNAL
    )


@SUITE.case(
    "reserved.request",
    VALIDATES,
    WIREKIT,
    send="a ping with reserved byte 1",
    expect="error PROTOCOL (a future use of the byte is noticed)",
)
def reserved_request(target: MipServerTarget, deadline: Deadline) -> None:
    error_case(target, deadline, header(0, 1, 0, 1, 0), ErrorCode.PROTOCOL)


@SUITE.case(
    "stream.byte-by-byte",
    CONNECTIONS,
    MUST,
    send="an inference request written one byte per TCP segment",
    expect="the answer once the last byte is in",
)
def stream_byte_by_byte(target: MipServerTarget, deadline: Deadline) -> None:
    request = request_of([[Item.text("split"), Item.json({"a": 1})]])
    with target.connect(deadline) as conn:
        conn.send_bytewise(mip.encode(request))
        conn.expect(echo_of(request))


@SUITE.case(
    "stream.one-write",
    CONNECTIONS,
    SHOULD,
    send="a ping, an inference and a ping in one write",
    expect="a pong, the answer and a pong, in order",
)
def stream_one_write(target: MipServerTarget, deadline: Deadline) -> None:
    request = request_of([[Item.text("between pings")]])
    with target.connect(deadline) as conn:
        conn.send(PING + mip.encode(request) + PING)
        conn.expect(Ping(True))
        conn.expect(echo_of(request))
        conn.expect(Ping(True))


@SUITE.case(
    "stream.pipelining",
    CONNECTIONS,
    MAY,
    send="16 requests written without waiting for answers",
    expect="16 answers in request order",
)
def stream_pipelining(target: MipServerTarget, deadline: Deadline) -> None:
    requests = [request_of([[Item.text(f"pipelined {k}")]] * (1 + k % 3)) for k in range(16)]
    with target.connect(deadline) as conn:
        for request in requests:
            conn.send(mip.encode(request))
        for request in requests:
            conn.expect(echo_of(request))


@SUITE.case(
    "connection.reuse",
    CONNECTIONS,
    SHOULD,
    send="a request, its answer awaited, then a second request on the same connection",
    expect="both answered on that connection",
)
def connection_reuse(target: MipServerTarget, deadline: Deadline) -> None:
    with target.connect(deadline) as conn:
        for k in range(2):
            request = request_of([[Item.text(f"reuse {k}")]])
            conn.send(mip.encode(request))
            conn.expect(echo_of(request))


@SUITE.case(
    "connection.concurrent",
    CONNECTIONS,
    WIREKIT,
    send="a ping on a second connection while a first one is open and idle",
    expect="a pong on the second connection",
)
def connection_concurrent(target: MipServerTarget, deadline: Deadline) -> None:
    with target.connect(deadline):
        still_serving(target, deadline, "another connection opened and left idle")


@SUITE.case(
    "connection.abandoned",
    CONNECTIONS,
    MUST,
    send="half an inference request, then close",
    expect="a new connection still served",
)
def connection_abandoned(target: MipServerTarget, deadline: Deadline) -> None:
    wire = mip.encode(request_of([[Item.text("never finished")]]))
    with target.connect(deadline) as conn:
        conn.send(wire[: len(wire) // 2])
        time.sleep(0.05)  # let the server read the half before the close
    still_serving(target, deadline, "a client closed mid-request")


#: connections opened at once by connection.backlog (KubeMo's listen(1) lets 2 in)
CONNECTORS = 6
#: the extra wait that marks a stalled connect: a dropped SYN is sent again after ~1 s
STALL = 0.9
_BASELINE_CONNECTS = 3


@dataclass
class _Connector:
    """One of the connections opened at once: when its connect completed, and whether its
    SYN had to be sent again (Linux ``TCP_INFO``; None where that cannot be read)."""

    sock: socket.socket
    connected: float | None = None
    syn_resent: bool | None = None
    pong: bool = False
    decoder: mip.Decoder = field(default_factory=mip.Decoder)


def _syn_resent(sock: socket.socket) -> bool | None:
    """Whether this TCP socket retransmitted a segment (before it carried data: its SYN),
    from Linux's ``struct tcp_info`` (``tcpi_total_retrans`` at byte 100); None elsewhere."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, 104)
    except OSError:
        return None
    return struct.unpack_from("=I", info, 100)[0] > 0 if len(info) >= 104 else None


def _connect_time(family: int, target: tuple, deadline: Deadline) -> float:
    """A single connect's time (then a ping answered and the connection closed)."""
    start = time.monotonic()
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(deadline.remaining())
        try:
            sock.connect(target)
        except OSError as exc:
            raise Failed("a single connection first", f"connect failed: {exc}") from None
        took = time.monotonic() - start
        sock.sendall(PING)
        decoder = mip.Decoder()
        while (msg := decoder.next_message()) is None:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                raise Failed("a pong on a single connection", "no pong (the connection closed)")
            decoder.feed(data)
        if msg != Ping(True):
            raise Failed("a pong on a single connection", describe(msg))
    return took


def _connect_at_once(
    family: int, target: tuple, deadline: Deadline
) -> tuple[list[_Connector], float]:
    """:data:`CONNECTORS` non-blocking connects started back to back; each sends a ping once
    connected and reads its pong.  Returns when each got its pong or was closed, or at the
    deadline: the connectors and the seconds that took."""
    connectors: list[_Connector] = []
    with selectors.DefaultSelector() as selector, contextlib.ExitStack() as stack:
        start = time.monotonic()
        for _ in range(CONNECTORS):
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sock.setblocking(False)
            connector = _Connector(sock)
            connectors.append(connector)
            error = sock.connect_ex(target)
            if error not in (0, errno.EINPROGRESS, errno.EAGAIN):
                raise Failed("connections to the server", f"connect failed: {os.strerror(error)}")
            selector.register(sock, selectors.EVENT_WRITE, connector)
        while not deadline.passed and selector.get_map():
            for key, _ in selector.select(min(deadline.remaining(), 0.05)):
                connector = key.data
                if connector.connected is None:
                    connector.connected = time.monotonic() - start
                    connector.syn_resent = _syn_resent(connector.sock)
                    error = connector.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if error:
                        raise Failed("connections to the server", os.strerror(error))
                    with contextlib.suppress(OSError):
                        connector.sock.send(PING)
                    selector.modify(connector.sock, selectors.EVENT_READ, connector)
                    continue
                try:
                    data = connector.sock.recv(65536)
                except OSError:
                    data = b""
                connector.decoder.feed(data)
                with contextlib.suppress(DecodeError):
                    connector.pong = connector.decoder.next_message() == Ping(True)
                if connector.pong or not data:
                    selector.unregister(connector.sock)
        for connector in connectors:
            if connector.connected is None:
                connector.syn_resent = _syn_resent(connector.sock)
        return connectors, time.monotonic() - start


def _span(seconds: list[float]) -> str:
    low, high = f"{min(seconds):.2f}", f"{max(seconds):.2f}"
    return f"{low} s" if low == high else f"{low}-{high} s"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


@SUITE.case(
    "connection.backlog",
    CONNECTIONS,
    SHOULD,
    send=f"{CONNECTORS} TCP connections opened at once, each sending a ping once connected "
    "(after 3 single connects: the baseline)",
    expect="every connect as quick as the baseline (no ~1 s stall of a SYN sent again: a "
    "listen backlog too small for them); a pong on each",
    timeout=6.0,
)
def connection_backlog(target: MipServerTarget, deadline: Deadline) -> None:
    from wirekit.mip.runtime import parse_address

    network, address = parse_address(target.address)
    if network != "tcp":
        raise Skipped("TCP only: it measures connects that wait for a SYN sent again")
    assert isinstance(address, tuple)
    family, _, _, _, sockaddr = socket.getaddrinfo(*address, type=socket.SOCK_STREAM)[0]
    singles = sorted(_connect_time(family, sockaddr, deadline) for _ in range(_BASELINE_CONNECTS))
    baseline = singles[len(singles) // 2]
    connectors, waited = _connect_at_once(family, sockaddr, deadline)
    times = [c.connected if c.connected is not None else waited for c in connectors]
    # A stall is a connect that took a SYN retransmission longer than the baseline and
    # whose SYN was sent again (the kernel says so; where it cannot, one that took that
    # much longer than the quickest of the burst): a slow machine slows every connect
    # alike and, on loopback, sends no SYN twice.
    fastest = min(times)
    stalled = [
        t for t, c in zip(times, connectors, strict=True)
        if t >= baseline + STALL
        and (c.syn_resent if c.syn_resent is not None else t >= fastest + STALL)
    ]  # fmt: skip
    expected = f"{CONNECTORS} connects as quick as a single one ({_ms(baseline)})"
    if stalled:
        quick = [t for t in times if t not in stalled]
        unconnected = sum(c.connected is None for c in connectors)
        got = (
            f"connects stalled: {len(stalled)} of {CONNECTORS} took {_span(stalled)}"
            + (f" ({unconnected} not connected by then)" if unconnected else "")
            + ", waiting for their SYN to be sent again (the listen backlog is too small for "
            f"{CONNECTORS} connections at once)"
            + (f"; the other {len(quick)} took at most {_ms(max(quick))}" if quick else "")
        )
        raise Failed(expected, got)
    answered = sum(c.pong for c in connectors)
    if answered < CONNECTORS:
        raise Failed(
            f"a pong on each of the {CONNECTORS} connections",
            f"{answered} pongs within {deadline.seconds:g} s",
        )


@SUITE.case(
    "lifecycle.restart",
    CONNECTIONS,
    WIREKIT,
    send="a request answered on a connection left open; the server stopped and started "
    "again on the same address (--target-cmd or --restart-cmd)",
    expect="the server serves again on its port (a port with connections in TIME_WAIT can "
    "be bound again: SO_REUSEADDR)",
    timeout=60.0,
    may_end_target=True,
)
def lifecycle_restart(target: MipServerTarget, deadline: Deadline) -> None:
    from ..core.runner import serves

    lifecycle = target.lifecycle
    if lifecycle is None:
        raise Skipped("needs --target-cmd (or --restart-cmd): conform stops and starts the server")
    request = request_of([[Item.text("before the restart")]])
    with target.connect(deadline) as conn:
        conn.send(mip.encode(request))
        conn.expect(echo_of(request))
        if lifecycle.owns_process:
            lifecycle.stop()  # its side of the open connection closes first: TIME_WAIT
            conn.closed_by_peer(1.0)
    problem = None
    if lifecycle.owns_process:
        lifecycle.start()
    else:
        problem = lifecycle.restart()
    want = f"the server serving again on {target.address} after a restart"
    if problem is not None:
        raise Failed(want, problem)
    seconds = min(lifecycle.start_timeout, deadline.remaining())
    if serves(target, lifecycle, seconds) is None:
        ended = lifecycle.describe_exit()  # " (it exited 1: ... Address already in use)"
        raise Failed(
            want, f"it did not serve again{ended}" if ended else f"no pong in {seconds:g} s"
        )


# --------------------------------------------------------------------------- the command


def add_arguments(options: SuiteOptions) -> None:
    """TARGET is the server's MIP address; ``--max-batch``."""
    options.target(mip_address, note="a MIP server also unix:///PATH")
    options.add_argument(
        "--max-batch",
        type=int,
        default=MAX_BATCH,
        metavar="N",
        help="the batch_size of case batch.max (default 65535, the header's largest)",
    )


def check_arguments(args: argparse.Namespace) -> str | None:
    """A usage error in ``args``, or None."""
    from wirekit.mip.runtime import parse_address

    if not args.target:
        return "mip server: give the server's address: tcp://HOST:PORT or unix:///PATH"
    try:
        parse_address(args.target)
    except ValueError as exc:
        return f"mip server: {exc}"
    if not 1 <= args.max_batch <= MAX_BATCH:
        return f"--max-batch must be 1..{MAX_BATCH}"
    return None


@contextlib.contextmanager
def open_target(args: argparse.Namespace) -> Iterator[MipServerTarget]:
    yield MipServerTarget(args.target, args.max_batch)
