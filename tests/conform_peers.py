"""Real peers the conformance tests run ``wirekit conform`` against.

* :func:`kubemo_conform_main`: KubeMo's own server (``kubemo`` from PyPI) serving the
  conformance model, written against KubeMo's model API (what an implementer would write);
* broken servers: small MIP servers that get one thing wrong each, so the tests see the
  right cases fail.

Each ``*_main`` prints ``listening on ADDRESS`` and serves until killed.
"""

from __future__ import annotations

import io
import socket
import struct
import sys
import threading

FIRST_ONLY = b"conform:first"
FAIL = b"conform:fail"


def kubemo_conform_model(*samples):
    """The conformance model in KubeMo's API: each sample's inputs echoed; ``conform:first``
    answers the first input only; ``conform:fail`` raises."""
    import kubemo
    from mip_net import kubemo_echo

    outputs = []
    for sample, row in zip(samples, kubemo_echo(*samples), strict=True):
        first = bytes(row[0].reader.getvalue()) if row else b""
        if row and sample[0].serial.kind == kubemo.TEXT and first == FAIL:
            raise RuntimeError("the conformance case asked the model to fail")
        if row and sample[0].serial.kind == kubemo.TEXT and first == FIRST_ONLY:
            row = row[:1]
        outputs.append(tuple(row))
    return tuple(outputs)


def kubemo_conform_main() -> None:
    """KubeMo's server with :func:`kubemo_conform_model` on a free port, until killed."""
    from mip_net import serve_kubemo

    serve_kubemo(kubemo_conform_model)


def kubemo_natural_conform_model(*samples):
    """The conformance model as one would first write it in KubeMo's API: each sample's
    inputs returned as its outputs (the ``Dynamic`` objects KubeMo passed in), with
    ``conform:first`` and ``conform:fail`` as in :func:`kubemo_conform_model`."""
    import kubemo

    outputs = []
    for sample in samples:
        first = sample[0].serial if sample else None
        marker = first.reader.getvalue() if first is not None and first.kind == kubemo.TEXT else b""
        if marker == FAIL:
            raise RuntimeError("the conformance case asked the model to fail")
        outputs.append(sample[:1] if marker == FIRST_ONLY else sample)
    return tuple(outputs)


def kubemo_natural_echo_main() -> None:
    """KubeMo's server with :func:`kubemo_natural_conform_model`: its ``Dynamic`` outputs
    bug (they have no ``kind``) makes every echo an INTERNAL, until killed."""
    from mip_net import serve_kubemo

    serve_kubemo(kubemo_natural_conform_model)


# --------------------------------------------------------------------------- broken servers


