"""A conformance case, declared once: its id, spec section, level, what it sends and what
must come back, and the function that does it.

A suite (one per protocol and role) collects its cases with the :meth:`Suite.case`
decorator.  A case's function gets the suite's target object and the case's
:class:`~wirekit.conform.core.net.Deadline`; it returns when the target behaved, raises
:class:`Failed` (expected, got, and the bytes received) when it did not, or :class:`Skipped`
when the case does not apply.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

#: The time a case may take unless it says otherwise (``--case-timeout`` changes it).
DEFAULT_TIMEOUT = 5.0


class Level(enum.Enum):
    """How binding a case is.  Only a failed MUST makes ``wirekit conform`` exit 1."""

    MUST = "MUST"
    SHOULD = "SHOULD"
    #: optional behaviour: a target may do it, and is checked to do it right if it does
    MAY = "MAY"
    #: the seed implementation is silent (or differs) and wirekit chose this behaviour
    WIREKIT = "wirekit's choice"


class Failed(Exception):
    """The target did not do what the case requires.

    ``expected`` and ``got`` are short human descriptions; ``received`` the bytes the
    target sent during the case (shown as a hex excerpt).
    """

    def __init__(self, expected: str, got: str, received: bytes | bytearray = b"") -> None:
        super().__init__(f"expected {expected}; got {got}")
        self.expected = expected
        self.got = got
        self.received = bytes(received)


class TimedOut(Failed):
    """The target said nothing (or too little) before the case's deadline: a slow target
    and a wrong one look alike here, so the runner may run the case again with a longer
    budget (see :func:`~wirekit.conform.core.runner.run_suite`)."""


class Skipped(Exception):
    """The case does not apply to this target (the reason is reported)."""


class NothingConnected(Exception):
    """No implementation under test came to where wirekit listens (within
    ``--connect-timeout``): there is nothing to judge, and the run ends with one line."""


@dataclass(frozen=True)
class Case:
    """One conformance case.

    ``id`` is unique within its suite (dotted: ``error.shape``); ``section`` the spec
    section it checks (``specs/mip.md#error-codes``); ``send`` what the case sends and
    ``expect`` what must come back, in words; ``timeout`` bounds the whole case in seconds
    (None: the run's default).  ``may_end_target``: the case may kill or restart the
    target (what some implementations die of, a restart of the peer): such cases run after
    all the others, and the runner checks afterwards that the target still serves.
    """

    id: str
    section: str
    level: Level
    send: str
    expect: str
    body: Callable[[Any, Any], None]
    timeout: float | None = None
    may_end_target: bool = False


class Suite:
    """The cases of one protocol and role, in the order they run."""

    def __init__(
        self, protocol: str, role: str, title: str, *, always: tuple[str, ...] = ()
    ) -> None:
        self.protocol = protocol
        self.role = role
        self.title = title
        #: ids of the cases every selection includes (a handshake the others build on)
        self.always = always
        self.cases: list[Case] = []

    def case(
        self,
        case_id: str,
        section: str,
        level: Level,
        *,
        send: str,
        expect: str,
        timeout: float | None = None,
        may_end_target: bool = False,
    ) -> Callable[[Callable[[Any, Any], None]], Callable[[Any, Any], None]]:
        """Declare the decorated function ``body(target, deadline)`` as a case."""

        def declare(body: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
            if any(c.id == case_id for c in self.cases):
                raise ValueError(f"conform: case {case_id!r} declared twice in {self.title}")
            self.cases.append(
                Case(case_id, section, level, send, expect, body, timeout, may_end_target)
            )
            return body

        return declare

    def __iter__(self) -> Iterator[Case]:
        return iter(self.cases)
