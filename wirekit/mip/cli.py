"""``wirekit mip serve|ping|infer``: run a MIP server, or call one.

    wirekit mip serve --listen tcp://127.0.0.1:5000 --handler package.module:function
    wirekit mip ping tcp://127.0.0.1:5000 --count 3
    wirekit mip infer tcp://127.0.0.1:5000 --text "hello" --json-item '{"k": 1}' --image cat.png

``serve`` prints each bound address on standard output (``listening on ADDRESS``) once it
accepts connections, logs to standard error, and shuts down gracefully on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from typing import Any, TextIO

from wirekit import _loop
from wirekit._callables import load_callable
from wirekit._logging import add_logging_arguments
from wirekit._vocabulary import add_address, add_deprecated_alias, mip_address
from wirekit.errors import WirekitError

from .decoder import DEFAULT_MAX_MESSAGE_SIZE
from .limits import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_WRITE_STALL_TIMEOUT,
)
from .messages import DEFAULT_MAX_ITEMS, Item, ItemType
from .runtime import item_value

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def load_handler(spec: str) -> Any:
    """Import the handler named ``package.module:function``."""
    return load_callable(spec)


# --------------------------------------------------------------------------- serve


async def _serve(args: argparse.Namespace, out: TextIO) -> None:
    from wirekit._memory import return_freed_buffers

    from .server import Server

    return_freed_buffers()  # a long-running server: freed big buffers go back to the system
    server = Server(
        load_handler(args.handler_spec),
        max_message_size=args.max_message_size,
        max_items=args.max_items,
        memory_budget=args.memory_budget,
        timeout=args.request_timeout or None,
        idle_timeout=args.idle_timeout or None,
        write_stall_timeout=args.write_stall_timeout or None,
        max_in_flight=args.max_in_flight,
        inline=args.inline,
    )
    await server.start(*(args.listen or ["tcp://127.0.0.1:5000"]))
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Not available off the main thread or on some platforms: then Ctrl-C just stops.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    for address in server.addresses:
        out.write(f"listening on {address}\n")
    out.flush()
    waiter = asyncio.ensure_future(server.serve_forever())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    logging.getLogger("wirekit.mip.server").info("shutting down")
    await server.shutdown(grace=args.grace)
    await waiter


def _serve_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.cgroup:
        from wirekit.cgroups import CgroupError, join_cgroup

        try:
            join_cgroup(args.cgroup)
        except CgroupError as exc:
            err.write(f"wirekit mip serve: --cgroup: {exc}\n")
            return EXIT_FAILED
    try:
        _loop.run(_serve(args, out), args.loop)
    except (ImportError, AttributeError, ValueError) as exc:
        err.write(f"wirekit mip serve: {exc}\n")
        return EXIT_USAGE
    except OSError as exc:
        err.write(f"wirekit mip serve: cannot listen: {exc}\n")
        return EXIT_FAILED
    return EXIT_OK


# --------------------------------------------------------------------------- ping / infer


def _ping_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .client import Client

    rtts: list[float] = []
    try:
        with Client(args.address, timeout=args.timeout) as client:
            for _ in range(args.count):
                try:
                    rtt = client.ping()
                except WirekitError as exc:  # lost: say so and go on, as ping does
                    err.write(f"wirekit mip ping: no pong: {exc}\n")
                    continue
                rtts.append(rtt)
                out.write(f"pong from {args.address}: {rtt * 1e3:.3f} ms\n")
    except (WirekitError, ValueError) as exc:
        err.write(f"wirekit mip ping: {exc}\n")
        return EXIT_FAILED
    out.write(f"--- {args.address} ping statistics ---\n")
    loss = 100.0 * (args.count - len(rtts)) / args.count if args.count else 0.0
    summary = f"{args.count} sent, {len(rtts)} received, {loss:.0f}% loss"
    if rtts:
        ms = [r * 1e3 for r in rtts]
        summary += f", rtt min/avg/max = {min(ms):.3f}/{sum(ms) / len(ms):.3f}/{max(ms):.3f} ms"
    out.write(summary + "\n")
    return EXIT_OK if rtts or not args.count else EXIT_FAILED


class _InputAction(argparse.Action):
    """Collect --text/--json-item/--image/--item in the order given."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        inputs = getattr(namespace, "inputs", None) or []
        inputs.append((self.dest, values))
        namespace.inputs = inputs


