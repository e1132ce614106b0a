"""``wirekit conform mip client``: wirekit plays a MIP server for a client under test.

wirekit listens on ``--listen``; the client under test runs a driver
(:mod:`wirekit.conform.drivers`) that connects there, pings, then asks ``conform:next``
until told ``conform:done``, reporting after each call what its client made of the
answer.  Each case answers one ``conform:next`` its own way (a normal reply, each error
kind, a reply split byte by byte, a malformed one, a closed connection...) and judges the
report; the last cases judge what the client sent all along.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from wirekit import mip
from wirekit.errors import DecodeError
from wirekit.mip import ErrorCode, ErrorReply, Inference, Item, ItemType, Message, Ping

from ..core.cases import Case, Failed, Level, NothingConnected, Skipped, Suite
from ..core.net import Deadline
from ..core.options import SuiteOptions, add_connect_timeout, add_listen
from ..drivers import (
    DONE,
    JSON_VALUE,
    NEXT,
    OUTCOME,
    REUSE,
    STEP_EMPTY,
    STEP_REUSE,
    TYPES,
    image,
)

SUITE = Suite("mip", "client", "MIP client", always=("ping", "request.item-types"))
#: the command prints the address it listens on (the peer under test connects to it)
LISTENS = True
MUST, SHOULD, WIREKIT = Level.MUST, Level.SHOULD, Level.WIREKIT

SPEC = "specs/mip.md"
FORMAT = f"{SPEC}#messages"
ERRORS = f"{SPEC}#error-codes"
VALIDATES = f"{SPEC}#how-wirekit-validates-both-implementations-in-this-order"
CONNECTIONS = f"{SPEC}#server-connections"
CONFORMANCE = "specs/conformance.md"
_CLOSE_ATTEMPTS = 3  # a client that retries a request the server closed on: closed again


@dataclass
class Exchange:
    """One message the client sent, on its connection."""

    conn: ClientConnection
    message: Message

    @property
    def texts(self) -> list[str]:
        if not isinstance(self.message, Inference) or self.message.response:
            return []
        return [
            bytes(i.data).decode("utf-8", "replace")
            for i in self.message.items
            if i.type == ItemType.TEXT
        ]

    def reply(self, message: Message) -> None:
        self.conn.write(mip.encode(message))


@dataclass(eq=False)
class ClientConnection:
    """One connection from the client: read on its own thread, written by the cases."""

    sock: socket.socket
    harness: MipClientHarness
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, data: bytes) -> None:
        with self.lock, contextlib.suppress(OSError):
            self.sock.sendall(data)

    def write_bytewise(self, data: bytes) -> None:
        for k in range(len(data)):
            self.write(data[k : k + 1])
            time.sleep(0.001)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def read_loop(self) -> None:
        decoder = mip.Decoder()
        with contextlib.suppress(OSError):
            while True:
                try:
                    msg = decoder.next_message()
                except DecodeError as exc:
                    self.harness.malformed.append(str(exc))
                    if decoder.broken:
                        break
                    continue
                if msg is not None:
                    self.harness.sent.append(msg)
                    self.harness.incoming.put(Exchange(self, msg))
                    continue
                data = self.sock.recv(65536)
                if not data:
                    break
                self.harness.received += data
                decoder.feed(data)
        self.harness.incoming.put(None)  # a connection ended (wakes a waiting case)


class MipClientHarness:
    """The listening side: connections accepted on a thread, their messages queued."""

    def __init__(self, address: str, connect_timeout: float = 30.0) -> None:
        from wirekit.mip.runtime import parse_address

        family, target = parse_address(address)
        if family != "tcp":
            raise OSError("mip client: --listen takes tcp://HOST:PORT")
        assert isinstance(target, tuple)
        self.listener = socket.create_server(target)
        self.address = "tcp://{}:{}".format(*self.listener.getsockname()[:2])
        self.incoming: queue.Queue[Exchange | None] = queue.Queue()
        self.connections: list[ClientConnection] = []
        self.sent: list[Message] = []  #: every well-formed message the client sent
        self.malformed: list[str] = []  #: the errors of the malformed ones
        self.received = bytearray()  #: every byte the client sent
        self.connect_timeout = connect_timeout
        self.connected = threading.Event()  #: set when the first connection came
        self._stop = False
        self._threads = [threading.Thread(target=self._accept, daemon=True, name="conform-accept")]
        self._threads[0].start()

    def __str__(self) -> str:
        return f"{self.address} (run the client's driver against it)"

    def _accept(self) -> None:
        while not self._stop:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            conn = ClientConnection(sock, self)
            self.connections.append(conn)
            self.connected.set()
            reader = threading.Thread(target=conn.read_loop, daemon=True, name="conform-read")
            self._threads.append(reader)
            reader.start()

    def timeout_for(self, case: Case, seconds: float) -> float:
        """The first case waits ``connect_timeout`` for the client, then as any case."""
        return self.connect_timeout + seconds if case.id == "ping" else seconds

    def wait_client(self) -> None:
        """Return once a client connected; :class:`NothingConnected` after
        ``connect_timeout`` without one."""
        if not self.connected.wait(self.connect_timeout):
            raise NothingConnected(
                f"nothing connected to {self.address} within {self.connect_timeout:g} s "
                "(--connect-timeout): no case was run"
            )

    def next_exchange(self, deadline: Deadline, waiting_for: str) -> Exchange:
        """The client's next message (connections that end are skipped)."""
        while True:
            try:
                item = self.incoming.get(timeout=deadline.remaining())
            except queue.Empty:
                raise Failed(
                    waiting_for, f"nothing from the client within {deadline.seconds:g} s"
                ) from None
            if item is not None:
                return item

    def next_request(self, deadline: Deadline) -> Exchange:
        """The driver's next ``conform:next`` request."""
        exchange = self.next_exchange(deadline, f"the driver's {NEXT} request")
        if exchange.texts != [NEXT]:
            raise Failed(f"a {NEXT} request", describe(exchange.message))
        return exchange

    def outcome(self, deadline: Deadline) -> str:
        """The driver's report of what the client made of the last answer."""
        exchange = self.next_exchange(deadline, "the driver's outcome report")
        texts = exchange.texts
        if len(texts) != 2 or texts[0] != OUTCOME:
            raise Failed("the driver's outcome report", describe(exchange.message))
        exchange.reply(echo(exchange.message))
        return texts[1]

    def finish(self, seconds: float) -> None:
        """Tell the driver the cases are over (its next ``conform:next`` gets ``DONE``)."""
        with contextlib.suppress(Failed):
            exchange = self.next_exchange(Deadline(seconds), "the last request")
            if exchange.texts == [NEXT]:
                exchange.reply(Inference.reply([[Item.text(DONE)]], n_input=1))

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):  # wakes the accepting thread
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for conn in self.connections:
            conn.close()
        for thread in self._threads:
            thread.join(2.0)


