"""The admin API of ``wirekit serve`` is safe by default (issue 25): a web page open in the
operator's browser can neither add a model with a cross-origin ``text/plain`` POST nor reach
the API through DNS rebinding (a foreign ``Host``); with no token configured, one is
generated at start into a file only the user can read, which the ``wirekit serve models``
commands find by themselves; ``/healthz`` and ``/metrics`` keep answering probes and
scrapers whatever their ``Host``.

Through a real ``wirekit serve`` subprocess on loopback and real ``wirekit serve models``
subprocesses; the checks themselves (:class:`AdminAccess`) also on their own."""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from serve_support import ROOT, TIMEOUT, BackendProcess, DispatcherProcess, deployment

from wirekit import mip
from wirekit.mip.client import Client
from wirekit.serve.config import ConfigError, parse_config
from wirekit.serve.doors.adminauth import (
    AdminAccess,
    TokenFileError,
    read_token_file,
    remove_token_file,
    token_file_candidates,
    token_file_name,
    write_token_file,
)

#: nothing listens there: the models' backends are never called in these tests
NO_BACKEND = 9


def one_model(tmp_path: Path, **top) -> dict:
    """A deployment of model m1 on n1 (CPU 0, half of it), with no admin token configured."""
    return deployment(
        tmp_path / "r.db",
        {"m1": {"timeout": 5}},
        [
            {
                "id": "n1",
                "devices": ["CPU"],
                "models": ["m1"],
                "quotas": [0.5],
                "ports": [NO_BACKEND],
            }
        ],
        **top,
    )


