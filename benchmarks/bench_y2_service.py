"""Delta throughput through the y2 communication services against a raw ZeroMQ relay.

    python benchmarks/bench_y2_service.py                   # 4096-word Deltas, 3 nodes
    python benchmarks/bench_y2_service.py --words 64 --deltas 20000

Three nodes on loopback, every node's service in its own process.  Worker 0 sends
``--deltas`` Delta messages of ``--words`` words; workers 1 and 2 read them.  Rate: words
per second from worker 0 until both others have every byte, and the CPU time the relaying
processes (the three services; the three relays) spent per word.

* ``wirekit``: ``wirekit y2 client`` + 3 ``wirekit y2 service`` processes (framing, checks,
  flow control, counters: the real thing).
* ``raw``: the same bytes through the same hops with nothing in between: one process reads
  worker 0's TCP stream and publishes each chunk it reads on a ZeroMQ PUB socket; two
  processes subscribe and write what they get to their worker's TCP connection.  No framing,
  no checks, unbounded queues (high-water marks 0, so PUB drops nothing).

Both run in the same invocation, rounds alternating; the table gives the median of each and
wirekit's rate as a share of raw's, the median over pairs of rounds run back to back (the
goal is >= 70%).  Ratios only: absolute rates depend
on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve()


# ---------------------------------------------------------------- the raw relay


def _relay_in(port_file: str) -> None:
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind("tcp://127.0.0.1:*")
    srv = socket.create_server(("127.0.0.1", 0))
    info = {"worker": srv.getsockname()[1], "pub": pub.getsockopt_string(zmq.LAST_ENDPOINT)}
    Path(port_file).write_text(json.dumps(info))
    conn, _ = srv.accept()
    while data := conn.recv(256 * 1024):
        pub.send(data)


def _relay_out(pub: str, port_file: str) -> None:
    import zmq

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub)
    srv = socket.create_server(("127.0.0.1", 0))
    Path(port_file).write_text(json.dumps({"worker": srv.getsockname()[1]}))
    conn, _ = srv.accept()
    conn.sendall(b"ready")
    while True:
        conn.sendall(sub.recv())


def _wait_file(path: Path, procs: list[subprocess.Popen]) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return json.loads(path.read_text())
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a relay process died")
        time.sleep(0.02)
    raise RuntimeError(f"no {path}")


@contextmanager
def raw_cluster(tmp: Path):
    """Yields (sender socket, [receiver sockets], relay pids) through the raw relay."""
    procs: list[subprocess.Popen] = []
    socks: list[socket.socket] = []
    try:
        f_in = tmp / "in.json"
        procs.append(subprocess.Popen([sys.executable, str(HERE), "--relay-in", str(f_in)]))
        info = _wait_file(f_in, procs)
        outs = []
        for k in (1, 2):
            f = tmp / f"out{k}.json"
            procs.append(
                subprocess.Popen([sys.executable, str(HERE), "--relay-out", info["pub"], str(f)])
            )
            outs.append(_wait_file(f, procs))
        receivers = [socket.create_connection(("127.0.0.1", o["worker"])) for o in outs]
        for r in receivers:
            assert r.recv(5) == b"ready"
        socks += receivers
        sender = socket.create_connection(("127.0.0.1", info["worker"]))
        socks.append(sender)
        time.sleep(0.5)  # PUB/SUB: let the subscriptions reach the publisher
        yield sender, receivers, [p.pid for p in procs]
    finally:
        for s in socks:
            s.close()
        for p in procs:
            p.kill()
            p.wait()


# ---------------------------------------------------------------- wirekit's services


def _line(proc: subprocess.Popen, prefix: str) -> str:
    line = proc.stdout.readline()
    if not line.startswith(prefix):
        raise RuntimeError(f"expected {prefix!r}, got {line!r}")
    return line[len(prefix) :].strip()


@contextmanager
def wirekit_cluster(tmp: Path):
    """Yields (sender socket, [receiver sockets], service pids): workers of a 3-node
    wirekit cluster."""
    base = [sys.executable, "-m", "wirekit.cli", "y2"]
    quiet = ["--log-level", "warning"]
    procs: list[subprocess.Popen] = []
    socks: list[socket.socket] = []
    try:
        client = subprocess.Popen(
            [*base, "client", "--nodes", "3", "--listen", "tcp://127.0.0.1:0", *quiet],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(client)
        address = _line(client, "client listening on ")
        ports = []
        for k in range(3):
            p = subprocess.Popen(
                [*base, "service", "--client", address, "--worker-listen", "127.0.0.1:0",
                 "--name", f"bench{k}", *quiet],
                stdout=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            procs.append(p)
            ports.append(int(_line(p, "worker link on ").rsplit(":", 1)[1]))
        workers = [socket.create_connection(("127.0.0.1", port)) for port in ports]
        socks += workers
        for w in workers:
            _recv_exact(w, 16)  # the NodeIndex
        yield workers[0], workers[1:], [p.pid for p in procs[1:]]  # the node services
    finally:
        for s in socks:
            s.close()
        for p in procs:
            p.kill()
            p.wait()
            if p.stdout:
                p.stdout.close()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise RuntimeError("closed")
        out += chunk
    return bytes(out)


# ---------------------------------------------------------------- one round


def _payload(deltas: int, words: int) -> bytes:
    import numpy as np

    size = 4 * words
    head = (1).to_bytes(4, "big") + size.to_bytes(4, "big")
    body = np.arange(words, dtype=">u4").tobytes()
    one = head + body
    return one * deltas


def _cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes have used so far (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def run_round(
    sender: socket.socket, receivers: list[socket.socket], pids: list[int], payload: bytes
) -> tuple[float, float]:
    """(seconds from the first byte sent until every receiver has all of ``payload``, CPU
    seconds the relaying processes spent meanwhile)."""
    cpu0 = _cpu(pids)
    total = len(payload)
    left = {r: total for r in receivers}
    sel = selectors.DefaultSelector()
    for r in receivers:
        r.setblocking(False)
        sel.register(r, selectors.EVENT_READ)
    t = threading.Thread(target=sender.sendall, args=(payload,), daemon=True)
    start = time.perf_counter()
    t.start()
    deadline = time.monotonic() + 300
    try:
        while any(left.values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"round timed out, left {list(left.values())}")
            for key, _ in sel.select(1.0):
                data = key.fileobj.recv(1 << 20)
                if not data:
                    raise RuntimeError("receiver closed")
                left[key.fileobj] -= len(data)
        elapsed = time.perf_counter() - start
        cpu = _cpu(pids) - cpu0
    finally:
        sel.close()
        t.join(60)
        for r in receivers:
            r.setblocking(True)
    return elapsed, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--words", type=int, default=4096, help="words per Delta (default 4096)")
    parser.add_argument("--deltas", type=int, default=2000, help="Deltas per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per contender (default 5)")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    parser.add_argument("--relay-in", help=argparse.SUPPRESS)
    parser.add_argument("--relay-out", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.relay_in:
        _relay_in(args.relay_in)
        return 0
    if args.relay_out:
        _relay_out(*args.relay_out)
        return 0

    import tempfile

    one = _payload(1, args.words)
    payload = one * args.deltas
    words = args.deltas * args.words
    rates: dict[str, list[float]] = {"wirekit": [], "raw": []}
    cpu: dict[str, list[float]] = {"wirekit": [], "raw": []}
    warm = payload[: (len(payload) // 10) // len(one) * len(one) or len(payload)]
    with (
        tempfile.TemporaryDirectory() as tmp,
        wirekit_cluster(Path(tmp)) as ours,
        raw_cluster(Path(tmp)) as raw,
    ):
        run_round(*ours, warm)
        run_round(*raw, warm)
        for _ in range(args.rounds):
            for name, cluster in (("wirekit", ours), ("raw", raw)):
                seconds, cpu_s = run_round(*cluster, payload)
                rates[name].append(words / seconds)
                cpu[name].append(cpu_s)  # CPU seconds; summed over the rounds below
    med = {k: statistics.median(v) for k, v in rates.items()}
    pairs = [a / b for a, b in zip(rates["wirekit"], rates["raw"], strict=True)]
    share = statistics.median(pairs)
    print(
        f"3 nodes, {args.deltas} Deltas x {args.words} words "
        f"({len(payload) / 1e6:.1f} MB) per round, {args.rounds} rounds, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'contender':<10} {'median words/s':>15} {'min':>12} {'max':>12} {'CPU ns/word':>12}")
    for k, v in rates.items():
        print(
            f"{k:<10} {med[k]:>15,.0f} {min(v):>12,.0f} {max(v):>12,.0f} "
            f"{sum(cpu[k]) * 1e9 / (words * len(cpu[k])):>12.2f}"
        )
    print(
        f"wirekit / raw, median of the {len(pairs)} round pairs = {share:.0%} "
        f"(pairs {min(pairs):.0%}..{max(pairs):.0%}; goal >= 70%)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "rates": rates, "cpu_seconds": cpu, "share": share})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
