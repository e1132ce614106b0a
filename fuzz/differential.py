"""Differential fuzz targets: the compiled twin against the pure twin, one function per target.

Each target takes arbitrary bytes, turns them into a call of one decoder or kernel (the bytes
pick the arguments, the chunking of a stream, the shapes of a model), makes that call on the
Cython twin and on the pure twin (``wirekit._impl.twin``), and raises :class:`Disagreement`
unless both give the same value, or both raise the same wirekit error class with the same
text, field, offset (and code/frame).  Any other exception escapes: it is a crash.

This module needs no atheris: ``fuzz/fuzz.py`` drives it under libFuzzer, and
``tests/test_fuzz_regressions.py`` replays the saved inputs through the same checks in the
normal test suite.  Inputs are kept small (a few KiB) by the run scripts: the checks decode
each input several times.
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import os
import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from wirekit._impl import twin
from wirekit.errors import DecodeError, WirekitError


class Disagreement(AssertionError):
    """The two twins did not do the same thing for one input."""


#: Known defects whose fixes are pending: while a name is listed in ``WIREKIT_FUZZ_AVOID``
#: (comma-separated), the targets do not build inputs that reach it, so a campaign can look
#: for other problems.  Names: ``y2-many-layers`` (models of more than 512 layers),
#: ``y2-tied-views`` (one array in two slots of a model, as itself or as a view).
AVOID = frozenset(os.environ.get("WIREKIT_FUZZ_AVOID", "").replace(",", " ").split())


# --- reading the fuzzer's bytes --------------------------------------------------------------


class Reader:
    """Consume fuzzer bytes as small choices; past the end every read gives zeros."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def below(self, n: int) -> int:
        """An int in ``range(n)`` (from one or two bytes)."""
        value = self.byte() if n <= 256 else (self.byte() << 8) | self.byte()
        return value % n

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out

    def rest(self) -> bytes:
        return self.take(len(self.data))


def _chunks(data: bytes) -> tuple[list[Any], bytes]:
    """Split a stream target's input: ``p = data[0] % 16`` plan bytes, then the stream.

    Each plan byte gives one chunk (low 6 bits + 1 bytes) and the type it is fed as (top two
    bits: bytes, bytearray, memoryview, bytes); the plan repeats until the stream is used up.
    No plan bytes: the whole stream in one ``bytes`` chunk.
    """
    if not data:
        return [], b""
    p = data[0] % 16
    plan, stream = data[1 : 1 + p], data[1 + p :]
    if not plan:
        return [stream], stream
    out: list[Any] = []
    pos = k = 0
    while pos < len(stream):
        code = plan[k % len(plan)]
        k += 1
        chunk = stream[pos : pos + (code & 63) + 1]
        pos += len(chunk)
        kind = code >> 6
        out.append(bytearray(chunk) if kind == 1 else memoryview(chunk) if kind == 2 else chunk)
    return out, stream


# --- comparing outcomes ----------------------------------------------------------------------


def snapshot(value: Any) -> Any:
    """A comparable picture of a decoded value: types, dtypes, shapes and exact bytes."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, enum.Enum):
        return (type(value).__name__, value.value)
    if isinstance(value, int):
        return ("int", int(value))
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))  # NaN equals NaN, 0.0 differs from -0.0
    if isinstance(value, bytes | bytearray):
        return (type(value).__name__, bytes(value))
    if isinstance(value, memoryview):
        return ("memoryview", value.format, value.shape, value.tobytes())
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, np.generic):
        return ("np", value.dtype.str, value.tobytes())
    if dataclasses.is_dataclass(value):
        return (
            type(value).__name__,
            tuple(snapshot(getattr(value, f.name)) for f in dataclasses.fields(value)),
        )
    if isinstance(value, tuple | list):
        return (type(value).__name__, tuple(snapshot(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((snapshot(k), snapshot(v)) for k, v in value.items()))
    return (type(value).__name__, repr(value))


def describe(exc: BaseException) -> tuple:
    """Everything a wirekit error says (class, text and its structured fields)."""
    return (
        type(exc).__name__,
        str(exc),
        getattr(exc, "protocol", None),
        getattr(exc, "field", None),
        getattr(exc, "offset", None),
        getattr(exc, "code", None),
        getattr(exc, "frame", None),
    )


def outcome(call: Callable[[], Any], expected: tuple[type[BaseException], ...] = ()) -> tuple:
    """``("ok", snapshot of the result)`` or ``("error", describe(exc))`` for a wirekit error
    (or one of ``expected``); anything else propagates (a crash)."""
    try:
        return ("ok", snapshot(call()))
    except (WirekitError, *expected) as exc:
        return ("error", describe(exc))


def same(what: str, fast: Any, pure: Any) -> None:
    if fast != pure:
        raise Disagreement(f"{what}:\n  fast: {_short(fast)}\n  pure: {_short(pure)}")


def _short(value: Any, limit: int = 1500) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def both(protocol: str) -> tuple[Any, Any]:
    return twin(protocol, "fast"), twin(protocol, "pure")


def differential(what: str, protocol: str, call: Callable[[Any], Any], expected=()) -> tuple:
    """Run ``call(codec)`` on both twins and require the same outcome; return it."""
    fast, pure = both(protocol)
    a = outcome(lambda: call(fast), expected)
    b = outcome(lambda: call(pure), expected)
    same(what, a, b)
    return a


# --- MIP -------------------------------------------------------------------------------------


def mip_decode(data: bytes) -> None:
    """``decode``, ``decode_prefix`` (at 0 and at a chosen offset) and ``check_header``."""
    differential("mip.decode", "mip", lambda c: c.decode(data))
    differential("mip.decode(bytearray)", "mip", lambda c: c.decode(bytearray(data)))
    pos = data[0] % 16 if data else 0
    if pos <= len(data):
        differential("mip.decode_prefix", "mip", lambda c: c.decode_prefix(memoryview(data), pos))
    if len(data) >= 8:
        differential("mip.check_header", "mip", lambda c: c.check_header(data))


def _framed_events(decoder: Any, chunks: list[Any]) -> list[tuple]:
    """Feed ``chunks`` one by one, taking every complete message out after each."""
    events: list[tuple] = []
    for chunk in chunks:
        if decoder.broken:
            break
        decoder.feed(chunk)
        while True:
            try:
                msg = decoder.next_message()
            except DecodeError as exc:
                events.append(("error", describe(exc)))
                if decoder.broken:
                    break
                continue
            if msg is None:
                break
            events.append(("message", snapshot(msg)))
    # (a broken stream is not fed further, so what it holds depends on the chunking)
    events.append(("end", True) if decoder.broken else ("end", decoder.offset, decoder.buffered))
    return events


_STREAM_LIMITS = (1 << 20, 64, 300, 4096)


def _stream_check(what: str, protocol: str, make: Callable[..., Any], data: bytes) -> None:
    chunks, stream = _chunks(data)
    limit = _STREAM_LIMITS[len(stream) % len(_STREAM_LIMITS)]
    fast, pure = both(protocol)
    a = _framed_events(make(limit, codec=fast), chunks)
    b = _framed_events(make(limit, codec=pure), chunks)
    same(f"{what} (same chunking)", a, b)
    # The chunking must not change what comes out.
    whole = _framed_events(make(limit, codec=fast), [stream] if stream else [])
    same(f"{what} (chunked vs whole, fast)", a, whole)


def mip_stream(data: bytes) -> None:
    """``mip.Decoder`` fed in chunks chosen by the input, with each twin's codec."""
    from wirekit.mip import Decoder

    _stream_check("mip.Decoder", "mip", Decoder, data)


# --- the MIP server connection ---------------------------------------------------------------
#
# A program is what a runtime does to a sans-IO ``Connection``: feed reads, take events,
# answer now or owe, fill slots, send, pause writing, end, shut down, expire, let a lane take
# frames.  Both twins run the same program; every event, byte sent and state after each step
# must be the same.

#: limits a program runs under (``Limits`` keyword arguments)
CONNECTION_LIMITS: tuple[dict[str, Any], ...] = (
    {"request_timeout": 3.0, "idle_timeout": 10.0},
    {"max_message_size": 64, "max_items": 4, "max_buffered": 128, "request_timeout": 2.0},
    {"max_message_size": 300, "max_items": 16, "max_buffered": 300, "idle_timeout": 1.0},
    {"max_message_size": 4096, "max_items": 8, "request_timeout": None, "idle_timeout": None},
)


def connection_twins() -> tuple[Any, Any]:
    """The compiled ``Connection`` class and the pure one (``PyConnection``)."""
    import importlib

    from wirekit.mip.connection import PyConnection

    return importlib.import_module("wirekit._fast.mipconn").Connection, PyConnection


def _answer_for(frame: bytes) -> bytes:
    return frame[:2] + b"\x01" + frame[3:]


def _collect(owed: Any) -> list[bytes]:
    """A runtime's own collector for ``send`` (bytes and filled slots, as the default)."""
    out = []
    while owed:
        head = owed[0]
        wire = head if type(head) is bytes else head.wire
        if wire is None:
            break
        out.append(wire)
        owed.popleft()
    return out


def _lane_take(codec: Any, limit: int, max_size: int) -> Callable[..., int]:
    """A lane's ``take``: up to ``limit`` whole inference requests at ``buf[pos:end]`` (the
    codec's frame check), each answered at once into ``owed``."""

    def take(buf: Any, pos: int, end: int, owed: Any) -> int:
        for _ in range(limit):
            try:
                size = codec.frame_size(buf, pos, max_size)
            except DecodeError:
                break
            if size is None or pos + size > end or buf[pos + 1] != 2 or buf[pos + 2] != 0:
                break
            owed.append(_answer_for(bytes(buf[pos : pos + size])))
            pos += size
        return pos

    return take


def _event(event: Any) -> tuple:
    from wirekit.mip.connection import Answered, Rejected, Request

    if type(event) is Request:
        return ("request", snapshot(event.message), event.frame)
    if type(event) is Rejected:
        return ("rejected", int(event.code), describe(event.error), event.closing)
    if type(event) is Answered:
        return ("answered", snapshot(event.message))
    return ("other", repr(event))


def _state(conn: Any, budget: Any) -> tuple:
    g = conn.guard
    return (
        conn.reading,
        conn.broken,
        conn.done,
        conn.pending,
        conn.buffered,
        conn.closing,
        conn.paused,
        conn.write_paused,
        len(conn.owed),
        len(conn.ready),
        g.held,
        g.started,
        g.last,
        budget.total,
    )


