"""``wirekit clipper container|frontend|predict``: the Clipper runtimes on the command line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from collections.abc import Sequence
from typing import Any, TextIO, cast

from wirekit._logging import add_logging_arguments
from wirekit._vocabulary import (
    add_address,
    add_deprecated_alias,
    add_deprecated_flag,
    add_max_message_size,
    zmq_address,
    zmq_address_or_off,
)
from wirekit.errors import WirekitError

from .queries import (
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PENDING_BYTES,
    DEFAULT_MAX_QUERY_SIZE,
    DEFAULT_MAX_TIMEOUT,
)
from .session import DEFAULT_MAX_FRAME_SIZE

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
GENERATIONS = ("2016", "2017", "v3")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose numeric options take values starting with ``-``.

    argparse reads ``--ints -5,3`` (or ``--timeout -1e3``) as an option with no value: a
    word that starts with ``-`` is a value only when it is a plain negative number and no
    option looks like one.  Each option added with :meth:`add_value` (the numeric ones, and
    ``--strings``) gets the next word as its value whatever it starts with (``--ints=-5,3``
    works with any option already).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.numeric_options: set[str] = set()

    def add_value(self, *flags: str, **kwargs: Any) -> argparse.Action:
        """``add_argument`` for an option whose value may start with ``-``."""
        self.numeric_options.update(flags)
        return self.add_argument(*flags, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if args is not None and self.numeric_options:
            args = _glue_values(list(args), self.numeric_options)
        return super().parse_known_args(args, namespace)


def _glue_values(args: list[str], options: set[str]) -> list[str]:
    """``[..., "--ints", "-5,3", ...]`` -> ``[..., "--ints=-5,3", ...]`` for ``options``
    (up to a ``--``)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            out.extend(args[i:])
            break
        if (
            word in options
            and i + 1 < len(args)
            and args[i + 1].startswith("-")
            and args[i + 1] != "--"
        ):
            out.append(f"{word}={args[i + 1]}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def _until_signal(stop: threading.Event) -> None:
    """Wait for SIGINT/SIGTERM (when on the main thread) or ``stop``."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.2):
        pass


def _container(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .container import ModelContainer, address_from_env, load_function
    from .session import VersionMismatch

    if not args.handler_spec:
        err.write("wirekit clipper container: give --handler MODULE:FUNCTION\n")
        return EXIT_USAGE
    try:
        fn = load_function(args.handler_spec)
        env = dict(os.environ)
        if args.ip:
            env["CLIPPER_IP"] = args.ip
        if args.port is not None:
            env["CLIPPER_PORT"] = str(args.port)
        container = ModelContainer.from_env(
            fn,
            env,
            model_name=args.name,
            model_version=args.model_version,
            input_type=args.input_type,
            address=args.address or address_from_env(env),
            generation=args.generation,
            poll_interval=args.poll_interval,
            activity_timeout=args.activity_timeout,
            max_frame_size=args.max_frame_size,
        )
    except (ValueError, ImportError, AttributeError) as exc:
        err.write(f"wirekit clipper container: {exc}\n")
        return EXIT_USAGE
    reg = container.registration
    out.write(
        f"serving {reg.model_name}:{reg.model_version} ({reg.input_type.name.lower()}) "
        f"to {container.address}, Clipper RPC {container.generation.value}\n"
    )
    out.flush()
    stop = threading.Event()
    container.start()

    def watch() -> None:
        cast(threading.Thread, container._thread).join()  # started above
        stop.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _until_signal(stop)
    container.stop()
    if isinstance(container.error, VersionMismatch):
        err.write(f"wirekit clipper container: {container.error}\n")
        return EXIT_FAIL
    if container.error is not None:
        err.write(f"wirekit clipper container: stopped: {container.error}\n")
        return EXIT_FAIL
    return EXIT_OK


def _frontend(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import zmq

    from .frontend import Frontend

    try:
        frontend = Frontend(
            args.listen,
            args.generation,
            activity_timeout=args.activity_timeout,
            max_in_flight=args.max_in_flight,
            query=args.query or None,
            max_rejected=args.max_rejected,
            max_frame_size=args.max_frame_size,
            max_query_size=args.max_query_size,
            max_pending_queries=args.max_pending_queries,
            max_pending_query_bytes=args.max_pending_query_bytes,
            max_query_timeout=args.max_query_timeout,
        )
    except ValueError as exc:
        err.write(f"wirekit clipper frontend: {exc}\n")
        return EXIT_USAGE
    try:
        frontend.start()
    except zmq.ZMQError as exc:
        where = f"{args.listen} and {args.query}" if args.query else args.listen
        err.write(f"wirekit clipper frontend: cannot listen on {where}: {exc}\n")
        return EXIT_FAIL
    out.write(
        f"Clipper RPC {frontend.generation.value} frontend on {frontend.endpoint}"
        + (f", queries on {frontend.query_endpoint}" if frontend.query_endpoint else "")
        + "\n"
    )
    out.flush()
    stop = threading.Event()
    # A socket loop that crashes (a bug; its traceback is logged) ends the command.

    def watch() -> None:
        frontend.wait()
        stop.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _until_signal(stop)
    frontend.stop()
    if frontend.error is not None:
        err.write(
            f"wirekit clipper frontend: the socket loop crashed: "
            f"{type(frontend.error).__name__}: {frontend.error}\n"
        )
        return EXIT_FAIL
    return EXIT_OK


def _predict(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .frontend import query

    given = [
        (k, v)
        for k in ("doubles", "floats", "ints", "strings", "bytes_hex")
        if (v := getattr(args, k))
    ]
    if len(given) != 1:
        err.write(
            "wirekit clipper predict: give inputs of one type (--doubles, --floats, "
            "--ints, --strings or --bytes-hex), each flag once per input\n"
        )
        return EXIT_USAGE
    kind, raw = given[0]
    try:
        if kind in ("doubles", "floats"):
            inputs: list = [[float(x) for x in item.split(",") if x.strip()] for item in raw]
        elif kind == "ints":
            inputs = [[int(x) for x in item.split(",") if x.strip()] for item in raw]
        elif kind == "bytes_hex":
            inputs = [bytes.fromhex(item) for item in raw]
        else:
            inputs = list(raw)
    except ValueError as exc:
        err.write(f"wirekit clipper predict: bad input: {exc}\n")
        return EXIT_USAGE
    itype = "bytes" if kind == "bytes_hex" else kind
    if args.address and args.frontend and args.address != args.frontend:
        err.write("wirekit clipper predict: ADDRESS and --frontend differ; give one\n")
        return EXIT_USAGE
    address = args.address or args.frontend or "tcp://127.0.0.1:7001"
    if not 0 <= args.timeout < float("inf"):
        err.write(
            f"wirekit clipper predict: --timeout must be a finite number of seconds "
            f">= 0, got {args.timeout}\n"
        )
        return EXIT_USAGE
    try:
        outputs = query(address, args.model, inputs, itype, timeout=args.timeout)
    except WirekitError as exc:
        err.write(f"wirekit clipper predict: {exc}\n")
        return EXIT_FAIL
    if args.json:
        out.write(json.dumps(outputs) + "\n")
    else:
        for value in outputs:
            out.write(f"{value}\n")
    return EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``wirekit clipper ...`` to the ``wirekit`` command line."""
    clipper = subparsers.add_parser(
        "clipper",
        help="Clipper model containers and a Clipper-side frontend",
        description="Serve a Python model to Clipper, host Clipper containers, or query them.",
    )
    sub = clipper.add_subparsers(
        dest="clipper_command", required=True, metavar="ACTION", parser_class=_Parser
    )

    con = sub.add_parser(
        "container",
        help="serve a predict function as a Clipper model container",
        description="Serve package.module:function to a Clipper (or wirekit frontend). "
        "Defaults come from CLIPPER_MODEL_NAME, CLIPPER_MODEL_VERSION, CLIPPER_IP, "
        "CLIPPER_PORT (7000) and CLIPPER_INPUT_TYPE (doubles).",
    )
    # --handler, as in `wirekit mip serve`: --model names a model in predict and decode.
    # Not required=True: argparse would refuse the old spelling, --model, as missing it.
    handler = con.add_argument(
        "--handler",
        dest="handler_spec",
        metavar="MODULE:FUNCTION",
        help="the predict function (required): gets the inputs, returns one output each",
    )
    add_deprecated_alias(con, "--model", of=handler)
    con.add_argument("--name", metavar="NAME", help="model name (CLIPPER_MODEL_NAME)")
    con.add_argument(
        "--model-version", metavar="VERSION", help="model version (CLIPPER_MODEL_VERSION)"
    )
    con.add_argument(
        "--input-type",
        metavar="TYPE",
        help="bytes, ints, floats, doubles or strings (CLIPPER_INPUT_TYPE, default doubles)",
    )
    add_address(
        con,
        "--address",
        kind=zmq_address,
        help="Clipper's RPC address, tcp://HOST:PORT or HOST:PORT (default from CLIPPER_IP "
        "and CLIPPER_PORT: tcp://127.0.0.1:7000)",
    )
    # the two halves of --address, as the environment variables have them
    add_deprecated_flag(con, "--ip", instead="--address", metavar="HOST")
    add_deprecated_flag(con, "--port", instead="--address", type=int, metavar="PORT")
    con.add_argument(
        "--generation",
        choices=GENERATIONS,
        default="v3",
        help="Clipper RPC generation (default v3, the final release)",
    )
    con.add_value(
        "--poll-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="heartbeat period in seconds (default 5)",
    )
    con.add_value(
        "--activity-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="reconnect after this many silent seconds (default 30)",
    )
    add_max_message_size(
        con,
        dest="max_frame_size",
        default=DEFAULT_MAX_FRAME_SIZE,
        old=["--max-frame-size"],
        help="largest message part (ZMTP frame) Clipper may send; a peer announcing more is "
        "disconnected (default 256 MiB; 0: no limit)",
    )
    add_logging_arguments(con, verbose_alias=True, what="sessions to Clipper")
    con.set_defaults(handler=_container)

    fe = sub.add_parser(
        "frontend",
        help="host Clipper model containers (the Clipper side of the RPC)",
        description="Bind a ROUTER for model containers and a query socket for "
        "wirekit clipper predict.",
    )
    add_address(
        fe,
        "--listen",
        kind=zmq_address,
        default="tcp://127.0.0.1:7000",
        help="where containers connect (port 0: any free port; default tcp://127.0.0.1:7000)",
    )
    add_address(
        fe,
        "--query",
        kind=zmq_address_or_off,
        default="tcp://127.0.0.1:7001",
        help="where wirekit clipper predict connects (default "
        "tcp://127.0.0.1:7001; empty to disable)",
    )
    fe.add_argument(
        "--generation",
        choices=GENERATIONS,
        default="v3",
        help="Clipper RPC generation (default v3)",
    )
    fe.add_value(
        "--activity-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="drop containers silent this long (default 30 s)",
    )
    fe.add_value(
        "--max-in-flight",
        type=int,
        default=1,
        metavar="N",
        help="batches in flight per container (default 1, as Clipper)",
    )
    fe.add_value(
        "--max-rejected",
        type=int,
        default=256,
        metavar="N",
        help="peers of another generation remembered (default 256; the oldest is forgotten first)",
    )
    add_max_message_size(
        fe,
        dest="max_frame_size",
        default=DEFAULT_MAX_FRAME_SIZE,
        old=["--max-frame-size"],
        help="largest message part (ZMTP frame) a container may send; a peer announcing more "
        "is disconnected (default 256 MiB; 0: no limit)",
    )
    fe.add_value(
        "--max-query-size",
        type=int,
        default=DEFAULT_MAX_QUERY_SIZE,
        metavar="BYTES",
        help="largest query body decoded; a larger one is answered with an error unread "
        "(default 8 MiB; libzmq drops frames over 8 times this with their connection)",
    )
    fe.add_value(
        "--max-pending-queries",
        type=int,
        default=DEFAULT_MAX_PENDING,
        metavar="N",
        help="queries taken and not yet answered; more are answered with an error at once "
        "(default 256)",
    )
    fe.add_value(
        "--max-pending-query-bytes",
        type=int,
        default=DEFAULT_MAX_PENDING_BYTES,
        metavar="BYTES",
        help="body bytes of the queries taken and not yet answered; a query that would "
        "pass it is answered with an error at once (default 64 MiB)",
    )
    fe.add_value(
        "--max-query-timeout",
        type=float,
        default=DEFAULT_MAX_TIMEOUT,
        metavar="SECONDS",
        help="the longest timeout a query may ask for; a longer one is refused with an "
        "error (default 300)",
    )
    add_logging_arguments(fe, verbose_alias=True, what="containers registered and removed")
    fe.set_defaults(handler=_frontend)

    pr = sub.add_parser(
        "predict",
        help="ask a running wirekit clipper frontend for a prediction",
        description="Send one batch to a model; repeat an input flag for several inputs.",
    )
    # The address is positional, as in `wirekit mip ping|infer`; --frontend is its old name.
    add_address(
        pr,
        "address",
        kind=zmq_address,
        nargs="?",
        help="the frontend's query address (default tcp://127.0.0.1:7001)",
    )
    pr.add_argument("--model", required=True, metavar="NAME", help="the model name")
    add_deprecated_flag(pr, "--frontend", instead="ADDRESS", type=zmq_address, metavar="ADDRESS")
    pr.add_value("--doubles", action="append", metavar="X,Y,...", help="one input")
    pr.add_value("--floats", action="append", metavar="X,Y,...", help="one input")
    pr.add_value("--ints", action="append", metavar="X,Y,...", help="one input")
    pr.add_value("--strings", action="append", metavar="TEXT", help="one input")
    pr.add_argument("--bytes-hex", action="append", metavar="HEX", help="one input")
    pr.add_value(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="wait this long for the answer (default 5)",
    )
    pr.add_argument("--json", action="store_true", help="print the outputs as a JSON list")
    pr.set_defaults(handler=_predict)
