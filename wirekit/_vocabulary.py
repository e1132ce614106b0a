"""The words every ``wirekit`` command shares: addresses, sizes, exit codes, old spellings.

README.md ("One vocabulary") has the table users read; this module is the code behind it,
and ``tests/test_cli_vocabulary.py`` walks every command's parser to check each follows it.

* **Addresses** are ``tcp://HOST:PORT`` (``unix:///PATH`` too where MIP takes it);
  ``HOST:PORT`` is accepted wherever an address is typed.  Every address flag parses
  through one of the argparse types below (:data:`ADDRESS_TYPES`), so a bad one is a usage
  error (exit 2, one line) in every command, never a socket library's ``Invalid argument``.
  "Any free port" is ``0``; ZeroMQ's ``*`` still works as a deprecated spelling of it.
  Where a command listens the flag is ``--listen`` (``--worker-listen``, ``--query``,
  ``--inbox``: one per socket it binds); where it calls a server the address is an argument
  without a flag, except the three of :data:`PEER_FLAGS`.  An HTTP server's address
  (``serve models --url``) is a URL, and ``HOST:PORT`` there too (:func:`parse_http_url`).
* **Exit codes**: :data:`EXIT_OK` done; :data:`EXIT_FAILED` the operation failed or the
  input data is bad (a peer unreachable, a port taken, a malformed message, a refusal);
  :data:`EXIT_USAGE` the command as typed cannot run (a bad flag or address, a file that
  cannot be read or written, a missing extra).
* **Old spellings** of renamed flags stay as hidden aliases (:func:`add_deprecated_alias`):
  they work, are left out of ``--help``, and ``wirekit.cli.main`` prints one line on
  standard error for each one used (:func:`deprecation_notes`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

#: the attribute of the parsed namespace that collects the deprecation notes of a command line
_NOTES = "deprecation_notes"


class Address(str):
    """An address written the one way (``tcp://HOST:PORT``, ``unix:///PATH``), with its parts:
    a ``str``, so code that takes an address string takes it as it is.

    ``host`` has no brackets (an IPv6 literal is bracketed in the text only); ``port`` is 0
    for any free port; ``path`` is a ``unix://``/``ipc://`` address's path; ``old_spelling``
    says what was written in a deprecated form ("" when nothing was).
    """

    scheme: str
    host: str
    port: int
    path: str
    old_spelling: str

    def __new__(
        cls, scheme: str, host: str = "", port: int = 0, path: str = "", old_spelling: str = ""
    ) -> Address:
        if path:
            text = f"{scheme}://{path}"
        else:
            shown = f"[{host}]" if ":" in host else host
            text = f"{scheme}://{shown}:{port}"
        self = super().__new__(cls, text)
        self.scheme, self.host, self.port, self.path = scheme, host, port, path
        self.old_spelling = old_spelling
        return self

    @property
    def host_port(self) -> tuple[str, int]:
        """``(host, port)`` of a TCP address, as :mod:`socket` takes it."""
        return self.host, self.port


def parse_address(
    text: str,
    *,
    schemes: tuple[str, ...] = ("tcp",),
    star: bool = False,
    bare_port: bool = False,
    default_host: str = "127.0.0.1",
) -> Address:
    """``text`` as an :class:`Address`, or ``ValueError`` saying what is expected.

    ``tcp://HOST:PORT`` and ``HOST:PORT`` (IPv6 hosts in brackets) always; ``unix:///PATH``
    and ``ipc://PATH`` when ``schemes`` has them; ``*`` as the host (every interface) and, a
    deprecated spelling of 0, as the port when ``star`` (ZeroMQ's own forms); ``PORT`` and
    ``:PORT`` alone (host ``default_host``) when ``bare_port``.
    """
    expected = " or ".join(_FORMS[s] for s in schemes) + " or HOST:PORT"
    if bare_port:
        expected += " or PORT"
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "tcp", text
    elif scheme not in schemes:
        raise ValueError(f"{text!r}: unknown scheme {scheme}://; expected {expected}")
    if scheme in ("unix", "ipc"):
        if not rest:
            raise ValueError(f"{text!r}: no path; expected {_FORMS[scheme]}")
        return Address(scheme, path=rest)
    host, colon, port_text = rest.rpartition(":")
    if not colon:
        if not (bare_port and sep == ""):
            raise ValueError(f"{text!r} has no port; expected {expected}")
        host, port_text = "", rest
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host or "[" in host or "]" in host:
        raise ValueError(f"{text!r}: an IPv6 host goes in brackets, like tcp://[::1]:5000")
    if not host:
        if not (bare_port and sep == ""):
            raise ValueError(f"{text!r} has no host; expected {expected}")
        host = default_host
    if host == "*" and not star:
        raise ValueError(f"{text!r}: host * is ZeroMQ's; here give 0.0.0.0 (every interface)")
    if any(c.isspace() or c in "/?#@" for c in host):
        raise ValueError(f"{text!r}: {host!r} is not a host name; expected {expected}")
    old = ""
    if port_text == "*" and star:
        port, old = 0, "port *"
    else:
        try:
            port = int(port_text, 10)
        except ValueError:
            raise ValueError(f"{text!r}: the port must be a number from 0 to 65535") from None
        if not 0 <= port <= 65535:
            raise ValueError(f"{text!r}: the port must be a number from 0 to 65535") from None
    return Address(scheme, host, port, old_spelling=old)


_FORMS = {"tcp": "tcp://HOST:PORT", "unix": "unix:///PATH", "ipc": "ipc://PATH"}


def _address_type(name: str, doc: str, **options: Any) -> Callable[[str], Address]:
    def parse(text: str) -> Address:
        try:
            return parse_address(text, **options)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"bad address {exc}") from None

    parse.__name__ = parse.__qualname__ = name
    parse.__doc__ = doc
    return parse


#: a plain TCP address (a socket wirekit opens itself): ``tcp://HOST:PORT`` or ``HOST:PORT``
tcp_address = _address_type("tcp_address", "A TCP address: tcp://HOST:PORT or HOST:PORT.")
#: ``wirekit record``'s: a TCP address, or a bare ``PORT`` (on 127.0.0.1), as it always took
tcp_address_or_port = _address_type(
    "tcp_address_or_port", "A TCP address, or PORT alone (on 127.0.0.1).", bare_port=True
)
#: a MIP address: TCP, or ``unix:///PATH``
mip_address = _address_type(
    "mip_address", "A MIP address: tcp://HOST:PORT, HOST:PORT or unix:///PATH.",
    schemes=("tcp", "unix"),
)  # fmt: skip
#: a ZeroMQ endpoint: TCP (host ``*``: every interface; port ``*``: deprecated 0) or ``ipc://``
zmq_address = _address_type(
    "zmq_address", "A ZeroMQ endpoint: tcp://HOST:PORT, HOST:PORT or ipc://PATH.",
    schemes=("tcp", "ipc"), star=True,
)  # fmt: skip


def parse_http_url(text: str) -> str:
    """An HTTP server's base URL from what was typed: ``http://HOST[:PORT][/PATH]`` and
    ``https://...`` as they are; ``HOST:PORT`` and ``tcp://HOST:PORT`` as
    ``http://HOST:PORT`` (the address form of the vocabulary); ``ValueError`` otherwise."""
    from urllib.parse import urlsplit

    scheme, sep, _ = text.partition("://")
    if sep and scheme in ("http", "https"):
        try:
            parts = urlsplit(text)
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc}") from None
        if not parts.hostname:
            raise ValueError(f"{text!r} has no host")
        return text
    address = parse_address(text)  # ValueError saying what is expected
    shown = f"[{address.host}]" if ":" in address.host else address.host
    return f"http://{shown}:{address.port}"


#: The address options that name a peer the command connects to with a flag, where the
#: vocabulary gives such an address as an argument: each sits beside a ``--listen`` of the
#: same command (or, for ``clipper container``, has a default from the environment Clipper
#: sets), where a flag says which address is which.  ``command -> (flag, why)``.
PEER_FLAGS: dict[str, tuple[str, str]] = {
    "wirekit clipper container": (
        "--address",
        "Clipper's RPC address; optional, defaulting to CLIPPER_IP/CLIPPER_PORT as Clipper's "
        "own containers do",
    ),
    "wirekit y2 service": (
        "--client",
        "the client service it connects to, beside --worker-listen and --inbox, which it binds",
    ),
    "wirekit record": (
        "--target",
        "the real peer a recording proxy forwards to, beside its --listen",
    ),
}


def zmq_address_or_off(text: str) -> Address | str:
    """A ZeroMQ endpoint, or "" (the socket is off)."""
    return "" if text == "" else zmq_address(text)


#: every argparse type an address flag may have (the vocabulary test checks each has one)
ADDRESS_TYPES: frozenset[Callable[[str], Any]] = frozenset(
    {tcp_address, tcp_address_or_port, mip_address, zmq_address, zmq_address_or_off}
)


# --- deprecation ------------------------------------------------------------------------------


def _note(namespace: argparse.Namespace, text: str) -> None:
    notes = list(getattr(namespace, _NOTES, None) or ())
    if text not in notes:
        notes.append(text)
    setattr(namespace, _NOTES, notes)


def deprecation_notes(args: argparse.Namespace) -> list[str]:
    """The one-line warnings this command line earned: one per deprecated flag or spelling
    used, each prefixed by its command (``wirekit mip serve: --timeout is deprecated...``)."""
    return list(getattr(args, _NOTES, None) or ())


class _AddressAction(argparse._StoreAction):
    """Store an address; note a deprecated spelling of it (``port *``)."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        if isinstance(values, Address) and values.old_spelling:
            flag = option_string or self.metavar or self.dest
            _note(
                namespace,
                f"{parser.prog}: {flag}: {values.old_spelling} is deprecated; use 0 for any "
                "free port",
            )
        super().__call__(parser, namespace, values, option_string)


def add_address(
    parser: argparse.ArgumentParser,
    *flags: str,
    kind: Callable[[str], Any] = tcp_address,
    **kwargs: Any,
) -> argparse.Action:
    """Add an address argument (a flag, or a positional) parsed by ``kind``, one of
    :data:`ADDRESS_TYPES`; its metavar is ADDRESS unless given."""
    if kind not in ADDRESS_TYPES:
        raise ValueError(f"{kind!r} is not an address type of the vocabulary")
    kwargs.setdefault("metavar", "ADDRESS")
    if kwargs.get("action") in (None, "store"):
        kwargs["action"] = _AddressAction
    add = getattr(parser, "add_value", parser.add_argument)  # clipper's parser: values "-..."
    return add(*flags, type=kind, **kwargs)


class _DeprecatedAlias(argparse.Action):
    """An old spelling of another option: does what it does, hidden from ``--help``, and
    notes that it was used."""

    def __init__(self, option_strings: list[str], dest: str, *, of: argparse.Action,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(
            option_strings,
            of.dest,
            nargs=of.nargs,
            const=of.const,
            default=argparse.SUPPRESS,
            type=of.type,  # type: ignore[arg-type]  # typeshed: an Action's type may be a str, __init__'s not
            choices=of.choices,
            metavar=of.metavar,
            help=argparse.SUPPRESS,
        )
        self.of = of

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        self.of(parser, namespace, values, option_string)
        instead = "/".join(f for f in self.of.option_strings if f.startswith("--"))
        _note(namespace, f"{parser.prog}: {option_string} is deprecated; use {instead}")


def add_deprecated_alias(
    parser: argparse.ArgumentParser, *old: str, of: argparse.Action
) -> argparse.Action:
    """Keep ``old`` working as a hidden, deprecated spelling of the option ``of``."""
    numeric = getattr(parser, "numeric_options", None)
    if numeric is not None and set(of.option_strings) & numeric:
        numeric.update(old)
    return parser.add_argument(*old, action=_DeprecatedAlias, of=of)


class _DeprecatedFlag(argparse._StoreAction):
    """A flag kept for scripts (hidden from ``--help``) whose job another one does better."""

    def __init__(self, option_strings: list[str], dest: str, *, instead: str,
                 **kwargs: Any) -> None:  # fmt: skip
        kwargs["help"] = argparse.SUPPRESS
        super().__init__(option_strings, dest, **kwargs)
        self.instead = instead

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        super().__call__(parser, namespace, values, option_string)
        _note(namespace, f"{parser.prog}: {option_string} is deprecated; use {self.instead}")


def add_deprecated_flag(
    parser: argparse.ArgumentParser, *flags: str, instead: str, **kwargs: Any
) -> argparse.Action:
    """A hidden flag kept for old scripts, saying what to use ``instead`` when given."""
    add = getattr(parser, "add_value", parser.add_argument)
    return add(*flags, action=_DeprecatedFlag, instead=instead, **kwargs)


# --- sizes ------------------------------------------------------------------------------------

#: the one name of the message size limit, in every command that has one
MAX_MESSAGE_SIZE_FLAG = "--max-message-size"


def add_max_message_size(
    parser: Any,
    *,
    default: int,
    help: str,
    dest: str = "max_message_size",
    old: Iterable[str] = (),
    type: Callable[[str], int] = int,
) -> argparse.Action:
    """``--max-message-size BYTES`` (``old``: its former names, kept as deprecated aliases)."""
    add = getattr(parser, "add_value", parser.add_argument)
    action = add(
        MAX_MESSAGE_SIZE_FLAG, dest=dest, type=type, default=default, metavar="BYTES", help=help
    )
    old = tuple(old)
    if old:
        add_deprecated_alias(parser, *old, of=action)
    return action