def echo(message: Message) -> Message:
    assert isinstance(message, Inference)
    return Inference.reply(message.samples, n_input=message.n_input)


def describe(message: Message) -> str:
    from .mip_server import describe as describe_message

    return describe_message(message)


def answer_text(case_id: str) -> Inference:
    return Inference.reply([[Item.text(case_id)]], n_input=1)


def expect_outcome(harness: MipClientHarness, deadline: Deadline, want: str, expected: str) -> str:
    got = harness.outcome(deadline)
    if not got.startswith(want):
        raise Failed(expected, f"the client reported {got!r}", harness.received[-64:])
    return got


# --------------------------------------------------------------------------- cases


@SUITE.case(
    "ping",
    FORMAT,
    MUST,
    send="a pong to the driver's ping",
    expect="a well-formed ping (kind 1, subtype 0, no payload); the client reports ok",
)
def ping(harness: MipClientHarness, deadline: Deadline) -> None:
    harness.wait_client()
    exchange = harness.next_exchange(deadline, "a ping")
    if exchange.message != Ping(False):
        raise Failed("a ping request", describe(exchange.message))
    exchange.reply(Ping(True))
    expect_outcome(harness, deadline, "ok", "the client to report the pong (ok)")


@SUITE.case(
    "request.item-types",
    FORMAT,
    MUST,
    send="the answer echoing the driver's sample of a TEXT, a JSON and an IMAGE item",
    expect='one sample: TEXT "conform:types", JSON {"conform":[1,2]}, IMAGE (the PNG), as '
    "the client builds them",
)
def request_item_types(harness: MipClientHarness, deadline: Deadline) -> None:
    want = "the driver's TEXT, JSON and IMAGE sample"
    exchange = harness.next_exchange(deadline, want)
    msg = exchange.message
    if exchange.texts[:1] == [OUTCOME]:  # it could not send the sample: its report says why
        exchange.reply(echo(msg))
        raise Failed(want, f"no request; the client reported {exchange.texts[1]!r}")
    if not isinstance(msg, Inference) or msg.batch_size != 1 or msg.n_input != 3:
        raise Failed(want, describe(msg), harness.received[-64:])
    text, value, png = msg.items
    problems = []
    if (text.type, bytes(text.data)) != (ItemType.TEXT, TYPES.encode()):
        problems.append(f"item 0 is {text!r}")
    try:
        parsed = json.loads(bytes(value.data)) if value.type == ItemType.JSON else None
    except ValueError:
        parsed = None
    if parsed != JSON_VALUE:
        problems.append(f"item 1 is {value!r}")
    if (png.type, bytes(png.data)) != (ItemType.IMAGE, image()):
        problems.append(f"item 2 is {png!r}")
    exchange.reply(echo(msg))
    if problems:
        raise Failed(want, "; ".join(problems), harness.received[-64:])
    expect_outcome(harness, deadline, f"ok:{TYPES}", f"ok:{TYPES}")


