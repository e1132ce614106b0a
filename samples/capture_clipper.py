"""Record the bundled Clipper samples: ``python samples/capture_clipper.py``.

A pyzmq ROUTER (standing in for Clipper) and a DEALER (a model container) exchange RPC v3
messages encoded by ``wirekit.clipper`` through ``wirekit.zmtp.record.RecordingProxy`` on
127.0.0.1; the two directions of the real libzmq TCP stream are written to
``clipper-v3-container.bin`` (DEALER → ROUTER) and ``clipper-v3-clipper.bin`` (ROUTER →
DEALER).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zmq

from wirekit import clipper
from wirekit.zmtp.record import RecordingProxy

HERE = Path(__file__).resolve().parent
V3 = clipper.Generation.V3

#: what the container sends, in order
CONTAINER = [
    clipper.NewContainer("sum-model", "1", clipper.messages.InputType.DOUBLES, 3),
    clipper.Heartbeat(),
    clipper.PredictResponse(0, ["6.0", "15.0"]),
    clipper.PredictResponse(1, ["5", "5"]),
]
#: what Clipper sends, in order (the first answers the heartbeat)
CLIPPER = [
    clipper.HeartbeatReply(clipper.messages.HeartbeatType.KEEPALIVE),
    clipper.PredictRequest(
        0, clipper.messages.InputType.DOUBLES, np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    ),
    clipper.PredictRequest(1, clipper.messages.InputType.STRINGS, ["hello", "wörld"]),
]


def record(timeout_ms: int = 5000) -> tuple[bytes, bytes]:
    """Run the exchange; return (container→Clipper bytes, Clipper→container bytes)."""
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for sock in (router, dealer):
        sock.linger = 0
        sock.rcvtimeo = sock.sndtimeo = timeout_ms
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        with RecordingProxy(("127.0.0.1", port)) as proxy:
            dealer.connect(f"tcp://127.0.0.1:{proxy.port}")
            dealer.send_multipart(clipper.encode(CONTAINER[0], V3))
            peer = router.recv_multipart()[0]
            dealer.send_multipart(clipper.encode(CONTAINER[1], V3))
            router.recv_multipart()
            router.send_multipart([peer, *clipper.encode(CLIPPER[0], V3)])
            dealer.recv_multipart()
            for request, response in zip(CLIPPER[1:], CONTAINER[2:], strict=True):
                router.send_multipart([peer, *clipper.encode(request, V3)])
                dealer.recv_multipart()
                dealer.send_multipart(clipper.encode(response, V3))
                router.recv_multipart()
            dealer.close()
            if not proxy.wait(10):
                raise RuntimeError("the proxied connection did not close")
        return bytes(proxy.upstream), bytes(proxy.downstream)
    finally:
        dealer.close()
        router.close()
        ctx.term()


def main() -> None:
    up, down = record()
    (HERE / "clipper-v3-container.bin").write_bytes(up)
    (HERE / "clipper-v3-clipper.bin").write_bytes(down)
    print(f"container side: {len(up)} bytes, Clipper side: {len(down)} bytes")


if __name__ == "__main__":
    main()
