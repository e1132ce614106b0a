"""The ``wirekit`` command line.  ``main(argv)`` returns the exit status.

``wirekit decode --proto P FILE`` works the same way for every protocol: each protocol
package has a ``dump`` module with ``walk(data, args)`` (yields ``(offset, record)`` pairs,
raises :class:`~wirekit.errors.DecodeError` where the input goes bad) and
``render(record) -> str`` (the human form); optionally ``add_arguments(parser)`` for its own
options.  Protocol runtimes add their own subcommands through ``COMMAND_MODULES``; a command's
module is imported only when that command runs (or when the whole list is shown).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Sequence
from typing import TextIO

from wirekit import __version__, analyse, capture
from wirekit._dumping import DEFAULT_MAX_MESSAGE, hex_excerpt
from wirekit._logging import add_logging_arguments, command_logging
from wirekit._vocabulary import (
    add_address,
    add_max_message_size,
    deprecation_notes,
    tcp_address_or_port,
)
from wirekit.analyse import DUMPERS, EXIT_MALFORMED, EXIT_OK, EXIT_USAGE

#: ``wirekit <name> ...`` commands of other modules: name -> the module whose
#: ``register(subparsers)`` adds it.  Only the module of the command being run is imported
#: (``wirekit decode`` does not import the dispatcher, nor need its extra).
COMMAND_MODULES: dict[str, str] = {
    "mip": "wirekit.mip.cli",
    "clipper": "wirekit.clipper.commands",
    "serve": "wirekit.serve.cli",
    "y2": "wirekit.y2.commands",
    "conform": "wirekit.conform.cli",
}

EXIT_BAD_INPUT = EXIT_MALFORMED
__all__ = ["EXIT_BAD_INPUT", "EXIT_OK", "EXIT_USAGE", "build_parser", "hex_excerpt", "main"]

DECODE_HELP = """\
Decode MIP, Clipper (ZMTP) and y2 worker-link traffic.

FILE is a pcap or pcapng capture (detected by its magic bytes; TCP connections are
reassembled, both directions shown on one timeline, responses paired with their requests
and given their latency) or a raw file of one direction's bytes as sent; - reads standard
input as it comes (tcpdump -U -w - | wirekit decode -).  --client/--server give both
directions of one connection as two raw files (merged request, then answer).  The protocol
of each connection is detected unless --proto says.  On a terminal, standard error shows the
progress of a long decode (not with -q).

