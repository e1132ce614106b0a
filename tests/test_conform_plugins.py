"""A ``wirekit conform`` suite brings its own options and TARGET type (issue 35): a suite
registered here, in the test, with an ``http://`` target and a flag of its own runs through
the real command line, and ``wirekit/conform/cli.py`` names no suite's option."""

from __future__ import annotations

import argparse
import contextlib
import http.server
import io
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest

from wirekit import cli
from wirekit.conform import Failed, Level, Suite
from wirekit.conform.core.options import SuiteOptions, add_listen
from wirekit.conform.suites import SUITES

ROOT = Path(__file__).resolve().parent.parent


def http_address(text: str) -> str:
    """An ``http://HOST:PORT`` TARGET (the type an OIP suite would declare)."""
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None or parts.path not in "/":
        raise argparse.ArgumentTypeError(f"bad address {text!r}: expected http://HOST:PORT")
    return f"http://{parts.netloc}"


OIP = Suite("oip", "server", "OIP server")


@OIP.case("health.ready", "specs/conformance.md", Level.MUST,
          send="GET /v2/health/ready", expect="200")  # fmt: skip
def health_ready(target: OipTarget, deadline: object) -> None:
    expect_status(f"{target.url}/v2/health/ready", 200)


@OIP.case("model.ready", "specs/conformance.md", Level.MUST,
          send="GET /v2/models/NAME/ready", expect="200")  # fmt: skip
def model_ready(target: OipTarget, deadline: object) -> None:
    expect_status(f"{target.url}/v2/models/{target.model}/ready", 200)


def expect_status(url: str, want: int) -> None:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    if status != want:
        raise Failed(f"HTTP {want}", f"HTTP {status}")


def add_arguments(options: SuiteOptions) -> None:
    options.target(http_address, note="an OIP server http://HOST:PORT")
    options.add_argument("--model-name", default="conform", metavar="NAME", help="the model")


def check_arguments(args: argparse.Namespace) -> str | None:
    return None if args.target else "oip server: give the server's address: http://HOST:PORT"


@dataclass
class OipTarget:
    """What the cases run against; the report names it by its URL."""

    url: str
    model: str

    def __str__(self) -> str:
        return self.url


@contextlib.contextmanager
def open_target(args: argparse.Namespace) -> Iterator[OipTarget]:
    yield OipTarget(args.target, args.model_name)


OIP_SUITE = SimpleNamespace(
    SUITE=OIP, add_arguments=add_arguments, check_arguments=check_arguments,
    open_target=open_target,
)  # fmt: skip


@pytest.fixture
def oip(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The OIP suite, registered for this test only (``cli.py`` untouched)."""
    monkeypatch.setitem(SUITES, ("oip", "server"), OIP_SUITE)
    return OIP_SUITE


class ReadyHandler(http.server.BaseHTTPRequestHandler):
    """Ready, and so is the model ``conform``; nothing else."""

    def do_GET(self) -> None:
        ok = self.path in ("/v2/health/ready", "/v2/models/conform/ready")
        self.send_response(200 if ok else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ReadyHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def conform(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = cli.main(["conform", *argv], out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def conform_help(capsys: pytest.CaptureFixture[str]) -> str:
    """``wirekit conform --help`` (argparse prints it on the real standard output)."""
    status, _, _ = conform("--help")
    assert status == 0
    return capsys.readouterr().out


def test_a_suite_runs_with_its_own_target_type_and_option(oip, http_server):
    status, out, err = conform("oip", "server", http_server, "--json")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["target"] == http_server
    assert {c["id"]: c["status"] for c in doc["cases"]} == {
        "health.ready": "pass",
        "model.ready": "pass",
    }
    status, out, _ = conform("oip", "server", http_server, "--model-name", "other", "--json")
    failed = {c["id"]: c["got"] for c in json.loads(out)["cases"] if c["status"] == "fail"}
    assert status == 1 and failed == {"model.ready": "HTTP 404"}


def test_a_bad_target_for_the_suites_type_is_the_usage_error_of_a_bad_address(oip):
    status, out, err = conform("oip", "server", "tcp://127.0.0.1:5000")
    assert status == 2 and out == ""
    assert err.splitlines()[-1] == (
        "wirekit conform: error: argument ADDRESS: bad address 'tcp://127.0.0.1:5000': "
        "expected http://HOST:PORT"
    )
    status, _, err = conform("oip", "server")
    assert status == 2 and "oip server: give the server's address: http://HOST:PORT" in err
    # the same parser still parses a MIP server's TARGET as a MIP address
    status, _, err = conform("mip", "server", "http://127.0.0.1:5000")
    assert status == 2 and "unknown scheme http://" in err.splitlines()[-1]


def test_help_shows_the_suites_option_and_target(oip, capsys):
    out = conform_help(capsys)
    assert "\noip server:\n  --model-name NAME" in out
    assert "(a MIP server also unix:///PATH; an OIP server http://HOST:PORT)" in " ".join(
        out.split()
    )
    status, out, _ = conform("oip", "server", "--list")
    assert status == 0 and out.splitlines()[0].startswith("health.ready\tMUST\t")


def test_an_option_suites_share_is_added_once_under_every_suite_that_uses_it(monkeypatch, capsys):
    def with_listen(options: SuiteOptions) -> None:
        add_arguments(options)
        add_listen(options)

    monkeypatch.setitem(SUITES, ("oip", "server"), SimpleNamespace(**{**vars(OIP_SUITE),
                        "add_arguments": with_listen}))  # fmt: skip
    out = conform_help(capsys)
    assert out.count("--listen ADDRESS  ") == 1
    assert "\nclipper container, mip client, oip server, y2 service (wirekit listens):\n" in out


def test_an_option_declared_two_ways_is_refused(monkeypatch):
    def other_listen(options: SuiteOptions) -> None:
        options.add_argument("--listen", metavar="ADDRESS", help="somewhere else")

    monkeypatch.setitem(SUITES, ("oip", "server"), SimpleNamespace(**{**vars(OIP_SUITE),
                        "add_arguments": other_listen}))  # fmt: skip
    with pytest.raises(ValueError, match="--listen of oip server differs from"):
        conform("--help")


def test_the_central_cli_names_no_suites_option():
    source = (ROOT / "wirekit" / "conform" / "cli.py").read_text(encoding="utf-8")
    for flag in ("--max-batch", "--listen", "--connect-timeout", "--gen", "--query"):
        assert f'"{flag}"' not in source, flag
    assert "mip_address" not in source and "tcp_address" not in source