def _make_input(kind: str, value: str) -> Item:
    if kind == "text":
        return Item.text(value)
    if kind == "json":
        try:
            return Item.json(json.loads(value))
        except json.JSONDecodeError as exc:
            raise ValueError(f"--json-item {value!r} is not JSON: {exc}") from None
    if kind == "image":
        with open(value, "rb") as fh:
            return Item.image(fh.read())
    type_text, sep, hex_data = value.partition(":")
    try:
        return Item(int(type_text), bytes.fromhex(hex_data) if sep else b"")
    except ValueError:
        raise ValueError(f"--item {value!r}: expected TYPE:HEX, like 7:0a0b") from None


def _describe(item: Item) -> str:
    if item.type in (ItemType.TEXT, ItemType.JSON):
        try:
            value = item_value(item)
        except ValueError:
            pass
        else:
            shown = value if item.type == ItemType.TEXT else json.dumps(value)
            return f"{item.type_name} {shown}"
    data = item.as_bytes()
    preview = data[:16].hex() + ("..." if len(data) > 16 else "")
    return f"{item.type_name} {len(data)} bytes {preview}"


def _jsonable(item: Item) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": int(item.type), "type_name": item.type_name}
    if item.type == ItemType.TEXT:
        entry["text"] = item.as_text()
    elif item.type == ItemType.JSON:
        entry["json"] = item.as_json()
    else:
        entry["size"] = len(item.data)
        entry["data_hex"] = item.as_bytes().hex()
    return entry


def _infer_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .client import Client

    try:
        sample = [_make_input(kind, value) for kind, value in (getattr(args, "inputs", None) or [])]
    except (OSError, ValueError) as exc:
        err.write(f"wirekit mip infer: {exc}\n")
        return EXIT_USAGE
    if not sample:
        err.write(
            "wirekit mip infer: give at least one input (--text, --json-item, --image, --item)\n"
        )
        return EXIT_USAGE
    try:
        with Client(args.address, timeout=args.timeout) as client:
            outputs = client.infer([sample] * args.batch)
    except (WirekitError, ValueError) as exc:
        err.write(f"wirekit mip infer: {exc}\n")
        return EXIT_FAILED
    if args.json:
        out.write(json.dumps([[_jsonable(i) for i in sample] for sample in outputs]) + "\n")
        return EXIT_OK
    for k, sample_out in enumerate(outputs):
        for n, item in enumerate(sample_out):
            out.write(f"[{k}][{n}] {_describe(item)}\n")
    return EXIT_OK


# --------------------------------------------------------------------------- parser


