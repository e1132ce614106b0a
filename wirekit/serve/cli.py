"""``wirekit serve``: run the dispatcher, check a config, print the metrics of a store.

    wirekit serve --config deployment.json      # run until SIGINT/SIGTERM
    wirekit serve check --config deployment.toml
    wirekit serve stats --store requests.db [--json]

When the dispatcher is listening it prints one JSON line to standard output:
``{"event": "ready", "host": ..., "http": port, "mip": {model: port}, "clipper_rpc": port}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import json
import logging
import signal
import sqlite3
from pathlib import Path
from typing import TextIO

from wirekit import _loop

EXIT_OK, EXIT_BAD_INPUT, EXIT_USAGE = 0, 1, 2
log = logging.getLogger("wirekit.serve")


def register(subparsers) -> None:
    """Add ``wirekit serve`` to the top-level parser."""
    p = subparsers.add_parser(
        "serve",
        help="run the request dispatcher over MIP and Clipper backends",
        description="Run the request dispatcher described by a deployment config.",
    )
    p.add_argument("--config", metavar="FILE", help="deployment config (.json or .toml)")
    p.add_argument(
        "--log-level",
        default="warning",
        type=str.lower,
        choices=["debug", "info", "warning", "error"],
        help="any case (default warning)",
    )
    p.add_argument(
        "--loop",
        choices=_loop.CHOICES,
        default=None,
        help="event loop (default: uvloop when installed, else asyncio; env WIREKIT_LOOP)",
    )
    p.set_defaults(handler=_serve)
    sub = p.add_subparsers(dest="serve_command", metavar="SUBCOMMAND")
    st = sub.add_parser("stats", help="print the metrics of a requests store")
    st.add_argument("--store", required=True, help="the SQLite store file")
    st.add_argument("--json", action="store_true", help="print the metrics as JSON")
    st.set_defaults(handler=_stats)
    ck = sub.add_parser("check", help="validate a deployment config and print its devices")
    ck.add_argument(
        "--config",
        dest="check_config",
        metavar="FILE",
        help="the config file (or give --config before `check`)",
    )
    ck.add_argument(
        "--probe",
        action="store_true",
        help="also try a TCP connection to every MIP/KubeMo backend with quota > 0 "
        "(exit 1 if one cannot be reached)",
    )
    ck.set_defaults(handler=_check)


def _stats(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .metrics import render_stats, stats_from_store
    from .store import connect

    path = Path(args.store)
    if not path.is_file():
        err.write(f"wirekit: no store at {path}\n")
        return EXIT_USAGE
    try:
        conn = connect(path, readonly=True)
        try:
            stats = stats_from_store(conn)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        err.write(f"wirekit: {path} is not a requests store: {exc}\n")
        return EXIT_BAD_INPUT
    out.write((json.dumps(stats, indent=2) if args.json else render_stats(stats)) + "\n")
    return EXIT_OK


def _check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .config import ConfigError, load_config
    from .router import Router

    path = args.check_config or args.config
    if not path:
        err.write("wirekit: serve check needs --config FILE\n")
        return EXIT_USAGE
    try:
        dep = load_config(path)
    except ConfigError as exc:
        err.write(f"wirekit: {exc}\n")
        return EXIT_BAD_INPUT
    router = Router(dep.rows)
    for name in dep.models:
        out.write(f"{name}:\n")
        probs = router.probabilities(name)
        for row in dep.rows_of(name):
            if row.quota == 0:
                where = "disabled"
            elif row.port is None:
                where = "clipper (the container connects)"
            else:
                where = f"{row.backend} {row.endpoint}:{row.port}"
            p = probs.get(row.key, 0.0)
            out.write(
                f"  {row.key:<24} {row.device_type} quota {row.quota:<5g} P={p:.3f}  {where}\n"
            )
    if not args.probe:
        return EXIT_OK
    results = asyncio.run(probe(dep.rows))
    for key, problem in results.items():
        out.write(f"probe {key}: {'reachable' if problem is None else 'UNREACHABLE: ' + problem}\n")
    return EXIT_OK if all(p is None for p in results.values()) else EXIT_BAD_INPUT


async def probe(rows, timeout: float = 2.0) -> dict[str, str | None]:
    """Try a TCP connection to the backend of every row that has one (quota > 0): row key →
    None when it accepted, else why not."""

    async def one(row) -> str | None:
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(row.endpoint, row.port), timeout
            )
        except (OSError, asyncio.TimeoutError) as exc:
            return str(exc) or type(exc).__name__
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return None

    reachable = [row for row in rows if row.port is not None and row.quota > 0]
    results = await asyncio.gather(*(one(row) for row in reachable))
    return {row.key: result for row, result in zip(reachable, results, strict=True)}


def _serve(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .config import ConfigError, load_config

    if not args.config:
        err.write("wirekit: serve needs --config FILE (or a subcommand: stats, check)\n")
        return EXIT_USAGE
    missing = _missing_extra()
    if missing is not None:
        err.write(
            f"wirekit: serve needs the 'serve' extra ({missing} is not installed): "
            "pip install 'wirekit[serve]'\n"
        )
        return EXIT_USAGE
    try:
        dep = load_config(args.config)
    except ConfigError as exc:
        err.write(f"wirekit: {exc}\n")
        return EXIT_BAD_INPUT
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        _loop.resolve(args.loop)
    except ValueError as exc:
        err.write(f"wirekit: {exc}\n")
        return EXIT_USAGE
    try:
        return _loop.run(_run(dep, out), args.loop)
    except ConfigError as exc:  # what only building the service finds (controller.policy)
        err.write(f"wirekit: {exc}\n")
        return EXIT_BAD_INPUT
    except OSError as exc:
        err.write(f"wirekit: cannot listen: {exc.strerror or exc}\n")
        return EXIT_BAD_INPUT


#: What the dispatcher imports beyond wirekit's own requirements (the ``serve`` extra);
#: ``serve check`` and ``serve stats`` need none of it.
SERVE_EXTRA = ("aiohttp", "prometheus_client")


def _missing_extra() -> str | None:
    """The first module of the ``serve`` extra that cannot be imported, or None."""
    for name in SERVE_EXTRA:
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


async def _run(dep, out: TextIO) -> int:
    from .service import Service

    service = Service(dep)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    received: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig.name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    await service.start()
    # What start-up made (modules, the app, the listeners) lives as long as the process: out
    # of the collector's way, a full collection walks only what requests make (a few ms
    # less every few thousand requests, which would otherwise stall every answer in flight).
    gc.freeze()
    try:
        out.write(json.dumps({"event": "ready", **service.addresses()}) + "\n")
        out.flush()
        # Said once at start (the dispatcher already serves meanwhile): a backend that
        # cannot be reached now has its requests resubmitted elsewhere and is backed off.
        for key, problem in (await probe(dep.rows)).items():
            if problem is not None:
                log.warning("wirekit serve: backend of %s cannot be reached now (%s)", key, problem)
        await stop.wait()
        log.warning(
            "wirekit serve: %s received; stopping (requests in flight are answered)",
            received[0] if received else "stop",
        )
    finally:
        await service.stop()
    log.warning("wirekit serve: stopped")
    return EXIT_OK
