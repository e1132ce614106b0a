"""Who may use the admin API of ``wirekit serve``, and where its token lives.

The admin API changes what the dispatcher serves and where it sends requests, so a web page
open in the operator's browser must not be able to use it (cross-site requests, DNS
rebinding).  Three things keep such a page out:

* **a token**, always: ``admin.token`` or ``WIREKIT_ADMIN_TOKEN`` when configured, else one
  generated at start (:func:`new_token`) and written to a file only the user can read
  (:func:`write_token_file`, :func:`default_token_file`), which the ``wirekit serve models``
  commands find from the URL they target (:func:`token_file_candidates`);
* **the Host check**: on a loopback bind, a request must name this server (its address,
  ``localhost`` or a loopback literal, or a name of ``admin.allowed_hosts``), which a
  rebinding page cannot;
* **the Origin and Content-Type checks**: a browser's cross-origin request carries a foreign
  ``Origin`` (403), and the only body a page can send cross-origin without asking first is
  not ``application/json`` (415).

No sockets and no aiohttp here: the HTTP front door asks :meth:`AdminAccess.refusal` with the
request's headers and answers what it says.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import re
import secrets
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ..config import ConfigError, Deployment

#: the environment variable that gives the admin API's bearer token (``admin.token``)
ADMIN_TOKEN_ENV = "WIREKIT_ADMIN_TOKEN"
#: the environment variable that names a file holding the token (the clients read it)
ADMIN_TOKEN_FILE_ENV = "WIREKIT_ADMIN_TOKEN_FILE"
#: the methods that change state; their bodies must be JSON
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: the longest Host or Origin value quoted back in a refusal
QUOTED = 100


class TokenFileError(Exception):
    """The token file cannot be written, found or read (the message says which and why)."""


def admin_token(deployment: Deployment, environ: Mapping[str, str] = os.environ) -> str | None:
    """The admin API's configured bearer token: ``admin.token``, else
    ``WIREKIT_ADMIN_TOKEN``, else None (then the ``Service`` generates one at start and
    writes it to a file only the user can read).  Raises :class:`ConfigError` when the HTTP
    front door listens beyond loopback with the admin API on and no token configured: a
    client on another machine could not read the generated one.  (Asked by
    :func:`wirekit.serve.config.validate`, for ``wirekit serve`` and ``wirekit serve check``
    alike.)"""
    admin = deployment.admin
    token = admin.token or environ.get(ADMIN_TOKEN_ENV) or None
    if (
        admin.enabled
        and token is None
        and deployment.http_port is not None
        and not is_loopback(deployment.host)
    ):
        raise ConfigError(
            "admin.token",
            f"the HTTP front door listens on {deployment.host}, beyond loopback: the admin API"
            f" (/admin/models) needs a bearer token (admin.token or {ADMIN_TOKEN_ENV}),"
            " or turn it off with admin.enabled = false",
        )
    return token


def new_token() -> str:
    """A fresh random bearer token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


# --- where the generated token lives -----------------------------------------------------


