"""``wirekit y2 client|service``: the y2 communication services, without the JVM.

    wirekit y2 client --nodes 3 --listen tcp://0.0.0.0:5560 --report run.y2 --json
    wirekit y2 service --client tcp://HOST:5560 --worker-listen 127.0.0.1:8888

Each prints its addresses on standard output once it listens (``client listening on ADDR``;
``worker link on HOST:PORT``, ``inbox ADDR``), logs to standard error and stops on
SIGINT/SIGTERM.  The client exits 0 once every node has finished or ended (its worker's
connection closed before Finished, as y2's own worker usually ends), with a summary that says
which; with ``--timeout SECONDS`` it gives up (exit 1) when nothing moved for that long,
naming the nodes still running, and tells every service to stop.  A service exits 0 when the
client says every node is done, 1 when it refuses the node or gives up.  Both print their
counters on exit (``--json``: one JSON object).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import threading
from collections.abc import Iterator
from typing import Any, TextIO

from wirekit._logging import add_logging_arguments
from wirekit._vocabulary import add_address, add_max_message_size, tcp_address, zmq_address

from .cluster import DEFAULT_HWM
from .decoder import DEFAULT_MAX_MESSAGE_SIZE
from .service import DEFAULT_MAX_WORKER_BUFFER, STATUS_INTERVAL, SlowWorker

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT/SIGTERM while in the block (main thread only)."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: object) -> None:
        stop.set()

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def _client_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import zmq

    from .cluster import ClientService

    try:
        client = ClientService(args.nodes, args.listen, max_message_size=args.max_message_size)
    except ValueError as exc:
        err.write(f"wirekit y2 client: {exc}\n")
        return EXIT_USAGE
    except zmq.ZMQError as exc:  # the address is taken, or not this machine's
        err.write(f"wirekit y2 client: cannot listen on {args.listen}: {exc}\n")
        return EXIT_FAILED
    with _stop_on_signals() as stop:  # before the line: a SIGTERM right after it stops it
        out.write(f"client listening on {client.address}\n")
        out.flush()
        done = client.run(stop, args.timeout)
    reg = client.registry
    if args.report:
        with open(args.report, "wb") as f:
            f.write(reg.report_bytes())
    summary = reg.summary()
    if args.json:
        out.write(json.dumps(summary) + "\n")
    else:
        for node in summary["nodes"]:
            out.write(f"node {node['node_id']}: {node['name']} (inbox {node['inbox']})\n")
        for rec in summary["records"]:
            out.write(_record_line(rec) + "\n")
        for node in summary["nodes"]:
            out.write(_node_line(node) + "\n")
        counters = " ".join(f"{k}={v}" for k, v in summary["counters"].items())
        out.write(f"{_outcome_line(summary)}; {counters}\n")
    out.flush()
    if reg.aborted is not None:
        err.write(f"wirekit y2 client: {reg.aborted}\n")
    return EXIT_OK if done else EXIT_FAILED


def _node_line(node: dict[str, Any]) -> str:
    """One node's end for a person: its state and what its worker did."""
    a = node["activity"]
    state = {
        "finished": "finished",
        "ended": "ended without Finished (its worker's connection closed)",
        "running": "still running",
        "waiting": "waiting for its worker",
    }[node["state"]]
    return (
        f"node {node['node_id']}: {state}; its worker sent {a['deltas_from_worker']} Deltas "
        f"({a['words_from_worker']} words), {a['runtime_from_worker']} Runtime, "
        f"{a['finished_from_worker']} Finished; got {a['node_index_to_worker']} NodeIndex, "
        f"{a['deltas_to_worker']} Deltas; {a['worker_connections']} connection(s)"
    )


def _outcome_line(summary: dict[str, Any]) -> str:
    outcome = summary["outcome"]
    if outcome == "finished":
        return "every node finished"
    if outcome == "ended":
        ended = [f"node {n['node_id']}" for n in summary["nodes"] if n["state"] == "ended"]
        return f"every node finished or ended; without Finished: {', '.join(ended)}"
    if outcome == "aborted":
        return f"gave up: {summary['aborted']}"
    return "stopped"


def _record_line(rec: dict[str, Any]) -> str:
    node = rec["node_id"]
    if rec["kind"] == "finished":
        return f"node {node}: finished"
    loss = f" loss={rec['loss_milli'] / 1000:g}" if "loss_milli" in rec else ""
    return (
        f"node {node}: runtime samples={rec['sample_count']} "
        f"decompression={rec['decompression_ms']}ms training={rec['training_ms']}ms "
        f"compression={rec['compression_ms']}ms{loss}"
    )


