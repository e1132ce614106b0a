"""Actuators: how a controller decision reaches a node.

An actuator is any object with the two methods of :class:`Actuator`.  The controller calls
them in a worker thread (never on the event loop), one call at a time, after the catalog took
the new quota; an exception (or running out of the controller's time) fails the decision and
rolls the quota back.  So an actuator is plain blocking code: it does the change, or raises
:class:`ActuatorError` saying why not.

Shipped (``controller.actuator.kind``):

* ``log`` -- :class:`LogActuator`: records the calls, changes nothing;
* ``command`` -- :class:`CommandActuator`: runs an argv template per decision (the design's
  ``docker update --cpus {cpus} {container}``), no shell, with a timeout;
* ``cgroup`` -- :class:`CgroupActuator`: writes the CPU quota of the cgroup holding the
  model's backend (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` + ``cpu.cfs_period_us``:
  what ``docker update --cpus`` does underneath; :mod:`wirekit.cgroups`).  ``wirekit mip
  serve --cgroup PATH`` puts a backend in one;
* ``repository`` -- :class:`RepositoryActuator`: a model's GPU on a node is its model
  server's to load (a share above 0) or unload (0), through the OIP repository extension
  (``oip`` models with ``load = true``; :meth:`ModelAdmin.follow_quotas
  <wirekit.serve.admin.ModelAdmin.follow_quotas>`).  CPU shares are routing only.

A Kubernetes actuator is a small class of the same shape (``specs/controller.md`` shows one).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from wirekit.cgroups import CgroupError, set_cpu_limit
from wirekit.errors import WirekitError

from ..config import ACTUATOR_FIELDS, ActuatorConfig
from ..logs import serve_logger

log = serve_logger("wirekit.serve.actuators")

#: bytes of a command's output kept for the log (the rest is cut)
OUTPUT_LOGGED = 4096


class ActuatorError(WirekitError, RuntimeError):
    """An actuator could not carry out a decision (the decision is marked failed)."""


@runtime_checkable
class Actuator(Protocol):
    """What a node does with a decision.

    ``set_cpu_share(node, model, share)``: give ``model`` on ``node`` ``share`` of the node's
    CPU device (0..1; 0 means the pair is disabled: throttle it to nothing or stop it).  When
    a node lists several CPU devices, ``share`` is the sum of the model's shares on them.

    ``set_gpus(node, model, count)``: ``model`` on ``node`` now holds ``count`` whole GPUs.

    Both run in a worker thread and either return (done) or raise (the decision fails and the
    catalog goes back to the old quota).  They should be idempotent: the same call twice
    leaves the node as one call would.
    """

    def set_cpu_share(self, node: str, model: str, share: float) -> None: ...

    def set_gpus(self, node: str, model: str, count: int) -> None: ...


class LogActuator:
    """Changes nothing; logs each call and keeps the last ones in ``calls``."""

    def __init__(self, keep: int = 1000) -> None:
        self.calls: deque[tuple[str, str, str, float]] = deque(maxlen=keep)

    def set_cpu_share(self, node: str, model: str, share: float) -> None:
        self.calls.append(("cpu", node, model, share))
        log.info("actuator log: %s/%s CPU share %g", node, model, share)

    def set_gpus(self, node: str, model: str, count: int) -> None:
        self.calls.append(("gpu", node, model, count))
        log.info("actuator log: %s/%s GPUs %d", node, model, count)


class CommandActuator:
    """Runs ``argv`` (CPU share) or ``gpu_argv`` (GPU count) per decision, without a shell.

    Each argument is a template of ``{node}``, ``{model}``, ``{share}`` (0..1), ``{cpus}``
    (``share × cpus``, the CPUs it stands for, as ``docker update --cpus`` takes them),
    ``{gpus}`` and ``{container}`` (``containers["node/model"]``, default
    ``<node>-<model>``).  The command must finish within ``timeout`` seconds (it is killed
    otherwise) and exit 0; its output is logged (the first :data:`OUTPUT_LOGGED` bytes of
    each stream).  Anything else raises :class:`ActuatorError`.  An empty template skips
    that kind of decision (it succeeds without running anything).
    """

    def __init__(
        self,
        argv: Sequence[str],
        gpu_argv: Sequence[str] = (),
        *,
        timeout: float = 10.0,
        containers: Mapping[str, str] | None = None,
        cpus: float = 1.0,
    ) -> None:
        self.argv = tuple(argv)
        self.gpu_argv = tuple(gpu_argv)
        self.timeout = timeout
        self.containers = dict(containers or {})
        self.cpus = cpus

    def set_cpu_share(self, node: str, model: str, share: float) -> None:
        self._run(self.argv, node, model, share=share, gpus=0)

    def set_gpus(self, node: str, model: str, count: int) -> None:
        self._run(self.gpu_argv, node, model, share=0.0, gpus=count)

    def command(
        self, template: Sequence[str], node: str, model: str, share: float, gpus: int
    ) -> list[str]:
        """The argv a decision runs."""
        fields = {
            "node": node,
            "model": model,
            "share": f"{share:g}",
            "cpus": f"{share * self.cpus:.3f}",
            "gpus": str(gpus),
            "container": self.containers.get(f"{node}/{model}", f"{node}-{model}"),
        }
        return [arg.format(**fields) for arg in template]

    def _run(self, template: Sequence[str], node: str, model: str, share: float, gpus: int):
        if not template:
            return
        argv = self.command(template, node, model, share, gpus)
        try:
            done = subprocess.run(
                argv, capture_output=True, timeout=self.timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise ActuatorError(f"{argv[0]}: killed after {self.timeout:g} s") from None
        except OSError as exc:
            raise ActuatorError(f"{argv[0]}: cannot run: {exc.strerror or exc}") from None
        out = done.stdout[:OUTPUT_LOGGED].decode("utf-8", "replace").strip()
        err = done.stderr[:OUTPUT_LOGGED].decode("utf-8", "replace").strip()
        log.info(
            "actuator command %s: exit %d%s%s",
            argv,
            done.returncode,
            f"; stdout: {out}" if out else "",
            f"; stderr: {err}" if err else "",
        )
        if done.returncode != 0:
            raise ActuatorError(
                f"{argv[0]} exited with {done.returncode}" + (f": {err}" if err else "")
            )


class CgroupActuator:
    """Sets the CPU quota of the cgroup holding each model's backend on this node.

    ``cgroups`` maps ``node/model`` (or just ``model``) to the cgroup directory; a share
    ``s`` becomes a quota of ``s × cpus`` CPUs (``cpus``: what a share of 1 stands for,
    usually the CPUs of the node's CPU device), written with the CFS period ``period_us``.
    GPU counts are not a cgroup's to give: ``set_gpus`` logs only (routing carries them).
    A cgroup that cannot be written raises :class:`~wirekit.cgroups.CgroupError`.
    """

    def __init__(
        self, cgroups: Mapping[str, str], *, cpus: float = 1.0, period_us: int = 100_000
    ) -> None:
        self.cgroups = dict(cgroups)
        self.cpus = cpus
        self.period_us = period_us

    def path(self, node: str, model: str) -> str:
        path = self.cgroups.get(f"{node}/{model}") or self.cgroups.get(model)
        if path is None:
            raise ActuatorError(f"no cgroup configured for {node}/{model}")
        return path

    def set_cpu_share(self, node: str, model: str, share: float) -> None:
        set_cpu_limit(self.path(node, model), share * self.cpus, self.period_us)

    def set_gpus(self, node: str, model: str, count: int) -> None:
        log.info("actuator cgroup: %s/%s GPUs %d (routing only)", node, model, count)


class RepositoryActuator:
    """Loads a model on, or unloads it from, the model server of each GPU of a node as the
    catalog's quota says (above 0: loaded, 0: unloaded), through the OIP repository
    extension; only ``oip`` models with ``load = true`` (others: routing only).  CPU shares
    are routing only.

    The service binds it (:meth:`bind`) to its :class:`~wirekit.serve.admin.ModelAdmin`
    and its event loop at start: the loads run on that loop, the actuator's worker thread
    waits for them.  A server that refuses or fails raises :class:`ActuatorError` with its
    reason (the controller then rolls the quota back)."""

    def __init__(self, timeout: float = 10.0) -> None:
        self._timeout = timeout
        self._admin: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, admin: Any, loop: asyncio.AbstractEventLoop) -> None:
        """Act through ``admin`` (its ``follow_quotas`` and ``service.catalog``), on
        ``loop``."""
        self._admin, self._loop = admin, loop

    @property
    def timeout(self) -> float:
        """Seconds one decision may take: the longest ``load_timeout`` of the models that
        load (at least the configured ``timeout``)."""
        if self._admin is None:
            return self._timeout
        catalog = self._admin.service.catalog
        loads = [catalog.model(n).load_timeout for n in catalog.models() if catalog.model(n).load]
        return max([self._timeout, *loads])

    def set_cpu_share(self, node: str, model: str, share: float) -> None:
        log.info("actuator repository: %s/%s CPU share %g (routing only)", node, model, share)

    def set_gpus(self, node: str, model: str, count: int) -> None:
        if self._admin is None or self._loop is None:
            raise ActuatorError("the repository actuator is not bound to a running service")
        future = asyncio.run_coroutine_threadsafe(
            self._admin.follow_quotas(model, node, "GPU"), self._loop
        )
        try:
            future.result(self.timeout + 1.0)
        except TimeoutError:
            future.cancel()
            raise ActuatorError(
                f"{node}/{model}: the servers did not load/unload in {self.timeout:g} s"
            ) from None
        except Exception as exc:
            raise ActuatorError(f"{node}/{model}: {exc}") from None
        log.info("actuator repository: %s/%s GPUs %d (servers follow)", node, model, count)


def build_actuator(cfg: ActuatorConfig) -> Actuator:
    """The actuator a ``controller.actuator`` table describes: a shipped kind, or
    ``module:Class`` built as ``Class(options)`` (``options``: the table's ``options``, a
    dict).  ``ValueError`` when that class cannot be loaded or lacks a method."""
    if ":" in cfg.kind:
        from .controller import load_plugin

        return load_plugin(
            cfg.kind,
            dict(cfg.options),
            "controller.actuator.kind",
            ("set_cpu_share", "set_gpus"),
        )
    if cfg.kind == "command":
        return CommandActuator(
            cfg.argv,
            cfg.gpu_argv,
            timeout=cfg.timeout,
            containers=dict(cfg.containers),
            cpus=cfg.cpus,
        )
    if cfg.kind == "cgroup":
        return CgroupActuator(dict(cfg.cgroups), cpus=cfg.cpus, period_us=cfg.period_us)
    if cfg.kind == "repository":
        return RepositoryActuator(timeout=cfg.timeout)
    return LogActuator()


__all__ = [
    "ACTUATOR_FIELDS",
    "Actuator",
    "ActuatorError",
    "CgroupActuator",
    "CgroupError",
    "CommandActuator",
    "LogActuator",
    "RepositoryActuator",
    "build_actuator",
]
