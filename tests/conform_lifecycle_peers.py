"""Targets ``wirekit conform --target-cmd`` starts on the address it gives them.

``python conform_lifecycle_peers.py NAME`` runs the target NAME on
``$WIREKIT_CONFORM_HOST:$WIREKIT_CONFORM_PORT`` (what conform puts in the environment of
its ``--target-cmd``) until killed:

* ``kubemo``: KubeMo's server (``kubemo`` from PyPI) with the conformance model; it binds
  without ``SO_REUSEADDR`` (``kubemo/server.py``: ``bind``, then ``listen(1)``);
* ``dies_on_fail``: ``wirekit mip serve`` with the conformance model, except that it exits
  when asked to fail (``conform:fail``): a server a case can end;
* ``fragile_container``: a v3 Clipper container that dies where Clipper's rpc.py does.
"""

from __future__ import annotations

import os
import sys

from conform_peers import FAIL, kubemo_conform_model, serve_v3_container


def _address() -> tuple[str, int]:
    return os.environ["WIREKIT_CONFORM_HOST"], int(os.environ["WIREKIT_CONFORM_PORT"])


def kubemo() -> None:
    """KubeMo's own server on the address conform gives."""
    import kubemo as km

    server = km.Server("tcp", _address())
    server.handle(km.InferenceHandler(kubemo_conform_model))
    print(f"listening on tcp://{server.socket.getsockname()[0]}", flush=True)
    server.serve()


def dies_on_fail_model(batch):
    """The conformance model, except that ``conform:fail`` ends the process (exit 3)."""
    from wirekit.conform.models import mip_model

    if any(sample and bytes(sample[0].data) == FAIL for sample in batch):
        os._exit(3)
    return mip_model(batch)


def dies_on_fail() -> None:
    """``wirekit mip serve`` with :func:`dies_on_fail_model` on the address conform gives
    (exec'd: the process conform or the test starts is the server)."""
    host, port = _address()
    os.execv(
        sys.executable,
        [sys.executable, "-m", "wirekit", "mip", "serve", "--listen", f"tcp://{host}:{port}",
         "--handler", "conform_lifecycle_peers:dies_on_fail_model"],
    )  # fmt: skip


def fragile_container() -> None:
    """A v3 Clipper container (doubles) that dies as Clipper's rpc.py does: on a feedback
    request (rpc.py's NameError) and on a request of another input type (its bare
    ``raise``), exit 1.  It connects to ``$WIREKIT_CONFORM_ADDRESS``."""
    from wirekit.clipper import InputType, PredictResponse
    from wirekit.errors import DecodeError

    def answer(request):
        if request.input_type != InputType.DOUBLES:
            sys.exit(1)
        return PredictResponse(request.msg_id, [str(len(x)) for x in request.inputs])

    def other(message):
        sys.exit(1)

    try:
        serve_v3_container(os.environ["WIREKIT_CONFORM_ADDRESS"], "fragile", answer, other)
    except DecodeError:
        sys.exit(1)  # a feedback request: rpc.py's loop is over


if __name__ == "__main__":
    globals()[sys.argv[1]]()
