"""Seed inputs for every fuzz target, from the golden vectors (specs/vectors) and the samples.

    python fuzz/seeds.py OUTDIR      # writes OUTDIR/<target>/<name> for every target

Each seed is in the target's own input format (see fuzz/differential.py): a stream target's input
starts with its chunking plan, a Clipper input spells frames, a ZMTP decode input starts with
a control byte.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
from differential import TARGETS, frames_input

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "specs" / "vectors"
SAMPLES = ROOT / "samples"

#: chunking plans put in front of a stream: whole, 1-byte chunks, mixed sizes and feed types
_PLANS = (b"\x00", b"\x01\x00", b"\x03\x07\x42\x85")


def _bins(proto: str) -> dict[str, bytes]:
    return {p.stem: p.read_bytes() for p in sorted((VECTORS / proto).glob("*.bin"))}


def _streams(messages: dict[str, bytes], sample: str) -> dict[str, bytes]:
    """Stream seeds: every vector alone, all of them concatenated, and the sample capture."""
    joined = b"".join(messages.values())
    streams = {**messages, "all-vectors": joined}
    path = SAMPLES / sample
    if path.exists():
        streams[path.stem] = path.read_bytes()
    return {
        f"{name}-plan{k}": plan + data
        for name, data in streams.items()
        for k, plan in enumerate(_PLANS)
    }


def _clipper() -> dict[str, bytes]:
    out = {}
    for path in sorted((VECTORS / "clipper").glob("*.json")):
        frames = [bytes.fromhex(h) for h in json.loads(path.read_text())["frames_hex"]]
        out[path.stem] = frames_input(frames)
    return out


def _zmtp_streams() -> dict[str, bytes]:
    from wirekit.zmtp import _pure as z

    handshake = z.encode_greeting() + z.encode_ready("DEALER", b"id")
    out = {
        "handshake": handshake,
        "messages": handshake + z.encode_message([b"", b"hello"]) + z.encode_message([b"x" * 300]),
        "command": handshake + z.encode_command("PING", b"\x00\x01"),
        "server": z.encode_greeting(as_server=True) + z.encode_ready("ROUTER"),
    }
    for path in sorted(SAMPLES.glob("clipper-*.bin")):
        out[path.stem] = path.read_bytes()[:4096]
    return out


def _y2_kernels() -> dict[str, bytes]:
    vectors = json.loads((VECTORS / "y2" / "words.json").read_text())
    values = [int(v["word"], 16) for v in vectors]
    wire = np.array(values, dtype=">u4").tobytes()
    n = len(values) % 48
    model = bytes([3, 0x08, 0x10, 4, 1, 2, 3, 4, 0x11, 0x28, 6, 0x47, 1, 0x05, 2])
    return {
        "vector-words": bytes([0, n]) + wire[: 4 * n] + bytes(16 * n) + model,
        "valid-words": bytes([0, 3]) + bytes(12) + bytes(48) + model + b"\x01",
        "many-layers": bytes([0x80, 2]) + bytes(8) + bytes(32) + b"\x80\x05" + bytes(64),
        "tied": bytes([0, 4])
        + b"\x00\x00\x00\x02" * 4
        + bytes(64)
        + bytes([2, 0x00, 6, 1, 2, 3, 4, 5, 6, 0x07, 0x07, 0x00, 0x01]),
    }


def _connection_programs(messages: dict[str, bytes]) -> dict[str, bytes]:
    """Programs (``differential.connection_program``) that feed each vector, all of them in
    reads of a few sizes (as one-call reads too), and the sample session, taking the events
    and sending after each read."""

    def program(limits: int, in_flight: int, stream: bytes, size: int, one_call: bool) -> bytes:
        out = bytearray([limits, in_flight])
        for at in range(0, len(stream), size):
            chunk = stream[at : at + size]
            out += bytes([0x80 if one_call else 0x00, len(chunk) - 1]) + chunk
            out += bytes([3, 6])  # events, send
        return bytes(out)

    joined = b"".join(messages.values())
    out = {name: program(0, 4, data[:256], 256, True) for name, data in messages.items()}
    for k, size in enumerate((256, 7, 61)):
        out[f"all-vectors-{size}"] = program(k, k + 1, joined, size, k == 0)
    path = SAMPLES / "mip-session.bin"
    if path.exists():
        out["mip-session"] = program(0, 5, path.read_bytes()[:4096], 200, False)
    return out


def _responses(mip: dict[str, bytes]) -> dict[str, bytes]:
    """The inference vectors as responses (subtype 1), as a backend sends them back."""
    out = {}
    for name, wire in mip.items():
        if not name.startswith("bad") and wire[1] == 2:
            out[name] = wire[:2] + b"\x01" + wire[3:]
    return out


def _mip_net(mip: dict[str, bytes]) -> dict[str, bytes]:
    """``ctrl`` (calls waiting, reply size limit), the waiting calls' done flags, replies."""
    replies = _responses(mip)
    joined = b"".join(replies.values())
    out = {f"{name}-1-call": b"\x01\x00" + wire for name, wire in replies.items()}
    out["all-replies-7-calls"] = b"\x07" + bytes([0, 1, 0, 0, 0, 1, 0]) + joined
    out["all-replies-small-limit"] = b"\x0f" + bytes(7) + joined
    out["vectors"] = b"\x05" + bytes(5) + b"".join(mip.values())
    return out