def connection_trace(cls: Any, codec: Any, limits: int, in_flight: int, program: list) -> list:
    """Run ``program`` (a list of steps, see :func:`connection_program`) on a ``cls``
    connection with ``codec`` under ``CONNECTION_LIMITS[limits]``; return what it did."""
    from wirekit.mip.connection import LocalProtocolError, Request, Slot
    from wirekit.mip.limits import BufferBudget, Limits

    lim = Limits(**CONNECTION_LIMITS[limits % len(CONNECTION_LIMITS)])
    budget = BufferBudget(lim.max_buffered)
    now = 0.0
    conn = cls(lim, budget, now, max_in_flight=in_flight, codec=codec)
    slots: list[Any] = []
    trace: list[Any] = []
    placed = 0

    def place(event: Any) -> None:
        nonlocal placed
        if type(event) is Request:
            if (placed * 7 + len(event.frame)) % 3 == 0:
                slot = Slot()
                slots.append((slot, _answer_for(event.frame)))
                conn.owe(slot)
            else:
                conn.reply(_answer_for(event.frame))
            placed += 1

    for step in program:
        op = step[0]
        try:
            if op == "data":
                _, chunk, one_call, dt = step
                now += dt
                if one_call:
                    event = conn.receive_request(chunk, now)
                    trace.append(("one", None if event is None else _event(event)))
                    place(event)
                else:
                    conn.receive_data(chunk, now)
            elif op == "events":
                while (event := conn.next_event()) is not None:
                    trace.append(_event(event))
                    place(event)
            elif op == "fill":
                waiting = [s for s in slots if s[0].wire is None]
                if waiting:
                    slot, wire = waiting[step[1] % len(waiting)]
                    slot.wire = wire
            elif op == "send":
                now += step[1]
                trace.append(("sent", conn.send(now, _collect if step[2] else None)))
            elif op == "writing":
                now += step[2]
                conn.writing(step[1], now)
            elif op == "eoi":
                conn.end_of_input()
            elif op == "shutdown":
                conn.shutdown()
            elif op == "release":
                conn.release()
            elif op == "expired":
                now += step[1]
                trace.append(("expired", conn.expired(now)))
            elif op == "timer":
                trace.append(("timer", conn.timer_wanted()))
            elif op == "take":
                take = _lane_take(codec, step[1], lim.max_message_size)
                trace.append(("took", conn.take_frames(take, conn.owed)))
            else:  # pragma: no cover - a bad program
                raise ValueError(f"unknown step {step!r}")
        except LocalProtocolError as exc:
            trace.append(("misuse", str(exc)))
        trace.append(_state(conn, budget))
    return trace


_OPS = (
    "data",
    "data",
    "data",
    "events",
    "events",
    "fill",
    "send",
    "writing",
    "eoi",
    "shutdown",
    "release",
    "expired",
    "timer",
    "take",
)


def connection_program(data: bytes) -> tuple[int, int, list]:
    """``(limits, max_in_flight, program)`` spelled by fuzzer bytes: a limits byte, an
    in-flight byte, then steps (one byte each, a data step followed by its length and
    bytes).  Rare steps (release, shutdown) come up less often."""
    r = Reader(data)
    limits = r.byte()
    in_flight = 1 + r.below(6)
    program: list = []
    while r.pos < len(data) and len(program) < 256:
        code = r.byte()
        op = _OPS[code % len(_OPS)]
        dt = (code >> 4) * 0.25
        if op == "data":
            chunk = r.take(1 + r.byte())
            program.append(("data", chunk, bool(code & 0x80), dt))
        elif op == "fill":
            program.append(("fill", code >> 4))
        elif op == "send":
            program.append(("send", dt, bool(code & 0x10)))
        elif op == "writing":
            program.append(("writing", bool(code & 0x10), dt))
        elif op == "expired":
            program.append(("expired", dt * 4))
        elif op == "take":
            program.append(("take", 1 + (code >> 4)))
        elif op in ("release", "shutdown") and code & 0x30:
            program.append(("events",))  # three times in four: the common step instead
        else:
            program.append((op,))
    # in the end the runtime takes what is left and sends it
    program += [("events",), ("send", 0.0, False)]
    return limits, in_flight, program


def connection_check(limits: int, in_flight: int, program: list) -> None:
    """Both twins (each on its own codec) run ``program``: the same trace or Disagreement."""
    fast_cls, pure_cls = connection_twins()
    fast, pure = both("mip")
    a = connection_trace(fast_cls, fast, limits, in_flight, program)
    b = connection_trace(pure_cls, pure, limits, in_flight, program)
    same("mip Connection (compiled vs pure)", a, b)


def mip_connection(data: bytes) -> None:
    """The MIP server's sans-IO ``Connection``: a runtime's program spelled by the input."""
    connection_check(*connection_program(data))


# --- y2 --------------------------------------------------------------------------------------


def y2_decode(data: bytes) -> None:
    """``decode``, ``decode_prefix``, ``check_handshake`` and ``scan_deltas``."""
    differential("y2.decode", "y2", lambda c: c.decode(data))
    differential("y2.decode(memoryview)", "y2", lambda c: c.decode(memoryview(data)))
    pos = data[0] % 16 if data else 0
    if pos <= len(data):
        differential("y2.decode_prefix", "y2", lambda c: c.decode_prefix(data, pos))
    if len(data) >= 8:
        differential("y2.check_handshake", "y2", lambda c: c.check_handshake(data))
    for at in range(0, min(len(data), 64) + 1, 4):
        args = (data, at, len(data), 4 + at * 8, 8 + at * 4)  # start, end, run cap, size cap
        differential("y2.scan_deltas", "y2", lambda c, a=args: c.scan_deltas(*a))


def y2_stream(data: bytes) -> None:
    """``y2.Decoder`` (the worker link) fed in chunks chosen by the input."""
    from wirekit.y2 import Decoder

    _stream_check("y2.Decoder", "y2", Decoder, data)


_FLOATS = (np.float32, np.float64, np.float32, np.float16)
_TAUS = (0.25, 0.5, 1.0, 1e-3, 3.0, 1e30)
_ARG_ERRORS = (TypeError, ValueError)


def _model_recipe(r: Reader) -> list[tuple]:
    """How to build a model: per layer two array recipes (or references to earlier arrays)."""
    mode = r.byte()
    n_layers = 500 + r.below(40) if mode & 0x80 else r.below(5)
    if "y2-many-layers" in AVOID:
        n_layers = min(n_layers, 512)
    small = mode & 0x80  # many layers: keep them empty but for a few
    recipe = []
    made = 0
    for _ in range(n_layers):
        pair = []
        for _ in range(2):
            kind = r.byte()
            if made and kind % 8 == 7 and "y2-tied-views" not in AVOID:
                # a tie: an earlier array again, or a view of it
                pair.append(("tie", r.below(made), r.byte() % 4))
                continue
            size = 0 if small and kind % 4 else r.below(24)
            dtype = _FLOATS[(kind >> 3) % 4]
            layout = (kind >> 5) % 5
            values = r.take(size * np.dtype(dtype).itemsize) if (kind >> 4) & 1 else None
            small_values = [((b % 17) - 8) * 0.25 for b in r.take(size)] if values is None else None
            pair.append(("new", size, dtype, layout, values, small_values))
            made += 1
        recipe.append(tuple(pair))
    return recipe


