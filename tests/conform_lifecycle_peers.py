"""Targets ``wirekit conform --target-cmd`` starts on the address it gives them.

``python conform_lifecycle_peers.py NAME`` runs the target NAME on
``$WIREKIT_CONFORM_HOST:$WIREKIT_CONFORM_PORT`` (what conform puts in the environment of
its ``--target-cmd``) until killed:

* ``kubemo``: KubeMo's server (``kubemo`` from PyPI) with the conformance model; it binds
  without ``SO_REUSEADDR`` (``kubemo/server.py``: ``bind``, then ``listen(1)``);
* ``dies_on_fail``: a MIP server (wirekit's codec) that serves the conformance model and
  exits when asked to fail (``conform:fail``), a server a case can end.
"""

from __future__ import annotations

import os
import socket
import sys

from conform_peers import FAIL, kubemo_conform_model


def _address() -> tuple[str, int]:
    return os.environ["WIREKIT_CONFORM_HOST"], int(os.environ["WIREKIT_CONFORM_PORT"])


def kubemo() -> None:
    """KubeMo's own server on the address conform gives."""
    import kubemo as km

    server = km.Server("tcp", _address())
    server.handle(km.InferenceHandler(kubemo_conform_model))
    print(f"listening on tcp://{server.socket.getsockname()[0]}", flush=True)
    server.serve()


def dies_on_fail() -> None:
    """One connection at a time; each message answered as the conformance model does;
    ``conform:fail`` ends the process (exit 3) instead of an INTERNAL error."""
    from wirekit import mip
    from wirekit.conform.models import mip_model
    from wirekit.errors import DecodeError

    listener = socket.create_server(_address(), reuse_port=False)
    print("listening", flush=True)
    while True:
        conn, _ = listener.accept()
        with conn:
            decoder = mip.Decoder()
            while True:
                try:
                    msg = decoder.next_message()
                except DecodeError:
                    conn.sendall(mip.encode(mip.ErrorReply(int(mip.ErrorCode.SHAPE))))
                    break
                if msg is None:
                    data = conn.recv(65536)
                    if not data:
                        break
                    decoder.feed(data)
                    continue
                if isinstance(msg, mip.Ping):
                    conn.sendall(mip.encode(mip.Ping(True)))
                    continue
                assert isinstance(msg, mip.Inference)
                samples = msg.samples
                if any(s and bytes(s[0].data) == FAIL for s in samples):
                    os._exit(3)
                outputs = mip_model(samples)
                conn.sendall(mip.encode(mip.Inference.reply(outputs, n_input=msg.n_input)))


if __name__ == "__main__":
    globals()[sys.argv[1]]()
