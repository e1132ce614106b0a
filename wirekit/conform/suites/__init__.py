"""The suites of ``wirekit conform``, one module per protocol and role.

``SUITES`` maps ``(protocol, role)`` to the module that holds the suite; a module is
imported only when its suite runs.  Each module has ``SUITE`` (a
:class:`~wirekit.conform.core.cases.Suite`), ``check_arguments(args) -> str | None`` (a
usage error) and ``open_target(args)``, a context manager giving the object its cases run
against.  The options themselves are declared in :mod:`wirekit.conform.cli` (so that
``wirekit --help`` imports no suite).
"""

from __future__ import annotations

SUITES: dict[tuple[str, str], str] = {
    ("mip", "server"): "wirekit.conform.suites.mip_server",
    ("mip", "client"): "wirekit.conform.suites.mip_client",
    ("clipper", "container"): "wirekit.conform.suites.clipper_container",
    ("clipper", "frontend"): "wirekit.conform.suites.clipper_frontend",
    ("y2", "service"): "wirekit.conform.suites.y2_service",
}
