# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython twin of ``wirekit.zmtp._pure``: same functions, same results, same errors."""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.list cimport PyList_Append
from cpython.object cimport PyObject_GenericSetAttr
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcpy, memset


cdef extern from "Python.h":
    object PyType_GenericAlloc(type t, Py_ssize_t n)
    const Py_ssize_t PY_SSIZE_T_MAX

from wirekit._encoding import checked_int, contiguous_bytes
from wirekit.errors import DecodeError, EncodeError
from wirekit.zmtp.messages import IDENTITY_SOCKETS, Command, Greeting, Message, Ready

DEF GREETING_SIZE = 64
DEF FLAG_MORE = 0x01
DEF FLAG_LONG = 0x02
DEF FLAG_COMMAND = 0x04
DEF FLAGS_RESERVED = 0xF8
DEF PHASE_GREETING = 0
DEF PHASE_HANDSHAKE = 1
DEF PHASE_TRAFFIC = 2
DEF U32_MAX = 0xFFFFFFFF

cdef type _MESSAGE_TYPE = Message
cdef str _FRAMES = "frames"


cdef inline object _new_message(tuple frames):
    """A ``Message`` built through its slot, skipping the frozen dataclass ``__init__``."""
    cdef object msg = PyType_GenericAlloc(_MESSAGE_TYPE, 0)
    PyObject_GenericSetAttr(msg, _FRAMES, frames)
    return msg


cdef object _fail(str field, Py_ssize_t offset, str text):
    return DecodeError("zmtp", field, offset, text)


