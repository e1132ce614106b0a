"""ZMTP: read a capture of 1,000 small multipart messages (3 frames each) into messages; feed
one long multipart message to a StreamReader whole and cut up."""

from __future__ import annotations

import struct

import pytest

from wirekit._fast import zmtp as fast
from wirekit.zmtp import Message, StreamReader, _pure, spec

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


# --- StreamReader: one long multipart message, cut up (wirekit issue 13, defect 6) ----------
#
# A message of N empty frames (2 bytes each), fed to a StreamReader whole, in TCP-segment-sized
# chunks, in 64-byte chunks and byte by byte.  `ratios.py` shows each as a multiple of feeding
# it whole.  The reader used to re-parse the unfinished message from its first frame on every
# feed (O(N^2) byte by byte); now every cutting is linear, so the multiples stay put from 2,000
# to 20,000 frames instead of growing tenfold.

_CUTS = {"whole": None, "chunks-1460": 1460, "chunks-64": 64, "byte-by-byte": 1}


def _long_message(frames: int) -> bytes:
    return (
        fast.encode_greeting() + fast.encode_ready("DEALER") + fast.encode_message([b""] * frames)
    )


def _feed(codec, wire: bytes, step: int | None) -> int:
    reader = StreamReader(codec=codec)
    if step is None:
        reader.feed(wire)
    else:
        for k in range(0, len(wire), step):
            reader.feed(wire[k : k + step])
    reader.close()
    return len([e for _, e in reader][-1].frames)


@pytest.mark.benchmark(group="zmtp StreamReader: one message of N empty frames")
@pytest.mark.parametrize("frames", [2_000, 20_000])
@pytest.mark.parametrize("impl", ["fast", "pure"])
@pytest.mark.parametrize("who", list(_CUTS))
def test_feed_long_message(benchmark, who, impl, frames):
    codec = fast if impl == "fast" else _pure
    wire = _long_message(frames)
    assert benchmark(_feed, codec, wire, _CUTS[who]) == frames
