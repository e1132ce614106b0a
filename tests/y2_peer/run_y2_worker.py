"""Run y2's own worker-side ``Communication`` class (unchanged) as a node's worker.

    python run_y2_worker.py PATH/TO/communication.py PORT DELTAS WORDS_PER_DELTA [ENDING]

Loads the class from the file y2 ships (``worker_service/communications/communication.py``),
does what y2's ``main.py`` and trainer do around it -- wait for the NodeIndex, send Deltas,
take the others' Deltas, send a Runtime per "epoch" -- and ends as ENDING says:

* ``graceful`` (default): queue Finished, give the class a second to write it, then stop it;
* ``main``: exactly ``main.py``'s ending -- queue the last Runtime (the test loss) and Finished,
  then ``communication.stop()`` at once, which cancels the class's writer task: what was
  queued usually never leaves, the connection just closes when the process exits;
* ``stall``: after the exchange, send nothing more and keep the connection open (until the
  process is killed), as a worker that hangs.

It prints one JSON line (before stalling, for ``stall``): the node index, how many Runtime it
queued, per sender the sequence numbers received in order, and the Python and janus it ran.
The words are opaque to the services: word j of Delta k of node i is
``(i << 24) | (k * WORDS_PER_DELTA + j)``.

Runs under the Python and janus y2 pins (Python 3.7, janus 0.4.0: ``WIREKIT_Y2_PYTHON`` in
the tests) and, when janus 0.4 is not installed, under wirekit's Python with the janus
stand-in beside this file; it imports nothing of wirekit.  y2's class connects to
127.0.0.1:8888; ``asyncio.open_connection`` is wrapped here so that the port is PORT (the class
itself is not touched).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)  # on sys.path first, with the janus stand-in
sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != Path(HERE)]
try:  # the janus y2 pins, when installed; else the stand-in
    import janus

    if not getattr(janus, "__version__", "").startswith("0.4."):
        raise ImportError(getattr(janus, "__version__", "?"))
except ImportError:
    sys.modules.pop("janus", None)
    sys.path.insert(0, HERE)
    import janus  # the stand-in

EPOCHS = 2  # Runtime messages sent while "training", each after a pause
WAIT = 60.0  # a bound for a hang


def _delta_payload(node_id: int, k: int, per: int) -> bytes:
    return b"".join(((node_id << 24) | (k * per + j)).to_bytes(4, "big") for j in range(per))


def _runtime(samples: int, loss_milli: int) -> bytes:
    return b"".join(v.to_bytes(4, "big") for v in (samples, 1, 2, 3, loss_milli))


def main() -> int:
    path, port, deltas, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    ending = sys.argv[5] if len(sys.argv) > 5 else "graceful"
    real_open = asyncio.open_connection

    async def open_connection(host, p, **kw):  # y2's worker: 127.0.0.1:8888, fixed
        return await real_open(host, port if p == 8888 else p, **kw)

    asyncio.open_connection = open_connection
    spec = importlib.util.spec_from_file_location("y2_communication", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    asyncio.set_event_loop(asyncio.new_event_loop())
    crashed = threading.Event()
    comm = module.Communication(crashed)

    # y2's receive() swaps in a new queue and returns the old one, into which its reader may
    # still put one message: every queue handed out is kept and looked at again.
    deadline = time.monotonic() + WAIT
    index_queues = [comm.receive(0)]
    while all(q.empty() for q in index_queues):
        if time.monotonic() > deadline or crashed.is_set():
            print(json.dumps({"error": "no NodeIndex"}), flush=True)
            comm.stop()
            return 1
        time.sleep(0.05)
        index_queues.append(comm.receive(0))
    raw = next(q for q in index_queues if not q.empty()).get_nowait()
    node_id = int.from_bytes(raw[:4], "big")
    count = int.from_bytes(raw[-4:], "big")

    for k in range(deltas):
        comm.send(1, _delta_payload(node_id, k, per))

    received = {}  # type: dict
    want = (count - 1) * deltas
    got = 0
    delta_queues = []
    while got < want and time.monotonic() < deadline and not crashed.is_set():
        delta_queues.append(comm.receive(1))
        for q in delta_queues[-2:]:  # the one just handed out and the one before
            while not q.empty():
                data = q.get_nowait()
                first = int.from_bytes(data[:4], "big")
                received.setdefault(first >> 24, []).append((first & 0xFFFFFF) // per)
                got += 1
        time.sleep(0.01)
    for epoch in range(EPOCHS):  # the trainer's Runtime after each epoch
        comm.send(2, _runtime(got, 4000 + 10 * node_id + epoch))
        time.sleep(0.2)
    result = {
        "node_id": node_id,
        "node_count": count,
        "received": received,
        "ending": ending,
        "janus": getattr(janus, "__version__", "stand-in"),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
    }
    if ending == "stall":
        result["runtime_queued"] = EPOCHS
        print(json.dumps(result), flush=True)
        while True:  # the connection stays open until the process is killed
            time.sleep(1)
    if ending == "main":
        comm.send(2, _runtime(got, 9000 + node_id))  # the test loss, after validation
        comm.send(3, bytearray(0))  # main.py: communication.send(3, bytearray(0))
        comm.stop()  # main.py: communication.stop(), at once
        result["runtime_queued"] = EPOCHS + 1
    else:
        comm.send(3, bytearray(0))
        time.sleep(1.0)  # let Finished go out before stopping the link
        comm.stop()
        result["runtime_queued"] = EPOCHS
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