@SUITE.case(
    "answer.echo",
    FORMAT,
    MUST,
    send="a normal response: one output, TEXT",
    expect="the client returns the output",
)
def answer_echo(harness: MipClientHarness, deadline: Deadline) -> None:
    harness.next_request(deadline).reply(answer_text("answer.echo"))
    expect_outcome(harness, deadline, "ok:answer.echo", "ok:answer.echo")


def _error_case(code: ErrorCode) -> None:
    name = code.name.lower()

    @SUITE.case(
        f"answer.error.{name}",
        ERRORS,
        MUST,
        send=f"the error reply {code.name} (kind 0, subtype {int(code)})",
        expect=f"the client raises error {int(code)} (and goes on)",
    )
    def answer_error(harness: MipClientHarness, deadline: Deadline) -> None:
        harness.next_request(deadline).reply(ErrorReply(int(code)))
        expect_outcome(harness, deadline, f"error:{int(code)}", f"error:{int(code)}")


for _code in ErrorCode:
    _error_case(_code)


@SUITE.case(
    "answer.byte-by-byte",
    CONNECTIONS,
    MUST,
    send="a normal response written one byte per TCP segment",
    expect="the client returns the output",
)
def answer_byte_by_byte(harness: MipClientHarness, deadline: Deadline) -> None:
    exchange = harness.next_request(deadline)
    exchange.conn.write_bytewise(mip.encode(answer_text("answer.byte-by-byte")))
    expect_outcome(harness, deadline, "ok:answer.byte-by-byte", "ok:answer.byte-by-byte")


@SUITE.case(
    "answer.slow",
    CONNECTIONS,
    MUST,
    send="a normal response after 1 s",
    expect="the client waits for it and returns the output",
)
def answer_slow(harness: MipClientHarness, deadline: Deadline) -> None:
    exchange = harness.next_request(deadline)
    time.sleep(1.0)
    exchange.reply(answer_text("answer.slow"))
    expect_outcome(harness, deadline, "ok:answer.slow", "ok:answer.slow")


@SUITE.case(
    "answer.bad-version",
    VALIDATES,
    MUST,
    send="a response with version 1",
    expect="the client fails the call (it does not take the reply)",
)
def answer_bad_version(harness: MipClientHarness, deadline: Deadline) -> None:
    wire = bytearray(mip.encode(answer_text("answer.bad-version")))
    wire[0] = 1
    harness.next_request(deadline).conn.write(bytes(wire))
    expect_outcome(harness, deadline, "failed", "failed (a reply of version 1 is refused)")