def runtime_dirs(environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The directories a generated token file may be in, the preferred one first:
    ``$XDG_RUNTIME_DIR/wirekit`` (when that variable names an absolute path), then
    ``~/.local/share/wirekit/runtime``."""
    dirs = []
    xdg = environ.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg):
        dirs.append(Path(xdg) / "wirekit")
    home = environ.get("HOME") or str(Path.home())
    dirs.append(Path(home) / ".local" / "share" / "wirekit" / "runtime")
    return dirs


def runtime_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where ``wirekit serve`` writes a generated token: ``$XDG_RUNTIME_DIR/wirekit`` when
    that directory exists, else ``~/.local/share/wirekit/runtime``."""
    first, *rest = runtime_dirs(environ)
    if rest and not first.parent.is_dir():
        return rest[0]
    return first


def token_file_name(host: str, port: int) -> str:
    """The file name of the token of the HTTP front door at ``host:port`` (so that several
    dispatchers on one machine each have their own): ``serve-127.0.0.1-8080.token``."""
    name = host.strip("[]").lower().rstrip(".") or "_"
    return f"serve-{re.sub(r'[^a-z0-9.-]', '_', name)}-{int(port)}.token"


def default_token_file(host: str, port: int, environ: Mapping[str, str] = os.environ) -> Path:
    """The token file of the front door at ``host:port`` in :func:`runtime_dir`."""
    return runtime_dir(environ) / token_file_name(host, port)


def _private_dir(directory: Path) -> None:
    """Make ``directory`` (and its parents) if missing; refuse one that is not a directory
    owned by this user, and take group and other permissions off it."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise TokenFileError(f"{directory} is not a directory")
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise TokenFileError(f"{directory} belongs to another user")
    if info.st_mode & 0o077:
        os.chmod(directory, 0o700)


def write_token_file(path: Path, token: str, *, private_dir: bool = True) -> None:
    """Write ``token`` to ``path``, readable and writable by this user only (mode 0600).

    The file is created under a random name with ``O_EXCL`` (never through a link), its mode
    set before anything is written, then renamed over ``path``: a reader sees no file or the
    whole token, never a partial one or one with wider permissions; a stale file of a
    dispatcher that died is replaced.  ``private_dir``: also make sure the directory is this
    user's own and closed to others (the default directories; a configured
    ``admin.token_file`` is in a directory the operator chose).  :class:`TokenFileError`
    saying why when it cannot be written."""
    try:
        if private_dir:
            _private_dir(path.parent)
        else:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(temporary, flags, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as out:
                if hasattr(os, "fchmod"):
                    os.fchmod(out.fileno(), 0o600)  # whatever the umask
                out.write(token + "\n")
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except OSError as exc:
        raise TokenFileError(
            f"cannot write the admin token file {path}: {exc.strerror or exc}"
        ) from None


def remove_token_file(path: Path, token: str) -> None:
    """Remove the token file at ``path`` if it still holds ``token`` (a file another
    dispatcher has written since is left alone)."""
    with contextlib.suppress(OSError):
        if path.read_text(encoding="ascii", errors="replace").strip() == token:
            path.unlink()


def read_token_file(path: Path) -> str:
    """The token in the file at ``path``; :class:`TokenFileError` when it cannot be read or
    holds none."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TokenFileError(f"cannot read the admin token file {path}: {why}") from None
    if not token:
        raise TokenFileError(f"the admin token file {path} is empty")
    return token


def token_file_candidates(url: str, environ: Mapping[str, str] = os.environ) -> list[Path]:
    """Where a dispatcher whose HTTP front door is ``url`` may have written its generated
    token, most likely first: for its host, and for a loopback URL (``localhost``,
    ``127.0.0.1``, ``[::1]``) for every loopback name a dispatcher may have been given,
    in each of :func:`runtime_dirs`."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return []
    hosts = [host]
    if is_loopback(host):
        hosts += ["127.0.0.1", "localhost", "::1"]
    names = list(dict.fromkeys(token_file_name(h, port) for h in hosts))
    return [directory / name for directory in runtime_dirs(environ) for name in names]


# --- the checks --------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listen address or a ``Host`` name: ``localhost`` or an address
    literal, IPv6 with or without brackets) is reachable from this machine only."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def split_host(value: str) -> tuple[str, int | None] | None:
    """A ``Host`` header's name (lowercase, IPv6 without brackets, no trailing dot) and port
    (None when absent); None when it is not shaped as a host."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
        if _ip(name) is None:
            return None
    else:
        name, sep, rest = value.partition(":")
        rest = sep + rest
    if rest and not re.fullmatch(r":[0-9]{1,5}", rest):
        return None
    if not name or not re.fullmatch(r"[a-z0-9._:%-]+", name):
        return None
    return name.rstrip("."), int(rest[1:]) if rest else None


def _quote(value: str) -> str:
    return repr(value if len(value) <= QUOTED else value[:QUOTED] + "...")


