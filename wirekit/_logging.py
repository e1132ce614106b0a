"""How every ``wirekit`` command logs: one set of flags, one text format, one JSON format.

Each command that logs calls :func:`add_logging_arguments` on its parser; the flags:

* ``--log-level debug|info|warning|error`` (any case; default :data:`DEFAULT_LEVEL`, INFO);
* ``--log-format text|json`` (default text).

Text: one line per record, ``TIME LEVEL COMPONENT: MESSAGE``::

    2025-03-01T12:00:00.123+01:00 INFO wirekit.serve: wirekit serve: model two added (...)

``TIME`` is ISO-8601 local time with milliseconds and the UTC offset, ``COMPONENT`` the
logger's name.  Every character of the message that :meth:`str.isprintable` refuses is
written as its Python escape (:func:`printable`): a model name, a peer's address or a
backend's error text holding a line break or an ANSI escape cannot forge a line nor rewrite
the terminal.  A traceback follows on lines of its own, each indented by two spaces (and
escaped the same way), so every line at column 0 is the start of a record.

JSON: one object per line, ``{"time", "level", "logger", "message"}`` and ``"exception"``
(the traceback text, its lines joined by ``\n``) when there is one, plus the record's
structured fields when it has some (the access log's ``method``, ``path``, ``status``...;
see :data:`FIELDS`).  The line is always valid JSON in plain ASCII: every string is made
:func:`printable` first, then JSON-escaped; a field's value that JSON cannot hold (NaN, an
object) is written as text.

:func:`setup_logging` puts its handler on the root logger (so what libraries log --
aiohttp, asyncio -- comes out in the same format) and replaces the one a previous call put
there; it leaves any other handler alone.  Python warnings are logged too
(``py.warnings``), so that a JSON log stays JSON.  ``wirekit.cli.main`` runs every command
that has the flags inside :func:`command_logging`, which undoes all this when it returns.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import time
from collections.abc import Iterator
from typing import Any, TextIO

#: the levels ``--log-level`` takes, lowest first
LEVELS = ("debug", "info", "warning", "error")
#: the default of ``--log-level`` in every command
DEFAULT_LEVEL = "info"
#: the formats ``--log-format`` takes
FORMATS = ("text", "json")
DEFAULT_FORMAT = "text"
#: the attribute of a :class:`logging.LogRecord` holding its structured fields (a dict of
#: JSON-able values; give them with ``log.info(..., extra={FIELDS: {...}})``): the JSON
#: format adds them to the object, the text format shows only the message
FIELDS = "wirekit_fields"
#: the keys of every JSON line, which a record's fields cannot replace
JSON_KEYS = ("time", "level", "logger", "message", "exception")

#: seconds between two log lines about the same kind of event (a burst is one line, then at
#: most one line per this many seconds while it goes on, with the count)
BURST_QUIET = 10.0


def _escape(char: str) -> str:
    code = ord(char)
    if char in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char]
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: object) -> str:
    """``str(text)`` with every character :meth:`str.isprintable` refuses (controls, line
    and paragraph separators, format characters, surrogates, unassigned code points) written
    as its Python escape: safe to put on one log line.  Printable text, non-ASCII letters
    included, is returned unchanged."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


#: the last second :func:`iso_time` wrote, with its date, time and UTC offset (records come
#: many to a second: one ``localtime`` a second)
_last_second: tuple[int, str, str] = (-1, "", "")


def iso_time(created: float) -> str:
    """``created`` (seconds since the epoch) as ISO-8601 local time with milliseconds and
    the UTC offset: ``2025-03-01T12:00:00.123+01:00``."""
    global _last_second
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    last, stamp, offset = _last_second
    if seconds != last:
        local = time.localtime(seconds)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", local)
        zone = time.strftime("%z", local)  # +0100
        offset = f"{zone[:3]}:{zone[3:]}"
        _last_second = (seconds, stamp, offset)  # one tuple: a thread sees all of it or none
    return f"{stamp}.{millis:03d}{offset}"


def _exception_text(formatter: logging.Formatter, record: logging.LogRecord) -> str:
    """The record's traceback and stack text ("" when none), as the stdlib renders them."""
    parts = []
    if record.exc_info and not record.exc_text:
        record.exc_text = formatter.formatException(record.exc_info)
    if record.exc_text:
        parts.append(record.exc_text)
    if record.stack_info:
        parts.append(formatter.formatStack(record.stack_info))
    return "\n".join(parts)


