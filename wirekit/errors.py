"""Exceptions shared by every protocol and by both implementations.

Both the Cython twin and the pure path raise these with the same arguments for the same
bad input, so the text a user sees does not depend on which one is active.
"""

from __future__ import annotations

from typing import Any


class WirekitError(Exception):
    """Base class of every error wirekit raises on purpose."""


class DecodeError(WirekitError, ValueError):
    """Bytes (or frames) that do not form a valid message.

    ``protocol`` names the protocol ("mip", "clipper", "y2", "zmtp"), ``field`` the field
    that is wrong, ``offset`` the byte offset (within the message, or within ``frame`` for
    framed protocols) where the problem was found.  ``code`` is a protocol-specific reply
    code when the protocol has one (MIP: the error kind a server should answer with).
    """

    def __init__(
        self,
        protocol: str,
        field: str,
        offset: int,
        message: str,
        *,
        code: int | None = None,
        frame: int | None = None,
    ) -> None:
        self.protocol = protocol
        self.field = field
        self.offset = offset
        self.reason = message
        self.code = code
        self.frame = frame
        where = f"byte {offset}" if frame is None else f"frame {frame}, byte {offset}"
        super().__init__(f"{protocol}: {field} at {where}: {message}")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # keep pickling (multiprocessing, logging) working
        return (
            _rebuild_decode_error,
            (
                type(self),
                self.protocol,
                self.field,
                self.offset,
                self.reason,
                self.code,
                self.frame,
            ),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DecodeError):
            return NotImplemented
        return (type(self), self.args, self.code) == (type(other), other.args, other.code)

    __hash__ = Exception.__hash__


def _rebuild_decode_error(
    cls: type[DecodeError],
    protocol: str,
    field: str,
    offset: int,
    message: str,
    code: int | None,
    frame: int | None,
) -> DecodeError:
    return cls(protocol, field, offset, message, code=code, frame=frame)


class EncodeError(WirekitError, ValueError):
    """A value that cannot be put on the wire (out of range, wrong type, inconsistent counts)."""

    def __init__(self, protocol: str, field: str, message: str) -> None:
        self.protocol = protocol
        self.field = field
        self.reason = message
        super().__init__(f"{protocol}: cannot encode {field}: {message}")