def _serve_raw(answer) -> None:
    """A threaded server that frames messages by their header alone (no checks: it is the
    broken one) and writes ``answer(frame)`` for each; a header announcing over 1 MiB is
    answered from the header, then the connection closes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    host, port = listener.getsockname()
    print(f"listening on tcp://{host}:{port}", flush=True)

    def serve(conn: socket.socket) -> None:
        with conn:
            buf = b""
            while True:
                if len(buf) >= 8:
                    size = 8 + struct.unpack(">I", buf[4:8])[0]
                    if size > 1 << 20:
                        conn.sendall(answer(buf[:8]))
                        return
                    if len(buf) >= size:
                        frame, buf = buf[:size], buf[size:]
                        conn.sendall(answer(frame))
                        continue
                data = conn.recv(65536)
                if not data:
                    return
                buf += data

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def bad_version_main() -> None:
    """Answers every message with a pong whose version byte is 1."""
    _serve_raw(lambda frame: b"\x01\x01\x01\x00\x00\x00\x00\x00")


def wrong_error_main() -> None:
    """Answers pings right; every other message with error INTERNAL (whatever was wrong)."""

    def answer(frame: bytes) -> bytes:
        if frame[:4] == b"\x00\x01\x00\x00":
            return b"\x00\x01\x01\x00\x00\x00\x00\x00"
        return b"\x00\x00\x05\x00\x00\x00\x00\x00"

    _serve_raw(answer)


def swapped_samples_main() -> None:
    """Echoes inference requests with their samples in reverse order (pings answered)."""
    from wirekit import mip

    def answer(frame: bytes) -> bytes:
        try:
            msg = mip.decode(frame)
        except Exception:
            return b"\x00\x00\x04\x00\x00\x00\x00\x00"
        if isinstance(msg, mip.Ping):
            return mip.encode(mip.Ping(True))
        rows = list(reversed(msg.samples))
        return (
            mip.encode(mip.Inference.reply(rows, n_input=msg.n_input))
            if rows
            else (struct.pack(">BBBBI", 0, 2, 1, 0, 4) + bytes(4))
        )

    _serve_raw(answer)


def serve_v3_container(address, name, answer, on_other=None) -> None:
    """A v3 Clipper container (doubles) at ``address``, forever: heartbeats while idle,
    registration as ``name`` when asked, ``answer(request)`` (a PredictResponse) sent for
    each request; ``on_other(message)`` for any other message (ignored by default).  A
    message it cannot decode raises :class:`wirekit.errors.DecodeError`."""
    import zmq

    from wirekit import clipper
    from wirekit.clipper import (
        Heartbeat,
        HeartbeatReply,
        HeartbeatType,
        InputType,
        NewContainer,
        PredictRequest,
    )

    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    sock.send_multipart(clipper.encode(Heartbeat(), "v3"))
    while True:
        if not sock.poll(500):
            sock.send_multipart(clipper.encode(Heartbeat(), "v3"))
            continue
        msg = clipper.decode(sock.recv_multipart(), "v3", "to_container")
        if isinstance(msg, HeartbeatReply):
            if msg.heartbeat_type == HeartbeatType.REQUEST_CONTAINER_METADATA:
                reg = NewContainer(name, "1", InputType.DOUBLES, 3)
                sock.send_multipart(clipper.encode(reg, "v3"))
        elif isinstance(msg, PredictRequest):
            sock.send_multipart(clipper.encode(answer(msg), "v3"))
        elif on_other is not None:
            on_other(msg)


def wrong_msg_id_container_main() -> None:
    """A v3 Clipper container that registers properly but answers every request with the
    msg_id after the request's.  argv[2]: Clipper's address."""
    from wirekit.clipper import PredictResponse

    def answer(request):
        return PredictResponse(request.msg_id + 1, [str(len(x)) for x in request.inputs])

    serve_v3_container(sys.argv[2], "off-by-one", answer)


def kubemo_client_driver_main() -> None:
    """KubeMo's client (from PyPI) under ``wirekit conform mip client``: the driver loop of
    :mod:`wirekit.conform.drivers` around ``kubemo.Client``.  argv[2]: the kit's address."""
    import re

    import kubemo

    from wirekit.conform.drivers import drive

    address = sys.argv[2]
    client = kubemo.Client()

    def infer(texts):
        outputs = client.inference(address, (tuple(kubemo.Text(t) for t in texts),))
        return outputs[0][0].decode()

    def typed(text, value, png):  # as KubeMo's README builds them: Json(obj)
        sample = (kubemo.Text(text), kubemo.Json(value), kubemo.Image(io.BytesIO(png)))
        return client.inference(address, (sample,))[0][0].decode()

    def error_code(exc):
        found = re.search(r"responded with error code: (\d+)", str(exc))
        return int(found[1]) if found else None

    def build(texts):  # a sample as KubeMo's README builds one: Text(str)
        return tuple(kubemo.Text(t) for t in texts)

    def send(samples):
        return [row[0].decode() for row in client.inference(address, tuple(samples))]

    drive(lambda: client.ping(address), infer, typed, error_code, build=build, send=send)


def silent_frontend_main() -> None:
    """A "Clipper frontend" that binds its ROUTER on a free port and never answers."""
    import zmq

    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    print(f"listening on tcp://127.0.0.1:{port}", flush=True)
    while True:
        router.recv_multipart()


def wrong_index_service_main() -> None:
    """A "y2 service" that registers at the client (argv[2]) and tells every worker it is
    node 1 of 3, whatever the client said."""
    import zmq

    from wirekit import y2

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    host, port = listener.getsockname()
    print(f"listening on tcp://{host}:{port}", flush=True)
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(sys.argv[2])
    dealer.send_multipart([b"hello", b"tcp://127.0.0.1:1"])
    while True:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(y2.encode(y2.NodeIndex(1, 3)))


if __name__ == "__main__":
    globals()[sys.argv[1]]()