A malformed message is shown, marked [Malformed] with its error (field, offset), and
decoding goes on with the next message wherever the framing allows.  A capture cut short
is decoded up to the cut, then a line says where it ends.  Exit status: 0 all decoded; 1
some message malformed, bytes missing/skipped or a capture cut short; 2 bad usage, an
unreadable input, or no protocol detected.
"""


def _record_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import signal
    import threading
    import time

    from wirekit.zmtp.record import RecordingProxy

    listen, target = args.listen.host_port, args.target.host_port
    try:
        fh = open(args.write, "wb")  # noqa: SIM115 - closed below, after the proxy
    except OSError as exc:
        err.write(f"wirekit record: cannot write {args.write}: {exc.strerror or exc}\n")
        return EXIT_USAGE
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        proxy = RecordingProxy(
            target, listen[0], listen_port=listen[1], accept_timeout=None,
            idle_timeout=args.idle_timeout, max_connections=args.connections, pcapng=fh,
        )  # fmt: skip
        with proxy:
            out.write(f"recording {listen[0]}:{proxy.port} -> {target[0]}:{target[1]} "
                      f"into {args.write}\n")  # fmt: skip
            out.flush()
            deadline = None if args.duration is None else time.monotonic() + args.duration
            try:
                while not stop.is_set() and not proxy.wait(0.1):
                    if deadline is not None and time.monotonic() >= deadline:
                        break
            except KeyboardInterrupt:
                pass
        out.write(f"{proxy.connections} connection(s) recorded\n")
        if proxy.refused and proxy.connections == 0:
            why = getattr(proxy.error, "strerror", None) or proxy.error
            err.write(
                f"wirekit record: nothing recorded: {proxy.refused} client(s) came, but the "
                f"target {target[0]}:{target[1]} could not be reached ({why})\n"
            )
            return EXIT_BAD_INPUT
        return EXIT_OK
    except OSError as exc:  # the address is taken, or not this machine's
        err.write(f"wirekit record: cannot listen on {args.listen}: {exc.strerror or exc}\n")
        return EXIT_BAD_INPUT
    finally:
        fh.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _decode_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # `wirekit decode --error cap.pcapng`: the optional NAME of --error took the file name.
    # With no FILE and no --client/--server that word can only be the file.
    if args.error and args.file is None and args.client is None and args.server is None:
        args.file, args.error = args.error, ""
    return analyse.run(args, out, err)


def _dissector_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from wirekit.dissector import GENERATORS

    lua = GENERATORS[args.proto](args.port, args.max_message)
    if args.output is None:
        out.write(lua)
        return EXIT_OK
    try:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(lua)
    except OSError as exc:
        err.write(f"wirekit dissector: cannot write {args.output}: {exc.strerror or exc}\n")
        return EXIT_USAGE
    return EXIT_OK


def command_of(argv: Sequence[str]) -> str | None:
    """The command word of a ``wirekit`` command line (its first argument that is not an
    option: the top-level parser has only ``--version`` and ``--help``), or None."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``wirekit`` parser: every command, or only ``command`` when it names one (what
    :func:`main` builds to run it, importing nothing the other commands need)."""
    parser = argparse.ArgumentParser(
        prog="wirekit", description="Decode, serve and test ML wire protocols."
    )
    parser.add_argument("--version", action="version", version=f"wirekit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    known = command in BUILT_IN or command in COMMAND_MODULES
    for name, add in BUILT_IN.items():
        if not known or name == command:
            add(sub)
    for name, module in COMMAND_MODULES.items():
        if not known or name == command:
            importlib.import_module(module).register(sub)
    return parser


def _add_decode(sub: argparse._SubParsersAction) -> None:
    dec = sub.add_parser(
        "decode",
        help="decode a capture (pcap/pcapng) or a raw dump",
        description=DECODE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dec.add_argument("--proto", choices=sorted(DUMPERS), help="the protocol (default: detected)")
    dec.add_argument("--json", action="store_true", help="print one JSON object per message")
    dec.add_argument("file", nargs="?", help="the file to decode, or - for standard input")
    dec.add_argument("--client", metavar="FILE", help="raw bytes the client sent")
    dec.add_argument("--server", metavar="FILE", help="raw bytes the server sent")
    sel = dec.add_argument_group("selection and summary")
    sel.add_argument(
        "--kind",
        action="append",
        metavar="KIND",
        help="show only messages of this kind (repeatable; 'malformed' too)",
    )
    sel.add_argument(
        "--error",
        nargs="?",
        const="",
        metavar="NAME",
        help="show only malformed messages and error replies (--error=NAME: only those "
        "with this error code, such as SHAPE, or this malformed field)",
    )
    sel.add_argument(
        "--model", metavar="NAME", help="show only messages of connections serving this model"
    )
    sel.add_argument(
        "--msg-id", type=int, metavar="ID", help="show only messages with this message id"
    )
    sel.add_argument("--conn", type=int, metavar="N", help="only connection N of a capture")
    sel.add_argument("-c", "--count", type=int, metavar="N", help="stop after N messages shown")
    sel.add_argument(
        "--stats",
        action="store_true",
        help="print counts per kind and error, sizes, batch sizes and latency "
        "percentiles after the messages",
    )
    sel.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="do not print the messages (with --stats: the summary only), nor progress",
    )
    lim = dec.add_argument_group("limits")
    add_max_message_size(
        lim,
        dest="max_message",
        default=DEFAULT_MAX_MESSAGE,
        old=["--max-message"],
        help=f"a header announcing more is lost framing (default {DEFAULT_MAX_MESSAGE})",
    )
    lim.add_argument(
        "--max-pending",
        type=int,
        default=capture.DEFAULT_MAX_PENDING,
        metavar="BYTES",
        help="out-of-order bytes held per direction waiting for a missing "
        f"segment (default {capture.DEFAULT_MAX_PENDING})",
    )
    for name in sorted(DUMPERS):
        module = importlib.import_module(DUMPERS[name])
        if hasattr(module, "add_arguments"):
            module.add_arguments(dec)
    dec.set_defaults(handler=_decode_command)


def _add_record(sub: argparse._SubParsersAction) -> None:
    rec = sub.add_parser(
        "record",
        help="record a connection through a forwarding proxy into a pcapng file",
        description="Listen, forward each connection to the real peer, and write both "
        "directions, with timestamps, to a pcapng file that wirekit decode reads.  Stops "
        "after --connections connections have closed, after --duration seconds, or on "
        "Ctrl-C / SIGTERM (the file is complete in every case).",
    )
    add_address(
        rec,
        "--listen",
        kind=tcp_address_or_port,
        required=True,
        help="where clients connect: HOST:PORT, tcp://HOST:PORT, or PORT on 127.0.0.1 (port "
        "0: any free port, printed)",
    )
    add_address(
        rec,
        "--target",
        kind=tcp_address_or_port,
        required=True,
        help="the real peer, HOST:PORT or tcp://HOST:PORT",
    )
    rec.add_argument("-w", "--write", required=True, metavar="FILE", help="the pcapng to write")
    rec.add_argument(
        "--connections",
        type=int,
        metavar="N",
        help="stop once N connections have been recorded (default: no limit)",
    )
    rec.add_argument(
        "--duration", type=float, metavar="SECONDS", help="stop after this long (default: no limit)"
    )
    rec.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="close a connection idle this long (default: never)",
    )
    add_logging_arguments(rec, what="connections forwarded; WARNING: a target not reached")
    rec.set_defaults(handler=_record_command)


def _add_dissector(sub: argparse._SubParsersAction) -> None:
    dis = sub.add_parser(
        "dissector",
        help="write a Wireshark Lua dissector for MIP, Clipper (with ZMTP) or y2",
        description="Write a Wireshark/tshark Lua dissector generated from wirekit's own "
        "field definitions.  Use: tshark -X lua_script:FILE -r capture.pcapng -V.  It "
        "registers a heuristic TCP dissector, and the given --port(s) in tcp.port.",
    )
    dis.add_argument(
        "--proto",
        required=True,
        choices=["clipper", "mip", "y2"],
        help="the protocol to dissect (clipper: its ZMTP framing too)",
    )
    dis.add_argument(
        "--port",
        type=int,
        action="append",
        default=[],
        metavar="PORT",
        help="a TCP port the protocol runs on (repeatable)",
    )
    add_max_message_size(
        dis,
        dest="max_message",
        default=DEFAULT_MAX_MESSAGE,
        old=["--max-message"],
        help="a larger announced size is shown as lost framing",
    )
    dis.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    dis.set_defaults(handler=_dissector_command)


#: the commands defined here, in the order ``wirekit --help`` lists them (before the
#: :data:`COMMAND_MODULES`)
BUILT_IN = {"decode": _add_decode, "record": _add_record, "dissector": _add_dissector}


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_of(argv))
    try:
        with contextlib.redirect_stderr(err):  # a usage error goes where the others go
            args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    for note in deprecation_notes(args):  # an old spelling: it works, and says so
        err.write(f"{note}\n")
    # a command that logs (it has --log-level/--log-format) logs as they say, to `err`
    logs = command_logging(args, err) if hasattr(args, "log_format") else contextlib.nullcontext()
    try:
        with logs:
            return int(args.handler(args, out, err))
    except BrokenPipeError:  # `wirekit decode ... | head`
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
