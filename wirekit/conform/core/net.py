"""Time-bounded sockets for the cases: every wait ends by the case's deadline.

A :class:`Stream` is one client connection to a ``tcp://`` or ``unix://`` target that keeps
every byte it received (a failing case shows them).  Reading past the deadline, or a
connection the target closed, becomes a :class:`~wirekit.conform.core.cases.Failed` naming
what the case was waiting for.
"""

from __future__ import annotations

import re
import socket
import time
from types import TracebackType
from typing import TypeVar

from .cases import Failed, TimedOut

_RECV_SIZE = 65536
_S = TypeVar("_S", bound="Stream")


class Deadline:
    """The moment a case must be over (monotonic seconds)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left, never below a millisecond (a socket timeout of 0 would not block)."""
        return max(0.001, self.at - time.monotonic())

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self.at


class Stream:
    """One connection to the target, bounded by ``deadline``."""

    def __init__(self, address: str, deadline: Deadline) -> None:
        self.address = address
        self.deadline = deadline
        self.received = bytearray()  #: every byte the target sent on this connection
        self.eof = False
        from wirekit.mip.runtime import parse_address

        family, target = parse_address(address)
        try:
            if family == "tcp":
                self.sock = socket.create_connection(target, timeout=deadline.remaining())  # type: ignore[arg-type]
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            else:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    self.sock.settimeout(deadline.remaining())
                    self.sock.connect(target)
                except BaseException:
                    self.sock.close()
                    raise
        except TimeoutError:
            raise TimedOut(f"a connection to {address}", "connect timed out") from None
        except OSError as exc:
            raise Failed(f"a connection to {address}", f"connect failed: {exc}") from None

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        """Write ``data`` in one call (one segment when it fits).  A connection the target
        closed or reset is not an error here: the next read reports what came back."""
        if self.eof:
            return
        try:
            self.sock.settimeout(self.deadline.remaining())
            self.sock.sendall(data)
        except TimeoutError:
            raise TimedOut(
                "the target to read what was sent", "sending stalled", self.received
            ) from None
        except (BrokenPipeError, ConnectionResetError):
            pass
        except OSError as exc:
            raise Failed("the target to read what was sent", f"sending failed: {exc}") from None

    def send_bytewise(self, data: bytes, gap: float = 0.001) -> None:
        """Write ``data`` one byte per write (one TCP segment each, with TCP_NODELAY and a
        short pause between them)."""
        for k in range(len(data)):
            self.send(data[k : k + 1])
            time.sleep(gap)

    def recv(self, waiting_for: str) -> bytes:
        """The next bytes the target sends; ``b""`` once it closed.  Past the deadline:
        :class:`Failed` (expected ``waiting_for``)."""
        if self.eof:
            return b""
        try:
            self.sock.settimeout(self.deadline.remaining())
            data = self.sock.recv(_RECV_SIZE)
        except TimeoutError:
            within = f"within {self.deadline.seconds:g} s"
            got = f"no reply {within}"
            if self.received:
                got = f"nothing more {within} ({len(self.received)} bytes received)"
            raise TimedOut(waiting_for, got, self.received) from None
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
        self.received += data
        return data

    def closed_by_peer(self, within: float) -> bool:
        """Whether the target closes this connection within ``within`` seconds (bytes it
        sends meanwhile are kept)."""
        end = min(self.deadline.at, time.monotonic() + within)
        while not self.eof:
            left = end - time.monotonic()
            if left <= 0:
                return False
            try:
                self.sock.settimeout(left)
                data = self.sock.recv(_RECV_SIZE)
            except TimeoutError:
                return False
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
            self.received += data
        return True


def refused_connection(address: str, seconds: float) -> str | None:
    """Why nothing takes a connection at ``address`` (``tcp://HOST:PORT`` or
    ``unix:///PATH``) within ``seconds`` -- the OS's words ("Connection refused") --
    or None when a connection is taken (and closed at once).  What the runner asks before
    the first case of a server suite, so that a target that is not there is one line, not
    a table of failures."""
    try:
        with Stream(address, Deadline(seconds)):
            return None
    except Failed as exc:
        why = exc.got.removeprefix("connect failed: ")
        return re.sub(r"^\[Errno \d+\] ", "", why)  # the OS's words alone