def register(subparsers: Any) -> None:
    """Add ``wirekit mip ...`` to the main parser."""
    mip_parser = subparsers.add_parser(
        "mip",
        help="run or call a MIP (KubeMo) model server",
        description=__doc__.split("\n")[0].replace("``", ""),
    )
    sub = mip_parser.add_subparsers(dest="mip_command", required=True, metavar="ACTION")

    serve = sub.add_parser(
        "serve",
        help="serve a handler over MIP",
        description="Serve a Python handler to MIP (KubeMo) clients: print 'listening on "
        "ADDRESS' once it accepts connections, log to standard error, stop gracefully on "
        "SIGINT/SIGTERM.  The limits drop clients that misbehave (wirekit.mip.limits).",
    )
    add_address(
        serve,
        "--listen",
        kind=mip_address,
        action="append",
        help="tcp://HOST:PORT, HOST:PORT or unix:///PATH (repeatable; port 0: any free "
        "port; default tcp://127.0.0.1:5000)",
    )
    serve.add_argument(
        "--handler",
        dest="handler_spec",
        required=True,
        metavar="MODULE:FUNCTION",
        help="the model: fn(batch) -> outputs, sync (run in threads) or async; "
        "wirekit.mip.runtime:echo echoes its inputs",
    )
    # The limits: wirekit.mip.limits has the table (the dispatcher's MIP front door takes the
    # same ones from its config's "mip" table, under the same names).
    serve.add_argument(
        "--max-message-size",
        type=int,
        metavar="BYTES",
        default=DEFAULT_MAX_MESSAGE_SIZE,
        help="bytes per request; larger ones get MEMORY and the connection is closed "
        "(default %(default)s)",
    )
    serve.add_argument(
        "--max-items",
        type=int,
        metavar="N",
        default=DEFAULT_MAX_ITEMS,
        help="items per request; more get MEMORY (default %(default)s)",
    )
    budget = serve.add_argument(
        "--memory-budget",
        dest="memory_budget",
        type=int,
        metavar="BYTES",
        default=DEFAULT_MEMORY_BUDGET,
        help="bytes all connections together may hold: bytes read, requests in flight, "
        "replies unsent; past it a connection owing answers stops being read, one holding "
        "only a partial request gets MEMORY and is closed (default %(default)s)",
    )
    add_deprecated_alias(serve, "--max-buffered", of=budget)
    request_timeout = serve.add_argument(
        "--request-timeout",
        dest="request_timeout",
        type=float,
        metavar="SECONDS",
        default=DEFAULT_REQUEST_TIMEOUT,
        help="drop a client whose request is not complete this long after its first byte "
        "(s, 0: off; default %(default)s)",
    )
    # a server's --timeout would read as "wait for an answer", what it means in every client
    add_deprecated_alias(serve, "--timeout", of=request_timeout)
    serve.add_argument(
        "--idle-timeout",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT,
        metavar="SECONDS",
        help="drop a client idle this long (s, 0: off; default %(default)s)",
    )
    serve.add_argument(
        "--write-stall-timeout",
        type=float,
        default=DEFAULT_WRITE_STALL_TIMEOUT,
        metavar="SECONDS",
        help="drop a client whose replies wait unsent, with no progress writing them, this "
        "long: it does not read them (s, 0: off; default %(default)s)",
    )
    serve.add_argument(
        "--max-in-flight",
        type=int,
        default=64,
        metavar="N",
        help="requests handled at once per connection; past it reading pauses (default 64)",
    )
    serve.add_argument(
        "--loop",
        choices=_loop.CHOICES,
        default=None,
        help="event loop (default: uvloop when installed, else asyncio; env WIREKIT_LOOP)",
    )
    serve.add_argument(
        "--inline",
        action="store_true",
        help="call a sync handler on the event loop (no thread hop): only for handlers "
        "that return at once",
    )
    serve.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, how long requests in flight may take (default 10)",
    )
    serve.add_argument(
        "--cgroup",
        metavar="PATH",
        help="run in this cgroup (a directory under /sys/fs/cgroup, created if missing; "
        "its CPU quota is what the controller's cgroup actuator sets); exit 1 if it "
        "cannot be joined",
    )
    add_logging_arguments(serve, what="listening, stopped, dropped connections")
    serve.set_defaults(func=_serve_command)

    ping = sub.add_parser(
        "ping",
        help="ping a MIP server",
        description="Send MIP pings to a server and print each round trip, then a summary "
        "as ping(8) does; exit 0 when a pong came back, 1 when none did.",
    )
    add_address(
        ping, "address", kind=mip_address, help="the server: tcp://HOST:PORT or unix:///PATH"
    )
    ping.add_argument(
        "-c", "--count", type=int, default=1, metavar="N", help="pings to send (default 1)"
    )
    ping.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="wait this long for each pong (default 5)",
    )
    ping.set_defaults(func=_ping_command)

    infer = sub.add_parser(
        "infer",
        help="send one sample and print the outputs",
        description="Send one sample (its items in the order given) to a MIP server and "
        "print the outputs; exit 1 when the server answers with an error.",
    )
    add_address(
        infer, "address", kind=mip_address, help="the server: tcp://HOST:PORT or unix:///PATH"
    )
    # Inputs are items named after their MIP type; --json is the JSON *output* switch, as in
    # every other command, so a JSON input is --json-item.
    for flag, kind, metavar, text in (
        ("--text", "text", "TEXT", "a TEXT input"),
        ("--json-item", "json", "JSON", "a JSON input (JSON text)"),
        ("--image", "image", "FILE", "an IMAGE input read from FILE"),
        ("--item", "item", "TYPE:HEX", "an input of any MIP type, e.g. 7:0a0b"),
    ):
        infer.add_argument(flag, dest=kind, metavar=metavar, action=_InputAction, help=text)
    infer.add_argument(
        "--batch",
        type=int,
        default=1,
        metavar="N",
        help="send the sample N times in one request (default 1)",
    )
    infer.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="wait this long for the answer (default 10)",
    )
    json_flag = infer.add_argument("--json", action="store_true", help="print the outputs as JSON")
    add_deprecated_alias(infer, "--print-json", of=json_flag)  # its name in 0.1
    infer.set_defaults(func=_infer_command)

    mip_parser.set_defaults(handler=_dispatch)


def _dispatch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return int(args.func(args, out, err))


def main(argv: list[str] | None = None) -> int:
    from wirekit.cli import main as wirekit_main

    return wirekit_main(["mip", *(argv if argv is not None else sys.argv[1:])])