@SUITE.case(
    "answer.wrong-batch",
    FORMAT,
    SHOULD,
    send="a response of batch_size 2 to a request of 1 sample",
    expect="the client fails the call",
)
def answer_wrong_batch(harness: MipClientHarness, deadline: Deadline) -> None:
    reply = Inference.reply([[Item.text("one")], [Item.text("two")]], n_input=1)
    harness.next_request(deadline).reply(reply)
    expect_outcome(harness, deadline, "failed", "failed (the batch does not match)")


@SUITE.case(
    "answer.closed",
    CONNECTIONS,
    MUST,
    send="the connection closed without a reply (again on each retry)",
    expect="the client fails the call, it does not hang",
)
def answer_closed(harness: MipClientHarness, deadline: Deadline) -> None:
    harness.next_request(deadline).conn.close()
    for _ in range(_CLOSE_ATTEMPTS - 1):  # a retry of the same call: closed again
        exchange = harness.next_exchange(deadline, "the driver's outcome report")
        if exchange.texts != [NEXT]:
            texts = exchange.texts
            if len(texts) != 2 or texts[0] != OUTCOME:
                raise Failed("the driver's outcome report", describe(exchange.message))
            exchange.reply(echo(exchange.message))
            if not texts[1].startswith("failed"):
                raise Failed("failed (no reply came)", f"the client reported {texts[1]!r}")
            return
        exchange.conn.close()
    expect_outcome(harness, deadline, "failed", "failed (no reply came)")


@SUITE.case(
    "request.format",
    FORMAT,
    MUST,
    send="(everything the client sent so far)",
    expect="well-formed requests: version 0, reserved 0, subtype 0 (request)",
)
def request_format(harness: MipClientHarness, deadline: Deadline) -> None:
    if not harness.sent and not harness.malformed:  # nothing sent is nothing shown right
        raise Failed("well-formed requests", "the client sent nothing")
    if harness.malformed:
        raise Failed(
            "well-formed requests", f"malformed: {harness.malformed[0]}", harness.received[:64]
        )
    for msg in harness.sent:
        if (
            isinstance(msg, ErrorReply)
            or msg in (Ping(True),)
            or (isinstance(msg, Inference) and msg.response)
        ):
            raise Failed("requests only", describe(msg), harness.received[:64])


@SUITE.case(
    "connection.reuse",
    CONNECTIONS,
    SHOULD,
    send="(the connections the client opened)",
    expect="the client keeps a connection for several calls",
)
def connection_reuse(harness: MipClientHarness, deadline: Deadline) -> None:
    calls = len(harness.sent)
    if calls < 2:  # one call (or none) cannot show a connection kept
        raise Skipped(f"the client made {calls} call{'s' if calls != 1 else ''}: too few to judge")
    if len(harness.connections) >= calls:
        raise Failed(
            f"fewer connections than its {calls} calls", f"{len(harness.connections)} connections"
        )


# --------------------------------------------------------------------------- the steps


def run_step(
    harness: MipClientHarness, deadline: Deadline, step: str, reports: int
) -> tuple[list[Message], list[str]]:
    """Answer the driver's next ``conform:next`` with ``step`` and take what the driver sends
    for it until its ``reports`` outcome reports: each request answered (an echo; a batch of
    no samples with one of no samples).  Returns the requests and the reports."""
    harness.next_request(deadline).reply(answer_text(step))
    requests: list[Message] = []
    outcomes: list[str] = []
    while len(outcomes) < reports:
        exchange = harness.next_exchange(deadline, f"what the driver sends for {step}")
        texts = exchange.texts
        if len(texts) == 2 and texts[0] == OUTCOME:
            exchange.reply(echo(exchange.message))
            if texts[1] == f"ok:{step}":
                raise Failed(
                    f"the driver to do the step {step}",
                    f"the driver reported {texts[1]!r}: it does not know the step "
                    "(wirekit/conform/drivers.py, step 4)",
                )
            outcomes.append(texts[1])
            continue
        requests.append(exchange.message)
        exchange.reply(_step_answer(exchange.message))
    return requests, outcomes


def _step_answer(message: Message) -> Message:
    if isinstance(message, Ping):
        return Ping(True)
    if not isinstance(message, Inference) or message.response:
        return ErrorReply(int(ErrorCode.SUBTYPE))
    if message.batch_size == 0:
        return Inference(True, message.n_input, 0, 0, ())
    return echo(message)


