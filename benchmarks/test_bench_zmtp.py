"""ZMTP: read a capture of 1,000 small multipart messages (3 frames each) into messages."""

from __future__ import annotations

import struct

import pytest

from wirekit._fast import zmtp as fast
from wirekit.zmtp import Message, _pure, spec

FRAMES = [[b"", b"req-%04d" % k, struct.pack("<3d", k, k + 0.5, -k)] for k in range(1000)]
WIRE = (
    fast.encode_greeting()
    + fast.encode_ready("DEALER")
    + b"".join(fast.encode_message(f) for f in FRAMES)
)
_LONG = struct.Struct(">Q")


def struct_loop(buf):
    """A plain-Python reader: skip the greeting and READY, then group frames by MORE."""
    pos = 64
    flags = buf[pos]
    pos += 2 + buf[pos + 1] if not flags & 2 else 9 + _LONG.unpack_from(buf, pos + 1)[0]
    messages, frames = [], []
    n = len(buf)
    while pos < n:
        flags = buf[pos]
        if flags & 2:
            size = _LONG.unpack_from(buf, pos + 1)[0]
            pos += 9
        else:
            size = buf[pos + 1]
            pos += 2
        frames.append(buf[pos : pos + size])
        pos += size
        if not flags & 1:
            messages.append(frames)
            frames = []
    return messages


def _frames(who, result):
    if who == "baseline":
        return result
    return [list(e.frames) for _, e in result if isinstance(e, Message)]


@pytest.mark.benchmark(group="zmtp read 1000 messages x 3 frames")
@pytest.mark.parametrize("who", ["fast", "construct", "baseline"])
def test_read_stream(benchmark, who):
    run = {
        "fast": lambda: fast.decode_stream(WIRE),
        "construct": lambda: _pure.events_from_container(spec.STREAM.parse(WIRE)),
        "baseline": lambda: struct_loop(WIRE),
    }[who]
    assert _frames(who, benchmark(run)) == FRAMES
