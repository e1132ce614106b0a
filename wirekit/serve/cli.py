"""``wirekit serve``: run the dispatcher, check a config, print the metrics of a store.

    wirekit serve --config deployment.json      # run until SIGINT/SIGTERM
    wirekit serve --config deployment.json --with-backends   # and its MIP backends
    wirekit serve check --config deployment.toml
    wirekit serve stats --store requests.db [--json]
    wirekit serve stats --store-url postgresql://host/db [--json]
    wirekit serve stats --config deployment.json [--json]    # the config's store
    wirekit serve models list|add|remove|set|quota [--url 127.0.0.1:8080 | --config FILE]
                                                   [--token T] [--token-file FILE] [--json]
    wirekit serve k8s --config deployment.json [-o DIR]      # Kubernetes manifests

When the dispatcher is listening it prints one JSON line to standard output:
``{"event": "ready", "host": ..., "http": port, "grpc": port, "mip": {model: port},
"clipper_rpc": port}`` (``grpc``: the OIP gRPC door's port, null without ``listen.grpc_port``)
(with ``--with-backends`` also ``"backends": {"node/device/model": "tcp://host:port"}``; with
a generated admin token, ``"admin_token_file": path``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import importlib
import json
import os
import signal
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from wirekit import _loop
from wirekit._logging import add_logging_arguments
from wirekit._vocabulary import add_address, parse_http_url, tcp_address

from .logs import serve_logger

if TYPE_CHECKING:
    from .backends.local import LocalBackends

EXIT_OK, EXIT_BAD_INPUT, EXIT_USAGE = 0, 1, 2
#: seconds ``serve check --probe`` gives each backend to accept a connection
CHECK_TIMEOUT = 2.0
ADMIN_URL_ENV = "WIREKIT_ADMIN_URL"
#: what ``wirekit serve check`` says of each ``health.ready`` policy
READY_MEANING = {
    "all": "/readyz is ready when every model has a reachable device",
    "any": "/readyz is ready when at least one model has a reachable device",
}
log = serve_logger()


def register(subparsers) -> None:
    """Add ``wirekit serve`` to the top-level parser."""
    p = subparsers.add_parser(
        "serve",
        # the dispatcher runs with no subcommand: argparse would show SUBCOMMAND as required
        usage="%(prog)s --config FILE [--listen ADDRESS] [--with-backends] [OPTION ...]\n"
        "       %(prog)s {stats,check,models,k8s} ...",
        help="run the request dispatcher over MIP and Clipper backends",
        description="Run the request dispatcher described by a deployment config. To try "
        "it, from the checkout: wirekit serve --config samples/serve-deployment.json "
        "--with-backends (samples/tiny_model.py says what to curl).",
    )
    p.add_argument("--config", metavar="FILE", help="deployment config (.json or .toml)")
    add_address(
        p,
        "--listen",
        kind=tcp_address,
        help="HOST:PORT or tcp://HOST:PORT: the HTTP front door's port, and the host every "
        "front door binds (replaces the config's listen.host and listen.http_port; port 0: "
        "any free port, printed in the ready line)",
    )
    add_logging_arguments(p, what="started, stopped, models added and removed, leads taken")
    p.add_argument(
        "--access-log",
        action="store_true",
        help="log one line per HTTP request answered: client, method, path, status, bytes, "
        "duration (logger wirekit.serve.access, INFO; config: http.access_log)",
    )
    p.add_argument(
        "--loop",
        choices=_loop.CHOICES,
        default=None,
        help="event loop (default: uvloop when installed, else asyncio; env WIREKIT_LOOP)",
    )
    p.add_argument(
        "--store-url",
        metavar="URL",
        help="a postgresql:// URL: the store several replicas share (replaces store.url)",
    )
    p.add_argument(
        "--memory-budget",
        type=int,
        metavar="BYTES",
        help="bytes all connections of every door may hold together: bytes read, requests "
        "in flight, replies unsent (replaces the config's memory_budget; default 256 MiB)",
    )
    p.add_argument(
        "--with-backends",
        action="store_true",
        help="also start every MIP backend of the config on this machine (wirekit mip serve "
        "with its model's handler, default the built-in echo; the config's directory is on "
        "their PYTHONPATH); SIGINT/SIGTERM stops them after the dispatcher",
    )
    p.set_defaults(handler=_serve)
    sub = p.add_subparsers(
        prog=p.prog,  # not the usage above: "wirekit serve stats", not "... {stats,...} stats"
        dest="serve_command",
        metavar="SUBCOMMAND",
        title="subcommands (none: run the dispatcher of --config)",
    )
    st = sub.add_parser(
        "stats",
        help="print the metrics of a requests store",
        description="Print the metrics of a requests store (a SQLite file or a PostgreSQL "
        "database), running or not: requests per model and status, latency percentiles. "
        "The store is --store, --store-url, or the one of the deployment config --config "
        "names (its store.url, else its store.path, as wirekit serve opens it).",
    )
    where = st.add_mutually_exclusive_group()
    where.add_argument("--store", metavar="FILE", help="the SQLite store file")
    where.add_argument("--store-url", dest="stats_url", metavar="URL", help="a postgresql:// store")
    where.add_argument(
        "--config",
        dest="stats_config",
        metavar="FILE",
        help="a deployment config: its store (or give --config before stats)",
    )
    st.add_argument("--json", action="store_true", help="print the metrics as JSON")
    st.set_defaults(handler=_stats)
    ck = sub.add_parser(
        "check",
        help="validate a deployment config and print its devices",
        description="Validate a deployment config and print, per model, its devices, quotas, "
        "routing probabilities and backends; exit 1 when the config is not valid (or, with "
        "--probe, a backend cannot be reached).",
    )
    ck.add_argument(
        "--config",
        dest="check_config",
        metavar="FILE",
        help="the config file (or give --config before check)",
    )
    ck.add_argument(
        "--probe",
        action="store_true",
        help="also try a TCP connection to every MIP/KubeMo backend with quota > 0 "
        "(exit 1 if one cannot be reached)",
    )
    ck.set_defaults(handler=_check)
    _register_models(sub)
    _add_k8s_parser(sub)


def _register_models(sub) -> None:
    """``wirekit serve models list|add|remove|set|quota``: the admin API of a running
    dispatcher."""
    common = argparse.ArgumentParser(add_help=False)
    dispatcher = common.add_mutually_exclusive_group()
    dispatcher.add_argument(
        "--url",
        help="the dispatcher's HTTP front door: HOST:PORT or http://HOST:PORT (env"
        f" {ADMIN_URL_ENV}; default: from --config, else the one dispatcher running here"
        " as this user, found by its token file)",
    )
    dispatcher.add_argument(
        "--config",
        dest="admin_config",
        metavar="FILE",
        help="the dispatcher's deployment config: its listen address, and its admin.token or"
        " admin.token_file (or give --config before models)",
    )
    credential = common.add_mutually_exclusive_group()
    credential.add_argument(
        "--token",
        help="the admin API's bearer token (env WIREKIT_ADMIN_TOKEN; default: the token"
        " file the dispatcher at --url wrote)",
    )
    credential.add_argument(
        "--token-file",
        metavar="FILE",
        help="a file holding the token (env WIREKIT_ADMIN_TOKEN_FILE), e.g. the dispatcher's"
        " admin.token_file",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="wait this long for the dispatcher's answer (default 60)",
    )
    common.add_argument(
        "--json", action="store_true", help="print the admin API's answer as JSON, for scripts"
    )
    mo = sub.add_parser(
        "models",
        help="list, add, remove, change models or set a quota in a running dispatcher (its"
        " admin API)",
        description="Models of a running wirekit serve, through its admin API. The token is"
        " --token, --token-file, WIREKIT_ADMIN_TOKEN or WIREKIT_ADMIN_TOKEN_FILE, else the"
        " file a dispatcher with no admin.token writes at start (found from --url). The"
        " dispatcher is --url, WIREKIT_ADMIN_URL, the listen address of --config, else the"
        " only one running here (several: the command names them). Each prints what was"
        " done, or with --json the admin API's answer. Exit status: 0 done, 1 refused by the"
        " dispatcher (or unreachable), 2 usage (no token or no dispatcher found included).",
    )
    msub = mo.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    ls = msub.add_parser(
        "list",
        parents=[common],
        help="the models, their devices and quotas",
        description="List the models a running dispatcher serves, their devices, quotas and "
        "ports, and what each device has free.",
    )
    ls.set_defaults(handler=_models_list)
    # the settings a model can change live (models add and models set; --target apart:
    # set makes it exclusive with --no-target)
    live = argparse.ArgumentParser(add_help=False)
    live.add_argument("--model-timeout", type=float, metavar="SECONDS", help="seconds per attempt")
    live.add_argument("--attempts", type=int, help="attempts per request")
    live.add_argument(
        "--max-batch", type=int, metavar="N", help="adaptive batching: samples per batch"
    )
    add = msub.add_parser(
        "add",
        parents=[common, live],
        help="add a model (a JSON/TOML file, or flags)",
        description="Add a model: FILE is a config document reduced to the model (its"
        " models entry and its nodes), or give --name and --place.",
    )
    add.add_argument("file", nargs="?", metavar="FILE", help="the model document (.json/.toml)")
    add.add_argument("--name", help="the model's name")
    add.add_argument(
        "--place",
        action="append",
        default=[],
        metavar="NODE:DEVICE:QUOTA[:PORT]",
        help="a device of a known node for the model (repeat for more)",
    )
    add.add_argument("--backend", metavar="KIND", help="mip, kubemo or clipper (default mip)")
    add.add_argument(
        "--mip-port", type=int, metavar="PORT", help="its MIP front door port (default 0: any)"
    )
    add.add_argument("--apps", help="comma-separated Clipper app names")
    add.add_argument(
        "--target",
        type=float,
        metavar="SECONDS",
        help="the response time the controller holds the model to",
    )
    add.set_defaults(handler=_models_add)
    st = msub.add_parser(
        "set",
        parents=[common, live],
        help="change a model's settings in place (timeout, attempts, batching, target)",
        description="Change the settings of a model while it is served: new requests use"
        " them at once, requests in flight finish with theirs (on every replica). Its port,"
        " backend, apps and handler change only by removing and adding it again.",
    )
    st.add_argument("name", help="the model")
    target = st.add_mutually_exclusive_group()
    target.add_argument(
        "--target",
        type=float,
        metavar="SECONDS",
        help="the response time the controller holds the model to",
    )
    target.add_argument(
        "--no-target", action="store_true", help="no target: the controller leaves it alone"
    )
    st.set_defaults(handler=_models_set)
    rm = msub.add_parser(
        "remove",
        parents=[common],
        help="remove a model (requests in flight are answered first)",
        description="Remove a model from a running dispatcher: its front door stops taking "
        "requests, the requests in flight are answered first.",
    )
    rm.add_argument("name", help="the model")
    rm.set_defaults(handler=_models_remove)
    qu = msub.add_parser(
        "quota",
        parents=[common],
        help="set a model's share of one device (routing follows at once, on every replica)",
        description="Set the share of one device given to a model, as the controller would "
        "(with a controller, the node's actuator is called too, and the quota is put back "
        "if it fails). Refused, with what is free, if the share is not free.",
    )
    qu.add_argument("name", help="the model")
    qu.add_argument("device", metavar="NODE:DEVICE", help="the device, e.g. n1:0")
    qu.add_argument("share", type=float, metavar="SHARE", help="from 0 to 1 (a GPU: 0 or 1)")
    qu.set_defaults(handler=_models_quota)


def _stats(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .control.metrics import render_stats, stats_from_store
    from .record.replay import with_journals
    from .record.store import connect

    if args.stats_url:
        return _stats_url(args.stats_url, args.json, out, err)
    if args.store:
        path = Path(args.store)
    else:
        config = args.stats_config or args.config
        if not config:
            err.write("wirekit serve stats: give --store FILE, --store-url URL or --config FILE\n")
            return EXIT_USAGE
        from .config import ConfigError, load_config

        try:
            dep = load_config(config)
        except ConfigError as exc:
            err.write(f"wirekit serve stats: {exc}\n")
            return _config_status(exc)
        if dep.store.url:
            return _stats_url(dep.store.url, args.json, out, err)
        path = Path(dep.store.path)
    if not path.is_file():
        err.write(f"wirekit serve stats: no store at {path}\n")
        return EXIT_USAGE
    try:
        conn = connect(path, readonly=True)
        try:
            # what a dispatcher journaled but had not written (killed, or still running)
            journaled = with_journals(conn, path)
            stats = stats_from_store(conn)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        err.write(f"wirekit serve stats: {path} is not a requests store: {exc}\n")
        return EXIT_BAD_INPUT
    out.write((json.dumps(stats, indent=2) if args.json else render_stats(stats)) + "\n")
    if journaled:
        err.write(
            f"wirekit serve stats: {journaled} answered request(s) counted from the store's "
            "journal, not "
            "yet in the store file (the next wirekit serve on it writes them)\n"
        )
    return EXIT_OK


def _stats_url(url: str, as_json: bool, out: TextIO, err: TextIO) -> int:
    """``serve stats --store-url``: the same figures from a PostgreSQL store."""
    from .config import is_postgresql_url
    from .control.metrics import render_stats, stats_from_store
    from .record.storedb import ExtraMissing, StoreUnavailable, open_db, redact

    if not is_postgresql_url(url):
        err.write("wirekit serve stats: --store-url expects a postgresql:// URL\n")
        return EXIT_USAGE
    try:
        db = open_db(url)
    except ExtraMissing as exc:
        err.write(f"wirekit serve stats: {exc}\n")
        return EXIT_USAGE
    except StoreUnavailable as exc:  # cannot connect
        err.write(f"wirekit serve stats: {exc}\n")
        return EXIT_BAD_INPUT
    try:
        stats = stats_from_store(db)
    except Exception as exc:  # psycopg.Error: no requests table
        why = (str(exc).splitlines() or [type(exc).__name__])[0]
        err.write(f"wirekit serve stats: {redact(url)} is not a requests store: {why}\n")
        return EXIT_BAD_INPUT
    finally:
        db.close()
    out.write((json.dumps(stats, indent=2) if as_json else render_stats(stats)) + "\n")
    return EXIT_OK


def _check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .config import ConfigError, load_config, validate
    from .dispatch.router import Router
    from .health import probe_rows, probed

    path = args.check_config or args.config
    if not path:
        err.write("wirekit serve check: give --config FILE\n")
        return EXIT_USAGE
    try:
        dep = load_config(path)
        validate(dep)  # what `wirekit serve` refuses at its start, refused here too
    except ConfigError as exc:
        source = "" if exc.source else f"{path}: "
        err.write(f"wirekit serve check: {source}{exc}\n")
        return _config_status(exc)
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
                if row.grpc_port is not None:
                    where += f" (gRPC {row.grpc_port})"
            p = probs.get(row.key, 0.0)
            out.write(
                f"  {row.key:<24} {row.device_type} quota {row.quota:<5g} P={p:.3f}  {where}\n"
            )
    out.write(f"health.ready: {dep.health.ready} ({READY_MEANING[dep.health.ready]})\n")
    if not args.probe:
        return EXIT_OK
    # the dispatcher's own probe; a Clipper container connects to it, and is not probed here
    rows = [r for r in dep.rows if r.quota > 0 and r.port is not None]
    results = asyncio.run(
        probe_rows([r for r in rows if probed(r)], timeout=CHECK_TIMEOUT, models=dep.models)
    )
    for row in rows:
        if row.key not in results:  # KubeMo: a connection without a request stops its server
            out.write(f"probe {row.key}: not probed ({row.backend})\n")
        elif (problem := results[row.key]) is not None:
            out.write(f"probe {row.key}: UNREACHABLE: {problem}\n")
        else:
            out.write(f"probe {row.key}: reachable\n")
    return EXIT_OK if all(p is None for p in results.values()) else EXIT_BAD_INPUT


def _config_status(exc: Exception) -> int:
    """The exit status of a config error: 2 (usage) for a file that cannot be read, 1 (bad
    input) for one that reads but is not a valid config."""
    from .config import ConfigUnreadable

    return EXIT_USAGE if isinstance(exc, ConfigUnreadable) else EXIT_BAD_INPUT


def _serve(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from wirekit._memory import return_freed_buffers

    from .config import ConfigError, is_postgresql_url, load_config

    if not args.config:
        err.write("wirekit serve: give --config FILE (or a subcommand: check, stats, k8s...)\n")
        return EXIT_USAGE
    missing = _missing_extra()
    if missing is not None:
        err.write(
            f"wirekit serve: needs the 'serve' extra ({missing} is not installed): "
            "pip install 'wirekit[serve]'\n"
        )
        return EXIT_USAGE
    try:
        dep = load_config(args.config)
    except ConfigError as exc:
        err.write(f"wirekit serve: {exc}\n")
        return _config_status(exc)
    if args.store_url:
        if not is_postgresql_url(args.store_url):
            err.write("wirekit serve: --store-url expects a postgresql:// URL\n")
            return EXIT_USAGE
        dep = dataclasses.replace(dep, store=dataclasses.replace(dep.store, url=args.store_url))
    if args.access_log:
        dep = dataclasses.replace(dep, http=dataclasses.replace(dep.http, access_log=True))
    if args.listen is not None:
        dep = dataclasses.replace(dep, host=args.listen.host, http_port=args.listen.port)
    if args.memory_budget is not None:
        try:
            limits = dataclasses.replace(dep.mip, memory_budget=args.memory_budget)
        except ValueError as exc:
            err.write(f"wirekit serve: --memory-budget: {exc}\n")
            return EXIT_USAGE
        dep = dataclasses.replace(dep, mip=limits)
    try:
        _loop.resolve(args.loop)
    except ValueError as exc:
        err.write(f"wirekit serve: {exc}\n")
        return EXIT_USAGE
    from .record.storedb import ExtraMissing, StoreUnavailable

    backends = None
    if args.with_backends:
        from .backends.local import BackendStartError, LocalBackends

        try:
            backends = LocalBackends(
                dep,
                path=Path(args.config).resolve().parent,
                output=err,
                log_format=args.log_format,
            )
            backends.start()
        except ConfigError as exc:
            err.write(f"wirekit serve: {args.config}: {exc}\n")
            return EXIT_BAD_INPUT
        except BackendStartError as exc:
            err.write(f"wirekit serve: {exc}\n")
            return EXIT_BAD_INPUT
    return_freed_buffers()  # a long-running server: freed big buffers go back to the system
    try:
        return _loop.run(_run(dep, out, backends), args.loop)
    except OSError as exc:
        err.write(f"wirekit serve: cannot listen: {exc.strerror or exc}\n")
        return EXIT_BAD_INPUT
    except ExtraMissing as exc:  # the pg extra, for a postgresql:// store
        err.write(f"wirekit serve: {exc}\n")
        return EXIT_USAGE
    except StoreUnavailable as exc:
        err.write(f"wirekit serve: {exc}\n")
        return EXIT_BAD_INPUT
    except ConfigError as exc:  # found at start-up (the admin token, controller.policy)
        err.write(f"wirekit serve: {args.config}: {exc}\n")
        return EXIT_BAD_INPUT
    finally:
        if backends is not None:
            backends.stop()
            log.info("wirekit serve: backends stopped")


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


async def _run(dep, out: TextIO, backends: LocalBackends | None = None) -> int:
    """Serve ``dep`` until SIGINT or SIGTERM; ``backends``: the
    :class:`~wirekit.serve.backends.local.LocalBackends` started for it (``--with-backends``),
    whose state ``/readyz`` shows."""
    from .service import Service

    service = Service(dep)
    if backends is not None:
        service.health.process_problem = backends.problem
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
        ready = {"event": "ready", **service.addresses()}
        if service.admin_token_file is not None:
            ready["admin_token_file"] = str(service.admin_token_file)
        if backends is not None:
            ready["backends"] = backends.addresses()
        out.write(json.dumps(ready) + "\n")
        out.flush()
        log.info(
            "wirekit serve: started: HTTP on %s:%s, MIP %s, Clipper RPC %s",
            ready["host"],
            ready["http"],
            ", ".join(f"{model} on {port}" for model, port in ready["mip"].items()) or "none",
            ready["clipper_rpc"] or "off",
        )
        if ready["grpc"] is not None:
            log.info("wirekit serve: OIP gRPC on %s:%s", ready["host"], ready["grpc"])
        # Said once at start, from the probe the service made before it was ready: a backend
        # that cannot be reached has its requests resubmitted elsewhere and is backed off (a
        # Clipper container connects to the dispatcher: not one yet is no news at start).
        for row in service.catalog.rows():
            problem = service.health.problem(row.key)
            if problem is not None and row.backend != "clipper":
                log.warning(
                    "wirekit serve: backend of %s cannot be reached now (%s)", row.key, problem
                )
        await stop.wait()
        log.info(
            "wirekit serve: %s received; stopping (requests in flight are answered)",
            received[0] if received else "stop",
        )
    finally:
        await service.stop()
    log.info("wirekit serve: stopped")
    return EXIT_OK


# --- wirekit serve models ----------------------------------------------------------------


class _AdminError(Exception):
    def __init__(self, message: str, status: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class _Dispatcher:
    """The dispatcher a ``serve models`` command talks to: its front door's ``url``, and
    what its config or its discovery told of its token."""

    url: str
    #: the config's ``admin.token``
    token: str | None = None
    #: the config's ``admin.token_file``, or the token file it was found by
    token_file: Path | None = None
    #: how it was found when nothing named it (said on standard error), else ""
    found: str = ""


def _connect_host(host: str) -> str:
    """Where a client reaches a front door bound to ``host`` (a wildcard: this machine)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def _url_of(host: str, port: int) -> str:
    host = _connect_host(host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _running_dispatchers(environ: Any = os.environ) -> tuple[list[tuple[str, Path]], list[Path]]:
    """The generated token files of :func:`~wirekit.serve.doors.adminauth.runtime_dirs`:
    ``([(url, file)] of the dispatchers that accept a connection, [files of none])``."""
    import ipaddress
    import re
    import socket

    from .doors.adminauth import runtime_dirs

    live: dict[str, Path] = {}
    stale: list[Path] = []
    for directory in runtime_dirs(environ):
        try:
            files = sorted(directory.glob("serve-*.token"))
        except OSError:
            continue
        for path in files:
            match = re.fullmatch(r"serve-(.+)-([0-9]{1,5})\.token", path.name)
            if match is None:
                continue
            host, port = match[1], int(match[2])
            if "_" in host:  # the file name's spelling of an IPv6 address
                try:
                    host = str(ipaddress.ip_address(host.replace("_", ":")))
                except ValueError:
                    continue
            url = _url_of(host, port)
            if url in live:
                continue
            try:
                with socket.create_connection((_connect_host(host), port), timeout=1.0):
                    pass
            except OSError:
                stale.append(path)
                continue
            live[url] = path
    return list(live.items()), stale


def _find_dispatcher(args: argparse.Namespace, environ: Any = os.environ) -> _Dispatcher:
    """The dispatcher to call: ``--url``, ``WIREKIT_ADMIN_URL``, the listen address of
    ``--config``, else the only one running here as this user (found by its token file);
    :class:`_AdminError` saying what to give when none or several are found."""
    given, where = args.url, "--url"
    if given is None and environ.get(ADMIN_URL_ENV):
        given, where = environ[ADMIN_URL_ENV], ADMIN_URL_ENV
    if given is not None:
        try:
            return _Dispatcher(parse_http_url(given))
        except ValueError:
            raise _AdminError(
                f"{where} must start with http:// or https:// (or be HOST:PORT), got {given!r}",
                EXIT_USAGE,
            ) from None
    config = getattr(args, "admin_config", None) or getattr(args, "config", None)
    if config:
        from .config import ConfigError, load_config

        try:
            dep = load_config(config)
        except ConfigError as exc:
            raise _AdminError(str(exc), _config_status(exc)) from None
        if dep.http_port is None or dep.http_port == 0:
            what = "no HTTP front door" if dep.http_port is None else "HTTP port 0 (any free port)"
            raise _AdminError(
                f"{config}: listen.http_port: {what}; give the dispatcher's --url (the http port"
                " of its ready line)",
                EXIT_USAGE,
            )
        token_file = dep.admin.token_file
        return _Dispatcher(
            _url_of(dep.host, dep.http_port),
            token=dep.admin.token,
            token_file=Path(token_file) if token_file else None,
        )
    from .doors.adminauth import runtime_dirs

    live, stale = _running_dispatchers(environ)
    if len(live) == 1:
        url, path = live[0]
        return _Dispatcher(
            url, token_file=path, found=f"the dispatcher at {url} (token file {path})"
        )
    ask = f"give the dispatcher's --url (or {ADMIN_URL_ENV}) or its --config"
    if live:
        choices = ", ".join(f"{url} ({path})" for url, path in live)
        raise _AdminError(f"{len(live)} dispatchers run here: {choices}; {ask}", EXIT_USAGE)
    dirs = " and ".join(str(d) for d in runtime_dirs(environ))
    found = (
        f"none of the token files in {dirs} is a running dispatcher's"
        if stale
        else (f"no dispatcher's token file in {dirs}")
    )
    raise _AdminError(f"{ask}: {found}", EXIT_USAGE)


def _admin_token(
    args: argparse.Namespace, dispatcher: _Dispatcher, environ: Any = os.environ
) -> str:
    """The admin token to send: ``--token``, ``--token-file``, ``WIREKIT_ADMIN_TOKEN``,
    ``WIREKIT_ADMIN_TOKEN_FILE``, the config's ``admin.token`` or ``admin.token_file`` (with
    ``--config``), else the file the dispatcher at its URL wrote
    (:func:`~wirekit.serve.doors.adminauth.token_file_candidates`); :class:`_AdminError` naming
    where it looked when there is none."""
    from .doors.adminauth import (
        ADMIN_TOKEN_ENV,
        ADMIN_TOKEN_FILE_ENV,
        TokenFileError,
        read_token_file,
        token_file_candidates,
    )

    candidates: list[Path] = []
    try:
        if args.token is not None:
            return args.token
        if args.token_file:
            return read_token_file(Path(args.token_file))
        if environ.get(ADMIN_TOKEN_ENV):
            return environ[ADMIN_TOKEN_ENV]
        if environ.get(ADMIN_TOKEN_FILE_ENV):
            return read_token_file(Path(environ[ADMIN_TOKEN_FILE_ENV]))
        if dispatcher.token:
            return dispatcher.token
        if dispatcher.token_file is not None:
            return read_token_file(dispatcher.token_file)
        candidates = token_file_candidates(dispatcher.url, environ)
        for path in candidates:
            if path.is_file():
                return read_token_file(path)
    except TokenFileError as exc:
        raise _AdminError(str(exc), EXIT_USAGE) from None
    where = "no token file"
    if candidates:
        dirs = list(dict.fromkeys(str(p.parent) for p in candidates))
        where = f"no token file {candidates[0]}" + (
            f" (looked in {' and '.join(dirs)})" if len(candidates) > 1 else ""
        )
    raise _AdminError(
        f"no admin token for {dispatcher.url}: {where}; wirekit serve writes it at start when"
        " no admin.token is configured (is it running there, as this user?); or give --token,"
        f" --token-file or {ADMIN_TOKEN_ENV}",
        EXIT_USAGE,
    )


def _admin_call(
    args: argparse.Namespace, method: str, path: str, body: object = None, err: TextIO | None = None
):
    """One call of the admin API: the decoded JSON answer, or :class:`_AdminError`."""
    import urllib.error
    import urllib.request

    dispatcher = _find_dispatcher(args)
    if dispatcher.found and err is not None:
        err.write(f"wirekit serve models {args.models_command}: {dispatcher.found}\n")
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    headers["Authorization"] = f"Bearer {_admin_token(args, dispatcher)}"
    url = dispatcher.url.rstrip("/") + path
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = {"error": raw.decode("utf-8", "replace").strip() or exc.reason}
        message = doc.get("error", str(doc)) if isinstance(doc, dict) else str(doc)
        if exc.code == 401:
            message += " (the token given is not this dispatcher's: check --token,"
            message += " --token-file or WIREKIT_ADMIN_TOKEN)"
        free = doc.get("free") if isinstance(doc, dict) else None
        if free:
            message += "\nfree: " + ", ".join(
                f"{d['node']}/{d['device']} ({d['type']}) {d['free']:g}" for d in free
            )
        raise _AdminError(f"{method} {path}: HTTP {exc.code}: {message}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise _AdminError(f"cannot reach the dispatcher at {dispatcher.url}: {reason}") from None


def _admin_command(run):
    def handler(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
        try:
            return run(args, out, err)
        except _AdminError as exc:
            err.write(f"wirekit serve models {args.models_command}: {exc}\n")
            return exc.status

    return handler


def _render_model(name: str, m: dict) -> list[str]:
    """A model's entry of ``GET /admin/models`` as ``models list`` prints it."""
    door = f", MIP port {m['mip_port']}" if m.get("mip_port") else ""
    state = " (being removed)" if m.get("removing") else ""
    target = f", target {m['target']:g} s" if m.get("target") is not None else ""
    lines = [f"{name}: {m['backend']}{door}{target}{state}"]
    loaded = m.get("loaded") or {}  # load = true: what wirekit did on each server
    for r in m["rows"]:
        port = r["port"]  # None: no backend on that device; a string: a Clipper name
        where = f"{r['endpoint']}:{port}" if isinstance(port, int) else (port or "-")
        did = loaded.get(f"{r['node']}/{r['device']}/{name}")
        lines.append(
            f"  {r['node']}/{r['device']:<4} {r['device_type']} quota {r['quota']:<6g} {where}"
            + (f" ({did})" if did else "")
        )
    return lines


def _render_settings(m: dict) -> str:
    """A model's live settings, as ``models set`` prints them."""
    target = "none" if m.get("target") is None else f"{m['target']:g} s"
    return (
        f"timeout {m['timeout']:g} s, attempts {m['attempts']}, max_batch {m['max_batch']},"
        f" target {target}"
    )


def _render_models(doc: dict) -> str:
    lines = []
    for name, m in doc["models"].items():
        lines += _render_model(name, m)
    lines.append("devices:")
    for d in doc["devices"]:
        lines.append(f"  {d['node']}/{d['device']:<4} {d['type']} free {d['free']:g}")
    return "\n".join(lines)


@_admin_command
def _models_list(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    doc = _admin_call(args, "GET", "/admin/models", err=err)
    out.write((json.dumps(doc, indent=2) if args.json else _render_models(doc)) + "\n")
    return EXIT_OK


def _model_from_flags(args: argparse.Namespace) -> dict:
    """The admin API's short form (name + placements) from ``add``'s flags."""
    if not args.name or not args.place:
        raise _AdminError("models add needs FILE, or --name and at least one --place", EXIT_USAGE)
    placements = []
    for spec in args.place:
        parts = spec.split(":")
        if len(parts) not in (3, 4):
            raise _AdminError(f"--place {spec!r}: expected NODE:DEVICE:QUOTA[:PORT]", EXIT_USAGE)
        try:
            place = {"node": parts[0], "device": int(parts[1]), "quota": float(parts[2])}
            if len(parts) == 4:
                place["port"] = int(parts[3]) if parts[3].isdigit() else parts[3]
        except ValueError:
            raise _AdminError(
                f"--place {spec!r}: DEVICE is an integer and QUOTA a number", EXIT_USAGE
            ) from None
        placements.append(place)
    model = {k: v for k, v in (("backend", args.backend), ("port", args.mip_port)) if v is not None}
    model.update(_live_settings_from_flags(args))
    if args.apps:
        model["apps"] = [a for a in args.apps.split(",") if a]
    return {"name": args.name, "model": model, "placements": placements}


def _live_settings_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The settings a model can change live, as given by ``models add`` / ``models set``
    flags (those left out are not in the result)."""
    given = (
        ("timeout", args.model_timeout),
        ("attempts", args.attempts),
        ("max_batch", args.max_batch),
        ("target", args.target),
    )
    return {key: value for key, value in given if value is not None}


@_admin_command
def _models_add(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.file:
        if args.name or args.place:
            raise _AdminError("models add: give FILE or --name/--place, not both", EXIT_USAGE)
        from .config import ConfigError, loads_toml

        path = Path(args.file)
        try:
            raw = path.read_bytes()
            doc = (
                loads_toml(raw.decode("utf-8"))
                if path.suffix.lower() == ".toml"
                else json.loads(raw)
            )
        except ConfigError as exc:  # no TOML parser here
            raise _AdminError(f"{path}: {exc.reason}") from None
        except OSError as exc:
            raise _AdminError(f"{path}: cannot read: {exc.strerror or exc}", EXIT_USAGE) from None
        except (UnicodeDecodeError, ValueError) as exc:  # TOMLDecodeError is a ValueError
            raise _AdminError(f"{path}: not valid JSON/TOML: {exc}") from None
    else:
        doc = _model_from_flags(args)
    added = _admin_call(args, "POST", "/admin/models", doc, err=err)
    if args.json:
        out.write(json.dumps({"added": added}) + "\n")
    else:
        name = doc.get("name") or next(iter(doc.get("models") or {}), "?")
        lines = _render_model(name, added)
        out.write(f"added {lines[0]}\n" + "".join(f"{line}\n" for line in lines[1:]))
    return EXIT_OK


@_admin_command
def _models_remove(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from urllib.parse import quote

    removed = _admin_call(args, "DELETE", f"/admin/models/{quote(args.name, safe='')}", err=err)
    if args.json:
        out.write(json.dumps(removed) + "\n")
        return EXIT_OK
    stuck = removed.get("in_flight_at_timeout") or 0
    drained = (
        "its requests in flight answered"
        if removed.get("drained", True)
        else f"{stuck} request(s) still in flight at admin.drain_timeout"
    )
    out.write(f"removed {removed.get('removed', args.name)}: {drained}\n")
    for where, did in (removed.get("unloaded") or {}).items():
        out.write(f"  {where}: {did}\n")
    return EXIT_OK


@_admin_command
def _models_set(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from urllib.parse import quote

    body = _live_settings_from_flags(args)
    if args.no_target:
        body["target"] = None
    if not body:
        raise _AdminError(
            "models set: give at least one of --model-timeout, --attempts, --max-batch,"
            " --target, --no-target",
            EXIT_USAGE,
        )
    changed = _admin_call(
        args, "PATCH", f"/admin/models/{quote(args.name, safe='')}", body, err=err
    )
    if args.json:
        out.write(json.dumps({"model": args.name, **changed}) + "\n")
    else:
        out.write(f"{args.name}: {_render_settings(changed)}\n")
    return EXIT_OK


@_admin_command
def _models_quota(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from urllib.parse import quote

    node, sep, index = args.device.rpartition(":")
    if not sep or not node or not index.isdigit():
        raise _AdminError(f"NODE:DEVICE expected, like n1:0, got {args.device!r}", EXIT_USAGE)
    body = {"node": node, "device": int(index), "quota": args.share}
    done = _admin_call(
        args, "PUT", f"/admin/models/{quote(args.name, safe='')}/quota", body, err=err
    )
    if args.json:
        out.write(json.dumps(done) + "\n")
        return EXIT_OK
    before, after = done.get("before", done.get("old")), done.get("after", done.get("new"))
    change = f"{before:g} -> {after:g}" if isinstance(before, (int, float)) else f"{after}"
    out.write(
        f"{args.name} on {node}/{index} ({done.get('device_type', '?')}): quota {change}"
        f" ({done.get('status', 'applied')})\n"
    )
    return EXIT_OK


def _add_k8s_parser(sub) -> None:
    from .control.k8s import K8sOptions

    default = K8sOptions()
    k8s = sub.add_parser(
        "k8s",
        help="write the Kubernetes manifests of a deployment config",
        description="Write the Kubernetes objects of a deployment config as JSON (which "
        "kubectl reads as YAML): per node a StatefulSet with a container per model's CPU "
        "share and per GPU, and its Service; the dispatcher's Deployment, Service, "
        "ConfigMap and data volume claim; the actuator's Role. Pods run on any node unless "
        "the config's k8s tables place them. The admin token's Secret is named, and made "
        "once by --create-admin-secret. The image they name is built by the repository's "
        "Dockerfile. specs/k8s.md has the mapping.",
    )
    k8s.add_argument(
        "--config", dest="k8s_config", metavar="FILE", help="deployment config (.json or .toml)"
    )
    k8s.add_argument(
        "-o",
        "--output",
        default="-",
        metavar="DIR",
        help="a directory to write one NN-kind-name.json file per object into, or - for one "
        "v1 List on standard output (default -)",
    )
    k8s.add_argument(
        "--image",
        default=default.image,
        metavar="IMAGE",
        help="an image with wirekit and the models' handler modules (default %(default)s)",
    )
    k8s.add_argument(
        "--namespace", default=default.namespace, help="namespace (default %(default)s)"
    )
    k8s.add_argument(
        "--name",
        default=default.name,
        help="prefix of every object's name; the dispatcher's Service is this (default "
        "%(default)s)",
    )
    k8s.add_argument(
        "--cpu-cores",
        type=float,
        default=default.cpu_cores,
        metavar="N",
        help="the cores one CPU device of the config stands for: a quota q is q × N CPUs "
        "(default %(default)s)",
    )
    k8s.add_argument(
        "--admin-secret",
        metavar="NAME",
        help="the Secret holding the admin API's token under the key 'token' (default: "
        "the --name and -admin, wirekit-admin); the manifests name it and do not write it "
        "(but for the config's own admin.token): make it once with --create-admin-secret",
    )
    k8s.add_argument(
        "--create-admin-secret",
        action="store_true",
        help="write only the admin token's Secret, with a new random token, for 'kubectl "
        "create -f -' (which never replaces an existing one); no --config needed",
    )
    k8s.add_argument(
        "--image-pull-policy",
        default=default.image_pull_policy,
        choices=("IfNotPresent", "Always", "Never"),
        help="when the kubelet pulls the image (default %(default)s)",
    )
    k8s.add_argument(
        "--image-pull-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="a Secret with the credentials of the image's registry (repeatable)",
    )
    k8s.add_argument(
        "--store-size",
        default=default.store_size,
        metavar="QUANTITY",
        help="the size of the dispatcher's data volume, for the requests store and its "
        "journals (default %(default)s)",
    )
    k8s.set_defaults(handler=_k8s)


def _k8s(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .config import ConfigError, read_document
    from .control.k8s import K8sOptions, admin_secret, manifests, write

    path = args.k8s_config or args.config
    if not path and not args.create_admin_secret:
        err.write("wirekit serve k8s: give --config FILE\n")
        return EXIT_USAGE
    options = K8sOptions(
        image=args.image,
        namespace=args.namespace,
        name=args.name,
        cpu_cores=args.cpu_cores,
        admin_secret=args.admin_secret,
        store_size=args.store_size,
        image_pull_policy=args.image_pull_policy,
        image_pull_secrets=tuple(args.image_pull_secret),
    )
    try:
        if args.create_admin_secret:
            objects = [admin_secret(options)]
        else:
            objects = manifests(read_document(path), options)
    except ConfigError as exc:
        if exc.where.startswith("--"):  # a flag, not the config
            err.write(f"wirekit serve k8s: {exc}\n")
            return EXIT_USAGE
        source = "" if exc.source else f"{path}: "
        err.write(f"wirekit serve k8s: {source}{exc}\n")
        return _config_status(exc)
    directory = None if args.output == "-" else Path(args.output)
    try:
        written = write(objects, out, directory)
    except OSError as exc:
        err.write(f"wirekit serve k8s: cannot write {args.output}: {exc.strerror or exc}\n")
        return EXIT_USAGE
    for name in written:
        out.write(f"{name}\n")
    return EXIT_OK
