"""Peers for the Clipper round-trip benchmark, run as separate processes.

``python bench_clipper_peers.py echo ADDRESS GEN [plain|lean]``: a bare pyzmq DEALER that
answers every request with pre-encoded response frames (no parsing), echoing the request's id
frame.  It moves frames with pyzmq's ``send_multipart``/``recv_multipart``; with ``plain``, with
the pure-Python twin of ``wirekit.clipper._zio`` (pyzmq's backend socket calls, plain int
flags); with ``lean``, with the multipart send/receive wirekit's runtimes use (``_zio``: its
Cython twin, straight on libzmq).
``ok`` is the model the wirekit container serves: one constant output per input.
"""

from __future__ import annotations

import sys


def ok(inputs):
    return ["1"] * len(inputs)


def echo(address: str, gen: str, io: str = "usual") -> None:
    import zmq

    from wirekit import clipper

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    sock.send_multipart([b"", b"hello"])
    answers = {n: clipper.encode(clipper.PredictResponse(0, ["1"] * n), gen) for n in (1, 32)}
    id_at = 2 if gen != "2016" else 1  # the id frame of a response (and of a v3 request: 3)
    req_id_at = {"2016": 1, "2017": 2, "v3": 3}[gen]
    count_at = {"2016": 3, "2017": 5, "v3": 6}[gen]
    recv, send = sock.recv_multipart, sock.send_multipart
    if io != "usual":
        from wirekit.clipper import _zio

        send_on, recv_on = (
            (_zio.send_frames, _zio.recv_frames)
            if io == "lean"
            else (_zio._send_frames, _zio._recv_frames)
        )

        def recv():
            return recv_on(sock)

        def send(frames):
            send_on(sock, frames)

    while True:
        frames = recv()
        if frames[-1] == b"stop":
            break
        n = int.from_bytes(
            frames[count_at][4:8] if gen != "v3" else frames[count_at][8:16], "little"
        )
        out = list(answers[n])
        out[id_at] = frames[req_id_at]
        send(out)
    sock.close(0)
    ctx.term()


if __name__ == "__main__":
    echo(sys.argv[2], sys.argv[3], io=sys.argv[4] if len(sys.argv) > 4 else "usual")