def _mip_dump(mip: dict[str, bytes]) -> dict[str, bytes]:
    out = {f"{name}": b"\x00" + wire for name, wire in mip.items()}
    out["all-vectors"] = b"\x00" + b"".join(mip.values())
    out["all-vectors-cut"] = b"\x93" + b"".join(mip.values())
    path = SAMPLES / "mip-session.bin"
    if path.exists():
        out["mip-session"] = b"\x00" + path.read_bytes()[:4000]
    return out


def _serve_lane(mip: dict[str, bytes]) -> dict[str, bytes]:
    """Programs (``differential.lane_trace``): config, slots, then reads of the request
    vectors, backend replies (echo, corrupted, error), job outcomes and flushes."""
    requests = [w for n, w in mip.items() if not n.startswith("bad") and w[1:3] == b"\x02\x00"]
    joined = b"".join(requests)[:590]

    def read(chunk: bytes) -> bytes:
        n = len(chunk) - 1
        return bytes([0, n >> 8, n & 0xFF]) + chunk

    out = {}
    for k, cfg in enumerate((0x08, 0x49, 0x8A, 0x01)):
        program = bytes([cfg, 0x55 if k % 2 else 0xFF])
        program += read(joined) + b"\x02" + b"\x0a" + b"\x13\x01" + b"\x04"
        program += read(joined[:100]) + b"\x03\xc3\x00" + b"\x04" + b"\x05" + read(joined) + b"\x04"
        out[f"requests-{k}"] = b"\x00" + program
    for name, wire in mip.items():
        out[f"size-{name}"] = b"\x10" + wire
    return out


def _clipper_front() -> dict[str, bytes]:
    """Programs (``differential.front_program``): registrations, submissions, answers."""
    out = {}
    for gen in range(3):
        for types in (b"\x00\x00\x00", b"\x01\x02\x03"):
            cfg = gen | (1 << 2) | (2 << 4)
            steps = b"\x00\x02\x01" + b"\x02\x00\x00\x00" + b"hello"
            steps += b"\x80\x01\x02" + b"\x02\x01\x00\x00" + b"\x07\x00" * 4
            steps += b"\x05\x00\x00\x00" + b"\x03\x01\x02\x00\x00"
            steps += b"\x00\x04\x02" + b"\x12\x00\x00\x00" + b"\x04\x00\x01\x04\x00\x01\x02"
            out[f"gen{gen}-types{types.hex()}"] = bytes([cfg]) + types + steps
    return out


