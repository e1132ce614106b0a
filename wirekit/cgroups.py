"""cgroups: put a process in one, limit its CPU (v1 and v2), read the limit back.

What ``docker update --cpus N`` does underneath: the CFS bandwidth controller lets a cgroup's
processes run ``quota`` microseconds of CPU time per ``period`` microseconds, so ``N`` CPUs is
``quota = N × period``.  cgroup v2 keeps both in ``cpu.max`` (``"<quota|max> <period>"``);
v1 in ``cpu.cfs_quota_us`` (-1: no limit) and ``cpu.cfs_period_us`` of the ``cpu``
controller's hierarchy (usually ``/sys/fs/cgroup/cpu``).  The version is read from the files
a cgroup directory holds.  Writing needs the right to (root, or a delegated subtree).

Used by the ``cgroup`` actuator of ``wirekit serve``'s controller and by ``wirekit mip serve
--cgroup PATH``.
"""

from __future__ import annotations

import os
from pathlib import Path

from wirekit.errors import WirekitError

#: the smallest CFS quota the kernel takes (1 ms per period): what a limit of 0 CPUs gets
MIN_QUOTA_US = 1000


class CgroupError(WirekitError, RuntimeError):
    """A cgroup that cannot be created, joined, read or written (the path and why)."""


def cgroup_version(path: str | Path) -> int:
    """1 or 2: the cgroup version of the directory ``path`` (which must exist)."""
    p = Path(path)
    if (p / "cpu.max").exists() or (p / "cgroup.controllers").exists():
        return 2
    if (p / "cpu.cfs_quota_us").exists():
        return 1
    raise CgroupError(f"{p}: not a cgroup with a CPU controller (no cpu.max, cpu.cfs_quota_us)")


def make_cgroup(path: str | Path) -> Path:
    """Create the cgroup ``path`` if missing (for v2, enabling the ``cpu`` controller in its
    parent) and return it.  Raises :class:`CgroupError` when it cannot be written."""
    p = Path(path)
    try:
        if not p.is_dir():
            parent = p.parent
            if (parent / "cgroup.subtree_control").exists():  # v2: cpu for the children
                control = parent / "cgroup.subtree_control"
                if "cpu" not in control.read_text().split():
                    control.write_text("+cpu")
            p.mkdir()
        cgroup_version(p)
    except OSError as exc:
        raise CgroupError(f"{p}: cannot create the cgroup: {exc.strerror or exc}") from None
    return p


def set_cpu_limit(path: str | Path, cpus: float | None, period_us: int = 100_000) -> None:
    """Limit the cgroup ``path`` to ``cpus`` CPUs (None: no limit).  A limit below
    :data:`MIN_QUOTA_US` per period is raised to it (the kernel's floor)."""
    p = Path(path)
    version = cgroup_version(p)
    quota = -1 if cpus is None else max(MIN_QUOTA_US, round(cpus * period_us))
    try:
        if version == 2:
            (p / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {period_us}")
        else:
            (p / "cpu.cfs_period_us").write_text(str(period_us))
            (p / "cpu.cfs_quota_us").write_text(str(quota))
    except OSError as exc:
        raise CgroupError(f"{p}: cannot set the CPU quota: {exc.strerror or exc}") from None


def cpu_limit(path: str | Path) -> float | None:
    """The CPUs the cgroup ``path`` may use (None: no limit)."""
    p = Path(path)
    try:
        if cgroup_version(p) == 2:
            quota, period = (p / "cpu.max").read_text().split()
            return None if quota == "max" else int(quota) / int(period)
        quota_us = int((p / "cpu.cfs_quota_us").read_text())
        period_us = int((p / "cpu.cfs_period_us").read_text())
    except OSError as exc:
        raise CgroupError(f"{p}: cannot read the CPU quota: {exc.strerror or exc}") from None
    except (ValueError, ZeroDivisionError) as exc:
        raise CgroupError(f"{p}: not a CPU quota the kernel writes: {exc}") from None
    return None if quota_us < 0 else quota_us / period_us


def join_cgroup(path: str | Path, pid: int | None = None) -> Path:
    """Move the process ``pid`` (default: this one) into the cgroup ``path``, created if
    missing.  Raises :class:`CgroupError` when that cannot be done."""
    p = make_cgroup(path)
    try:
        (p / "cgroup.procs").write_text(str(os.getpid() if pid is None else pid))
    except OSError as exc:
        raise CgroupError(f"{p}: cannot join the cgroup: {exc.strerror or exc}") from None
    return p