cdef inline uint64_t _be64(const uint8_t* p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int k
    for k in range(8):
        v = (v << 8) | p[k]
    return v


cdef inline unsigned int _be32(const uint8_t* p) noexcept nogil:
    return (<unsigned int>p[0] << 24) | (<unsigned int>p[1] << 16) | (<unsigned int>p[2] << 8) | p[3]


cdef object _check_greeting(const uint8_t* v, Py_ssize_t n, Py_ssize_t pos, bint final):
    cdef Py_ssize_t have = n - pos, k, name_len
    cdef const uint8_t* g = v + pos
    if have >= 1 and g[0] != 0xFF:
        raise _fail("signature", pos,
                    f"not a ZMTP greeting: byte 0 is 0x{g[0]:02x}, expected 0xff")
    if have >= 10 and g[9] != 0x7F:
        raise _fail("signature", pos + 9,
                    f"not a ZMTP 3 greeting: byte 9 is 0x{g[9]:02x}, expected 0x7f")
    if have >= 11 and g[10] != 3:
        raise _fail("version", pos + 10,
                    f"unsupported ZMTP major version {g[10]}: only 3 (ZMTP 3.0/3.1) is supported")
    if have >= 32:
        name_len = 0
        while name_len < 20 and g[12 + name_len] != 0:
            name_len += 1
        if not (name_len == 4 and g[12] == b'N' and g[13] == b'U' and g[14] == b'L'
                and g[15] == b'L'):
            name = PyBytes_FromStringAndSize(<const char*>g + 12, name_len).decode("latin-1")
            raise _fail("mechanism", pos + 12,
                        f"unsupported security mechanism {name!r}: only NULL is supported")
        for k in range(4, 20):
            if g[12 + k] != 0:
                raise _fail("mechanism", pos + 12 + k, "bytes after the name must be NUL")
    if have >= 33 and g[32] > 1:
        raise _fail("as-server", pos + 32, f"must be 0 or 1, got {g[32]}")
    if have < GREETING_SIZE:
        if final:
            raise _fail("greeting", n, f"truncated: need {GREETING_SIZE} bytes, have {have}")
        return None
    return Greeting(g[10], g[11], "NULL", g[32] == 1)


cdef object _command(const uint8_t* b, Py_ssize_t size, Py_ssize_t at, int phase):
    cdef Py_ssize_t q, i = 0, klen
    cdef unsigned int vlen
    cdef list props
    if size == 0:
        raise _fail("command name", at, "empty command: no name")
    if b[0] > size - 1:
        raise _fail("command name", at,
                    f"length {b[0]} exceeds the {size - 1} bytes left in the command")
    name = PyBytes_FromStringAndSize(<const char*>b + 1, b[0]).decode("latin-1")
    q = 1 + b[0]
    if phase == PHASE_HANDSHAKE and name != "READY" and name != "ERROR":
        raise _fail("command", at + 1, f"expected READY (NULL mechanism), got {name!r}")
    if name != "READY":
        return Command(name, PyBytes_FromStringAndSize(<const char*>b + q, size - q))
    props = []
    while q < size:
        klen = b[q]
        if klen > size - q - 1:
            raise _fail(f"properties[{i}].name", at + q,
                        f"length {klen} exceeds the {size - q - 1} bytes left in the command")
        key = PyBytes_FromStringAndSize(<const char*>b + q + 1, klen).decode("latin-1")
        q += 1 + klen
        if size - q < 4:
            raise _fail(f"properties[{i}].value", at + q,
                        f"truncated length: need 4 bytes, {size - q} left in the command")
        vlen = _be32(b + q)
        if vlen > size - q - 4:
            raise _fail(f"properties[{i}].value", at + q,
                        f"length {vlen} exceeds the {size - q - 4} bytes left in the command")
        q += 4
        props.append((key, PyBytes_FromStringAndSize(<const char*>b + q, vlen)))
        q += vlen
        i += 1
    return Ready(tuple(props))


cdef struct Scan:
    Py_ssize_t pos      # just past the last complete event, or the last frame kept pending
    Py_ssize_t msg      # offset of the unfinished message's first frame (Pending.start)
    Py_ssize_t need     # bytes from pos the next call needs (Pending.need)
    uint64_t total      # body bytes of the unfinished message's frames (Pending.size)
    int phase


cdef struct Limits:
    bint frame_limited, frames_limited, total_limited
    uint64_t max_frame, max_total
    Py_ssize_t max_frames


cdef inline Py_ssize_t _need(Py_ssize_t have, uint64_t more) noexcept:
    """``have + more``, at most PY_SSIZE_T_MAX (the pure twin's ``sys.maxsize``)."""
    if more > <uint64_t>(PY_SSIZE_T_MAX - have):
        return PY_SSIZE_T_MAX
    return have + <Py_ssize_t>more


cdef int _decode_into(list events, Scan* s, list frames, bint keep, const uint8_t* v,
                      Py_ssize_t n, bint final, Limits* lim) except -1:
    """Append complete events to ``events``; ``s.pos``/``s.phase`` after the last one (or
    after the last frame kept in ``frames`` when ``keep``: the Pending's list)."""
    cdef Py_ssize_t p, head, start, nframes, msg
    cdef int phase
    cdef uint8_t flags
    cdef uint64_t size, total
    cdef bint command
    cdef object frame, greeting, whole
    if s.phase == PHASE_GREETING:
        greeting = _check_greeting(v, n, s.pos, final)
        if greeting is None:
            s.need = n - s.pos + 1
            return 0
        PyList_Append(events, (s.pos, greeting))
        s.pos += GREETING_SIZE
        s.phase = PHASE_HANDSHAKE
    phase = s.phase
    nframes = 0 if frames is None else len(frames)
    msg = s.msg if nframes else s.pos
    total = s.total if nframes else 0
    p = s.pos
    while True:
        if p >= n:
            if nframes and final:  # the previous frame had MORE set
                raise _fail("message", n,
                            f"stream ends inside a multipart message: frame {nframes - 1} "
                            "has MORE set")
            s.need = p - s.pos + 1
            return 0
        flags = v[p]
        if flags & FLAGS_RESERVED:
            raise _fail("flags", p, f"reserved bits set in flags 0x{flags:02x}")
        command = (flags & FLAG_COMMAND) != 0
        if command:
            if flags & FLAG_MORE:
                raise _fail("flags", p, "command frame with MORE set")
            if nframes:
                raise _fail("flags", p, "command frame inside a multipart message")
        elif phase == PHASE_HANDSHAKE:
            raise _fail("flags", p, "expected the READY command, got a message frame")
        elif lim.frames_limited and nframes >= lim.max_frames:
            raise _fail("message", p,
                        f"multipart message of more than {lim.max_frames} frames (the limit)")
        head = 9 if flags & FLAG_LONG else 2
        if n - p < head:
            if final:
                raise _fail("frame", n,
                            f"truncated: frame header needs {head} bytes, {n - p} present")
            s.need = p - s.pos + head
            return 0
        size = _be64(v + p + 1) if flags & FLAG_LONG else v[p + 1]
        if lim.frame_limited and size > lim.max_frame:
            raise _fail("size", p + 1,
                        f"frame of {size} bytes exceeds the limit of {lim.max_frame}")
        if (not command and lim.total_limited
                and (total > lim.max_total or size > lim.max_total - total)):
            whole = <object>total + <object>size  # may not fit in 64 bits
            raise _fail("size", p + 1,
                        f"multipart message of {whole} bytes exceeds the limit of "
                        f"{lim.max_total}")
        start = p + head
        if size > <uint64_t>(n - start):
            if final:
                raise _fail("frame", n,
                            f"truncated: size announces {size} bytes, {n - start} present")
            s.need = _need(p - s.pos + head, size)
            return 0
        if command:
            PyList_Append(events, (p, _command(v + start, <Py_ssize_t>size, start, phase)))
            p = start + <Py_ssize_t>size
            phase = PHASE_TRAFFIC
            msg = p
            s.pos = p
            s.phase = phase
            continue
        frame = PyBytes_FromStringAndSize(<const char*>v + start, <Py_ssize_t>size)
        p = start + <Py_ssize_t>size
        if not flags & FLAG_MORE:
            if nframes == 0:
                PyList_Append(events, (msg, _new_message((frame,))))
            else:
                frames.append(frame)
                PyList_Append(events, (msg, _new_message(tuple(frames))))
                del frames[:]
                nframes = 0
                total = 0
            msg = p
            s.pos = p
            continue
        if frames is None:  # only without a Pending: a list for this call
            frames = []
        frames.append(frame)
        nframes += 1
        total += size
        if keep:  # keep the frame: the next call resumes after it
            s.msg = msg
            s.total = total
            s.pos = p


cdef int _check_limit(str name, object value) except -1:
    if value is not None and value < 0:
        raise ValueError(f"{name} must be >= 0")
    return 0


def decode_events(buf, Py_ssize_t pos=0, int phase=PHASE_GREETING, bint final=True,
                  max_frame_size=None, *, max_message_frames=None, max_message_size=None,
                  pending=None):
    """Decode every complete event in ``buf`` from ``pos``: ``(events, pos, phase, error)``."""
    cdef Py_buffer view
    cdef Scan s
    cdef Limits lim
    cdef list events = []
    cdef list frames = None
    cdef object error = None
    _check_limit("max_frame_size", max_frame_size)
    _check_limit("max_message_frames", max_message_frames)
    _check_limit("max_message_size", max_message_size)
    if pos < 0:
        raise IndexError(f"position {pos} is negative")
    lim.frame_limited = max_frame_size is not None
    lim.max_frame = max_frame_size if lim.frame_limited else 0
    lim.frames_limited = max_message_frames is not None
    lim.max_frames = max_message_frames if lim.frames_limited else 0
    lim.total_limited = max_message_size is not None
    lim.max_total = max_message_size if lim.total_limited else 0
    s.pos = pos
    s.phase = phase
    s.msg = 0
    s.total = 0
    s.need = 1
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if pos > view.len:
            raise IndexError(f"position {pos} outside a buffer of {view.len} bytes")
        if pending is not None:
            frames = pending.frames
            if frames and phase != PHASE_TRAFFIC:
                raise ValueError("a pending multipart message needs phase 2 (traffic)")
            s.msg = pending.start
            s.total = pending.size
            s.need = pending.need
        try:
            _decode_into(events, &s, frames, pending is not None, <const uint8_t*>view.buf,
                         view.len, final, &lim)
        except DecodeError as exc:
            error = exc
    finally:
        PyBuffer_Release(&view)
    if pending is not None:
        pending.start = s.msg
        pending.size = s.total
        if error is None:
            pending.need = s.need
    return events, s.pos, s.phase, error


def decode_stream(buf, max_frame_size=None):
    """Decode a whole capture (greeting first); return its ``(offset, event)`` pairs."""
    events, _pos, _phase, error = decode_events(buf, 0, PHASE_GREETING, True, max_frame_size)
    if error is not None:
        raise error
    return events


# --- encoding -------------------------------------------------------------------------------


cdef bytes _as_bytes(object data, str field):
    if type(data) is bytes:
        return data
    return contiguous_bytes("zmtp", data, field).tobytes()


cdef bytes _short_text(object value, str field, Py_ssize_t top):
    if not isinstance(value, str):
        raise EncodeError("zmtp", field, f"expected a str, got {type(value).__name__}")
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:
        raise EncodeError("zmtp", field, "must be Latin-1 text") from None
    if len(raw) > top:
        raise EncodeError("zmtp", field, f"{len(raw)} bytes is longer than {top}")
    return raw


cdef int _int_in(object value, str field, int top) except -1:
    return checked_int("zmtp", value, field, top)


def encode_greeting(mechanism="NULL", as_server=False, major=3, minor=1):
    """The 64-byte greeting (padding as libzmq writes it)."""
    cdef bytes mech = _short_text(mechanism, "mechanism", 20)
    cdef int ma = _int_in(major, "major", 255), mi = _int_in(minor, "minor", 255)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, GREETING_SIZE)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    memset(o, 0, GREETING_SIZE)
    o[0] = 0xFF
    o[8] = 0x01
    o[9] = 0x7F
    o[10] = ma
    o[11] = mi
    memcpy(o + 12, PyBytes_AS_STRING(mech), len(mech))
    o[32] = 1 if as_server else 0
    return out