def call(
    port: int,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> tuple[int, dict, http.client.HTTPMessage]:
    """One HTTP request to 127.0.0.1:``port`` with exactly these headers (a ``Host`` given
    replaces the one http.client would send): status, JSON answer (or ``{}``), headers."""
    headers = dict(headers or {})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = {"text": raw.decode("utf-8", "replace")}
        return resp.status, doc, resp.headers
    finally:
        conn.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def model_names(proc: DispatcherProcess) -> list[str]:
    status, doc, _ = call(proc.addresses["http"], "GET", "/admin/models", bearer(proc.admin_token))
    assert status == 200, doc
    return sorted(doc["models"])


#: what a page adds: a model on a node of its own, at an endpoint it chooses (loopback
#: here; a page would name any address)
EVIL_MODEL = {
    "models": {"evil": {"port": None}},
    "nodes": [
        {
            "id": "attacker",
            "endpoint": "127.0.0.1",
            "devices": ["CPU"],
            "models": ["evil"],
            "quotas": [1],
            "ports": [NO_BACKEND],
        }
    ],
}


def test_a_cross_origin_text_plain_post_adds_no_model(tmp_path):
    """Regression: a cross-origin ``text/plain`` POST (what any web page may send without
    asking first) to ``/admin/models`` added the model, 201; now 403, and nothing is
    added.  Neither is it without an ``Origin`` (401: no token) nor with the token but a
    ``text/plain`` body (415); the same body as JSON with the token is accepted."""
    body = json.dumps(EVIL_MODEL).encode()
    with DispatcherProcess.of(one_model(tmp_path), tmp_path) as proc:
        port = proc.addresses["http"]
        page = {"Content-Type": "text/plain", "Origin": "http://attacker.example"}
        status, doc, _ = call(port, "POST", "/admin/models", page, body)
        assert status == 403, doc
        assert "cross-origin" in doc["error"] and "attacker.example" in doc["error"]
        # a null Origin (a sandboxed frame, a file:// page) is foreign too
        status, doc, _ = call(port, "POST", "/admin/models", {**page, "Origin": "null"}, body)
        assert status == 403, doc
        # a page's JSON POST needs a preflight first: OPTIONS is not allowed, and no answer
        # of the server ever carries CORS headers (so a page reads none of them)
        preflight = {
            "Origin": "http://attacker.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,authorization",
        }
        for path in ("/admin/models", "/v1/models/m1:predict", "/metrics"):
            status, _doc, headers = call(port, "OPTIONS", path, preflight)
            assert status == 405, (path, status)
            assert not any(h.lower().startswith("access-control-") for h in headers), path
        for method, path in (("GET", "/metrics"), ("GET", "/stats"), ("GET", "/admin/models")):
            _status, _doc, headers = call(port, method, path, {"Origin": "http://attacker.example"})
            assert not any(h.lower().startswith("access-control-") for h in headers), path
        status, doc, headers = call(
            port, "POST", "/admin/models", {"Content-Type": "text/plain"}, body
        )
        assert status == 401, doc
        assert headers["WWW-Authenticate"].startswith("Bearer")
        token = bearer(proc.admin_token)
        status, doc, _ = call(
            port, "POST", "/admin/models", {**token, "Content-Type": "text/plain"}, body
        )
        assert status == 415, doc
        assert "application/json" in doc["error"]
        assert model_names(proc) == ["m1"]
        # the guard refused it, not the body: as JSON with the token it is a model
        json_type = {**token, "Content-Type": "application/json; charset=utf-8"}
        status, doc, _ = call(port, "POST", "/admin/models", json_type, body)
        assert status == 201, doc
        assert model_names(proc) == ["evil", "m1"]
        # its own origin (a page the server itself served: none) is not foreign
        own = {**token, "Origin": f"http://127.0.0.1:{port}"}
        status, doc, _ = call(port, "DELETE", "/admin/models/evil", own)
        assert status == 200, doc
        assert model_names(proc) == ["m1"]


def test_a_foreign_host_is_refused_but_probes_and_scrapers_are_not(tmp_path):
    """Regression: a request with a foreign ``Host`` (what a DNS-rebinding page sends) was
    answered 200; now 403 on ``/admin/*`` even with the right token, while the listening
    address, ``localhost`` and loopback literals work.  ``/healthz`` and ``/metrics``
    answer any ``Host``, and none (HAProxy's HTTP/1.0 check)."""
    with DispatcherProcess.of(one_model(tmp_path), tmp_path) as proc:
        port = proc.addresses["http"]
        foreign = {"Host": f"attacker.example:{port}"}
        status, doc, _ = call(port, "GET", "/admin/models", foreign)
        assert status == 403, doc
        assert "attacker.example" in doc["error"]
        token = bearer(proc.admin_token)
        status, doc, _ = call(port, "GET", "/admin/models", {**token, **foreign})
        assert status == 403, doc
        # the rebinding page's own view: same origin, JSON, but its Host is a name
        rebinding = {
            "Host": f"attacker.example:{port}",
            "Origin": f"http://attacker.example:{port}",
            "Content-Type": "application/json",
        }
        status, doc, _ = call(
            port, "POST", "/admin/models", rebinding, json.dumps(EVIL_MODEL).encode()
        )
        assert status == 403, doc
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"127.0.0.2:{port}"):
            status, doc, _ = call(port, "GET", "/admin/models", {**token, "Host": host})
            assert status == 200, (host, doc)
        assert model_names(proc) == ["m1"]
        for path in ("/healthz", "/metrics"):
            status, _doc, _ = call(port, "GET", path, {"Host": "dispatcher.example.internal"})
            assert status == 200, path
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw:
            raw.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            answer = b""
            while chunk := raw.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.0 200") or answer.startswith(b"HTTP/1.1 200"), answer


def test_the_generated_token_file_is_private_while_running_and_gone_after_stop(
    tmp_path, runtime_dir
):
    """With no token configured, ``wirekit serve`` writes a generated one to
    ``$XDG_RUNTIME_DIR/wirekit/serve-<host>-<port>.token`` (mode 0600, in a 0700 directory
    of the user), logs where (never the token), and removes it on a clean stop; every admin
    request needs it (401 without it or with another)."""
    with DispatcherProcess.of(one_model(tmp_path), tmp_path) as proc:
        port = proc.addresses["http"]
        path = Path(proc.addresses["admin_token_file"])
        assert path == runtime_dir / "wirekit" / f"serve-127.0.0.1-{port}.token"
        info = path.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        token = proc.admin_token
        assert len(token) >= 40
        for headers in ({}, bearer("wrong"), bearer(token + "x"), {"Authorization": token}):
            status, doc, answer = call(port, "GET", "/admin/models", headers)
            assert status == 401, doc
            assert answer["WWW-Authenticate"].startswith("Bearer")
            status, doc, _ = call(port, "DELETE", "/admin/models/m1", headers)
            assert status == 401, doc
        assert model_names(proc) == ["m1"]
        # predictions never need it (the backend is down: an answer, not a 401)
        predict = {"Content-Type": "application/json"}
        status, _doc, _ = call(
            port, "POST", "/v1/models/m1:predict", predict, b'{"inputs": [["a"]]}'
        )
        assert status != 401
        assert proc.stop() == 0
        log = proc.log
    assert not path.exists()
    assert f"admin API token written to {path}" in log
    assert token not in log


