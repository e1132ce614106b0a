"""A network lab for the benchmarks: ranks in network namespaces, each rank's egress shaped.

One network namespace per rank, each joined by a veth pair to a Linux bridge that lives in
a namespace of its own; rank ``r`` has address ``10.231.0.(r + 1)/24`` on its end of the
pair (:data:`DEVICE`, the same name in every rank's namespace).  With a rate (``"100mbit"``,
``"1gbit"``, anything ``tc`` reads as a rate) every rank's :data:`DEVICE` gets a ``tbf``
root qdisc: what a rank sends leaves at that rate at most (this kernel has ``tbf``, not
``netem``); what it receives is not shaped on its side (the sender's qdisc did).  Without a
rate (``"none"``) the veths are unshaped.  :func:`loopback` is the other shape: one
namespace, its loopback only, for every rank (a loopback of this run's own, whose counters
hold this run's bytes).

Every name starts with ``wkb<pid>`` (the creating process's id), so that two labs cannot
clash and a lab left by a process that died (``kill -9``) is recognised and deleted by the
next one (:func:`delete_stale`).  Everything is created by ``ip`` and ``tc`` (iproute2) and
deleted when the ``with`` block ends, however it ends; SIGTERM and SIGHUP are turned into
:class:`SystemExit` while a lab exists, so that they end it the same way.  Needs root
(:func:`require_root` says so plainly).  The addresses exist only inside these namespaces.

    with shaped_network(4, "100mbit") as lab:
        subprocess.run(lab.exec(0) + ["ip", "addr"])   # a command in rank 0's namespace
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

#: Every namespace a lab creates is named ``PREFIX<pid>...``.
PREFIX = "wkb"
#: A rank's end of its veth pair, inside its namespace.
DEVICE = "wkveth"
SUBNET = "10.231.0"
#: tbf's queue: a packet waits at most this long for tokens (then it is dropped and TCP
#: backs off, as on a real bottleneck).
TBF_LATENCY = "50ms"
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$", re.IGNORECASE)
_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_NAME = re.compile(rf"^{PREFIX}(\d+)(?:br|lo|r\d+)$")


class LabError(RuntimeError):
    """The lab cannot be built here (not root, no iproute2, a command failed)."""


def rate_bits(rate: str) -> int:
    """Bits per second of a rate written as ``tc`` does (``100mbit``, ``1gbit``, ``500kbit``);
    :class:`ValueError` for anything else."""
    m = _RATE.match(rate.strip())
    if not m:
        raise ValueError(f"not a rate: {rate!r} (e.g. 100mbit, 1gbit, 500kbit)")
    return round(float(m.group(1)) * _UNITS[m.group(2).lower()])


def tbf_burst(rate: str) -> int:
    """tbf's bucket in bytes: at least 64 KiB, and a 2 ms burst at the rate (tbf needs the
    bucket to hold what the rate brings per kernel tick)."""
    return max(64 * 1024, rate_bits(rate) // 8 // 500)


def require_root() -> None:
    """:class:`LabError` unless this process can create namespaces (root) with iproute2."""
    if os.geteuid() != 0:
        raise LabError(
            "the shaped-network mode creates network namespaces, veth pairs, a bridge and tbf "
            "qdiscs: it needs root (run it as root, or without --net for the loopback table)"
        )
    for tool in ("ip", "tc"):
        try:
            subprocess.run([tool, "-V"], capture_output=True, check=True, timeout=30)
        except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            raise LabError(f"the shaped-network mode needs iproute2's {tool!r}: {exc}") from exc


def _run(*cmd: str) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    if out.returncode:
        raise LabError(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()}")


def namespaces() -> list[str]:
    """The names of the network namespaces that exist (``ip netns list``)."""
    out = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=60, check=True
    )
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def delete_stale() -> list[str]:
    """Delete the namespaces of labs whose creating process is gone; their names."""
    stale = []
    for name in namespaces():
        m = _NAME.match(name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=60)
            stale.append(name)
    return stale


@dataclass
class Lab:
    """The namespaces of one lab: where rank ``r`` runs and which address it has."""

    ranks: int
    rate: str | None  # None: unshaped
    shared: bool = False  # True: one namespace, its loopback (``loopback()``)
    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    created: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def namespace(self, rank: int) -> str:
        """The network namespace rank ``rank`` runs in."""
        return f"{self.tag}lo" if self.shared else f"{self.tag}r{rank}"

    def address(self, rank: int) -> str:
        """Rank ``rank``'s IPv4 address (its peers reach it there)."""
        return "127.0.0.1" if self.shared else f"{SUBNET}.{rank + 1}"

    @property
    def device(self) -> str:
        """The interface the ranks' traffic leaves by (gloo's ``GLOO_SOCKET_IFNAME``)."""
        return "lo" if self.shared else DEVICE

    def exec(self, rank: int) -> list[str]:
        """The command prefix that runs a command in rank ``rank``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(rank)]

    def _add(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self.created.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def build(self) -> None:
        if self.shared:
            self._add(self.namespace(0))
            return
        self._add(self.bridge)
        _run("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.bridge, "link", "set", "br0", "up")
        for r in range(self.ranks):
            ns, port = self.namespace(r), f"p{r}"
            self._add(ns)
            _run("ip", "-n", ns, "link", "add", DEVICE, "type", "veth", "peer", "name", port,
                 "netns", self.bridge)  # fmt: skip
            _run("ip", "-n", self.bridge, "link", "set", port, "master", "br0")
            _run("ip", "-n", self.bridge, "link", "set", port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(r)}/24", "dev", DEVICE)
            _run("ip", "-n", ns, "link", "set", DEVICE, "up")
            if self.rate is not None:
                burst = str(tbf_burst(self.rate))
                _run("tc", "-n", ns, "qdisc", "add", "dev", DEVICE, "root", "tbf", "rate",
                     self.rate, "burst", burst, "latency", TBF_LATENCY)  # fmt: skip

    def qdiscs(self) -> list[str]:
        """``tc -s qdisc show`` of every rank's device (what shapes it, with counters)."""
        shown = []
        for r in range(1 if self.shared else self.ranks):
            out = subprocess.run(
                ["tc", "-n", self.namespace(r), "-s", "qdisc", "show", "dev", self.device],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            shown.append(out.stdout.strip())
        return shown

    def delete(self) -> None:
        """Delete every namespace this lab created (the veths and the bridge go with them)."""
        while self.created:
            name = self.created.pop()
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=60)


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _lab(lab: Lab) -> Iterator[Lab]:
    require_root()
    delete_stale()
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for s in saved:
        signal.signal(s, _raise_exit)
    try:
        lab.build()
        yield lab
    finally:
        lab.delete()
        for s, handler in saved.items():
            signal.signal(s, handler)


def shaped_network(ranks: int, rate: str | None) -> contextlib.AbstractContextManager[Lab]:
    """A namespace per rank behind a bridge, each rank's egress at ``rate`` (None:
    unshaped); deleted when the ``with`` block ends."""
    if rate is not None:
        rate_bits(rate)  # refuse a bad rate before anything is created
    if ranks > 250:
        raise ValueError(f"at most 250 ranks in {SUBNET}.0/24, not {ranks}")
    return _lab(Lab(ranks, rate))


def loopback(ranks: int) -> contextlib.AbstractContextManager[Lab]:
    """One namespace for every rank, its loopback only; deleted when the block ends."""
    return _lab(Lab(ranks, None, shared=True))
