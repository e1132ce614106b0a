"""How the commands log (issue 28, "Logs"): one text format, a JSON format, ``--log-level``
and ``--log-format`` on every command that logs, normal events at INFO, and the optional
access log of ``wirekit serve``'s HTTP door.

The formatters on their own; the flags of every command; real ``wirekit serve`` and
``wirekit mip serve`` subprocesses whose standard error is read line by line."""

from __future__ import annotations

import argparse
import http.client
import io
import json
import logging
import re
import sys
from pathlib import Path

import pytest
from mip_net import CliServer
from serve_support import TIMEOUT, DispatcherProcess, deployment

from wirekit._logging import (
    FIELDS,
    JsonFormatter,
    TextFormatter,
    command_logging,
    printable,
)
from wirekit.cli import main
from wirekit.mip.client import Client
from wirekit.mip.runtime import ServerError
from wirekit.serve.config import ConfigError, parse_config

#: a text line's start: ISO-8601 time with milliseconds and offset, level, component
TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"([\w.]+): (.*)$"
)
#: the keys every JSON line has
JSON_KEYS = {"time", "level", "logger", "message"}
JSON_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d$")
#: nothing listens there: the models' backends are never called
NO_BACKEND = 9


def record(
    message: str,
    *args: object,
    level: int = logging.INFO,
    name: str = "wirekit.test",
    exc: bool = False,
    fields: dict | None = None,
) -> logging.LogRecord:
    """A log record as a logger would make it (with the exception being handled, if
    ``exc``)."""
    exc_info = sys.exc_info() if exc else None
    rec = logging.LogRecord(name, level, __file__, 1, message, args, exc_info)
    if fields is not None:
        setattr(rec, FIELDS, fields)
    return rec


def json_lines(text: str) -> list[dict]:
    """Every line of ``text`` parsed as JSON (fails on the first that is not an object
    with the keys every JSON log line has)."""
    docs = []
    for line in text.splitlines():
        doc = json.loads(line)
        assert isinstance(doc, dict) and doc.keys() >= JSON_KEYS, line
        assert JSON_TIME.match(doc["time"]), line
        assert line.isascii(), line
        docs.append(doc)
    return docs


def level_of(docs: list[dict], text: str) -> str:
    """The level of the one JSON record whose message holds ``text``."""
    found = [d["level"] for d in docs if text in d["message"]]
    assert len(found) == 1, (text, docs)
    return found[0]


# --- the formatters ------------------------------------------------------------------------


def test_a_text_line_is_time_level_component_message():
    line = TextFormatter().format(record("model %s added", "m1", name="wirekit.serve"))
    match = TEXT_LINE.match(line)
    assert match is not None, line
    assert match.groups() == ("INFO", "wirekit.serve", "model m1 added")


def test_text_lines_cannot_be_forged_and_tracebacks_are_indented():
    """A line break, an ANSI escape or a bidi override in an argument is escaped; a
    traceback's lines are indented, so a line break in an exception's message (peer text)
    makes no line at column 0: every line at column 0 is a record."""
    forged = "x\n2030-01-01T00:00:00.000+00:00 ERROR wirekit.serve: forged\x1b[2J\u202e"
    line = TextFormatter().format(record("peer said %s", forged, level=logging.WARNING))
    assert "\n" not in line and "\x1b" not in line and "\u202e" not in line
    assert line.endswith("peer said x\\n2030-01-01T00:00:00.000+00:00 ERROR wirekit.serve: "
                         "forged\\x1b[2J\\u202e")  # fmt: skip
    try:
        raise ValueError(forged)
    except ValueError:
        text = TextFormatter().format(record("handler failed", level=logging.ERROR, exc=True))
    first, *rest = text.split("\n")
    assert TEXT_LINE.match(first) and first.endswith("handler failed")
    assert rest and all(part.startswith("  ") for part in rest), rest
    assert "  Traceback (most recent call last):" in rest
    assert any(part.startswith("  2030-01-01") for part in rest)
    assert "\x1b" not in text


def test_json_lines_are_valid_ascii_json_whatever_they_hold():
    fmt = JsonFormatter()
    nasty = 'naïve 模型 \n\r\x00\x1b[31m \u2028 \ud800 "quoted" \\ end'
    try:
        raise RuntimeError(nasty)
    except RuntimeError:
        line = fmt.format(
            record(
                "got %s",
                nasty,
                level=logging.ERROR,
                name="wirekit.serve",
                exc=True,
                fields={
                    "status": 200,
                    "duration": 0.5,
                    "ratio": float("nan"),
                    "path": "/a\nb",
                    "message": "cannot replace the message",
                    "object": object(),
                },
            )
        )
    assert "\n" not in line and line.isascii()
    (doc,) = json_lines(line)
    assert doc["level"] == "ERROR" and doc["logger"] == "wirekit.serve"
    assert doc["message"] == "got " + printable(nasty)
    assert "naïve 模型" in doc["message"] and "\\ud800" in doc["message"]
    assert doc["exception"].startswith("Traceback (most recent call last):\n")
    assert "\x1b" not in doc["exception"] and "\\x1b[31m" in doc["exception"]
    assert "RuntimeError: naïve" in doc["exception"]
    assert doc["status"] == 200 and doc["duration"] == 0.5
    assert doc["ratio"] == "nan" and doc["path"] == "/a\\nb"
    assert doc["object"].startswith("<object object")
    # a plain record has exactly the four keys
    assert set(json.loads(fmt.format(record("stopped")))) == JSON_KEYS