def _build_model(recipe: list[tuple]) -> list[tuple[np.ndarray, np.ndarray]]:
    arrays: list[np.ndarray] = []
    model = []
    for pair in recipe:
        out = []
        for item in pair:
            if item[0] == "tie":
                base = arrays[item[1]]
                how = item[2]
                arr = base if how == 0 else base[::-1] if how == 1 else base.reshape(-1)[::2]
                if how == 3:
                    arr = base.T
                out.append(arr)
                continue
            _, size, dtype, layout, values, small_values = item
            if values is not None:
                flat = np.frombuffer(values.ljust(size * np.dtype(dtype).itemsize, b"\0"), dtype)
            else:
                flat = np.array(small_values + [0.0] * (size - len(small_values)), dtype)
            if layout == 0:  # 1-D contiguous
                arr = flat.copy()
            elif layout == 1:  # 1-D strided view
                holder = np.zeros((size, 2), dtype)
                holder[:, 0] = flat
                arr = holder[:, 0]
            elif layout == 2 and size % 2 == 0:  # 2-D C order
                arr = flat.copy().reshape(2, size // 2)
            elif layout == 3 and size % 2 == 0:  # 2-D Fortran order
                arr = np.asfortranarray(flat.copy().reshape(2, size // 2))
            else:  # reversed view
                arr = flat.copy()[::-1]
            arrays.append(arr)
            out.append(arr)
        model.append(tuple(out))
    return model


def _model_snapshot(model: list[tuple[np.ndarray, np.ndarray]]) -> Any:
    return [tuple(snapshot(np.array(a)) for a in pair) for pair in model]


def _valid_words(words: np.ndarray, model: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Map each word onto an address the model has (when it has any), keeping its sign bit.

    An address is y2's parameter index: ``2 * k`` for layer k's weights, ``2 * k + 1`` for
    its biases."""
    targets = [
        (2 * k + j, a.size) for k, pair in enumerate(model) for j, a in enumerate(pair) if a.size
    ]
    if not targets:
        return words
    out = []
    for word in words.tolist():
        param, size = targets[(word >> 22) % len(targets)]
        out.append((param << 22) | ((((word >> 1) & 0x1FFFFF) % size) << 1) | (word & 1))
    return np.array(out, dtype=np.uint32)


def y2_kernels(data: bytes) -> None:
    """``from_wire``/``to_wire``/``unpack``/``pack`` on words from the input, then ``compress``
    and ``apply`` on a model the input shapes (dtypes, layouts, views, tied arrays, many
    layers), each on identical copies for the two twins."""
    r = Reader(data)
    flags = r.byte()
    n_words = r.below(48)
    raw = r.take(4 * n_words + (flags & 3 if flags & 4 else 0))
    differential("y2.from_wire", "y2", lambda c: c.from_wire(raw), _ARG_ERRORS)
    if len(raw) % 4:
        return
    fast, pure = both("y2")
    words = pure.from_wire(raw)
    for name, form in (
        ("native", words),
        ("big-endian", fast.from_wire(raw, copy=False)),
        ("list", words.tolist()),
    ):
        differential(f"y2.to_wire({name})", "y2", lambda c, w=form: c.to_wire(w), _ARG_ERRORS)
        differential(f"y2.unpack({name})", "y2", lambda c, w=form: c.unpack(w), _ARG_ERRORS)
    fields = pure.unpack(words)
    differential("y2.pack(unpack)", "y2", lambda c: c.pack(*fields), _ARG_ERRORS)
    # pack with arbitrary (often out-of-range) fields of a chosen integer dtype
    dtype = (np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint64)[(flags >> 3) % 6]
    raw_fields = [
        np.frombuffer(
            r.take(n_words * np.dtype(dtype).itemsize).ljust(
                n_words * np.dtype(dtype).itemsize, b"\0"
            ),
            dtype,
        )
        for _ in range(4)
    ]
    differential("y2.pack(raw)", "y2", lambda c: c.pack(*raw_fields), _ARG_ERRORS)

    recipe = _model_recipe(r)
    tau = _TAUS[r.below(len(_TAUS))]
    if flags & 0x40:
        tau = float(np.frombuffer(r.take(4).ljust(4, b"\0"), np.float32)[0])

    def kernel(what: str, call: Callable[[Any, list], Any]) -> None:
        results = []
        for codec in (fast, pure):
            model = _build_model(recipe)
            res = outcome(lambda c=codec, m=model: call(c, m), _ARG_ERRORS)
            results.append((res, _model_snapshot(model)))
        same(what, results[0], results[1])

    kernel("y2.compress", lambda c, m: c.compress(m, tau))
    apply_words = words if flags & 0x80 else _valid_words(words, _build_model(recipe))
    kernel("y2.apply", lambda c, m: c.apply(m, apply_words, tau))
    # compress then apply the words to a fresh model (the worker's round trip)
    try:
        sent = pure.compress(_build_model(recipe), tau)
    except (WirekitError, *_ARG_ERRORS):
        return
    kernel("y2.apply(compress)", lambda c, m: c.apply(m, sent, tau))


# --- Clipper ---------------------------------------------------------------------------------

GENERATIONS = ("2016", "2017", "v3")
DIRECTIONS = ("to_clipper", "to_container")


def clipper_frames(data: bytes) -> list[bytes]:
    """Frames from the input: each a length byte (255: two more length bytes) then the body;
    a short last body takes what is left."""
    frames = []
    pos = 0
    while pos < len(data) and len(frames) < 64:
        n = data[pos]
        pos += 1
        if n == 255:
            n = int.from_bytes(data[pos : pos + 2], "big")
            pos += 2
        frames.append(data[pos : pos + n])
        pos += n
    return frames


def frames_input(frames: list[bytes]) -> bytes:
    """The inverse of :func:`clipper_frames` (for seeds)."""
    out = bytearray()
    for f in frames:
        out += bytes([len(f)]) if len(f) < 255 else b"\xff" + len(f).to_bytes(2, "big")
        out += f
    return bytes(out)


def clipper_decode(data: bytes) -> None:
    """``decode`` of the frames the input spells, in every generation and direction."""
    frames = clipper_frames(data)
    for gen in GENERATIONS:
        for direction in DIRECTIONS:
            differential(
                f"clipper.decode({gen}, {direction})",
                "clipper",
                lambda c, g=gen, d=direction: c.decode(frames, g, d),
            )


# --- ZMTP ------------------------------------------------------------------------------------

_FRAME_LIMITS = (None, 0, 16, 255, 4096)


def zmtp_decode(data: bytes) -> None:
    """``decode_events`` from a chosen phase (final or not, with a frame limit) and
    ``decode_stream``; the first byte chooses, the rest is the stream."""
    ctrl, buf = (data[0], data[1:]) if data else (0, b"")
    phase = ctrl % 3
    final = bool(ctrl & 4)
    limit = _FRAME_LIMITS[(ctrl >> 3) % len(_FRAME_LIMITS)]
    differential(
        "zmtp.decode_events",
        "zmtp",
        lambda c: c.decode_events(buf, 0, phase, final, limit),
    )
    differential("zmtp.decode_stream", "zmtp", lambda c: c.decode_stream(buf, limit))


def _reader_events(reader: Any, chunks: list[Any]) -> list[tuple]:
    events: list[tuple] = []

    def drain() -> bool:
        try:
            for offset, event in reader:
                events.append(("event", offset, snapshot(event)))
        except DecodeError as exc:
            events.append(("error", describe(exc)))
            return False
        return True

    for chunk in chunks:
        reader.feed(chunk)
        if not drain():
            break
    else:
        reader.close()
        drain()
    events.append(("end", reader.broken, snapshot(reader.ready)))
    return events


def zmtp_stream(data: bytes) -> None:
    """``zmtp.StreamReader`` fed in chunks chosen by the input, then closed."""
    from wirekit.zmtp import StreamReader

    chunks, stream = _chunks(data)
    limit = _FRAME_LIMITS[len(stream) % len(_FRAME_LIMITS)]
    fast, pure = both("zmtp")
    a = _reader_events(StreamReader(limit, codec=fast), chunks)
    b = _reader_events(StreamReader(limit, codec=pure), chunks)
    same("zmtp.StreamReader (same chunking)", a, b)
    whole = _reader_events(StreamReader(limit, codec=fast), [stream] if stream else [])
    same("zmtp.StreamReader (chunked vs whole, fast)", a, whole)


# --- the MIP client's reply path and item helpers (wirekit._fast.mipnet) --------------------


class _Future:
    """A client call's future as ``deliver`` sees it: ``done()`` and ``set_result``."""

    def __init__(self, done: bool) -> None:
        self.finished = done
        self.result: Any = None

    def done(self) -> bool:
        return self.finished

    def set_result(self, value: Any) -> None:
        if self.finished:
            raise Disagreement("deliver completed a future that was already done")
        self.finished = True
        self.result = value


class _Waiting:
    """One waiting call of a client connection (``deliver`` takes ``.future``)."""

    def __init__(self, done: bool) -> None:
        self.future = _Future(done)


def _deliver_trace(deliver: Callable[..., Any], data: bytes, waits: list[bool], limit: int):
    from collections import deque

    calls = [_Waiting(done) for done in waits]
    waiting = deque(calls)
    try:
        res: Any = ("ok", snapshot(deliver(data, waiting, limit)))
    except WirekitError as exc:  # (none expected: a reply it does not take is left)
        res = ("error", describe(exc))
    futures = [
        (c.future.finished, snapshot(c.future.result), c.future.result is data) for c in calls
    ]
    return res, futures, len(waiting)


def _samples_of(items: tuple, width: int, r: Reader) -> list:
    """Per-sample values from decoded items, in the forms a handler returns (Items, text,
    bytes-like, JSON values, bare single values, ragged rows), as the input chooses."""
    values: list[Any] = []
    for item in items:
        form = r.byte() % 9
        if form == 0:
            values.append(item)
        elif form == 1:
            values.append(bytes(item.data).decode("utf-8", "replace"))
        elif form == 2:
            values.append(bytes(item.data))
        elif form == 3:
            values.append(bytearray(item.data))
        elif form == 4:
            values.append(memoryview(bytes(item.data)))
        elif form == 5:
            values.append({"n": len(item.data)})
        elif form == 6:
            values.append(int.from_bytes(bytes(item.data)[:4], "big") - 7)
        elif form == 7:
            values.append([len(item.data), None, 0.5])
        else:
            values.append(object())  # not JSON: an EncodeError
    width = max(width, 1)
    samples: list[Any] = []
    for at in range(0, len(values), width):
        row = values[at : at + width]
        shape = r.byte() % 5
        if shape == 0 and len(row) == 1 and not isinstance(row[0], list | int):
            samples.append(row[0])  # a bare single value
        elif shape == 1:
            samples.append(tuple(row))
        elif shape == 2:
            samples.append(iter(row))
        elif shape == 3 and row:
            samples.append(row[:-1])  # ragged
        else:
            samples.append(row)
    return samples


def mip_net(data: bytes) -> None:
    """The MIP client's reply fast path ``deliver`` (the replies at the start of a read, each
    to the call at the head of the queue) against ``runtime._deliver_py``; then ``flatten``
    (a handler's outputs to items) on values built from the items the input decodes to."""
    import importlib

    from wirekit.mip import Inference, runtime

    fast = importlib.import_module("wirekit._fast.mipnet")
    r = Reader(data)
    ctrl = r.byte()
    waits = [bool(b & 1) for b in r.take(ctrl % 8)]
    limit = _STREAM_LIMITS[(ctrl >> 3) % len(_STREAM_LIMITS)]
    rest = r.rest()
    same(
        "mipnet.deliver",
        _deliver_trace(fast.deliver, rest, waits, limit),
        _deliver_trace(runtime._deliver_py, rest, waits, limit),
    )
    try:
        msg = twin("mip", "pure").decode_prefix(rest, 0)[0]
    except DecodeError:
        return
    if not isinstance(msg, Inference):
        return
    items = msg.items
    width = msg.n_output if msg.response else msg.n_input
    choices = Reader(rest[::-1])

    def flatten(impl: Callable[[Any], Any]) -> tuple:
        samples = _samples_of(items, width, Reader(choices.data))
        try:
            return ("ok", snapshot(impl(samples)))
        except runtime._Ragged as exc:
            return ("ragged", exc.sample, exc.got, exc.width)
        except TypeError as exc:  # a sample that is not a sequence (build_reply says so)
            return ("type", str(exc))
        except WirekitError as exc:
            return ("error", describe(exc))

    same("mipnet.flatten", flatten(fast.flatten), flatten(runtime._flatten_py))
    if items:
        same("mipnet.singles", snapshot(fast.singles(items)), snapshot(runtime._singles_py(items)))


# --- the dump's formatter (wirekit._fast.mipdump) --------------------------------------------


def mip_dump(data: bytes) -> None:
    """``wirekit.mip.dump``'s ``format_run`` (the human and the JSON form of a run of
    well-formed messages) against ``format_run_pure``: the same text, stop and count from
    any start and stop inside the input."""
    import importlib

    from wirekit.mip import dump

    fast = importlib.import_module("wirekit._fast.mipdump")
    ctrl, buf = (data[0], data[1:]) if data else (0, b"")
    pos = min(ctrl % 16, len(buf))
    stop = len(buf) - min((ctrl >> 4) % 8, len(buf) - pos) if ctrl & 0x80 else len(buf)
    base = (ctrl * 7919) % 100003
    for as_json in (False, True):
        same(
            f"mipdump.format_run(json={as_json})",
            outcome(lambda j=as_json: fast.format_run(buf, pos, stop, base, j)),
            outcome(lambda j=as_json: dump.format_run_pure(buf, pos, stop, base, j)),
        )


# --- the dispatcher's MIP lane (wirekit._fast.servelane) -------------------------------------


def serve_lane_twins() -> tuple[Any, Any]:
    """The compiled lane module and the pure one (``wirekit.serve.dispatch.lane``)."""
    import importlib

    return importlib.import_module("wirekit._fast.servelane"), importlib.import_module(
        "wirekit.serve.dispatch.lane"
    )


class _Row:
    """A device row as the lane sees it: ``key`` (hashable, as a DeviceRow)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __repr__(self) -> str:
        return f"row {self.key}"


class _LaneClient:
    """A pipelined backend client as the lane sees it, recording what it is asked."""

    def __init__(self, name: str, slots: int, log: list) -> None:
        self.name = name
        self.slots = slots
        self.timeout = 5.0
        self.log = log

    def free_slots(self) -> Any:
        return None if self.slots < 0 else (f"conn-{self.name}", self.slots, 1000.0)

    def send_calls(self, conn: Any, frames: list, calls: list, deadline: float) -> None:
        self.log.append(("send", self.name, conn, [bytes(f) for f in frames], deadline))

    def release_slot(self) -> None:
        self.log.append(("release", self.name))

    def call_failed(self, conn: Any, exc: BaseException) -> None:
        self.log.append(("failed", self.name, conn, str(exc)))


class _Job:
    """The dispatcher's job for a request the lane handed over."""

    def __init__(self, frame: bytes) -> None:
        self.frame = frame
        self.outcome: Any = None
        self.error: Any = None


class _LaneDispatcher:
    """What a :class:`Lane` asks of the dispatcher, answered from a plan and recorded."""

    def __init__(self, rows: list[_Row], clients: dict, cache_on: bool, recent: bool) -> None:
        from wirekit.serve.dispatch.cache import ResponseCache

        self.log: list = []
        self.rows = rows
        self.clients = clients
        self.now = 100.0
        self.store = None
        self.cache = ResponseCache(64 if cache_on else 0, clock=self.clock)
        self.route_version = 0
        self.closing = False
        self.metrics = self
        self.router = self
        self.recent = [] if recent else None
        self.draw = 0
        self.ids = 0
        self.jobs: list[_Job] = []

    def stats(self, model: str) -> Any:
        return self

    def clock(self) -> float:
        self.now += 0.125
        return self.now

    def choose(self, model: str, exclude: tuple) -> _Row:
        self.draw += 1
        return self.rows[(self.draw * 5) % len(self.rows)]

    def lane_route(self, model: str) -> Any:
        return None if self.route_version % 3 == 2 else ({}, self.rows, self.clients)

    def new_ids(self, n: int) -> list[str]:
        self.ids += n
        return [f"r{self.ids - n + k}" for k in range(n)]

    def lane_arrived(
        self, stats: Any, model: str, client: str, t_in: float, requests: list
    ) -> bool:
        self.log.append(("arrived", model, client, t_in, snapshot([tuple(r) for r in requests])))
        # a read of 3, 7, 11, ... requests finds the journal's disk full: none is sent
        return len(requests) % 4 != 3

    def lane_refused(self, model: str, client: str, rid: str, t_in: float, wire: Any) -> _Job:
        self.log.append(("refused", model, client, rid, t_in, bytes(wire)))
        job = _Job(bytes(wire))
        job.outcome = _JobOutcome(b"\x00\x00\x05\x00\x00\x00\x00\x00")  # ended at once
        return job

    def new_job(self, model: str, frame: bytes, client: str, t_in: float, wake: Any) -> _Job:
        job = _Job(bytes(frame))
        self.jobs.append(job)
        self.log.append(("job", model, bytes(frame), client, t_in))
        return job

    def start(self, job: _Job, row: _Row) -> None:
        self.log.append(("start", job.frame, row.key))
        if len(job.frame) % 5 == 0:
            raise RuntimeError("no such device")

    def lane_fallback(self, call: Any, frame: Any, exc: Any) -> None:
        self.log.append(("fallback", call.rid, frame, None if exc is None else str(exc)))

    def lane_answered(
        self, stats, model, client, t_out, total, lo, hi, ok, done, by_row=None, backend=None
    ):
        self.log.append(
            (
                "answered",
                model,
                client,
                t_out,
                total,
                lo,
                hi,
                sorted(row.key for row in ok),
                snapshot([tuple(d) for d in done]),
                None if by_row is None else sorted(by_row.items()),
                None if backend is None else list(backend),
            )
        )


class _JobOutcome:
    def __init__(self, wire: bytes) -> None:
        self.response = self
        self.wire = wire


def _lane_entry(entry: Any) -> tuple:
    if type(entry) is bytes:
        return ("bytes", entry)
    if isinstance(entry, _Job):
        return ("job", entry.frame)
    return (
        "call",
        entry.rid,
        entry.wire,
        int(entry.state),
        entry.reply,
        None if entry.row is None else entry.row.key,
        entry.key,
    )


def _reply_for(frame: bytes, how: int, r: Reader) -> bytes:
    """A backend's reply to ``frame``: the request echoed as a response (KubeMo's way), a
    byte of it changed, an error reply, or bytes from the input."""
    echo = bytearray(frame)
    if len(echo) >= 12:
        echo[2] = 1
        echo[8], echo[9] = echo[9], echo[8]
    if how == 0:
        return bytes(echo)
    if how == 1 and echo:
        at = r.below(len(echo))
        echo[at] ^= 1 + r.byte() % 255
        return bytes(echo)
    if how == 2:
        return b"\x00\x00\x05\x00\x00\x00\x00\x00"
    return r.take(r.byte())


def lane_trace(module: Any, plan: bytes) -> list:
    """Run the lane program ``plan`` (see :func:`serve_lane`) on ``module``'s ``Lane``."""
    from collections import deque

    r = Reader(plan)
    cfg = r.byte()
    n_rows = 1 + cfg % 3
    max_size = (64, 300, 1 << 20, 40)[(cfg >> 2) % 4]
    max_items = (-1, 0, 2, 16)[(cfg >> 4) % 4]
    cache_on, recent = bool(cfg & 0x40), bool(cfg & 0x80)
    log: list = []
    rows = [_Row(f"d{k}") for k in range(n_rows)]
    slots = r.byte()
    clients = {
        row.key: _LaneClient(row.key, ((slots >> (2 * k)) % 4) - 1, log)
        for k, row in enumerate(rows)
    }
    d = _LaneDispatcher(rows, clients, cache_on, recent)
    d.log = log
    pending: deque = deque()
    woken: list = []
    lane = module.Lane(
        d, "m", "c1", ({}, rows, clients), max_size, max_items, pending, woken.append
    )
    trace: list[Any] = []
    while r.pos < len(plan) and len(trace) < 200:
        op = r.byte()
        kind = op % 6
        if kind <= 1:  # a read: the lane takes what it can
            chunk = r.take(1 + r.below(600))
            pos = r.below(len(chunk) + 1) if op & 0x40 else 0
            end = len(chunk) - r.below(len(chunk) - pos + 1) if op & 0x80 else len(chunk)
            form = (op >> 3) % 3
            src: Any = chunk if form == 0 else bytearray(chunk) if form == 1 else memoryview(chunk)
            trace.append(("take", lane.take(src, pos, end, d.clock())))
        elif kind == 2:  # the backend answers a call in flight
            calls = [c for c in pending if type(c) is module.LaneCall and not c.done()]
            if calls:
                call = calls[r.below(len(calls))]
                call.future.set_result(_reply_for(call.wire, (op >> 3) % 4, r))
        elif kind == 3:  # a call fails, or a job is answered
            calls = [c for c in pending if type(c) is module.LaneCall and not c.done()]
            jobs = [j for j in d.jobs if j.outcome is None and j.error is None]
            if calls and op & 0x80:
                calls[r.below(len(calls))].set_exception(TimeoutError("backend timeout"))
            elif jobs:
                job = jobs[r.below(len(jobs))]
                if op & 0x40:
                    job.outcome = _JobOutcome(_reply_for(job.frame, 0, r))
                else:
                    job.error = RuntimeError("failed")
            handed = [c for c in pending if type(c) is module.LaneCall and c.state == 2]
            if handed and op & 0x20:
                handed[r.below(len(handed))].job_done(_Job(b"\x00\x02\x01\x00" + bytes(8)))
        elif kind == 4:  # the front door flushes
            trace.append(("answers", [_lane_entry(e) for e in [*lane.answers(pending)]]))
        else:  # the catalog changes, or the dispatcher closes
            if op & 0x80:
                d.closing = not d.closing
            else:
                d.route_version += 1
        trace.append(("pending", [_lane_entry(e) for e in pending], len(woken)))
    trace.append(("log", snapshot(log)))
    trace.append(("cache", d.cache.hits, d.cache.misses, len(d.cache)))
    return trace


def serve_lane(data: bytes) -> None:
    """The dispatcher's MIP lane: ``inference_size`` (its frame check) on any buffer and
    range, then ``Lane.take`` / ``LaneCall.set_result`` / ``set_exception`` / ``job_done`` /
    ``Lane.answers`` in a program of reads, backend replies (echoed, corrupted, error
    replies, junk), job outcomes, flushes, route changes and closings the input spells; both
    twins must ask the dispatcher and the backends the same things and answer the same."""
    fast, pure = serve_lane_twins()
    ctrl, buf = (data[0], data[1:]) if data else (0, b"")
    pos = min(ctrl % 8, len(buf))
    subtype = (ctrl >> 3) & 1
    max_items = (-1, 0, 1, 3, 255, 1 << 40)[(ctrl >> 4) % 6]
    for end in sorted({len(buf), max(pos, len(buf) - (ctrl >> 5))}):
        for form in (bytes, bytearray, memoryview):
            src = form(buf)
            same(
                "servelane.inference_size",
                outcome(lambda s=src, e=end: fast.inference_size(s, pos, e, subtype, max_items)),
                outcome(lambda s=src, e=end: pure.inference_size(s, pos, e, subtype, max_items)),
            )
    same("servelane.Lane", lane_trace(fast, buf), lane_trace(pure, buf))


# --- the request store's writers (wirekit._fast.journal, wirekit._fast.storewriter) ----------


def serve_store_twins() -> tuple[Any, Any]:
    """The store's batch writers and hand-over merge, compiled and pure: namespaces with
    ``arrival_records``, ``ok_records`` (``wirekit._fast.journal`` /
    ``wirekit.serve.record.journal``) and ``merge_ops`` (``wirekit._fast.storewriter`` /
    ``wirekit.serve.record.writer``).  The compiled ones must be what the store uses (the
    journal module binds its field writers into the compiled module when it loads it)."""
    import importlib
    from types import SimpleNamespace

    from wirekit.serve.record import journal, writer

    fast_journal = importlib.import_module("wirekit._fast.journal")
    fast_writer = importlib.import_module("wirekit._fast.storewriter")
    if (
        journal.arrivals_writer is not fast_journal.arrival_records
        or journal.ok_writer is not fast_journal.ok_records
        or writer._merge_ops is not fast_writer.merge_ops
    ):
        raise RuntimeError("the request store does not use its compiled writers")
    fast = SimpleNamespace(
        arrival_records=fast_journal.arrival_records,
        ok_records=fast_journal.ok_records,
        merge_ops=fast_writer.merge_ops,
    )
    pure = SimpleNamespace(
        arrival_records=journal.arrival_records,
        ok_records=journal.ok_records,
        merge_ops=writer.merge_ops,
    )
    return fast, pure


#: pieces of text a record must escape: quotes, backslashes, control and line-separator
#: characters, NUL, lone surrogates, non-ASCII and astral characters
_AWKWARD_TEXT = ('"', "\\", "\n", "\r", "\u2028", "\x00", "\ud800", "\udfff", "é", "😀", "\x7f", "")


def _unicode_from(r: Reader, limit: int = 16) -> str:
    """Text of any code points (the ids, model, client and device names a record holds)."""
    kind = r.byte() % 4
    raw = r.take(r.byte() % limit)
    if kind == 0:
        return raw.decode("latin-1")
    if kind == 1:
        return raw.decode("utf-8", "surrogateescape")  # lone low surrogates
    if kind == 2:  # any BMP code point, surrogates (paired or not) included
        return raw[: len(raw) & ~1].decode("utf-16-le", "surrogatepass")
    return "".join(_AWKWARD_TEXT[b % len(_AWKWARD_TEXT)] for b in raw)


_SPECIAL_FLOATS = (
    float("nan"),
    float("inf"),
    float("-inf"),
    -0.0,
    0.0,
    1763790000.5,
    5e-324,
    1.7976931348623157e308,
)


def _time_from(r: Reader) -> Any:
    """A time as the store may be given one: any double (NaN, infinities, -0.0, subnormal
    included), an int (past 64 bits too), a bool, None, a numpy float."""
    kind = r.byte() % 8
    if kind <= 1:
        return struct.unpack("<d", r.take(8).ljust(8, b"\0"))[0]
    if kind == 2:
        return _SPECIAL_FLOATS[r.byte() % len(_SPECIAL_FLOATS)]
    if kind == 3:
        return int.from_bytes(r.take(1 + r.byte() % 10), "little", signed=True)
    if kind == 4:
        return bool(r.byte() & 1)
    if kind == 5:
        return None
    if kind == 6:
        return np.float64(_SPECIAL_FLOATS[r.byte() % len(_SPECIAL_FLOATS)])
    return float(r.byte())  # a plain, small time: shared by many


def _count_from(r: Reader) -> Any:
    """A payload size or attempt count: mostly a non-negative int, sometimes a negative or
    huge one, a bool or a float."""
    kind = r.byte() % 8
    if kind <= 3:
        return r.byte()
    if kind == 4:
        return int.from_bytes(r.take(8), "little")
    if kind == 5:
        return -int.from_bytes(r.take(9), "little")
    if kind == 6:
        return bool(r.byte() & 1)
    return _time_from(r)


def _payload_from(r: Reader) -> Any:
    """A request's bytes: None, bytes (maybe empty), a bytearray or a memoryview."""
    kind = r.byte() % 6
    if kind == 0:
        return None
    raw = r.take(r.byte() % 24)
    if kind == 3:
        return bytearray(raw)
    if kind == 4:
        return memoryview(b"<" + raw + b">")[1:-1]
    if kind == 5 and len(raw) % 2 == 0:
        return memoryview(raw).cast("H")  # items of two bytes
    return raw


class _NamesOf:
    """``names_of`` as ``RequestStore.completions_ok`` passes it (the names text of model,
    client and a device), recording the devices it is asked about."""

    def __init__(self, model: str, client: str) -> None:
        from wirekit.serve.record.journal import names_text

        self.text = names_text
        self.model = model
        self.client = client
        self.asked: list[Any] = []

    def __call__(self, device: str | None) -> str:
        self.asked.append(device)
        return self.text(self.model, self.client, device)


#: rows per INSERT statement a hand-over may be asked for (SQLite's is 32, PostgreSQL's 1 << 30)
_STORE_CHUNKS = (1, 2, 3, 4, 7, 32, 1 << 30, (1 << 63) - 1)
_STORE_STATUSES = ("ok", "error", "failed", "abandoned", "lost", "queued")


def store_program_trace(fast: Any, pure: Any, data: bytes) -> int:
    """Run the store program ``data`` (see :func:`serve_store`) on both twins, comparing every
    call; returns the number of hand-overs merged."""
    from wirekit.serve.record.journal import ARRIVAL, COMPLETION, json_time, names_text

    r = Reader(data)
    arrived: list[str] = []  # ids that arrived: the completions mostly refer to them
    pending: list[tuple[int, tuple[Any, ...]]] = []  # the rows of the next hand-over
    merged = 0

    def rid() -> str:  # one that arrived (top bit set), or a new one
        pick = r.byte()
        if pick & 0x80 and arrived:
            return arrived[pick % len(arrived)]
        return _unicode_from(r)

    def hand_over(chunk: int) -> None:
        nonlocal merged, pending
        ops, pending = pending, []
        a = outcome(lambda: fast.merge_ops(ops, chunk))
        b = outcome(lambda: pure.merge_ops(ops, chunk))
        same(f"storewriter.merge_ops(chunk={chunk})", a, b)
        merged += 1

    steps = 0
    while r.pos < len(data) and steps < 64:
        steps += 1
        op = r.byte()
        kind = op % 4
        journal_on, payloads = bool(op & 0x10), bool(op & 0x20)
        if kind == 0:  # RequestStore.arrivals: the requests of one read
            model, client, time_in = _unicode_from(r), _unicode_from(r), _time_from(r)
            requests = []
            for _ in range(r.byte() % 9):
                requests.append((rid(), _count_from(r), _payload_from(r)))
                arrived.append(requests[-1][0])
            names = names_text(model, client, None) if journal_on else ""
            tin = json_time(time_in) if journal_on else ""
            args = (requests, model, client, time_in, names, tin, journal_on, payloads)
            a = outcome(lambda a=args: fast.arrival_records(*a))
            result = pure.arrival_records(*args)
            same("journal.arrival_records", a, ("ok", snapshot(result)))
            pending.extend(result[2])
        elif kind == 1:  # RequestStore.completions_ok: the answers of one flush
            model, client, time_out = _unicode_from(r), _unicode_from(r), _time_from(r)
            times = [_time_from(r) for _ in range(1 + r.byte() % 3)]  # one per read
            devices = [_unicode_from(r) for _ in range(1 + r.byte() % 3)]
            answers = []
            for _ in range(r.byte() % 9):
                at = r.byte()
                device = None if at % 7 == 6 else devices[at % len(devices)]
                t_in = times[(at >> 3) % len(times)]
                answers.append(
                    (rid(), device, t_in, _count_from(r), _count_from(r), _payload_from(r))
                )
            tout = json_time(time_out) if journal_on else ""
            fast_names, pure_names = _NamesOf(model, client), _NamesOf(model, client)
            args = (answers, time_out, tout, fast_names, journal_on, payloads)
            a = outcome(lambda a=args: fast.ok_records(*a))
            result = pure.ok_records(answers, time_out, tout, pure_names, journal_on, payloads)
            same("journal.ok_records", a, ("ok", snapshot(result)))
            same("journal.ok_records: names_of asked", fast_names.asked, pure_names.asked)
            pending.extend(result[2])
        elif kind == 2:  # rows the store adds one by one (RequestStore.arrival / complete)
            for _ in range(1 + r.byte() % 4):
                if r.byte() & 1:
                    row = (rid(), _unicode_from(r), _unicode_from(r), _time_from(r))
                    pending.append((ARRIVAL, (*row, _count_from(r), _payload_from(r))))
                    arrived.append(row[0])
                else:
                    at = r.byte()
                    status = _STORE_STATUSES[at % len(_STORE_STATUSES)]
                    device = None if at & 0x80 else _unicode_from(r)
                    row = (device, _time_from(r), status, _count_from(r), rid())
                    pending.append((COMPLETION, row))
        else:  # the hand-over to the writer thread
            hand_over(_STORE_CHUNKS[(op >> 4) % len(_STORE_CHUNKS)])
    if pending:
        hand_over(_STORE_CHUNKS[r.byte() % len(_STORE_CHUNKS)])
    return merged


def serve_store(data: bytes) -> None:
    """The request store's writers: ``arrival_records`` and ``ok_records`` (the journal
    records, their length and the store rows of the requests of one read and the answers of
    one flush) and ``merge_ops`` (one hand-over to the writer thread as statements, at any
    rows per statement), in a program the input spells: reads, flushes, single arrivals and
    completions, hand-overs; ids, names and devices of any code points (quotes, backslashes,
    newlines, NULs, lone surrogates), times of any double (NaN, infinities), int, bool or
    None, sizes and counts out of range, payloads of every buffer type, journal and payloads
    on or off.  Both twins must write the same records and rows, ask for the same device
    names, and merge the rows into the same statements."""
    fast, pure = serve_store_twins()
    store_program_trace(fast, pure, data)


# --- ZeroMQ plumbing shared by the Clipper runtime targets -----------------------------------

_ZMQ: dict[str, Any] = {}


def _zmq_context() -> Any:
    """One ZeroMQ context for every target in this process (inproc endpoints need it)."""
    import zmq

    if "ctx" not in _ZMQ:
        _ZMQ["ctx"] = zmq.Context()
        _ZMQ["n"] = 0
        # The sockets kept for the process are closed with it, not left to the garbage
        # collector (which would report each one as a ResourceWarning at exit).
        atexit.register(_ZMQ["ctx"].destroy, linger=0)
    return _ZMQ["ctx"]


def _socket(kind: int, *, identity: bytes | None = None, rcvtimeo: int = 2000) -> Any:
    import zmq

    sock = _zmq_context().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, rcvtimeo)
    sock.setsockopt(zmq.SNDTIMEO, 2000)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    return sock


def _endpoint(what: str) -> str:
    _zmq_context()
    _ZMQ["n"] += 1
    return f"inproc://fuzz-{what}-{_ZMQ['n']}"


def _drain(sock: Any) -> list[list[bytes]]:
    """Every message waiting on ``sock`` now."""
    out = []
    while sock.poll(0):
        out.append(sock.recv_multipart())
    return out


def _frames_from(r: Reader, limit: int = 12) -> list[bytes]:
    """Up to ``limit`` frames spelled by the input (a length byte, then the bytes)."""
    return [r.take(r.byte() % 40) for _ in range(1 + r.below(limit))]


def _mutate(frames: list[bytes], r: Reader) -> list[bytes]:
    """``frames`` with one change the input chooses: a byte flipped, a frame cut, dropped or
    doubled, or the last frame split."""
    out = list(frames)
    if not out:
        return out
    k = r.below(len(out))
    how = r.byte() % 5
    if how == 0 and out[k]:
        f = bytearray(out[k])
        f[r.below(len(f))] ^= 1 << (r.byte() % 8)
        out[k] = bytes(f)
    elif how == 1:
        out[k] = out[k][: r.below(len(out[k]) + 1)]
    elif how == 2:
        del out[k]
    elif how == 3:
        out.insert(k, out[k])
    else:
        at = r.below(len(out[-1]) + 1)
        out[-1:] = [out[-1][:at], out[-1][at:]]
    return out


# --- the frontend's ROUTER lane (wirekit._fast.clipperfront) ---------------------------------

_FRONT_NAMES = (b"\x00A", b"\x00B", b"\x00C")


class _FrontToken:
    """A caller's token: completed at once (as ``submit_callback``'s), or later through the
    runtime's list / the state's events (as a Future)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.outcome: Any = None

    def set_result(self, value: Any) -> None:
        if self.outcome is not None:
            raise Disagreement(f"token {self.k} completed twice")
        self.outcome = ("ok", snapshot(list(value)))

    def set_exception(self, error: BaseException) -> None:
        self.outcome = ("error", str(error))


class _LaterToken(_FrontToken):
    pass


def _front_inputs(kind: int, rows: int, r: Reader) -> Any:
    cols = 1 + r.below(4)
    raw = r.take(rows * cols * 8).ljust(rows * cols * 8, b"\1")
    dtypes = (np.float64, np.float32, np.int32, np.uint8)
    if kind < 4:
        dtype = dtypes[kind]
        n = rows * cols
        return np.frombuffer(raw[: n * np.dtype(dtype).itemsize], dtype).reshape(rows, cols)
    if kind == 4:
        return [[float(b) for b in raw[c * cols : (c + 1) * cols]] for c in range(rows)]
    if kind == 5:
        return [raw[c : c + 3].decode("latin-1") for c in range(rows)]
    if kind == 6:
        return [raw[c : c + cols] for c in range(rows)]
    if kind == 7:  # Fortran order: not the compiled array path
        return np.asfortranarray(
            np.frombuffer(raw[: rows * cols * 8], np.float64).reshape(rows, cols)
        )
    return []


class _FrontWorld:
    """One frontend (its state class and receive path) on a ROUTER of its own, talking to
    DEALER peers named ``_FRONT_NAMES``."""

    def __init__(self, impl: str, generation: Any, max_in_flight: int) -> None:
        import importlib

        import zmq

        from wirekit.clipper import _zio  # noqa: F401  (binds the compiled zio to libzmq)
        from wirekit.clipper.session import FrontendState

        self.impl = impl
        key = f"front-{impl}"
        if key not in _ZMQ:  # one ROUTER and its peers per twin: closed sockets are reaped lazily
            router = _socket(zmq.ROUTER)
            endpoint = _endpoint("front")
            router.bind(endpoint)
            peers = []
            for name in _FRONT_NAMES:
                peer = _socket(zmq.DEALER, identity=name)
                peer.connect(endpoint)
                peers.append(peer)
            _ZMQ[key] = (router, peers)
        self.router, self.peers = _ZMQ[key]
        for sock in (self.router, *self.peers):
            _drain(sock)  # what an earlier run left (one that failed half-way)
        self.later: list = []
        if impl == "fast":
            fast = importlib.import_module("wirekit._fast.clipperfront")
            self.state = fast.FrontendState(generation, max_in_flight=max_in_flight)
            self.wire = fast.Wire(self.router, (fast.Callback, _FrontToken), self.later)
        else:
            self.state = FrontendState(generation, max_in_flight=max_in_flight)
            self.wire = None
        self.tokens: dict[int, _FrontToken] = {}
        self.trace: list = []

    def send(self, messages: list) -> None:
        from wirekit.clipper._zio import send_frames

        for message in messages:
            if self.wire is not None:
                self.wire.send(message)
            else:
                send_frames(self.router, message)

    def submit(self, k: int, inputs: Any, later: bool, now: float) -> None:
        token = self.tokens[k] = (_LaterToken if later else _FrontToken)(k)
        state = self.state
        message = state.try_send("m", inputs, now + 100.0, token, None)
        if message is None:
            state.submit("m", inputs, now + 100.0, token, None)
            self.send(state.dispatch(now))
        else:
            self.send([message])
        self.settle()

    def peer_sends(self, who: int, frames: list[bytes], now: float) -> None:
        from wirekit.clipper._zio import recv_message

        self.peers[who].send_multipart(frames)
        state = self.state
        if self.wire is not None:
            got = self.wire.receive(state, True, 0.0)
        else:
            got = recv_message(self.router, True, 0.0)
        if got is None:
            raise Disagreement(f"{self.impl}: a message sent on inproc did not arrive")
        if type(got) is int:  # the compiled Wire completed an answer itself
            if got == 2:
                self.send(state.dispatch(now))
        else:
            message, _fd = got
            self.send(state.receive(message[0], message[1:], now))
        self.settle()

    def settle(self) -> None:
        from wirekit.clipper.session import Completed

        while self.later:
            token, outputs = self.later.pop(0)
            token.set_result(outputs)
        events, self.state.events = self.state.events, []
        for event in events:
            if type(event) is Completed:
                event.token.set_result(event.outputs)
            else:
                event.token.set_exception(event.error)

    def heard(self) -> list:
        """What each peer received since the last look."""
        return [[who, frames] for who, peer in enumerate(self.peers) for frames in _drain(peer)]

    def snapshot(self) -> dict:
        state = self.state
        return {
            "tokens": {k: t.outcome for k, t in self.tokens.items()},
            "in_flight": sorted(state.in_flight),
            "held": {i: sorted(r.in_flight) for i, r in state.replicas.items()},
            "batches": {
                i: (b.msg_id, b.replica.identity, b.attempts, b.count, b.lost, b.token.k)
                for i, b in state.in_flight.items()
            },
            "pending": {m: [b.token.k for b in q] for m, q in state.pending.items() if q},
            "replicas": [
                (r.identity, r.model_name, int(r.input_type)) for r in state.replicas.values()
            ],
            "rejected": sorted(state.rejected),
        }


def _answer_frames(generation: Any, msg_id: int, outputs: list) -> list[bytes]:
    """A container's answer: strings (2016: numbers, their lengths)."""
    from wirekit import clipper

    outputs = outputs or ["?"]  # (no outputs: not encodable; junk frames try that)
    if generation is clipper.Generation.G2016:
        outputs = [float(len(o)) for o in outputs]
    return clipper.encode(clipper.PredictResponse(msg_id, outputs), generation)


def _front_outputs(count: int, r: Reader) -> list:
    out = []
    for _ in range(count):
        raw = r.take(r.byte() % 12)
        out.append(raw.decode("utf-8", "surrogateescape").encode("utf-8", "replace").decode())
    return out


def front_program(data: bytes) -> tuple[Any, int, list]:
    """``(generation, max_in_flight, steps)`` spelled by the input for :func:`clipper_front`."""
    from wirekit import clipper
    from wirekit.clipper import Generation, Heartbeat, InputType, NewContainer

    r = Reader(data)
    cfg = r.byte()
    gen = list(Generation)[cfg % 3]
    max_in_flight = 1 + (cfg >> 2) % 3
    steps: list = []
    # registrations first (the input chooses their types), then the program
    for who in range(1 + (cfg >> 4) % 3):
        itype = (InputType.DOUBLES, InputType.FLOATS, InputType.STRINGS, InputType.INTS)[
            r.byte() % 4
        ]
        if gen is not Generation.G2016:
            steps.append(("peer", who, clipper.encode(Heartbeat(), gen)))
        rpc = 3 if gen is Generation.V3 else None
        steps.append(("peer", who, clipper.encode(NewContainer("m", "1", itype, rpc), gen)))
    k = 0
    while r.pos < len(data) and len(steps) < 80:
        op = r.byte()
        kind = op % 5
        if kind <= 1:
            k += 1
            rows = 1 + r.below(5)
            steps.append(("submit", k, _front_inputs((op >> 3) % 9, rows, r), bool(op & 0x80)))
        elif kind == 2:  # an answer to a batch the peer holds (or not), good or not
            steps.append(("answer", r.byte(), r.byte(), op >> 3, _front_outputs(8, r), r.byte()))
        elif kind == 3:
            steps.append(("peer", r.below(3), _frames_from(r)))
        else:
            steps.append(("mutated", r.below(3), r.byte(), r.take(4)))
    return gen, max_in_flight, steps


def front_trace(impl: str, gen: Any, max_in_flight: int, steps: list) -> list:
    """Run ``steps`` on one frontend of ``impl``; what it sent, completed and holds."""
    world = _FrontWorld(impl, gen, max_in_flight)
    now = 1.0
    for step in steps:
        now += 0.01
        op = step[0]
        if op == "submit":
            world.submit(step[1], step[2], step[3], now)
        elif op == "peer":
            world.peer_sends(step[1] % len(_FRONT_NAMES), step[2], now)
        elif op in ("answer", "mutated"):
            who = step[1] % len(_FRONT_NAMES)
            held = sorted(world.state.in_flight.items())
            if held:
                msg_id, batch = held[step[2] % len(held)]
                count = batch.count
            else:
                msg_id, count = 77, 1
            if op == "answer":
                how = step[3] % 4
                count = count + 1 if how == 1 else max(count - 1, 0) if how == 2 else count
                frames = _answer_frames(gen, msg_id if how != 3 else msg_id + 1000, step[4][:count])
                if step[5] % 4 == 0:
                    frames = _mutate(frames, Reader(bytes(step[4][0], "utf-8") if step[4] else b""))
            else:
                frames = _mutate(_answer_frames(gen, msg_id, ["x"] * count), Reader(step[3]))
            world.peer_sends(who, frames, now)
        world.trace.append(("heard", world.heard()))
    world.trace.append(("end", world.snapshot()))
    return world.trace


def clipper_front(data: bytes) -> None:
    """The frontend's compiled ROUTER lane (``clipperfront.Wire.receive``: the v3 answers it
    reads straight from the received parts; ``Wire.send``: requests written from the input
    array) and its compiled ``FrontendState`` (``try_send``, ``complete``, ``pick``), against
    ``session.FrontendState`` with pyzmq: registrations, submissions of every input form,
    answers (right, short, long, unknown id, corrupted) and junk from three peers over real
    inproc sockets; the same frames reach the peers, the same callers complete with the same
    outputs, the same batches stay in flight."""
    gen, max_in_flight, steps = front_program(data)
    same(
        "clipperfront (compiled vs pure)",
        front_trace("fast", gen, max_in_flight, steps),
        front_trace("pure", gen, max_in_flight, steps),
    )


# --- the container's lane (wirekit._fast.clippercontainer) -----------------------------------

#: The last request of every container program has this many inputs (no other request the
#: programs spell has as many): its model call stops the container, so the lane returns STOP
#: at once instead of waiting for a message that never comes.
_STOP_ROWS = 13
_CONTAINERS: dict[tuple, Any] = {}


class _FuzzModel:
    """A model answering as the input chose (strings, a wrong count, numbers, raising...),
    recording what it was given; the stop request stops its container."""

    def __init__(self, plan: bytes) -> None:
        self.plan = plan
        self.calls = 0
        self.seen: list = []
        self.container: Any = None

    def __call__(self, inputs: Any) -> Any:
        self.seen.append(snapshot(inputs))
        if len(inputs) == _STOP_ROWS:
            self.container.stopping = True
        how = self.plan[self.calls % len(self.plan)] % 10 if self.plan else 0
        self.calls += 1
        n = len(inputs)
        if how <= 3:
            return [f"o{k}-{how}" for k in range(n)]
        if how == 4:
            return ["x"] * (n + 1)
        if how == 5:
            return [float(k) for k in range(n)]
        if how == 6:
            return ["\ud800"] * n
        if how == 7:
            return tuple("t" for _ in range(n))
        if how == 8:
            return ["é" * 30] * n
        raise RuntimeError("model failed")


def _container(impl: str, gen: Any, itype: Any) -> Any:
    """A model container per twin, generation and input type, kept for the process (the
    per-run state is its session and counters, compared as differences)."""
    import zmq

    from wirekit.clipper.container import ModelContainer

    key = (impl, gen, itype)
    if key not in _CONTAINERS:
        c = ModelContainer(
            None,
            "m",
            "1",
            itype,
            "inproc://unused",
            generation=gen,
            poll_interval=600.0,
            activity_timeout=600.0,
            threaded=False,
            context=_zmq_context(),
        )
        router = _socket(zmq.ROUTER)
        endpoint = _endpoint("container")
        router.bind(endpoint)
        dealer = _socket(zmq.DEALER, identity=b"lane")
        dealer.connect(endpoint)
        _CONTAINERS[key] = (c, router, dealer)
    return _CONTAINERS[key]


def container_trace(impl: str, gen: Any, itype: Any, plan: bytes, messages: list) -> dict:
    import functools
    import importlib
    import time

    from wirekit.clipper._lane import PureLane
    from wirekit.clipper._zio import send_frames
    from wirekit.clipper.session import ContainerSession

    container, router, dealer = _container(impl, gen, itype)
    _drain(dealer)
    _drain(router)
    model = _FuzzModel(plan)
    model.container = container
    container.predict = model
    container.stopping = False
    served, failures = container.served, container.failures
    session = ContainerSession(
        gen,
        container.registration,
        poll_interval=600.0,
        activity_timeout=600.0,
        now=time.monotonic(),
    )
    cls = (
        importlib.import_module("wirekit._fast.clippercontainer").Lane
        if impl == "fast"
        else PureLane
    )
    lane = cls(container, dealer, session, functools.partial(send_frames, dealer))
    for frames in messages:
        router.send_multipart([b"lane", *frames])
    outcomes = []
    try:
        for _ in range(len(messages) + 2):
            outcome_ = lane.run()
            if outcome_ != 1:  # LOOK (its timing is the clock's): the lane serves on
                outcomes.append(outcome_)
                break
    except WirekitError as exc:  # VersionMismatch: the same from both twins
        outcomes.append(describe(exc))
    container.stopping = False
    return {
        "answers": [m[1:] for m in _drain(router)],
        "outcomes": outcomes,
        "seen": model.seen,
        "served": container.served - served,
        "failures": container.failures - failures,
        "requests": session.requests,
        "state": session.state,
    }


def clipper_container(data: bytes) -> None:
    """The model container's compiled lane (``clippercontainer.Lane.run``: the v3 requests it
    reads straight from the received parts into the model's array, the 2017/v3 answers it
    writes from the model's strings) against ``PureLane`` (the codec and
    ``ContainerSession``), over a real inproc ROUTER/DEALER: requests of every type (whole,
    mutated, junk), models answering well and badly; the same answers reach the frontend,
    the model sees the same inputs, the counters and the session end the same."""
    from wirekit import clipper
    from wirekit.clipper import Generation, InputType, PredictRequest

    r = Reader(data)
    cfg = r.byte()
    gen = list(Generation)[cfg % 3]
    itype = list(InputType)[(cfg >> 2) % 5]
    plan = r.take(4)
    messages: list[list[bytes]] = []
    while r.pos < len(data) and len(messages) < 24:
        op = r.byte()
        kind = op % 4
        msg_id = r.byte()
        if kind <= 1:
            t = list(InputType)[(op >> 2) % 5] if op & 0x80 else itype
            rows = 1 + r.below(4)
            inputs: Any
            if t == InputType.STRINGS:
                inputs = [r.take(r.byte() % 8).decode("latin-1") for _ in range(rows)]
            else:
                dtype = {0: np.uint8, 1: np.int32, 2: np.float32, 3: np.float64}[int(t)]
                cols = 1 + r.below(5)
                if op & 0x40:  # unequal lengths
                    inputs = [np.arange(k + 1, dtype=dtype) for k in range(rows)]
                else:
                    n = rows * cols * np.dtype(dtype).itemsize
                    inputs = np.frombuffer(r.take(n).ljust(n, b"\0"), dtype).reshape(rows, cols)
            try:
                frames = clipper.encode(PredictRequest(msg_id, t, inputs), gen)
            except WirekitError:
                continue
            messages.append(_mutate(frames, r) if kind == 1 else frames)
        elif kind == 2:
            messages.append(_frames_from(r))
        else:
            messages.append(
                clipper.encode(clipper.HeartbeatReply(op >> 7), gen)
                if gen != Generation.G2016
                else [b""]
            )
    if itype == InputType.STRINGS:
        stop_inputs: Any = ["s"] * _STOP_ROWS
    else:
        dtype = {0: np.uint8, 1: np.int32, 2: np.float32, 3: np.float64}[int(itype)]
        stop_inputs = np.zeros((_STOP_ROWS, 2), dtype)
    messages.append(clipper.encode(PredictRequest(0xFFFF, itype, stop_inputs), gen))
    same(
        "clippercontainer.Lane (compiled vs pure)",
        container_trace("fast", gen, itype, plan, messages),
        container_trace("pure", gen, itype, plan, messages),
    )


# --- multipart send/receive on libzmq (wirekit._fast.zio) ------------------------------------


def _zio_frame(kind: int, raw: bytes) -> Any:
    if kind == 0:
        return raw
    if kind == 1:
        return bytearray(raw)
    if kind == 2:
        return memoryview(raw)
    if kind == 3:
        return np.frombuffer(raw.ljust(8 * ((len(raw) + 7) // 8), b"\0"), np.uint8)
    if kind == 4:
        return memoryview(raw)[::2]  # not contiguous: ValueError
    if kind == 5:
        return raw.decode("latin-1")  # not bytes-like: TypeError
    return np.frombuffer(raw[: len(raw) // 4 * 4] or bytes(4), np.float32)


def zio_frames(data: bytes) -> None:
    """``send_frames`` / ``recv_frames`` / ``recv_message`` of the compiled twin (straight on
    libzmq) against pyzmq's (``wirekit.clipper._zio``), each sending to the other over a real
    inproc pair: the same frames arrive, the same errors (class and text) for frames that
    are not bytes-like or not contiguous, and nothing half-sent."""
    import importlib

    import zmq

    from wirekit.clipper import _zio

    fast = importlib.import_module("wirekit._fast.zio")
    r = Reader(data)
    batches = []
    while r.pos < len(data) and len(batches) < 16:
        kinds = r.byte()
        frames = [
            _zio_frame((kinds >> (k % 4)) % 7 if kinds & 0x80 else k % 3, r.take(r.byte()))
            for k in range(r.below(9))
        ]
        batches.append((frames, kinds & 1))
    if "zio" not in _ZMQ:  # one pair for the process: closed sockets are reaped lazily
        a = _socket(zmq.PAIR, rcvtimeo=0)
        b = _socket(zmq.PAIR, rcvtimeo=0)
        endpoint = _endpoint("zio")
        a.bind(endpoint)
        b.connect(endpoint)
        _ZMQ["zio"] = (a, b)
    a, b = _ZMQ["zio"]
    _drain(b)
    for frames, how in batches:
        results = []
        for send, recv in ((fast, _zio), (_zio, fast)):
            sent = outcome(lambda s=send, f=frames: s.send_frames(a, f), _ARG_ERRORS)
            if how:
                got = outcome(lambda v=recv: v.recv_frames(b, zmq.NOBLOCK), (zmq.Again,))
            else:
                got = outcome(lambda v=recv: v.recv_message(b, False, 0.0))
            results.append((sent, got))
        same("zio send/receive (compiled sends vs pure sends)", results[0], results[1])


# --- the encoders ----------------------------------------------------------------------------


def _text_from(r: Reader, limit: int = 24) -> Any:
    """A str (sometimes with a lone surrogate, sometimes not ASCII), bytes, or an int, as the
    input chooses: the names and outputs an encoder is given."""
    kind = r.byte() % 8
    raw = r.take(r.byte() % limit)
    if kind <= 3:
        return raw.decode("latin-1")
    if kind == 4:
        return raw.decode("utf-8", "surrogateescape")  # lone surrogates: not encodable
    if kind == 5:
        return raw
    if kind == 6:
        return raw.decode("latin-1") * 12  # long
    return int.from_bytes(raw[:2], "big")


def _built(make: Callable[[], Any]) -> Any:
    """A message built from the input, or None when its constructor refuses the values."""
    try:
        return make()
    except (WirekitError, *_ARG_ERRORS):
        return None


def _frame_bytes(frames: Any) -> list[bytes]:
    """An encoder's frames as bytes (the codecs may return buffers of other types)."""
    return [f if type(f) is bytes else memoryview(f).tobytes() for f in frames]


def _mip_encode(r: Reader, rest: bytes) -> None:
    from wirekit.mip import ErrorReply, Inference, Item, Ping

    pure = twin("mip", "pure")
    try:
        msg, _end = pure.decode_prefix(rest, 0)
    except DecodeError:
        msg = None
    if msg is not None:
        wire = differential("mip.encode(decoded)", "mip", lambda c: c.encode(msg))
        if wire[0] == "ok":
            again = pure.decode(wire[1][1])
            same("mip decode(encode(decoded))", snapshot(again), snapshot(msg))
    # a message built from the input, often invalid
    kind = r.byte() % 4
    built: Any
    if kind == 0:
        built = _built(lambda: Ping(bool(r.byte() & 1)))
    elif kind == 1:
        code = r.byte() % 8
        built = _built(lambda: ErrorReply(code))
    else:
        n_input, n_output, batch = r.byte() % 4, r.byte() % 4, r.byte() % 4
        items = []
        for _ in range(r.byte() % 10):
            t = r.byte()
            data = r.take(r.byte() % 16)
            form = t >> 5
            value: Any = (
                data
                if form <= 2
                else bytearray(data)
                if form == 3
                else memoryview(data)
                if form == 4
                else data.decode("latin-1")
                if form == 5
                else np.frombuffer(data[: len(data) // 4 * 4], np.float32)
                if form == 6
                else len(data)
            )
            items.append(Item(t % 6, value) if t & 0x10 else Item(1 + t % 3, value))
        built = _built(lambda: Inference(bool(kind & 1), n_input, n_output, batch, tuple(items)))
    if built is not None:
        differential("mip.encode(built)", "mip", lambda c: c.encode(built), _ARG_ERRORS)


def _clipper_encode(r: Reader, rest: bytes) -> None:
    from wirekit import clipper
    from wirekit.clipper import (
        Heartbeat,
        HeartbeatReply,
        NewContainer,
        PredictRequest,
        PredictResponse,
    )

    pure = twin("clipper", "pure")
    frames = clipper_frames(rest)
    for gen in GENERATIONS:
        for direction in DIRECTIONS:
            try:
                msg = pure.decode(frames, gen, direction)
            except DecodeError:
                continue
            wire = differential(
                f"clipper.encode(decoded, {gen})",
                "clipper",
                lambda c, m=msg, g=gen: _frame_bytes(c.encode(m, g)),
            )
            if wire[0] == "ok":
                again = pure.decode(_frame_bytes(pure.encode(msg, gen)), gen, direction)
                if not clipper.same_message(again, msg):
                    raise Disagreement(f"clipper {gen}: decode(encode(m)) != m for {msg!r}")
    gen = GENERATIONS[r.byte() % 3]
    kind = r.byte() % 5
    built: Any
    if kind == 0:
        n = 1 + r.below(4)
        itype = r.byte() % 6
        inputs = _front_inputs(r.byte() % 9, n, r)
        msg_id, rtype = (r.byte() << 24) | r.byte(), r.byte() % 3
        built = _built(lambda: PredictRequest(msg_id, itype, inputs, rtype))
    elif kind == 1:
        outputs: list = [_text_from(r) for _ in range(r.byte() % 6)]
        if r.byte() & 1:
            outputs = [float(len(str(o))) for o in outputs]
        msg_id = r.byte() << 26
        built = _built(lambda: PredictResponse(msg_id, outputs))
    elif kind == 2:
        rpc = (None, 3, 2)[r.byte() % 3]
        name, version, itype = _text_from(r), _text_from(r), r.byte() % 6
        built = _built(lambda: NewContainer(name, version, itype, rpc))
    elif kind == 3:
        hb = r.byte() % 3
        built = _built(lambda: HeartbeatReply(hb))
    else:
        built = Heartbeat()
    if built is not None:
        differential(
            f"clipper.encode(built, {gen})",
            "clipper",
            lambda c: _frame_bytes(c.encode(built, gen)),
            _ARG_ERRORS,
        )


def _y2_encode(r: Reader, rest: bytes) -> None:
    from wirekit.y2 import Delta, Finished, NodeIndex, Runtime

    pure = twin("y2", "pure")
    try:
        msg, _end = pure.decode_prefix(rest, 0)
    except DecodeError:
        msg = None
    if msg is not None:
        wire = differential("y2.encode(decoded)", "y2", lambda c: c.encode(msg))
        if wire[0] == "ok":
            same("y2 decode(encode(decoded))", snapshot(pure.decode(wire[1][1])), snapshot(msg))
    kind = r.byte() % 4
    built: Any
    if kind == 0:
        node_id, node_count = r.byte() - 8, r.byte() - 8
        built = _built(lambda: NodeIndex(node_id, node_count))
    elif kind == 1:
        raw = r.take(4 * r.below(12))
        raw = raw[: len(raw) // 4 * 4]
        form = r.byte() % 4
        words: Any = np.frombuffer(raw, np.uint32)
        if form == 1:
            words = words.tolist()
        elif form == 2:
            words = np.frombuffer(raw, ">u4")
        elif form == 3:
            words = np.frombuffer(raw, np.int64) if len(raw) % 8 == 0 else words[::-1]
        built = _built(lambda: Delta(words))
    elif kind == 2:
        fields = [int.from_bytes(r.take(5), "big") - 16 for _ in range(4)]
        loss = None if r.byte() & 1 else r.byte() - 100
        built = _built(lambda: Runtime(*fields, loss))
    else:
        built = Finished()
    if built is not None:
        differential("y2.encode(built)", "y2", lambda c: c.encode(built), _ARG_ERRORS)


def _zmtp_encode(r: Reader, rest: bytes) -> None:
    out = []
    mech, as_server = _text_from(r), bool(r.byte() & 1)
    major, minor = r.byte() % 5 * 100 - 50, r.byte()
    out.append(
        differential(
            "zmtp.encode_greeting",
            "zmtp",
            lambda c: c.encode_greeting(mech, as_server, major, minor),
            _ARG_ERRORS,
        )
    )
    stype, ident = _text_from(r), _text_from(r)
    props = [(_text_from(r), _text_from(r)) for _ in range(r.byte() % 3)]
    if r.byte() % 8 == 0:
        props.append(("x",))  # not a pair
    out.append(
        differential(
            "zmtp.encode_ready",
            "zmtp",
            lambda c: c.encode_ready(stype, ident, props),
            _ARG_ERRORS,
        )
    )
    name, cdata = _text_from(r), _text_from(r, 300)
    out.append(
        differential(
            "zmtp.encode_command", "zmtp", lambda c: c.encode_command(name, cdata), _ARG_ERRORS
        )
    )
    frames = [
        _text_from(r, 300) if r.byte() % 6 == 0 else r.take(r.byte() + r.byte())
        for _ in range(r.byte() % 5)
    ]
    out.append(
        differential("zmtp.encode_message", "zmtp", lambda c: c.encode_message(frames), _ARG_ERRORS)
    )
    # what was encoded decodes (as a client and as a server would read it)
    wire = b"".join(o[1][1] for o in out if o[0] == "ok")
    differential("zmtp.decode_stream(encoded)", "zmtp", lambda c: c.decode_stream(wire))


def codec_encode(data: bytes) -> None:
    """The encoders of all four codecs, compiled against pure: what the input decodes to is
    encoded again (the same bytes from both, which decode to the same message), and messages
    built from the input -- often invalid: wrong counts, out-of-range numbers, lone
    surrogates, odd buffer types -- encode to the same bytes or fail with the same error.
    The first byte chooses the codec."""
    sel, rest = (data[0] % 4, data[1:]) if data else (0, b"")
    r = Reader(rest[::-1])
    (_mip_encode, _clipper_encode, _y2_encode, _zmtp_encode)[sel](r, rest)


# --- y2's threaded and portable kernels ------------------------------------------------------


def _tile(seed: bytes, n_bytes: int) -> bytes:
    if not seed:
        seed = b"\x01"
    return (seed * (n_bytes // len(seed) + 1))[:n_bytes]


def _large_model(seed: bytes, elems: int, tied: bool) -> list:
    """A model of a few large layers: float32 and float64, a strided view, float16, and
    (``tied``) arrays sharing memory with others (then compressed by one thread, in order)."""
    values = np.frombuffer(_tile(seed, 2 * elems), np.int8).astype(np.float64) / 16
    w32 = values.astype(np.float32)
    w64 = values[: elems // 3].copy()
    strided = np.repeat(values[:2000], 2).astype(np.float32)[::2]
    layers = [(w32, w64), (strided, values[:7].astype(np.float16))]
    if tied:
        layers.append((w32[:100], w64[::-1][:50]))
    return layers


def y2_threads(data: bytes) -> None:
    """``pack``, ``unpack`` and ``compress`` with ``threads=`` 1 to 4 on inputs large enough
    to be split (several ``WORD_CHUNK`` words, several ``ELEMENT_CHUNK`` elements), the
    vector loops on (AVX2, where the CPU has it) and off (``use_avx2(False)``: the portable
    loops): every result the same as the pure twin's, whatever the thread count."""
    fast, pure = both("y2")
    r = Reader(data)
    cfg = r.byte()
    threads = 1 + cfg % 4
    words_n = fast.WORD_CHUNK * (1 + (cfg >> 2) % 3) + r.below(300)
    seed = r.take(64)
    raw = _tile(seed, 4 * words_n)
    words = np.frombuffer(raw, np.uint32).copy()
    old = fast.use_avx2(True)
    try:
        for simd in (True, False):
            fast.use_avx2(simd)
            tag = f"avx2={fast.AVX2}, threads={threads}"
            got = outcome(lambda: fast.unpack(words, threads=threads), _ARG_ERRORS)
            same(f"y2.unpack({tag})", got, outcome(lambda: pure.unpack(words), _ARG_ERRORS))
            fields = pure.unpack(words)
            out = tuple(np.empty_like(f) for f in fields)  # unpack(out=): into the caller's arrays
            got = outcome(lambda o=out: fast.unpack(words, out=o, threads=threads), _ARG_ERRORS)
            want = snapshot(fields)
            same(f"y2.unpack(out=, {tag})", (got, snapshot(out)), (("ok", want), want))
            same(
                f"y2.pack({tag})",
                outcome(lambda f=fields: fast.pack(*f, threads=threads), _ARG_ERRORS),
                outcome(lambda f=fields: pure.pack(*f), _ARG_ERRORS),
            )
            if cfg & 0x40:  # out of range somewhere in one chunk: the same first fault
                bad = [f.copy() for f in fields]
                at = (int.from_bytes(seed[:4].ljust(4, b"\0"), "big")) % len(bad[2])
                field = bad[(cfg >> 4) % 4]
                field[at] = np.iinfo(field.dtype).max if field.dtype.kind in "iu" else 2
                same(
                    f"y2.pack(bad, {tag})",
                    outcome(lambda b=bad: fast.pack(*b, threads=threads), _ARG_ERRORS),
                    outcome(lambda b=bad: pure.pack(*b), _ARG_ERRORS),
                )
            # a model of a few large layers: float32 and float64, strided, tied
            elems = fast.ELEMENT_CHUNK + r.below(5000)
            tau = _TAUS[r.below(len(_TAUS))]
            for what, nthreads in (("compress", threads), ("compress(default threads)", None)):
                results = []
                for codec in (fast, pure):
                    m = _large_model(seed, elems, bool(cfg & 0x20))
                    kwargs = {"threads": nthreads} if codec is fast and nthreads else {}
                    res = outcome(
                        lambda c=codec, mm=m, kw=kwargs, t=tau: c.compress(mm, t, **kw), _ARG_ERRORS
                    )
                    results.append((res, _model_snapshot(m)))
                same(f"y2.{what}({tag})", results[0], results[1])
    finally:
        fast.use_avx2(old)


# --- OIP -------------------------------------------------------------------------------------

_OIP_TYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
    "FP8",
    "BYTES",
)
_OIP_HUGE_DIMS = (2**31, 2**32 + 1, 2**62, 2**63 - 1, 2**63, 2**64, -1, 10**12)


def _oip_buffer(raw: bytes, kind: int) -> Any:
    return bytearray(raw) if kind == 1 else memoryview(raw) if kind == 2 else raw


def _oip_request(r: Reader) -> Any:
    """An OIP request the reader spells: up to 4 inputs of any datatype (or an unknown one),
    shapes small or huge, data of the right size or not, BYTES framed well or not, names of
    any code points, parameters JSON or not."""
    from wirekit import oip

    inputs = []
    for _ in range(r.below(5)):
        name = r.take(r.below(8)).decode("latin-1")
        if r.byte() & 1:
            name += "\ud800\u00e9"
        datatype = _OIP_TYPES[r.below(len(_OIP_TYPES))]
        dims = []
        for _ in range(r.below(5)):
            b = r.byte()
            dims.append(_OIP_HUGE_DIMS[b % 8] if b >= 250 else b % 5)
        count = 1
        for d in dims:
            count *= d
        how = r.byte()
        size = oip.DATATYPES.get(datatype, oip.DATATYPES["INT8"]).size
        if datatype == "BYTES" and how % 4 != 3 and 0 <= count <= 16:
            elements = [r.take(r.below(6)) for _ in range(count)]
            raw = b"".join(struct.pack("<I", len(e)) + e for e in elements)
        elif how % 4 != 3 and 0 <= count * size <= 256:
            raw = (r.take(count * size) + bytes(count * size))[: count * size]
        else:
            raw = r.take(r.below(64))
        parameters: dict[str, Any] = {}
        if how & 4:
            parameters["p"] = r.byte()
        if how & 8:
            parameters["binary_data_size"] = len(raw)
        if how & 16 and how & 32:
            parameters["bad"] = {1, 2}  # not JSON
        inputs.append(
            oip.Tensor(name, datatype, tuple(dims), _oip_buffer(raw, (how >> 6) % 3), parameters)
        )
    outputs = [oip.RequestedOutput(r.take(r.below(4)).decode("latin-1")) for _ in range(r.below(3))]
    return oip.InferRequest(
        inputs, outputs=outputs, parameters={"q": r.byte()} if r.byte() & 1 else {}
    )


def _oip_reply(rest: bytes) -> Any:
    """The MIP reply ``rest`` decodes to (the pure MIP codec), or else one sample of one TENSOR
    item holding ``rest`` -- so every input reaches the TENSOR item reader."""
    from wirekit import mip
    from wirekit.oip import OipItem

    try:
        msg = twin("mip", "pure").decode(rest)
    except DecodeError:
        msg = None
    if isinstance(msg, mip.Inference):
        return msg
    return mip.Inference.reply([[mip.Item(int(OipItem.TENSOR), rest)]])


def _oip_bytes_walks(req: Any) -> None:
    """The compiled BYTES framing check (behind ``check_tensor``) against the pure walk."""
    from wirekit.oip.tensors import bytes_elements, element_count

    walk = twin("oip", "fast").bytes_framing_ok
    for t in req.inputs:
        if t.datatype != "BYTES" or any(not isinstance(d, int) or d < 0 for d in t.shape):
            continue
        count = element_count(t.shape)
        try:
            for _ in bytes_elements(t.name, t.data, count, "t"):
                pass
            pure = True
        except DecodeError:
            pure = False
        same("oip.bytes_framing_ok", walk(t.data, count), pure)


def oip_mapping(data: bytes) -> None:
    """The OIP mapping's hot path: ``request_to_mip`` of requests the input spells (rows or
    sample rule) and ``response_from_mip`` of replies it holds; when both twins succeed the
    result must also be what the construct spec (wirekit.oip.spec) builds or parses."""
    from wirekit.oip import OipItem, spec

    if not data:
        return
    control, rest = data[0], data[1:]
    rows = bool(control & 1)
    if control & 2:
        req = _oip_request(Reader(rest))
        got = differential("oip.request_to_mip", "oip", lambda c: c.request_to_mip(req, rows=rows))
        if got[0] == "ok":
            same("oip.request_to_mip vs spec", got[1], snapshot(spec.request_wire(req, rows)))
        _oip_bytes_walks(req)
        return
    msg = _oip_reply(rest)
    got = differential(
        "oip.response_from_mip", "oip", lambda c: c.response_from_mip(msg, rows=rows)
    )
    if got[0] == "ok" and not rows:
        parsed = [
            spec.parse_tensor_item(bytes(item.data))
            for item in msg.items
            if item.type == OipItem.TENSOR
        ]
        fast = twin("oip", "fast").response_from_mip(msg)[0]
        same(
            "oip.response_from_mip vs spec",
            snapshot([dataclasses.replace(t, data=bytes(t.data)) for t in fast]),
            snapshot([dataclasses.replace(t, data=bytes(t.data)) for t in parsed]),
        )


TARGETS: dict[str, Callable[[bytes], None]] = {
    "mip_decode": mip_decode,
    "mip_stream": mip_stream,
    "mip_connection": mip_connection,
    "clipper_decode": clipper_decode,
    "y2_decode": y2_decode,
    "y2_stream": y2_stream,
    "y2_kernels": y2_kernels,
    "zmtp_decode": zmtp_decode,
    "zmtp_stream": zmtp_stream,
    "mip_net": mip_net,
    "mip_dump": mip_dump,
    "serve_lane": serve_lane,
    "serve_store": serve_store,
    "clipper_front": clipper_front,
    "clipper_container": clipper_container,
    "zio_frames": zio_frames,
    "codec_encode": codec_encode,
    "y2_threads": y2_threads,
    "oip_mapping": oip_mapping,
}


#: The compiled modules (``wirekit._fast.<name>``) each target drives
#: (tests/test_fuzz_regressions.py checks every module has a target, and that running a
#: target's seeds loads what it names).
COMPILED: dict[str, tuple[str, ...]] = {
    "mip_decode": ("mip",),
    "mip_stream": ("mip",),
    "mip_connection": ("mipconn", "mip"),
    "clipper_decode": ("clipper",),
    "y2_decode": ("y2",),
    "y2_stream": ("y2",),
    "y2_kernels": ("y2",),
    "zmtp_decode": ("zmtp",),
    "zmtp_stream": ("zmtp",),
    "mip_net": ("mipnet", "mip"),
    "mip_dump": ("mipdump", "mip"),
    "serve_lane": ("servelane", "mip"),
    "serve_store": ("journal", "storewriter"),
    "clipper_front": ("clipperfront", "zio", "clipper"),
    "clipper_container": ("clippercontainer", "zio", "clipper"),
    "zio_frames": ("zio",),
    "codec_encode": ("mip", "clipper", "y2", "zmtp"),
    "y2_threads": ("y2",),
    "oip_mapping": ("oip",),
}


def inputs(directory: Any) -> Iterator[tuple[str, bytes]]:
    """``(name, bytes)`` of every file in ``directory`` (a pathlib.Path), sorted."""
    if directory.is_dir():
        for path in sorted(directory.iterdir()):
            if path.is_file() and not path.name.startswith("."):
                yield path.name, path.read_bytes()