def _service_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import zmq

    from .cluster import NodeService

    try:
        service = NodeService(
            args.client,
            args.worker_listen.host_port,
            name=args.name,
            inbox=args.inbox,
            advertise=args.advertise,
            hwm=args.hwm,
            max_message_size=args.max_message_size,
            max_worker_buffer=args.max_worker_buffer,
            slow_worker=args.slow_worker,
        )
    except ValueError as exc:
        err.write(f"wirekit y2 service: {exc}\n")
        return EXIT_USAGE
    except (OSError, zmq.ZMQError) as exc:
        err.write(f"wirekit y2 service: cannot listen: {exc}\n")
        return EXIT_FAILED
    host, port = service.worker_address
    with _stop_on_signals() as stop:  # before the lines: a SIGTERM right after them stops it
        out.write(f"worker link on {host}:{port}\ninbox {service.inbox}\n")
        out.flush()
        error = service.run(stop)
    counters = service.counters()
    if args.json:
        out.write(json.dumps({"name": service.name, "error": error, "counters": counters}) + "\n")
    else:
        out.write(" ".join(f"{k}={v}" for k, v in counters.items()) + "\n")
    out.flush()
    if error:
        err.write(f"wirekit y2 service: {error}\n")
        return EXIT_FAILED
    return EXIT_OK


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def register(subparsers: Any) -> None:
    """Add ``wirekit y2 ...`` to the main parser."""
    y2_parser = subparsers.add_parser(
        "y2",
        help="run y2's communication services",
        description=__doc__.split("\n")[0].replace("``", ""),
    )
    sub = y2_parser.add_subparsers(dest="y2_command", required=True, metavar="ACTION")

    client = sub.add_parser(
        "client",
        help="the client service: registers the nodes, collects their reports",
        description="Run y2's client service: give each node's service its index and the "
        "others' inboxes, collect the nodes' Runtime and Finished reports, and exit 0 once "
        "every node has finished (1 when stopped before).",
    )
    client.add_argument(
        "--nodes", type=_positive, required=True, metavar="N", help="nodes in the cluster"
    )
    add_address(
        client,
        "--listen",
        kind=zmq_address,
        default="tcp://127.0.0.1:5560",
        help="where the nodes' services connect, tcp://HOST:PORT or HOST:PORT (port 0: any "
        "free port; default tcp://127.0.0.1:5560)",
    )
    client.add_argument(
        "--report",
        metavar="FILE",
        help="write the Runtime and Finished messages here as y2 messages, each after the "
        "NodeIndex of its node (read it with wirekit decode --proto y2)",
    )
    client.add_argument(
        "--timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="give up (exit 1, every service told to stop) when nothing moved for this long: "
        "no node registered, no worker connected or went, no Delta, Runtime or Finished "
        f"(the services report progress every {STATUS_INTERVAL:g} s); default: wait for ever",
    )
    client.add_argument("--json", action="store_true", help="print the report as JSON")
    _common(client)
    client.set_defaults(func=_client_command)

    service = sub.add_parser(
        "service",
        help="one node's service: its worker's link, Deltas to and from the others",
        description="Run one node's y2 communication service: its worker connects on the "
        "worker link; it registers at the client service, sends the worker's Deltas to the "
        "other nodes and theirs to the worker; exit 0 when the client says the run is over.",
    )
    add_address(
        service,
        "--client",
        kind=zmq_address,
        required=True,
        help="the client service, tcp://HOST:PORT or HOST:PORT",
    )
    add_address(
        service,
        "--worker-listen",
        kind=tcp_address,
        default="127.0.0.1:8888",
        help="where the worker connects (port 0: any free port; default 127.0.0.1:8888, y2's)",
    )
    service.add_argument(
        "--name",
        metavar="NAME",
        help="this node's name at the client; the same name gets the same id "
        "(default HOSTNAME:WORKER_PORT)",
    )
    add_address(
        service,
        "--inbox",
        kind=zmq_address,
        default="tcp://127.0.0.1:0",
        help="where to bind for the other nodes' Deltas (default tcp://127.0.0.1:0, any free port)",
    )
    add_address(
        service,
        "--advertise",
        kind=zmq_address,
        help="the inbox address the other nodes connect to (default: the bound one; "
        "give it when binding 0.0.0.0)",
    )
    service.add_argument(
        "--hwm",
        type=_positive,
        default=DEFAULT_HWM,
        metavar="N",
        help=f"ZeroMQ high-water mark (messages) of the inbox and of each peer "
        f"(default {DEFAULT_HWM})",
    )
    service.add_argument(
        "--max-worker-buffer",
        type=_positive,
        default=DEFAULT_MAX_WORKER_BUFFER,
        metavar="BYTES",
        help=f"bytes queued for the worker before --slow-worker applies "
        f"(default {DEFAULT_MAX_WORKER_BUFFER})",
    )
    service.add_argument(
        "--slow-worker",
        choices=[p.value for p in SlowWorker],
        default=SlowWorker.BLOCK.value,
        help="past --max-worker-buffer: block (stop taking the other nodes' Deltas; "
        "nothing lost) or drop (drop them, counted) (default block)",
    )
    service.add_argument("--json", action="store_true", help="print the counters as JSON on exit")
    _common(service)
    service.set_defaults(func=_service_command)
    y2_parser.set_defaults(handler=_dispatch)


def _common(parser: argparse.ArgumentParser) -> None:
    add_max_message_size(
        parser,
        type=_positive,
        default=DEFAULT_MAX_MESSAGE_SIZE,
        old=["--max-message"],
        help=f"largest y2 message accepted (default {DEFAULT_MAX_MESSAGE_SIZE})",
    )
    add_logging_arguments(parser, what="links opened and closed, nodes registered")


def _dispatch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return int(args.func(args, out, err))