def test_a_command_leaves_the_logging_as_it_found_it():
    """In-process (``wirekit.cli.main``), a command's handler is gone when it returns and
    the root logger's level is back: nothing is left writing to a stream the caller may
    close."""
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    err = io.StringIO()
    args = argparse.Namespace(log_level="debug", log_format="json")
    with command_logging(args, err):
        assert root.level == logging.DEBUG
        logging.getLogger("wirekit.test").debug("inside")
    assert (list(root.handlers), root.level) == before
    logging.getLogger("wirekit.test").warning("outside")
    assert [d["message"] for d in json_lines(err.getvalue())] == ["inside"]
    status = main(["mip", "serve", "--handler", "nocolon", "--log-format", "json"], io.StringIO(),
                  io.StringIO())  # fmt: skip
    assert status == 2
    assert (list(root.handlers), root.level) == before


# --- the flags -----------------------------------------------------------------------------

#: every command that logs
LOGGING_COMMANDS = [
    ["serve"],
    ["mip", "serve"],
    ["clipper", "container"],
    ["clipper", "frontend"],
    ["y2", "client"],
    ["y2", "service"],
]


@pytest.mark.parametrize("command", LOGGING_COMMANDS, ids=" ".join)
def test_every_command_that_logs_has_the_logging_flags(command, capsys):
    assert main([*command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the help's lines joined
    assert "--log-level {debug,info,warning,error}" in text
    assert "--log-format {text,json}" in text
    assert "(default info" in text


def test_verbose_is_a_deprecated_alias_that_says_so():
    """``wirekit clipper container|frontend -v`` (their old switch to INFO) still works,
    is ``--log-level info``, and logs a WARNING that it is deprecated."""
    err = io.StringIO()
    status = main(["clipper", "frontend", "-v", "--generation", "v3", "--max-in-flight", "0",
                   "--query", ""], io.StringIO(), err)  # fmt: skip
    assert status != 0
    deprecation = [ln for ln in err.getvalue().splitlines() if "deprecated" in ln]
    assert len(deprecation) == 1
    match = TEXT_LINE.match(deprecation[0])
    assert match and match.group(1) == "WARNING" and "--log-level" in match.group(3)


# --- wirekit serve -------------------------------------------------------------------------


def one_model(tmp_path: Path, **top) -> dict:
    """Model m1 on n1's CPU, whose backend nothing serves (an actionable WARNING at start)."""
    return deployment(
        tmp_path / "r.db",
        {"m1": {"timeout": 5}},
        [{"id": "n1", "devices": ["CPU"], "models": ["m1"], "quotas": [1], "ports": [NO_BACKEND]}],
        **top,
    )


#: a model the admin API adds (and removes) while the dispatcher runs
ADDED_MODEL = {
    "models": {"m2": {"port": None}},
    "nodes": [
        {
            "id": "n2",
            "endpoint": "127.0.0.1",
            "devices": ["CPU"],
            "models": ["m2"],
            "quotas": [1],
            "ports": [NO_BACKEND],
        }
    ],
}


def call(
    port: int, method: str, path: str, headers: dict | None = None, body: bytes | None = None
) -> tuple[int, bytes]:
    """One HTTP request to 127.0.0.1:``port``: its status and body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def stop_and_read(proc: DispatcherProcess) -> tuple[str, str]:
    """SIGTERM the dispatcher; what it wrote to stdout after its ready line, and its log."""
    assert proc.stop() == 0
    assert proc.proc is not None and proc.proc.stdout is not None
    return proc.proc.stdout.read(), proc.log


def test_serve_json_log_access_log_and_levels(tmp_path):
    """``wirekit serve --log-format json --access-log``: standard error is only JSON lines
    (time, level, logger, message); each HTTP request is one access record with its
    method, path, status, bytes, duration and client; starting, models added and removed
    and stopping are INFO, a backend that cannot be reached is a WARNING; standard output
    has the ready line only."""
    doc = one_model(tmp_path)
    args = ("--log-format", "json", "--access-log")
    with DispatcherProcess.of(doc, tmp_path, args=args) as proc:
        port = proc.addresses["http"]
        assert call(port, "GET", "/stats")[0] == 200
        assert call(port, "GET", "/no/such/page?x=1")[0] == 404
        token = {"Authorization": f"Bearer {proc.admin_token}"}
        body = json.dumps(ADDED_MODEL).encode()
        headers = {**token, "Content-Type": "application/json"}
        assert call(port, "POST", "/admin/models", headers, body)[0] == 201
        assert call(port, "DELETE", "/admin/models/m2", token)[0] == 200
        proc.wait_for_log("model m2 removed")
        out, log = stop_and_read(proc)
    assert out == ""
    docs = json_lines(log)
    assert level_of(docs, "wirekit serve: started") == "INFO"
    assert level_of(docs, "admin API token written") == "INFO"
    assert level_of(docs, "model m2 added") == "INFO"
    assert level_of(docs, "model m2 removed") == "INFO"
    assert level_of(docs, "SIGTERM received") == "INFO"
    assert level_of(docs, "wirekit serve: stopped") == "INFO"
    assert level_of(docs, "n1/0/m1 cannot be reached") == "WARNING"
    access = [d for d in docs if d["logger"] == "wirekit.serve.access"]
    seen = [(d["method"], d["path"], d["status"]) for d in access]
    assert seen == [
        ("GET", "/stats", 200),
        ("GET", "/no/such/page?x=1", 404),
        ("POST", "/admin/models", 201),
        ("DELETE", "/admin/models/m2", 200),
    ]
    for d in access:
        assert d["level"] == "INFO" and d["client"] == "127.0.0.1"
        assert isinstance(d["bytes"], int) and d["bytes"] > 0
        assert isinstance(d["duration"], float) and d["duration"] >= 0
        assert f'"{d["method"]} {d["path"]}" {d["status"]}' in d["message"]


def test_serve_text_log_and_the_access_log_config_key(tmp_path):
    """The default text format: every line is ``TIME LEVEL COMPONENT: MESSAGE``, normal
    events at INFO, no access log unless asked; ``http.access_log = true`` in the config
    turns it on as ``--access-log`` does."""
    with DispatcherProcess.of(one_model(tmp_path), tmp_path) as proc:
        assert call(proc.addresses["http"], "GET", "/stats")[0] == 200
        _out, log = stop_and_read(proc)
    lines = [TEXT_LINE.match(line) for line in log.splitlines()]
    assert lines and all(lines), log
    events = {(m.group(1), m.group(2), m.group(3)) for m in lines if m}
    assert ("INFO", "wirekit.serve", "wirekit serve: stopped") in events
    assert not any(component == "wirekit.serve.access" for _, component, _ in events)

    on = one_model(tmp_path, http={"access_log": True})
    (tmp_path / "on").mkdir()
    with DispatcherProcess.of(on, tmp_path / "on") as proc:
        assert call(proc.addresses["http"], "GET", "/stats")[0] == 200
        line = proc.wait_for_log('"GET /stats" 200')[0]
    match = TEXT_LINE.match(line)
    assert match and match.group(1, 2) == ("INFO", "wirekit.serve.access")
    assert match.group(3).startswith('127.0.0.1 "GET /stats" 200 ')


def test_the_access_log_config_key_is_a_boolean(tmp_path):
    base = one_model(tmp_path)
    assert parse_config(base).http.access_log is False
    assert parse_config({**base, "http": {"access_log": True}}).http.access_log is True
    with pytest.raises(ConfigError, match=r"http\.access_log"):
        parse_config({**base, "http": {"access_log": "yes"}})


# --- wirekit mip serve ---------------------------------------------------------------------


def test_mip_serve_json_log_holds_a_traceback_in_one_line():
    """``wirekit mip serve --log-format json``: only JSON lines, listening and stopping at
    INFO, a handler's failure at ERROR with its traceback in ``exception`` (its message's
    lines kept in one JSON string, so the forged line in it stays inside the record)."""
    with CliServer(
        "--listen", "tcp://127.0.0.1:0", "--log-format", "json",
        handler="mip_handlers:fail_with_a_forged_line",
    ) as server:  # fmt: skip
        with Client(server.address, timeout=TIMEOUT) as client, pytest.raises(ServerError):
            client.infer([["x"]])
        status, log = server.stop(), server.log
    assert status == 0
    docs = json_lines(log)
    assert level_of(docs, "listening on tcp://127.0.0.1:") == "INFO"
    assert level_of(docs, "stopped") == "INFO"
    (failed,) = [d for d in docs if d["level"] == "ERROR"]
    assert failed["logger"] == "wirekit.mip.server"
    assert "handler failed" in failed["message"]
    assert failed["exception"].startswith("Traceback (most recent call last):\n")
    assert "RuntimeError: the model broke\n2030-01-01" in failed["exception"]


def test_mip_serve_text_log_shows_a_forged_line_inside_the_traceback():
    with CliServer(
        "--listen", "tcp://127.0.0.1:0", handler="mip_handlers:fail_with_a_forged_line"
    ) as server:
        with Client(server.address, timeout=TIMEOUT) as client, pytest.raises(ServerError):
            client.infer([["x"]])
        status, log = server.stop(), server.log
    assert status == 0
    records = [line for line in log.splitlines() if not line.startswith("  ")]
    assert all(TEXT_LINE.match(line) for line in records), log
    assert not any(line.startswith("2030-") for line in log.splitlines())
    assert "  2030-01-01T00:00:00.000+00:00 ERROR forged: line" in log.splitlines()
