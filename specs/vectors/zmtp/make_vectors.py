"""Regenerate the ZMTP golden vectors: ``python specs/vectors/zmtp/make_vectors.py``.

``real-*.bin`` are captured from real libzmq peers (pyzmq DEALER → recording proxy → pyzmq
ROUTER on 127.0.0.1); the others are written byte by byte here, from RFC 23/37, not with
wirekit's encoders.  Each ``.json`` holds the events wirekit decodes (offset first) and, for
the ``bad-*`` vectors, the error.  Review a diff of the JSON by eye before committing it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent

GREETING = b"\xff" + b"\x00" * 7 + b"\x01\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\x00")
GREETING += b"\x00" + b"\x00" * 31


def prop(name: bytes, value: bytes) -> bytes:
    return bytes([len(name)]) + name + struct.pack(">I", len(value)) + value


def command(name: bytes, data: bytes) -> bytes:
    body = bytes([len(name)]) + name + data
    if len(body) > 255:
        return b"\x06" + struct.pack(">Q", len(body)) + body
    return bytes([0x04, len(body)]) + body


def frame(body: bytes, more: bool) -> bytes:
    flags = 0x01 if more else 0x00
    if len(body) > 255:
        return bytes([flags | 0x02]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


def message(*frames: bytes) -> bytes:
    return b"".join(frame(f, k < len(frames) - 1) for k, f in enumerate(frames))


def ready(socket_type: bytes, identity: bytes | None = b"") -> bytes:
    data = prop(b"Socket-Type", socket_type)
    if identity is not None:
        data += prop(b"Identity", identity)
    return command(b"READY", data)


DEALER_HEAD = GREETING + ready(b"DEALER")
SYNTHETIC = {
    "dealer-empty-delimiter": DEALER_HEAD + message(b"", b"hello"),
    "router-long-frame": GREETING + ready(b"ROUTER") + message(b"", bytes(range(256)) * 2),
    "pub-no-identity-ping": GREETING
    + ready(b"PUB", None)
    + command(b"PING", b"\x00\x0aabc")
    + message(b"topic", b""),
    "zmtp30-as-server": GREETING[:11]
    + b"\x00"
    + GREETING[12:32]
    + b"\x01"
    + GREETING[33:]
    + ready(b"REP", None)
    + message(b"x"),
    "bad-signature": b"\x00\x02\x00\x00\x00\x00\x00\x05hello",
    "bad-version-2": GREETING[:10] + b"\x02" + GREETING[11:],
    "bad-mechanism-plain": GREETING[:12] + b"PLAIN".ljust(20, b"\x00") + GREETING[32:],
    "bad-reserved-flag": DEALER_HEAD + message(b"", b"ok") + b"\x10\x01z",
    "bad-property-length": GREETING
    + command(b"READY", b"\x0bSocket-Type" + struct.pack(">I", 1000) + b"DEALER"),
    "bad-truncated-frame": DEALER_HEAD + message(b"", b"fine") + b"\x00\x20only-part",
    "bad-command-with-more": DEALER_HEAD + b"\x05\x05\x04PING",
    "bad-ends-after-more": DEALER_HEAD + frame(b"", True) + frame(b"body", True),
    "bad-message-before-ready": GREETING + message(b"", b"too early"),
}


def capture_real() -> dict[str, bytes]:
    import zmq

    from wirekit.zmtp.record import RecordingProxy

    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for sock in (router, dealer):
        sock.linger = 0
        sock.rcvtimeo = sock.sndtimeo = 5000
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        with RecordingProxy(("127.0.0.1", port)) as proxy:
            dealer.connect(f"tcp://127.0.0.1:{proxy.port}")
            dealer.send_multipart([b"", b"ping", b"x" * 260, b""])
            peer = router.recv_multipart()[0]
            router.send_multipart([peer, b"", b"pong"])
            dealer.recv_multipart()
            dealer.close()
            assert proxy.wait(10)
        return {"real-dealer": bytes(proxy.upstream), "real-router": bytes(proxy.downstream)}
    finally:
        dealer.close()
        router.close()
        ctx.term()


def describe(data: bytes) -> dict:
    from wirekit.zmtp import _pure
    from wirekit.zmtp.messages import to_jsonable

    events, _pos, _phase, error = _pure.decode_events(data)
    out: dict = {"events": [{"offset": o, **to_jsonable(e)} for o, e in events]}
    if error is not None:
        out["error"] = {"field": error.field, "offset": error.offset, "message": error.reason}
    return out


def main() -> None:
    vectors = {**SYNTHETIC, **capture_real()}
    for name, data in vectors.items():
        (HERE / f"{name}.bin").write_bytes(data)
        (HERE / f"{name}.json").write_text(json.dumps(describe(data), indent=2) + "\n")
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
