"""``wirekit conform PROTOCOL ROLE [TARGET] [options]``: run a conformance suite.

Exit status: 0 when every MUST case passed, 1 when one failed, 2 for a usage error.  The
options and the TARGET type of each suite are the suite's own (its ``add_arguments``, see
:mod:`wirekit.conform.core.options`): this module declares only what every suite shares, so
a suite plugs in with its entry in :data:`~wirekit.conform.suites.SUITES`.  The suites are
imported when this command's parser is built (``wirekit conform``, or ``wirekit --help``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import shlex
from typing import Any, TextIO

from wirekit._logging import add_logging_arguments

from .core.cases import DEFAULT_TIMEOUT, NothingConnected
from .core.options import DEFAULT_TARGET, CommandOptions
from .core.runner import EXIT_USAGE
from .suites import SUITES

DESCRIPTION = """\
Play the peer of an implementation under test and run numbered cases tied to sections of
wirekit's specs; report per case what was expected and what came back.

  wirekit conform mip server tcp://127.0.0.1:5000
  wirekit conform mip client --listen tcp://127.0.0.1:5000     (then run the client's driver)
  wirekit conform clipper container --gen v3 --listen tcp://127.0.0.1:7000
  wirekit conform clipper frontend tcp://127.0.0.1:7000 --gen v3 --query tcp://127.0.0.1:7001
  wirekit conform y2 service tcp://127.0.0.1:8888 --listen tcp://127.0.0.1:5560
  wirekit conform oip server http://127.0.0.1:8080 --model echo     (--grpc: its gRPC port)

The target serves the conformance model (see specs/conformance.md): a MIP server runs
wirekit.conform.models:mip_model or its equivalent.  Levels: MUST, SHOULD, MAY (optional)
and "wirekit's choice" (where the seed implementation is silent).  Exit status: 0 every
MUST case passed; 1 a MUST case failed (or nothing came to be tested); 2 bad usage.

