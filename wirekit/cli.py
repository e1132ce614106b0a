"""The ``wirekit`` command line.  ``main(argv)`` returns the exit status.

``wirekit decode --proto P FILE`` works the same way for every protocol: each protocol
package has a ``dump`` module with ``walk(data, args)`` (yields ``(offset, record)`` pairs,
raises :class:`~wirekit.errors.DecodeError` where the input goes bad) and
``render(record) -> str`` (the human form); optionally ``add_arguments(parser)`` for its own
options.  Protocol runtimes add their own subcommands through ``COMMAND_MODULES``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from wirekit import __version__
from wirekit.errors import DecodeError

#: protocol name -> module with ``walk`` and ``render``
DUMPERS = {
    "clipper": "wirekit.clipper.dump",
    "mip": "wirekit.mip.dump",
    "y2": "wirekit.y2.dump",
}

#: modules with ``register(subparsers)`` adding ``wirekit <name> ...`` commands
COMMAND_MODULES: list[str] = ["wirekit.mip.cli", "wirekit.clipper.commands", "wirekit.serve.cli"]

EXIT_OK, EXIT_BAD_INPUT, EXIT_USAGE = 0, 1, 2


def hex_excerpt(data: bytes, offset: int, radius: int = 16) -> str:
    """Hex of the bytes around ``offset`` with the byte at ``offset`` in brackets."""
    start = max(0, offset - radius)
    stop = min(len(data), offset + radius)
    parts = [f"{b:02x}" for b in data[start:stop]]
    if offset < len(data):
        parts[offset - start] = f"[{parts[offset - start]}]"
    else:
        parts.append("[..end]")
    return f"  {start:08x}: " + " ".join(parts)


def _read_input(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    with open(path, "rb") as fh:
        return fh.read()


def _decode_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    dumper = importlib.import_module(DUMPERS[args.proto])
    try:
        data = _read_input(args.file)
    except OSError as exc:
        err.write(f"wirekit: cannot read {args.file}: {exc.strerror or exc}\n")
        return EXIT_USAGE
    count = 0
    try:
        for offset, record in dumper.walk(data, args):
            count += 1
            if args.json:
                out.write(json.dumps({"offset": offset, **record}) + "\n")
            else:
                out.write(f"@{offset} {dumper.render(record)}\n")
    except DecodeError as exc:
        out.flush()
        err.write(f"wirekit: {exc}\n{hex_excerpt(data, exc.offset)}\n")
        err.write(f"wirekit: {count} message(s) decoded before the error\n")
        return EXIT_BAD_INPUT
    if not args.json:
        out.write(f"{count} message(s), {len(data)} bytes\n")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wirekit", description="Decode, serve and test ML wire protocols."
    )
    parser.add_argument("--version", action="version", version=f"wirekit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    dec = sub.add_parser(
        "decode",
        help="decode a capture or dump file",
        description="Decode a file of concatenated messages (one direction of a stream).",
    )
    dec.add_argument("--proto", required=True, choices=sorted(DUMPERS), help="the protocol")
    dec.add_argument("--json", action="store_true", help="print one JSON object per message")
    dec.add_argument("file", help="the file to decode, or - for standard input")
    for name in sorted(DUMPERS):
        module = importlib.import_module(DUMPERS[name])
        if hasattr(module, "add_arguments"):
            module.add_arguments(dec)
    dec.set_defaults(handler=_decode_command)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    try:
        return int(args.handler(args, out, err))
    except BrokenPipeError:  # `wirekit decode ... | head`
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
