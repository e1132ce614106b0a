"""Every door's file descriptors: :class:`FdWatch` notices the process running out of them,
whichever door's ``accept`` fails, and :func:`warn_if_cap_exceeds_fds` warns at start when
the HTTP door's connection cap would run into the process's limit first.

Running out is seen two ways: plain asyncio reports each failed ``accept`` to the loop's
exception handler (once per attempt, at ERROR), uvloop (libuv) accepts and closes the
connection in silence.  Both are turned into one WARNING per burst (:class:`BurstLog`, which
the HTTP door uses too for its refusals and drops): a flood is one line every few seconds,
with a count, never one line per connection.
"""

from __future__ import annotations

import asyncio
import errno
import os
from typing import Any

from wirekit._logging import BURST_QUIET, BurstLog

from ..logs import serve_logger

log = serve_logger()

#: seconds between two looks for a process out of file descriptors
FD_CHECK_PERIOD = 1.0
#: file descriptors the HTTP door's connection cap should leave to the rest of the process
#: (the MIP doors, backends, the store); fewer: a WARNING at start
FD_RESERVE = 128
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)


def warn_if_cap_exceeds_fds(max_connections: int) -> None:
    """A WARNING when ``http.max_connections`` leaves fewer than :data:`FD_RESERVE` file
    descriptors of the process's limit to everything else."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Unix
        return
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and max_connections > soft - FD_RESERVE:
        log.warning(
            "wirekit serve: http.max_connections (%d) leaves fewer than %d of the process's %d"
            " file descriptors (ulimit -n) to the other doors: the fd limit will be hit first;"
            " raise ulimit -n or lower http.max_connections",
            max_connections,
            FD_RESERVE,
            soft,
        )


class FdWatch:
    """Notices the process out of file descriptors (accept fails with EMFILE/ENFILE on any
    door) and says so once per burst.

    Two sources, one log: the loop's exception handler (plain asyncio reports every failed
    ``accept`` there; those reports are taken over, everything else goes on to the handler
    there was before), and a look every :data:`FD_CHECK_PERIOD` seconds whether one more
    descriptor can be had at all (uvloop's libuv closes the connections it cannot accept
    without telling Python).
    """

    def __init__(self, period: float = FD_CHECK_PERIOD) -> None:
        self.period = period
        self.burst = BurstLog(log)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous: Any = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._previous = loop.get_exception_handler()
        loop.set_exception_handler(self._exception)
        self._timer = loop.call_later(self.period, self._look)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._loop is not None:
            self._loop.set_exception_handler(self._previous)
            self._loop = None

    def out_of_fds(self, now: float, why: str) -> None:
        self.burst.event(
            now,
            "wirekit serve: out of file descriptors (%s): new connections to every door are"
            " refused until some close; raise ulimit -n or lower http.max_connections",
            why,
        )

    def _exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_FDS and "socket" in context:
            self.out_of_fds(loop.time(), f"accept: {errno.errorcode[exc.errno]}")
            return
        if self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)

    def _look(self) -> None:
        loop = self._loop
        if loop is None:
            return
        try:  # one more descriptor, given back at once
            os.close(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        except OSError as exc:
            if exc.errno in _OUT_OF_FDS:
                self.out_of_fds(loop.time(), errno.errorcode[exc.errno])
        self._timer = loop.call_later(self.period, self._look)


__all__ = [
    "BURST_QUIET",
    "FD_CHECK_PERIOD",
    "FD_RESERVE",
    "BurstLog",
    "FdWatch",
    "warn_if_cap_exceeds_fds",
]