cdef Py_ssize_t _put_frame_head(uint8_t* o, int flags, Py_ssize_t size) noexcept:
    cdef int k
    if size > 255:
        o[0] = flags | FLAG_LONG
        for k in range(8):
            o[8 - k] = (<uint64_t>size >> (8 * k)) & 0xFF
        return 9
    o[0] = flags
    o[1] = <uint8_t>size
    return 2


cdef bytes _frame(int flags, bytes body):
    cdef Py_ssize_t size = len(body)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size + (9 if size > 255 else 2))
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    cdef Py_ssize_t h = _put_frame_head(o, flags, size)
    memcpy(o + h, PyBytes_AS_STRING(body), size)
    return out


def encode_command(name, data=b""):
    """One command frame: ``name`` (Latin-1, up to 255 bytes) and its raw ``data``."""
    cdef bytes raw = _short_text(name, "name", 255)
    cdef bytes payload = _as_bytes(data, "data")
    return _frame(FLAG_COMMAND, bytes((len(raw),)) + raw + payload)


def encode_ready(socket_type, identity=b"", properties=()):
    """The NULL mechanism's READY command frame (Socket-Type, Identity, then ``properties``)."""
    cdef bytes stype = _short_text(socket_type, "socket_type", U32_MAX)
    cdef bytes ident = _as_bytes(identity, "identity")
    cdef list parts = [b"\x05READY", b"\x0bSocket-Type", len(stype).to_bytes(4, "big"), stype]
    if socket_type in IDENTITY_SOCKETS or ident:
        parts += [b"\x08Identity", len(ident).to_bytes(4, "big"), ident]
    for i, pair in enumerate(properties):
        pair = tuple(pair)
        if len(pair) != 2:
            raise EncodeError("zmtp", f"properties[{i}]", "expected a (name, value) pair")
        key = _short_text(pair[0], f"properties[{i}].name", 255)
        value = _as_bytes(pair[1], f"properties[{i}].value")
        if len(value) > U32_MAX:
            raise EncodeError("zmtp", f"properties[{i}].value", "longer than 4 GiB - 1")
        parts += [bytes((len(key),)), key, len(value).to_bytes(4, "big"), value]
    return _frame(FLAG_COMMAND, b"".join(parts))


def encode_message(frames):
    """One multipart message: MORE on every frame but the last, LONG above 255 bytes."""
    cdef list bodies = [_as_bytes(f, f"frames[{i}]") for i, f in enumerate(frames)]
    cdef Py_ssize_t i, n = len(bodies), total = 0, size, p = 0
    cdef bytes body, out
    cdef uint8_t* o
    if n == 0:
        raise EncodeError("zmtp", "frames", "a message has at least one frame")
    for body in bodies:
        size = len(body)
        total += size + (9 if size > 255 else 2)
    out = PyBytes_FromStringAndSize(NULL, total)
    o = <uint8_t*>PyBytes_AS_STRING(out)
    for i in range(n):
        body = bodies[i]
        size = len(body)
        p += _put_frame_head(o + p, FLAG_MORE if i < n - 1 else 0, size)
        memcpy(o + p, PyBytes_AS_STRING(body), size)
        p += size
    return out