@dataclass(frozen=True, slots=True)
class Refusal:
    """What the admin API answers a request it refuses."""

    status: int
    message: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class AdminAccess:
    """The admin API's checks for a front door listening on ``listen_host``.

    ``token`` is always required.  ``allowed_hosts`` (``admin.allowed_hosts``) are the
    extra host names a client may use: on a loopback bind, a ``Host`` must be the listening
    address, ``localhost``, a loopback literal or one of them; beyond loopback (where the
    token is a configured one) any ``Host`` is accepted unless ``allowed_hosts`` is given,
    and then it must be an address literal, ``localhost`` or one of them."""

    token: str
    listen_host: str = "127.0.0.1"
    allowed_hosts: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(cls, token: str, listen_host: str, allowed_hosts: Iterable[str] = ()) -> AdminAccess:
        names = frozenset(h.strip().lower().strip("[]").rstrip(".") for h in allowed_hosts)
        return cls(token, listen_host, names)

    @property
    def loopback(self) -> bool:
        """Whether the front door listens on loopback only."""
        return is_loopback(self.listen_host)

    def host_allowed(self, host: str | None) -> bool:
        """Whether a request with this ``Host`` header may reach the admin API."""
        if not self.loopback and not self.allowed_hosts:
            return True  # names are the operator's (proxies, services): the token holds
        parsed = split_host(host) if host is not None else None
        if parsed is None:
            return False
        name = parsed[0]
        if name in self.allowed_hosts or name == "localhost":
            return True
        if name == self.listen_host.strip("[]").lower().rstrip("."):
            return True
        address = _ip(name)
        if address is None:
            return False  # a name: what a DNS-rebinding page sends
        return address.is_loopback or not self.loopback

    @staticmethod
    def same_origin(origin: str, host: str | None) -> bool:
        """Whether ``Origin`` names the server the request was sent to (its ``Host``)."""
        if host is None:
            return False
        parsed = split_host(host)
        try:
            parts = urlsplit(origin.strip())
            origin_port = parts.port
        except ValueError:
            return False
        if parsed is None or parts.scheme not in ("http", "https") or not parts.hostname:
            return False
        default = 443 if parts.scheme == "https" else 80
        origin_name = parts.hostname.lower().rstrip(".")
        return (origin_name, origin_port or default) == (parsed[0], parsed[1] or default)

    def refusal(
        self,
        *,
        method: str,
        host: str | None,
        origin: str | None,
        authorization: str | None,
        content_type: str | None,
        has_body: bool,
    ) -> Refusal | None:
        """The answer to an admin request that may not go on, or None when it may.

        In this order: a foreign ``Host`` (403), a foreign ``Origin`` (403; any method: no
        page of another origin has business here), no or a wrong bearer token (401,
        compared in constant time), a state-changing request whose body is not
        ``application/json`` (415)."""
        if not self.host_allowed(host):
            return Refusal(
                403,
                f"the admin API answers requests for this server's own address only, not"
                f" Host {_quote(host or '')}: use the address it listens on, localhost, or"
                " a name listed in admin.allowed_hosts",
            )
        if origin is not None and not self.same_origin(origin, host):
            return Refusal(
                403, f"the admin API refuses cross-origin requests (Origin {_quote(origin)})"
            )
        expected = f"Bearer {self.token}".encode()
        given = (authorization or "").encode("utf-8", "replace")
        if not hmac.compare_digest(given, expected):
            return Refusal(
                401,
                "the admin API needs Authorization: Bearer <token>",
                (("WWW-Authenticate", 'Bearer realm="wirekit admin"'),),
            )
        if method.upper() in STATE_CHANGING and has_body:
            mimetype = (content_type or "").split(";", 1)[0].strip().lower()
            if mimetype != "application/json":
                return Refusal(
                    415,
                    "the admin API reads application/json bodies only, got Content-Type"
                    f" {_quote(content_type or '')}",
                )
        return None
