"""Run y2's own worker-side ``Communication`` class (unchanged) as a node's worker.

    python run_y2_worker.py PATH/TO/communication.py PORT DELTAS WORDS_PER_DELTA

Loads the class from the file y2 ships (``worker_service/communications/communication.py``),
does what y2's ``main.py`` does around it -- wait for the NodeIndex, send Deltas, take the
others' Deltas, send a Runtime, then Finished -- and prints one JSON line: the node index and,
per sender, the sequence numbers received in order.  Word of Delta k of node i:
layer i, weight, index k * WORDS_PER_DELTA + j.

y2's class connects to 127.0.0.1:8888; ``asyncio.open_connection`` is wrapped here so that the
port is PORT (the class itself is not touched).  ``janus`` is the stand-in beside this file.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the janus stand-in

from wirekit import y2


def main() -> int:
    path, port, deltas, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
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
    deadline = time.monotonic() + 60
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
        idx = [k * per + j for j in range(per)]
        words = y2.pack([node_id] * per, [1] * per, idx, [0] * per)
        comm.send(1, y2.to_wire(words))

    received: dict[int, list[int]] = {}
    want = (count - 1) * deltas
    got = 0
    delta_queues = []
    while got < want and time.monotonic() < deadline and not crashed.is_set():
        delta_queues.append(comm.receive(1))
        for q in delta_queues[-2:]:  # the one just handed out and the one before
            while not q.empty():
                data = q.get_nowait()
                layer, _w, index, _s = y2.unpack(y2.from_wire(data))
                received.setdefault(int(layer[0]), []).append(int(index[0]) // per)
                got += 1
        time.sleep(0.01)
    comm.send(2, b"".join(v.to_bytes(4, "big") for v in (got, 1, 2, 3, 4000 + node_id)))
    comm.send(3, bytearray(0))
    time.sleep(1.0)  # y2's main.py stops right after queueing Finished; let it go out
    comm.stop()
    print(json.dumps({"node_id": node_id, "node_count": count, "received": received}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