Cases that may end the target (kill or restart it) run last.  A MUST case that cannot run
because the target stopped serving fails ("the target stopped serving after case X"); with
--target-cmd conform runs the target itself and restarts it after a case that ended it
(--restart-cmd: a command that restarts a target conform does not run).  Each failed case
is followed by the command line that runs it alone.
"""

#: how long a target conform (re)started may take to serve, unless --start-timeout says
DEFAULT_START_TIMEOUT = 30.0
#: options left out of a failed case's rerun line (the line adds its own --case)
_NOT_RERUN = {"case", "list", "json", "junit", "help", "protocol", "role", "target", "handler"}


def register(sub: Any) -> None:
    """Add ``wirekit conform`` to the ``wirekit`` command line: the options every suite
    shares, then each suite's own (its ``add_arguments``) and the type of its TARGET."""
    suites = {key: load_suite(entry) for key, entry in SUITES.items()}
    p = sub.add_parser(
        "conform",
        help="run a conformance suite against an implementation of a protocol",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    protocols = sorted({protocol for protocol, _ in suites})
    roles = sorted({role for _, role in suites})
    p.add_argument("protocol", choices=protocols, help="the protocol")
    role = p.add_argument(
        "role",
        choices=roles,
        action=_SuiteRole,
        help="the role of the implementation under test",
    )
    target = p.add_argument(
        "target",
        nargs="?",
        type=DEFAULT_TARGET,
        metavar="ADDRESS",
        help="the implementation's address (servers): tcp://HOST:PORT",
    )
    p.add_argument(
        "--case",
        action="append",
        metavar="PATTERN",
        help="run only these cases: an id, an id prefix (error), or a glob (error.*); repeatable",
    )
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--junit", metavar="FILE", help="also write the report as JUnit XML to FILE")
    p.add_argument(
        "--junit-strict",
        action="store_true",
        help="in the JUnit XML, every failed case is a <failure> (default: only MUST ones; "
        "the others are <skipped> findings, which do not fail a CI)",
    )
    p.add_argument(
        "--case-timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"the time each case may take unless it says otherwise (default {DEFAULT_TIMEOUT:g})",
    )
    lifecycle = p.add_argument_group("the target's lifecycle")
    lifecycle.add_argument(
        "--target-cmd",
        metavar="CMD",
        help="a shell command that runs the implementation under test: conform starts it "
        "(WIREKIT_CONFORM_ADDRESS, _HOST and _PORT in its environment say where it is "
        "tested), waits until it serves, restarts it after a case that ended it, and stops "
        "it at the end",
    )
    lifecycle.add_argument(
        "--restart-cmd",
        metavar="CMD",
        help="a shell command that restarts a target conform does not run (after a case "
        "that ended it; conform then waits until it serves again)",
    )
    lifecycle.add_argument(
        "--start-timeout",
        type=float,
        default=DEFAULT_START_TIMEOUT,
        metavar="SECONDS",
        help=f"how long a (re)started target may take to serve (default {DEFAULT_START_TIMEOUT:g})",
    )
    options = CommandOptions(p)
    for module in suites.values():
        add_arguments = getattr(module, "add_arguments", None)
        if add_arguments is not None:
            add_arguments(options.of(module.SUITE))
    if options.target_notes:
        target.help = f"{target.help} ({'; '.join(options.target_notes)})"
    assert isinstance(role, _SuiteRole)
    role.target, role.target_types = target, options.targets
    add_logging_arguments(p, what="nothing but problems of wirekit's own side")
    p.set_defaults(handler=functools.partial(_conform_command, suites, p))


def load_suite(entry: Any) -> Any:
    """The suite an entry of ``SUITES`` names: a module's name (imported), or the suite
    itself (a module, or any object with the same attributes)."""
    return importlib.import_module(entry) if isinstance(entry, str) else entry


class _SuiteRole(argparse.Action):
    """ROLE: stores it, and has TARGET (the next positional; PROTOCOL is the one before)
    parsed by the type the suite of PROTOCOL ROLE declared."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.target: argparse.Action | None = None
        self.target_types: dict[tuple[str, str], Any] = {}

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        setattr(namespace, self.dest, values)
        if self.target is not None:
            key = (namespace.protocol, values)
            self.target.type = self.target_types.get(key, DEFAULT_TARGET)


def rerun_line(parser: argparse.ArgumentParser, args: argparse.Namespace, case_id: str) -> str:
    """The command line that runs ``case_id`` alone, with the options of this run."""
    words = ["wirekit", "conform", args.protocol, args.role]
    if args.target:
        target = args.target
        if isinstance(target, tuple):  # a parsed (host, port): given back as HOST:PORT
            host, port = target
            target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        words.append(str(target))
    for action in parser._actions:
        if not action.option_strings or action.dest in _NOT_RERUN:
            continue
        value = getattr(args, action.dest, None)
        if value is None or value == action.default or value is False:
            continue
        flag = action.option_strings[-1]
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            for item in value:
                words += [flag, str(item)]
        else:
            words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join([*words, "--case", case_id])


def folded(command: str, width: int = 100) -> str:
    """A shell command line indented by 2, folded with `` \\`` continuations so that no
    line is wider than ``width`` (a word longer than that keeps its own line)."""
    words = [shlex.quote(word) for word in shlex.split(command)]
    units: list[str] = []  # an option and its value stay on one line
    for word in words:
        if units and units[-1].startswith("--") and " " not in units[-1] and word[0] != "-":
            units[-1] += " " + word
        else:
            units.append(word)
    lines: list[str] = []
    line = " "
    for unit in units:
        if len(line) > 2 and len(line) + 1 + len(unit) + 2 > width:
            lines.append(line + " \\")
            line = "     "
        line += " " + unit
    return "\n".join([*lines, line])


def _conform_command(
    suites: dict[tuple[str, str], Any],
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
) -> int:
    from . import report
    from .core.runner import EXIT_MUST_FAILED, FAIL, exit_status, run_suite, select
    from .core.target import TargetLifecycle
    from .report import render_table

    module = suites.get((args.protocol, args.role))
    if module is None:
        known = ", ".join(f"{p} {r}" for p, r in sorted(suites))
        err.write(
            f"wirekit conform: no suite for {args.protocol} {args.role} (there are: {known})\n"
        )
        return EXIT_USAGE
    suite = module.SUITE
    cases = select(suite.cases, args.case, suite.always)
    if not cases:
        err.write(f"wirekit conform: no case of {suite.title} matches {', '.join(args.case)}\n")
        return EXIT_USAGE
    if args.list:
        for case in cases:
            out.write(
                f"{case.id}\t{case.level.value}\t{case.section}\t{case.send} -> {case.expect}\n"
            )
        return 0
    if args.case_timeout <= 0:
        err.write("wirekit conform: --case-timeout must be positive\n")
        return EXIT_USAGE
    if args.start_timeout <= 0:
        err.write("wirekit conform: --start-timeout must be positive\n")
        return EXIT_USAGE
    if args.target_cmd and args.restart_cmd:
        err.write("wirekit conform: give --target-cmd or --restart-cmd, not both\n")
        return EXIT_USAGE
    problem = module.check_arguments(args)
    if problem is not None:
        err.write(f"wirekit conform: {problem}\n")
        return EXIT_USAGE
    if args.junit is not None:
        try:
            junit = open(args.junit, "wb")  # noqa: SIM115 - written after the run
        except OSError as exc:
            err.write(f"wirekit conform: cannot write {args.junit}: {exc.strerror or exc}\n")
            return EXIT_USAGE
    else:
        junit = None
    try:
        with contextlib.ExitStack() as stack:
            try:
                target = stack.enter_context(module.open_target(args))
            except OSError as exc:
                err.write(f"wirekit conform: cannot set up {suite.title}: {exc}\n")
                return EXIT_USAGE

            if getattr(module, "LISTENS", False):
                err.write(f"wirekit conform: listening on {target.address}\n")
                err.flush()

            def progress(result: Any) -> None:
                if not args.json:
                    err.write(f"  {result.case.id}: {result.status}\n")
                    err.flush()

            lifecycle = None
            if args.target_cmd or args.restart_cmd:
                address = str(getattr(target, "address", args.target))
                lifecycle = stack.enter_context(
                    TargetLifecycle(args.target_cmd, args.restart_cmd, address, args.start_timeout)
                )
                with contextlib.suppress(AttributeError):  # the lifecycle case uses it
                    target.lifecycle = lifecycle
                if args.target_cmd:
                    lifecycle.start()
            try:
                results = run_suite(
                    suite,
                    target,
                    cases,
                    timeout=args.case_timeout,
                    progress=progress,
                    lifecycle=lifecycle,
                )
            except NothingConnected as exc:
                err.write(f"wirekit conform: {suite.title}: {exc}\n")
                if args.json:
                    out.write(json.dumps({"error": str(exc), "exit_status": 1}) + "\n")
                if junit is not None:
                    why = str(exc)
                    junit.write(
                        report.nothing_connected_junit(args.protocol, args.role, str(target), why)
                    )
                return EXIT_MUST_FAILED
        name = str(target)
        failed = [r.case.id for r in results if r.status == FAIL]
        reruns = {case_id: rerun_line(parser, args, case_id) for case_id in failed}
        if args.json:
            doc = report.to_document(args.protocol, args.role, name, results)
            for entry in doc["cases"]:
                if entry["id"] in reruns:
                    entry["rerun"] = reruns[entry["id"]]
            out.write(json.dumps(doc, indent=2) + "\n")
        else:
            out.write(render_table(f"{suite.title} at {name}: {len(results)} cases", results))
            if reruns:
                out.write("\nrun a failed case alone:\n")
                out.writelines(f"{folded(line)}\n" for line in reruns.values())
        if junit is not None:
            junit.write(
                report.to_junit(args.protocol, args.role, name, results, strict=args.junit_strict)
            )
    finally:
        if junit is not None:
            junit.close()
    return exit_status(results)
