"""What a suite declares on the ``wirekit conform`` command line: its options and its TARGET.

A suite's ``add_arguments(options)`` gets a :class:`SuiteOptions`: ``options.add_argument``
takes what :meth:`argparse.ArgumentParser.add_argument` takes, and ``options.target(kind)``
says how the suite's positional TARGET is parsed (an argparse type: the text to an address,
raising :class:`argparse.ArgumentTypeError` with what is expected).  The command keeps one
parser for every suite, so ``--help`` lists every option and an option may come before
PROTOCOL ROLE: an option several suites declare the same way is added once, in a group
titled with the suites that use it (``clipper container, mip client, y2 service (wirekit
listens)``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wirekit._vocabulary import mip_address, tcp_address

from .cases import Suite

#: an argparse type for TARGET: its text to an address (``wirekit._vocabulary``'s address
#: types for the protocols wirekit has; a suite may bring its own, an ``http://`` one say)
TargetType = Callable[[str], Any]

#: what TARGET is parsed as for a suite that declares no type of its own, and for a
#: PROTOCOL ROLE there is no suite for: ``tcp://HOST:PORT``, ``HOST:PORT`` or
#: ``unix:///PATH`` (clipper frontend and y2 service take it, then require ``tcp://`` in
#: their ``check_arguments``; mip client and clipper container refuse any TARGET there)
DEFAULT_TARGET: TargetType = mip_address


@dataclass(frozen=True)
class Group:
    """A group of options in ``--help``, titled with the suites that declare options in it
    (sorted) and the ``note`` in brackets."""

    key: str
    note: str = ""


#: the options of the suites where wirekit listens for the implementation under test
LISTENING = Group("listening", note="wirekit listens")


@dataclass
class _TitledGroup:
    """An argparse group and the suites with options in it (its title names them)."""

    group: argparse._ArgumentGroup
    note: str = ""
    users: set[str] = field(default_factory=set)

    def add_user(self, name: str) -> None:
        self.users.add(name)
        title = ", ".join(sorted(self.users))
        self.group.title = f"{title} ({self.note})" if self.note else title


class CommandOptions:
    """The options every suite declared, on the one ``wirekit conform`` parser, and the
    TARGET type of each suite."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser
        #: ``(protocol, role)`` -> the type TARGET is parsed as
        self.targets: dict[tuple[str, str], TargetType] = {}
        #: what the suites add to the help of TARGET (``a MIP server also unix:///PATH``)
        self.target_notes: list[str] = []
        self._groups: dict[str, _TitledGroup] = {}
        #: flags -> (the suite that declared them first, its keywords, its group's key)
        self._flags: dict[tuple[str, ...], tuple[str, dict[str, Any], str]] = {}

    def of(self, suite: Suite) -> SuiteOptions:
        """What ``suite``'s ``add_arguments`` declares into."""
        return SuiteOptions(self, suite)

    def add(self, suite: Suite, flags: tuple[str, ...], group: Group | None,
            kwargs: dict[str, Any]) -> None:  # fmt: skip
        """Add one option of ``suite`` (once, however many suites declare it the same way;
        a ``ValueError`` when one declares it another way)."""
        name = f"{suite.protocol} {suite.role}"
        group = group or Group(name)
        first = self._flags.get(flags)
        if first is not None and first[1:] != (kwargs, group.key):
            raise ValueError(
                f"wirekit conform: {'/'.join(flags)} of {name} differs from {first[0]}'s"
            )
        titled = self._groups.get(group.key)
        if titled is None:
            titled = _TitledGroup(self.parser.add_argument_group(group.key), group.note)
            self._groups[group.key] = titled
        elif titled.note != group.note:
            raise ValueError(f"wirekit conform: group {group.key!r} of {name} has another note")
        titled.add_user(name)
        if first is None:
            titled.group.add_argument(*flags, **kwargs)
            self._flags[flags] = (name, kwargs, group.key)


class SuiteOptions:
    """What one suite's ``add_arguments(options)`` declares into."""

    def __init__(self, command: CommandOptions, suite: Suite) -> None:
        self._command = command
        self._suite = suite

    def add_argument(self, *flags: str, group: Group | None = None, **kwargs: Any) -> None:
        """An option of this suite, as :meth:`argparse.ArgumentParser.add_argument` takes
        it; in ``group`` (shared with other suites), else in the suite's own group."""
        self._command.add(self._suite, flags, group, kwargs)

    def target(self, kind: TargetType, *, note: str = "") -> None:
        """TARGET is parsed by ``kind``; ``note`` is added to its help (what else than
        ``tcp://HOST:PORT`` it takes, and for which suite)."""
        self._command.targets[(self._suite.protocol, self._suite.role)] = kind
        if note:
            self._command.target_notes.append(note)


def add_listen(options: SuiteOptions) -> None:
    """``--listen ADDRESS``: where wirekit listens for the implementation under test."""
    options.add_argument(
        "--listen",
        group=LISTENING,
        type=tcp_address,
        metavar="ADDRESS",
        help="where wirekit listens for the implementation under test (port 0: any free "
        "port; the address is printed on standard error)",
    )


def add_connect_timeout(options: SuiteOptions) -> None:
    """``--connect-timeout SECONDS``: how long to wait for the implementation to come."""
    options.add_argument(
        "--connect-timeout",
        group=LISTENING,
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for the implementation under test to come (its connection; "
        "over ZeroMQ its first message), before the first case's own time (default 30)",
    )
