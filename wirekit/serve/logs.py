"""Log lines of ``wirekit serve`` that nothing from outside can forge.

Names (models, apps, nodes), peers' addresses, backends' error messages and records read
back from the store reach log messages as ``%s`` arguments.  A line break in one of them
would start a new, forged line; an ANSI escape would rewrite the operator's terminal; a
bidirectional override would make a line read differently from what it says.  Every logger
of ``wirekit serve`` is made by :func:`serve_logger`, which attaches :class:`EscapingFilter`:
each message is formatted, then every character that :meth:`str.isprintable` refuses is
written as a Python escape (``\\n``, ``\\x1b``, ``\\u202e``) -- one record, one line.
A traceback (``log.exception``) is added by the handler after this and keeps its lines.

The commands' own formatters (:mod:`wirekit._logging`, text and JSON) escape every message
the same way, whichever logger it comes from; this filter keeps ``wirekit serve``'s lines
safe also where the embedding program formats them itself.
"""

from __future__ import annotations

import logging

from wirekit._logging import printable

__all__ = ["EscapingFilter", "printable", "serve_logger"]


class EscapingFilter(logging.Filter):
    """A logger filter that formats each record's message and makes it :func:`printable`
    (see the module docstring).  It never drops a record, and leaves a record whose
    arguments do not fit its format to the handler's usual error report."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # the handler reports a bad format as it always does
            return True
        safe = printable(message)
        if safe is not message or record.args:
            record.msg, record.args = safe, None
        return True


_FILTER = EscapingFilter()


def serve_logger(name: str = "wirekit.serve") -> logging.Logger:
    """The logger ``name`` with :class:`EscapingFilter` attached (once): what every module
    of ``wirekit serve`` logs through."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