def _clipper_container() -> dict[str, bytes]:
    """Programs (``differential.clipper_container``): requests, mutated ones, junk."""
    out = {}
    for gen in range(3):
        for itype in range(5):
            cfg = gen | (itype << 2)
            ops = b"\x00\x07\x01\x02" + bytes(range(64))
            ops += b"\x01\x08\x00\x01" + bytes(range(16)) + b"\x00\x00"
            ops += b"\x03\x00" + b"\x02\x09\x02\x00\x04\x00\x00\x00"
            ops += b"\xc0\x0a\x02"  # unequal lengths
            out[f"gen{gen}-type{itype}"] = bytes([cfg]) + b"\x00\x01\x05\x09" + ops
    return out


def _codec_encode(mip: dict[str, bytes], y2: dict[str, bytes]) -> dict[str, bytes]:
    """A codec selector byte, then a message of that codec (decoded, then encoded again;
    read backwards, the same bytes choose a message to build)."""
    out = {f"mip-{name}": b"\x00" + wire for name, wire in mip.items()}
    out.update({f"clipper-{name}": b"\x01" + data for name, data in _clipper().items()})
    out.update({f"y2-{name}": b"\x02" + wire for name, wire in y2.items()})
    out.update({f"zmtp-{name}": b"\x03" + data for name, data in _zmtp_streams().items()})
    return out


def _zio_frames() -> dict[str, bytes]:
    return {
        "plain": b"\x00\x03\x05hello\x00\x03abc",
        "buffers": b"\x81\x04\x10" + bytes(16) + b"\x07strings" + b"\x03abc" + b"\x00\x01",
        "empty": b"\x00\x00\x01\x00",
        "large": b"\x01\x02\xff" + bytes(255) + b"\xff" + bytes(255),
    }


def _y2_threads() -> dict[str, bytes]:
    vectors = json.loads((VECTORS / "y2" / "words.json").read_text())
    words = np.array([int(v["word"], 16) for v in vectors], dtype="<u4").tobytes()
    return {
        f"cfg{cfg:02x}": bytes([cfg, 0, 7]) + words[:64].ljust(64, b"\x11") + b"\x00\x10\x02"
        for cfg in (0x00, 0x01, 0x07, 0x43, 0x62, 0xA3)
    }


def _serve_store() -> dict[str, bytes]:
    """Programs (``differential.store_program_trace``): reads of requests, flushes of their
    answers, single rows, hand-overs at SQLite's and PostgreSQL's rows per statement; the
    journal and payloads on and off.  Spelled with the helpers below, one per choice the
    program reads."""

    def text(raw: bytes, kind: int = 0) -> bytes:  # kind 0 latin-1, 1 UTF-8, 2 UTF-16
        return bytes([kind, len(raw)]) + raw

    def new_id(raw: bytes, kind: int = 0) -> bytes:
        return b"\x00" + text(raw, kind)

    def old_id(k: int) -> bytes:  # the k-th id that arrived (modulo their number)
        return bytes([0x80 | k])

    def time(value: float) -> bytes:
        return b"\x00" + struct.pack("<d", value)

    def count(n: int) -> bytes:
        return bytes([0, n]) if n < 256 else b"\x04" + n.to_bytes(8, "little")

    def payload(raw: bytes | None, kind: int = 1) -> bytes:  # 1 bytes, 3 bytearray, 4/5 views
        return b"\x00" if raw is None else bytes([kind, len(raw)]) + raw

    nan, none_time, int_time = b"\x02\x00", b"\x05", b"\x03\x03" + (1 << 20).to_bytes(4, "little")
    read = text(b"m") + text(b'c"1') + time(1763790000.5) + b"\x04"  # 4 requests
    read += new_id(b"r-1") + count(32) + payload(b"abcd")
    read += new_id(b'r\\2\n"') + count((1 << 63) - 1) + payload(None)
    read += new_id(b"\xed\xa0\x80\xff", 1) + b"\x06\x01" + payload(b"xyzw", 5)  # a bool size
    read += new_id(b"\x00\xd8\x3d\xd8\x00\xde", 2) + count(0) + payload(b"", 4)
    flush = text(b"m") + text(b'c"1') + nan + b"\x02" + time(2.5) + none_time + int_time
    # 2 devices, 5 answers: each its (device, time) choice, id, size, attempts, payload
    flush += b"\x01" + text(b"n1/0/m") + text(b"n\x002", 1) + b"\x05"
    flush += b"\x00" + old_id(0) + count(32) + count(1) + payload(b"abcd", 3)
    flush += b"\x09" + old_id(1) + count(7) + count(0) + payload(b"")
    flush += b"\x10" + old_id(2) + b"\x07\x02\x01" + count(2) + payload(b"ab", 4)  # inf size
    flush += b"\x06" + old_id(3) + count(9) + b"\x06\x00" + payload(None)
    flush += b"\x11" + new_id(b"unknown") + count(1) + count(1) + payload(b"q")
    singles = b"\x02" + b"\x02"  # three rows one by one
    singles += b"\x01" + new_id(b"late") + text(b"m") + text(b"c") + time(-0.0)
    singles += count(5) + payload(b"late")
    singles += b"\x00" + b"\x81" + time(3.0) + count(2) + old_id(4)  # abandoned, no device
    singles += b"\x00" + b"\x02" + text(b"d") + nan + count(1) + new_id(b"gone")  # failed
    out = {}
    for k, flags in enumerate((0x00, 0x10, 0x30, 0x20)):
        for chunk in (0x00, 0x50, 0x60):  # 1, 32, 1 << 30 rows per statement
            program = bytes([flags]) + read + bytes([flags | 1]) + flush
            program += singles + bytes([chunk | 3])
            program += bytes([flags | 1]) + flush + bytes([0x23])  # completions of earlier ones
            out[f"flags{k}-chunk{chunk >> 4}"] = program
    return out


