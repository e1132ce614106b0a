"""``wirekit conform``: a conformance test kit for implementations of wirekit's protocols.

What h2spec is for HTTP/2 and the Autobahn testsuite for WebSocket: it plays the peer of an
implementation under test, runs numbered cases tied to sections of wirekit's specs, and
reports per case what was expected and what came back.

    wirekit conform mip server tcp://127.0.0.1:5000
    wirekit conform mip client --listen tcp://127.0.0.1:5000
    wirekit conform clipper container --gen v3 --listen tcp://127.0.0.1:7000
    wirekit conform clipper frontend tcp://127.0.0.1:7000 --gen v3 --query tcp://127.0.0.1:7001
    wirekit conform y2 service tcp://127.0.0.1:8888 --listen tcp://127.0.0.1:5560
    wirekit conform oip server http://127.0.0.1:8080 --model echo

The package reads as its concerns:

* :mod:`wirekit.conform.core` -- the case model (:class:`~wirekit.conform.core.cases.Case`,
  declared once with its spec section and level) and the runner (selection, time bounds,
  verdicts, the exit status);
* :mod:`wirekit.conform.report` -- the human table, ``--json`` and ``--junit FILE``;
* :mod:`wirekit.conform.suites` -- one module per protocol and role with its cases, its
  options and the type of its TARGET (declared through :mod:`wirekit.conform.core.options`);
* :mod:`wirekit.conform.models` -- the small models a target serves while it is tested;
* :mod:`wirekit.conform.drivers` -- what a client under test runs (it reports over MIP
  what it made of each answer).
"""

from __future__ import annotations

from .core.cases import Case, Failed, Level, Skipped, Suite
from .core.runner import Result, exit_status, run_suite, select

__all__ = [
    "Case",
    "Failed",
    "Level",
    "Result",
    "Skipped",
    "Suite",
    "exit_status",
    "run_suite",
    "select",
]