#: what a web page's ``fetch("http://127.0.0.1:PORT/", {method: "POST", body})`` puts on
#: the wire: a request line, headers and the page's bytes (here a valid MIP request)
BROWSER_POST = (
    b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://attacker.example\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 22\r\n\r\n"
    + mip.encode(mip.Inference.request([[mip.Item.text("hi")]]))
)


def raw_exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` to 127.0.0.1:``port`` and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as conn:
        conn.sendall(data)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_a_browser_request_to_a_mip_port_is_a_protocol_error(tmp_path):
    """What a web page can send to a MIP port (the dispatcher's front door, ``wirekit mip
    serve``) starts with an HTTP method, never MIP version 0: one PROTOCOL error reply, the
    connection closed, the model not called; both keep serving MIP clients."""
    refused = mip.encode(mip.ErrorReply(int(mip.ErrorCode.PROTOCOL)))
    with BackendProcess("serve_handlers:tag_fast") as backend:
        doc = one_model(tmp_path)
        doc["nodes"][0]["ports"] = [backend.port]
        with DispatcherProcess.of(doc, tmp_path) as proc:
            front = proc.addresses["mip"]["m1"]
            for port in (front, backend.port):
                assert raw_exchange(port, BROWSER_POST) == refused
            with Client(proc.mip_address("m1"), timeout=TIMEOUT) as client:
                (item,) = client.infer_one("x")
                assert item.as_text() == "F:X"
            status, doc_, _ = call(proc.addresses["http"], "GET", "/stats")
            assert status == 200
            assert doc_["models"]["m1"]["requests"] == 1  # the client's only


def run_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``wirekit serve models ARGV`` as a subprocess (the environment: this one's, and
    ``env``)."""
    environ = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    for name in ("WIREKIT_ADMIN_TOKEN", "WIREKIT_ADMIN_TOKEN_FILE", "WIREKIT_ADMIN_URL"):
        if name not in (env or {}):
            environ.pop(name, None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "wirekit.cli",
            "serve",
            "models",
            *argv,
            *(["--json"] if argv[0] != "list" else []),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 6,
        env=environ,
    )


def test_models_commands_find_the_token_file_by_themselves(tmp_path):
    """``wirekit serve models list|add|remove`` work against a dispatcher with no token
    configured, reading its token file from ``--url`` (``localhost`` included); a wrong
    token is refused (exit 1, HTTP 401); with no token file to be found the command says
    which file it looked for (exit 2) and sends nothing."""
    with DispatcherProcess.of(one_model(tmp_path), tmp_path) as proc:
        url = ["--url", proc.http]
        done = run_cli("list", "--json", *url)
        assert done.returncode == 0, done.stderr
        assert list(json.loads(done.stdout)["models"]) == ["m1"]
        done = run_cli("add", "--name", "m2", "--place", f"n1:0:0.5:{NO_BACKEND}", *url)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["added"]["rows"][0]["quota"] == 0.5
        localhost = f"http://localhost:{proc.addresses['http']}"
        done = run_cli("list", "--url", localhost)
        assert done.returncode == 0, done.stderr
        assert "m2: mip" in done.stdout
        done = run_cli("remove", "m2", *url)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["removed"] == "m2"

        done = run_cli("remove", "m1", *url, "--token", "wrong")
        assert done.returncode == 1 and "HTTP 401" in done.stderr, done.stderr
        done = run_cli("list", *url, env={"WIREKIT_ADMIN_TOKEN": "wrong"})
        assert done.returncode == 1 and "HTTP 401" in done.stderr, done.stderr

        # explicit: --token-file, WIREKIT_ADMIN_TOKEN_FILE
        copy = tmp_path / "copied.token"
        copy.write_text(proc.admin_token + "\n")
        done = run_cli("list", *url, "--token-file", str(copy))
        assert done.returncode == 0, done.stderr
        done = run_cli("list", *url, env={"WIREKIT_ADMIN_TOKEN_FILE": str(copy)})
        assert done.returncode == 0, done.stderr

        # another user's view (no file where this one looks): a clear refusal, exit 2
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        env = {"XDG_RUNTIME_DIR": str(elsewhere), "HOME": str(elsewhere)}
        done = run_cli("remove", "m1", *url, env=env)
        expected = elsewhere / "wirekit" / f"serve-127.0.0.1-{proc.addresses['http']}.token"
        assert done.returncode == 2, done.stderr
        assert f"no token file {expected}" in done.stderr and "--token" in done.stderr
        done = run_cli("list", *url, "--token-file", str(tmp_path / "missing.token"))
        assert done.returncode == 2 and "missing.token" in done.stderr, done.stderr
        assert model_names(proc) == ["m1"]


def test_admin_token_file_config_key(tmp_path):
    """``admin.token_file`` chooses where the generated token goes (mode 0600 there too);
    ``--token-file`` reads it; it is removed on stop."""
    path = tmp_path / "tokens" / "dispatcher.token"
    doc = one_model(tmp_path, admin={"token_file": str(path)})
    with DispatcherProcess.of(doc, tmp_path) as proc:
        assert Path(proc.addresses["admin_token_file"]) == path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        done = run_cli("list", "--url", proc.http, "--token-file", str(path))
        assert done.returncode == 0, done.stderr
        assert proc.stop() == 0
    assert not path.exists()


def test_a_configured_token_writes_no_file(tmp_path, runtime_dir):
    """With ``admin.token`` the token is the operator's: no file is written, and it is the
    one the API needs."""
    with DispatcherProcess.of(one_model(tmp_path, admin={"token": "t0ken"}), tmp_path) as proc:
        assert "admin_token_file" not in proc.addresses
        port = proc.addresses["http"]
        name = token_file_name("127.0.0.1", port)
        assert not (runtime_dir / "wirekit" / name).exists()
        assert call(port, "GET", "/admin/models", bearer("t0ken"))[0] == 200
        assert call(port, "GET", "/admin/models")[0] == 401


# --- the checks on their own -----------------------------------------------------------


def refusal(access: AdminAccess, **request):
    """The status ``access`` refuses a request with, or None; by default a GET from the
    CLI (right token, Host 127.0.0.1:8080, no Origin, no body)."""
    given = {
        "method": "GET",
        "host": "127.0.0.1:8080",
        "origin": None,
        "authorization": f"Bearer {access.token}",
        "content_type": None,
        "has_body": False,
        **request,
    }
    answer = access.refusal(**given)
    return None if answer is None else answer.status


@pytest.mark.parametrize(
    ("listen", "allowed", "host", "status"),
    [
        ("127.0.0.1", (), "127.0.0.1:8080", None),
        ("127.0.0.1", (), "LOCALHOST:8080", None),
        ("127.0.0.1", (), "localhost.", None),
        ("127.0.0.1", (), "[::1]:8080", None),
        ("::1", (), "[::1]:8080", None),
        ("127.0.0.1", (), "127.0.0.5", None),
        ("127.0.0.1", (), "attacker.example:8080", 403),
        ("127.0.0.1", (), "localhost.attacker.example", 403),
        ("127.0.0.1", (), "10.0.0.5:8080", 403),
        ("127.0.0.1", (), "", 403),
        ("127.0.0.1", (), None, 403),
        ("127.0.0.1", (), "127.0.0.1:80:80", 403),
        ("127.0.0.1", (), "[::1", 403),
        ("127.0.0.1", ("dispatcher.lan",), "dispatcher.lan:8080", None),
        ("localhost", (), "localhost:8080", None),
        # beyond loopback the token is a configured one: any Host unless names are listed
        ("0.0.0.0", (), "wirekit.default.svc:8080", None),
        ("0.0.0.0", ("wirekit",), "wirekit:8080", None),
        ("0.0.0.0", ("wirekit",), "10.0.0.5:8080", None),
        ("0.0.0.0", ("wirekit",), "attacker.example", 403),
        ("10.0.0.5", ("wirekit",), "10.0.0.5", None),
    ],
)
def test_host_check(listen, allowed, host, status):
    access = AdminAccess.of("t", listen, allowed)
    assert refusal(access, host=host) == status


@pytest.mark.parametrize(
    ("origin", "host", "status"),
    [
        ("http://127.0.0.1:8080", "127.0.0.1:8080", None),
        ("http://localhost", "localhost:80", None),
        ("https://localhost", "localhost:443", None),
        ("http://[::1]:8080", "[::1]:8080", None),
        ("http://127.0.0.1:9999", "127.0.0.1:8080", 403),
        ("http://attacker.example", "127.0.0.1:8080", 403),
        ("null", "127.0.0.1:8080", 403),
        ("", "127.0.0.1:8080", 403),
        ("http://127.0.0.1:99999", "127.0.0.1:8080", 403),
        ("file://", "127.0.0.1:8080", 403),
    ],
)
def test_origin_check(origin, host, status):
    assert refusal(AdminAccess.of("t", "127.0.0.1"), origin=origin, host=host) == status


@pytest.mark.parametrize(
    ("method", "content_type", "has_body", "status"),
    [
        ("POST", "application/json", True, None),
        ("PATCH", "Application/JSON; charset=utf-8", True, None),
        ("POST", "text/plain", True, 415),
        ("PUT", "application/x-www-form-urlencoded", True, 415),
        ("POST", "multipart/form-data; boundary=x", True, 415),
        ("POST", None, True, 415),
        ("DELETE", None, False, None),
        ("DELETE", "text/plain", True, 415),
        ("GET", "text/plain", True, None),
    ],
)
def test_content_type_check(method, content_type, has_body, status):
    access = AdminAccess.of("t", "127.0.0.1")
    got = refusal(access, method=method, content_type=content_type, has_body=has_body)
    assert got == status
    # without the token the answer is 401 whatever the body (it says nothing more)
    assert refusal(access, method=method, content_type=content_type, authorization=None) == 401


def test_token_file_writing(tmp_path):
    """Written with mode 0600 whatever the umask, over a stale file; the directory is made
    the user's own (0700); removed only while it holds this dispatcher's token."""
    directory = tmp_path / "run"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    path = directory / "serve-127.0.0.1-1.token"
    path.write_text("stale\n")
    old = os.umask(0)
    try:
        write_token_file(path, "abc")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert read_token_file(path) == "abc"
    assert sorted(p.name for p in directory.iterdir()) == [path.name]  # no temporary left
    remove_token_file(path, "another dispatcher's")
    assert path.exists()
    remove_token_file(path, "abc")
    assert not path.exists()
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(TokenFileError, match="cannot write the admin token file"):
        write_token_file(not_a_dir / "x.token", "abc")
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    with pytest.raises(TokenFileError, match="is empty"):
        read_token_file(empty)


def test_token_file_candidates(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")}
    xdg, home = tmp_path / "xdg" / "wirekit", tmp_path / "home" / ".local/share/wirekit/runtime"
    found = token_file_candidates("http://localhost:8080/", env)
    assert found[:3] == [
        xdg / "serve-localhost-8080.token",
        xdg / "serve-127.0.0.1-8080.token",
        xdg / "serve-__1-8080.token",
    ]
    assert found[3] == home / "serve-localhost-8080.token"
    assert token_file_candidates("http://dispatcher.lan", {"HOME": "/h"}) == [
        Path("/h/.local/share/wirekit/runtime/serve-dispatcher.lan-80.token")
    ]
    assert token_file_name("../../etc/passwd", 1) == "serve-.._.._etc_passwd-1.token"


def test_allowed_hosts_config(tmp_path):
    doc = one_model(tmp_path, admin={"allowed_hosts": ["Dispatcher.LAN.", "[::1]"]})
    assert parse_config(doc).admin.allowed_hosts == ("dispatcher.lan", "::1")
    with pytest.raises(ConfigError) as info:
        parse_config(one_model(tmp_path, admin={"allowed_hosts": ["a b"]}))
    assert info.value.where == "admin.allowed_hosts[0]"
