"""The suites of ``wirekit conform``, one module per protocol and role.

``SUITES`` maps ``(protocol, role)`` to the module that holds the suite (its name; or the
suite itself, a module or any object with the same attributes, as a test registers one).
A suite has:

* ``SUITE``, a :class:`~wirekit.conform.core.cases.Suite` (its cases);
* ``add_arguments(options)`` (optional): its own options and the type of its TARGET,
  declared into a :class:`~wirekit.conform.core.options.SuiteOptions`;
* ``check_arguments(args) -> str | None``: a usage error in the parsed arguments, or None;
* ``open_target(args)``: a context manager giving the object its cases run against;
* ``LISTENS`` (optional): true when the command prints the address it listens on.

The command's parser imports every suite to build itself, so an entry here is all a new
suite needs: :mod:`wirekit.conform.cli` names no suite's option.
"""

from __future__ import annotations

from typing import Any

SUITES: dict[tuple[str, str], Any] = {
    ("mip", "server"): "wirekit.conform.suites.mip_server",
    ("mip", "client"): "wirekit.conform.suites.mip_client",
    ("clipper", "container"): "wirekit.conform.suites.clipper_container",
    ("clipper", "frontend"): "wirekit.conform.suites.clipper_frontend",
    ("y2", "service"): "wirekit.conform.suites.y2_service",
    ("oip", "server"): "wirekit.conform.suites.oip_server",
}