def _inference_requests(messages: list[Message]) -> list[Inference]:
    return [m for m in messages if isinstance(m, Inference) and not m.response]


def _items(message: Inference) -> list[tuple[int, bytes]]:
    return [(int(i.type), bytes(i.data)) for i in message.items]


def _show_items(message: Inference) -> str:
    shown = []
    for item in message.items:
        data = bytes(item.data)
        text = data[:32].decode("utf-8", "replace") if item.type != ItemType.IMAGE else "..."
        shown.append(f"{item.type_name} {text!r} ({len(data)} bytes)")
    return ", ".join(shown) or "no items"


def _reported(reports: list[str]) -> str:
    return "the client reported " + ", ".join(repr(r) for r in reports)


@SUITE.case(
    "request.item-reuse",
    f"{CONFORMANCE}#mip-client-cases",
    WIREKIT,
    send=f"the step {STEP_REUSE}: the driver builds the sample [TEXT {REUSE!r}] once and "
    "sends that same built sample twice (each answered with its echo)",
    expect="the second request carries the same input as the first (a built item is read, "
    f"not used up); both calls ok:{REUSE}",
)
def request_item_reuse(harness: MipClientHarness, deadline: Deadline) -> None:
    requests, reports = run_step(harness, deadline, STEP_REUSE, 2)
    sent = _inference_requests(requests)
    want = [(int(ItemType.TEXT), REUSE.encode())]
    if len(sent) < 2:
        raise Failed(
            f"two requests of the sample [TEXT {REUSE!r}]",
            f"{len(sent)} request(s); {_reported(reports)}",
        )
    first, second = sent[:2]
    if _items(first) != want:
        raise Failed(
            f"the first request to carry [TEXT {REUSE!r}]",
            f"it carries {_show_items(first)}",
            mip.encode(first),
        )
    if _items(second) != want:
        used_up = all(not data for _, data in _items(second))
        raise Failed(
            f"the second request to carry the same input as the first: TEXT {REUSE!r}",
            f"it carries {_show_items(second)}"
            + (": the built item was used up by the first send" if used_up else ""),
            mip.encode(second),
        )
    if reports != [f"ok:{REUSE}"] * 2:
        raise Failed(f"ok:{REUSE} for both calls", _reported(reports))


@SUITE.case(
    "request.empty-batch",
    FORMAT,
    SHOULD,
    send=f"the step {STEP_EMPTY}: the driver sends a batch of no samples (answered with a "
    "response of batch_size 0)",
    expect="a well-formed request of batch_size 0 and no items; the client returns no "
    "samples (ok:0), it does not fail",
)
def request_empty_batch(harness: MipClientHarness, deadline: Deadline) -> None:
    requests, reports = run_step(harness, deadline, STEP_EMPTY, 1)
    sent = _inference_requests(requests)
    want = "a request of batch_size 0 and no items"
    if not sent:
        raise Failed(want, f"no request; {_reported(reports)}")
    if sent[0].batch_size != 0 or sent[0].items:
        raise Failed(want, describe(sent[0]), mip.encode(sent[0]))
    if reports != ["ok:0"]:
        raise Failed("ok:0 (the answer of batch_size 0 returned as no samples)", _reported(reports))


# --------------------------------------------------------------------------- the command


def add_arguments(options: SuiteOptions) -> None:
    """No TARGET: ``--listen``, where the client under test connects;
    ``--connect-timeout``."""
    add_listen(options)
    add_connect_timeout(options)


def check_arguments(args: argparse.Namespace) -> str | None:
    if args.target:
        return "mip client: give where to listen with --listen, not as TARGET"
    if not args.listen or not args.listen.startswith("tcp://"):
        return "mip client: give where to listen: --listen tcp://HOST:PORT"
    if args.connect_timeout <= 0:
        return "--connect-timeout must be positive"
    return None


@contextlib.contextmanager
def open_target(args: argparse.Namespace) -> Iterator[MipClientHarness]:
    harness = MipClientHarness(args.listen, args.connect_timeout)
    try:
        yield harness
        harness.finish(args.case_timeout)
    finally:
        harness.close()