class TextFormatter(logging.Formatter):
    """``TIME LEVEL COMPONENT: MESSAGE``, escaped to one line; a traceback below it, each of
    its lines indented (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        message = printable(record.getMessage())
        line = f"{iso_time(record.created)} {record.levelname} {printable(record.name)}: {message}"
        extra = _exception_text(self, record)
        if not extra:
            return line
        return "\n".join([line, *("  " + printable(part) for part in extra.split("\n"))])


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": iso_time(record.created),
            "level": record.levelname,
            "logger": printable(record.name),
            "message": printable(record.getMessage()),
        }
        extra = _exception_text(self, record)
        if extra:  # its lines kept (JSON escapes the breaks), each made printable
            doc["exception"] = "\n".join(printable(part) for part in extra.split("\n"))
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                key = printable(key)
                if key not in JSON_KEYS:
                    doc[key] = _json_value(value)
        return json.dumps(doc, ensure_ascii=True, allow_nan=False)


def _json_value(value: object) -> object:
    """A structured field's value as JSON can hold it: None, a bool, an int and a finite
    float as they are, anything else as its :func:`printable` text."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    return printable(value)


class _CommandHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`setup_logging` puts on the root logger (told apart from others,
    so that a second call replaces it)."""


def formatter_for(log_format: str) -> logging.Formatter:
    """The formatter of ``--log-format`` ``log_format`` (``text`` or ``json``)."""
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return TextFormatter()
    raise ValueError(f"unknown log format {log_format!r} (expected text or json)")


def setup_logging(
    level: str = DEFAULT_LEVEL, log_format: str = DEFAULT_FORMAT, stream: TextIO | None = None
) -> logging.Handler:
    """Log every record of ``level`` and above to ``stream`` (default: standard error) in
    ``log_format``; returns the handler (put on the root logger, replacing the one a
    previous call put there).  Python warnings are logged too."""
    handler = _CommandHandler(stream)
    handler.setFormatter(formatter_for(log_format))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _CommandHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)
    return handler


@contextlib.contextmanager
def command_logging(args: argparse.Namespace, stream: TextIO | None = None) -> Iterator[None]:
    """Logging as the flags :func:`add_logging_arguments` added say, for the length of one
    command: :func:`setup_logging`, then, on the way out, the root logger as it was (its
    level, without the handler) and warnings no longer logged -- what ``wirekit.cli.main``
    wraps every command that logs in (called in-process, a command leaves no handler on a
    stream that may be closed after it).  Says once (WARNING) that ``-v``/``--verbose`` is
    deprecated when it was given."""
    root = logging.getLogger()
    level = root.level
    handler = setup_logging(args.log_level, args.log_format, stream)
    try:
        if getattr(args, "deprecated_verbose", False):
            logging.getLogger("wirekit").warning(
                "-v/--verbose is deprecated: it is --log-level info, the default now"
            )
        yield
    finally:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        root.setLevel(level)
        handler.flush()


def _level(text: str) -> str:
    return text.lower()


def add_logging_arguments(
    parser: argparse.ArgumentParser, *, verbose_alias: bool = False, what: str = ""
) -> None:
    """Add ``--log-level`` and ``--log-format`` to ``parser`` (and the deprecated
    ``-v``/``--verbose``, an alias of ``--log-level info``, when ``verbose_alias``).
    ``what``: a few words saying what INFO logs in this command, for its help."""
    group = parser.add_argument_group("logging (standard error)")
    group.add_argument(
        "--log-level",
        default=DEFAULT_LEVEL,
        type=_level,
        choices=LEVELS,
        help=f"the least severe records logged, any case (default {DEFAULT_LEVEL}"
        + (f"; info: {what}" if what else "")
        + ")",
    )
    group.add_argument(
        "--log-format",
        default=DEFAULT_FORMAT,
        choices=FORMATS,
        help="text: 'TIME LEVEL COMPONENT: MESSAGE' lines; json: one object per line with "
        "time, level, logger, message (and exception) (default text)",
    )
    if verbose_alias:
        group.add_argument(
            "-v",
            "--verbose",
            dest="log_level",
            action=_VerboseAction,
            help=argparse.SUPPRESS,  # deprecated: --log-level info, the default
        )


class _VerboseAction(argparse.Action):
    """``-v``: sets ``--log-level info`` and remembers that the deprecated flag was used."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("nargs", 0)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, "info")
        namespace.deprecated_verbose = True


class BurstLog:
    """One WARNING (or ``level``) per burst of like events: the first at once, then at most
    one every ``quiet`` seconds, saying how many were not logged."""

    __slots__ = ("last", "level", "logger", "quiet", "unlogged")

    def __init__(
        self, logger: logging.Logger, quiet: float = BURST_QUIET, level: int = logging.WARNING
    ) -> None:
        self.logger = logger
        self.quiet = quiet
        self.level = level
        self.last: float | None = None
        self.unlogged = 0

    def event(self, now: float, message: str, *args: Any) -> bool:
        """One event at ``now`` (seconds, monotonic): logged, or counted.  True if logged."""
        if self.last is not None and now - self.last < self.quiet:
            self.unlogged += 1
            return False
        if self.unlogged:
            message += f" ({self.unlogged} more since the last such line)"
        self.logger.log(self.level, message, *args)
        self.last = now
        self.unlogged = 0
        return True
