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
    """Map each word onto an address the model has (when it has any), keeping its sign."""
    targets = [
        (k, w, a.size)
        for k, pair in enumerate(model)
        for w, a in ((1, pair[0]), (0, pair[1]))
        if a.size
    ]
    if not targets:
        return words
    out = []
    for word in words.tolist():
        k, w, size = targets[(word >> 22) % len(targets)]
        out.append((k << 23) | (w << 22) | ((((word >> 1) & 0x1FFFFF) % size) << 1) | (word & 1))
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
}


def inputs(directory: Any) -> Iterator[tuple[str, bytes]]:
    """``(name, bytes)`` of every file in ``directory`` (a pathlib.Path), sorted."""
    if directory.is_dir():
        for path in sorted(directory.iterdir()):
            if path.is_file() and not path.name.startswith("."):
                yield path.name, path.read_bytes()