def _oip_mapping() -> dict[str, bytes]:
    """Replies (control byte 0: sample rule, 1: rows) from the OIP golden vectors, and
    request programs (control 2, 3) spelling tensors of every datatype."""
    out: dict[str, bytes] = {}
    for name, wire in _bins("oip").items():
        if name.startswith("rest"):
            continue
        out[f"{name}-sample"] = b"\x00" + wire
        out[f"{name}-rows"] = b"\x01" + wire
    for code in range(16):
        # one input: name "t", datatype ``code``, shape [2, 3], data of the right size
        program = bytes([3, 1]) + b"t" + bytes([0, code, 2, 2, 3, 0]) + bytes(range(64))
        out[f"request-type{code}"] = b"\x02" + program
        out[f"request-type{code}-rows"] = b"\x03" + program
    out["request-huge-shape"] = b"\x02" + bytes([1, 1]) + b"h" + bytes([0, 12, 2, 254, 252, 3])
    return out


def seeds(target: str) -> dict[str, bytes]:
    mip = _bins("mip")
    y2 = _bins("y2")
    if target == "mip_decode":
        return mip
    if target == "mip_stream":
        return _streams(mip, "mip-session.bin")
    if target == "mip_connection":
        return _connection_programs(mip)
    if target == "y2_decode":
        return y2
    if target == "y2_stream":
        return _streams(y2, "y2-worker-link.bin")
    if target == "y2_kernels":
        return _y2_kernels()
    if target == "clipper_decode":
        return _clipper()
    if target == "zmtp_decode":
        return {
            f"{name}-c{c}": bytes([c]) + data
            for name, data in _zmtp_streams().items()
            for c in (4, 0)
        }
    if target == "zmtp_stream":
        return {
            f"{name}-plan{k}": plan + data
            for name, data in _zmtp_streams().items()
            for k, plan in enumerate(_PLANS)
        }
    if target == "mip_net":
        return _mip_net(mip)
    if target == "mip_dump":
        return _mip_dump(mip)
    if target == "serve_lane":
        return _serve_lane(mip)
    if target == "serve_store":
        return _serve_store()
    if target == "clipper_front":
        return _clipper_front()
    if target == "clipper_container":
        return _clipper_container()
    if target == "zio_frames":
        return _zio_frames()
    if target == "codec_encode":
        return _codec_encode(mip, y2)
    if target == "y2_threads":
        return _y2_threads()
    if target == "oip_mapping":
        return _oip_mapping()
    raise KeyError(target)


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    for target in TARGETS:
        folder = out / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in seeds(target).items():
            (folder / name).write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
