"""One command-line vocabulary (README "One vocabulary", issue 29): every command's parser
walked and held to the rules, then the exit codes of a bad address, a port already taken and a
missing extra checked on the real command line, command by command."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_support import deployment

from wirekit import _vocabulary as vocab
from wirekit._logging import _VerboseAction
from wirekit.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
WAIT = 30.0


def _commands() -> list[tuple[str, argparse.ArgumentParser]]:
    """``(command path, parser)`` of every command and subcommand, ``wirekit`` first."""
    found: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        found.append((path, parser))
        # argparse lists a parser's actions in no public attribute
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")

    walk(build_parser(), "wirekit")
    return found


COMMANDS = _commands()
IDS = [path for path, _ in COMMANDS]


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The parser's own options and positionals (not -h, not its subcommands)."""
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        yield action


def visible(action: argparse.Action) -> bool:
    return action.help is not argparse.SUPPRESS


def flags(parser: argparse.ArgumentParser, *, hidden: bool = False) -> set[str]:
    return {
        flag
        for action in options(parser)
        if hidden or visible(action)
        for flag in action.option_strings
    }


def test_every_command_has_a_description():
    missing = [path for path, parser in COMMANDS if not (parser.description or "").strip()]
    assert missing == []


#: options that name an address when they take a string (``serve models add --target`` is
#: seconds, ``--url`` an HTTP URL)
ADDRESS_DESTS = {"listen", "target", "address", "client", "inbox", "advertise", "worker_listen",
                 "query", "frontend"}  # fmt: skip


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=IDS)
def test_every_address_parses_through_the_one_address_parser(path, parser):
    for action in options(parser):
        takes_text = action.type is None or action.type in vocab.ADDRESS_TYPES
        names_address = (
            action.dest in ADDRESS_DESTS
            and takes_text
            and action.nargs != 0
            and action.metavar != "FILE"  # decode --client FILE: the client's bytes
        )
        if names_address or action.metavar == "ADDRESS":
            assert action.type in vocab.ADDRESS_TYPES, (path, action.option_strings, action.dest)
            assert action.metavar == "ADDRESS", (path, action.option_strings)
        if action.type in vocab.ADDRESS_TYPES:
            assert action.metavar == "ADDRESS", (path, action.option_strings)


@pytest.mark.parametrize(
    ("kind", "text", "written"),
    [
        (vocab.tcp_address, "127.0.0.1:5560", "tcp://127.0.0.1:5560"),
        (vocab.tcp_address, "tcp://localhost:0", "tcp://localhost:0"),
        (vocab.tcp_address, "[::1]:7", "tcp://[::1]:7"),
        (vocab.tcp_address_or_port, "7001", "tcp://127.0.0.1:7001"),
        (vocab.tcp_address_or_port, ":7001", "tcp://127.0.0.1:7001"),
        (vocab.mip_address, "unix:///run/m.sock", "unix:///run/m.sock"),
        (vocab.zmq_address, "tcp://*:5560", "tcp://*:5560"),
        (vocab.zmq_address, "tcp://127.0.0.1:*", "tcp://127.0.0.1:0"),
        (vocab.zmq_address, "ipc:///tmp/x", "ipc:///tmp/x"),
        (vocab.zmq_address_or_off, "", ""),
    ],
)
def test_the_address_parser_writes_each_address_one_way(kind, text, written):
    assert kind(text) == written


@pytest.mark.parametrize(
    ("kind", "text", "said"),
    [
        (vocab.tcp_address, "127.0.0.1", "has no port"),
        (vocab.tcp_address, "5560", "has no port"),
        (vocab.tcp_address, "tcp://h:99999", "from 0 to 65535"),
        (vocab.tcp_address, "tcp://h:*", "from 0 to 65535"),
        (vocab.tcp_address, "*:5", "host * is ZeroMQ's"),
        (vocab.tcp_address, "::1:5", "in brackets"),
        (vocab.tcp_address, "unix:///x", "unknown scheme unix://"),
        (vocab.mip_address, "ftp://x:1", "unknown scheme ftp://"),
        (vocab.zmq_address, "tcp://:5", "has no host"),
    ],
)
def test_a_bad_address_says_what_is_expected(kind, text, said):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(said)):
        kind(text)


#: spellings that are only deprecated aliases now (README, CHANGELOG)
OLD_SPELLINGS = {"--max-message", "--max-frame-size", "--max-buffered", "--print-json",
                 "--dialect", "--frontend", "--ip", "-v", "--verbose"}  # fmt: skip


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=IDS)
def test_one_name_for_the_size_limit_json_and_user_code(path, parser):
    assert not flags(parser) & OLD_SPELLINGS
    for action in options(parser):
        if not visible(action):
            continue
        if "max_message" in action.dest or "max_frame" in action.dest:
            assert action.option_strings == [vocab.MAX_MESSAGE_SIZE_FLAG], path
        if action.dest == "json" and action.nargs == 0:  # (mip infer --json-item: an input)
            assert action.option_strings == ["--json"], path
        if action.metavar == "MODULE:FUNCTION":  # user code
            assert action.option_strings == ["--handler"], path
        if "--model" in action.option_strings:  # a model's name
            assert action.metavar == "NAME", path


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=IDS)
def test_timeout_is_how_long_a_client_waits_for_its_answer(path, parser):
    """A server's limits on its clients have names that say what they wait for; --timeout
    is a client's wait for the answer.  (y2 client's --timeout, added with issue 29's end
    of run, is how long the run may go without progress.)"""
    if "--timeout" not in flags(parser) or path == "wirekit y2 client":
        return
    assert "--listen" not in flags(parser), f"{path} listens and has a --timeout"
    timeout = next(a for a in options(parser) if "--timeout" in a.option_strings)
    assert timeout.help.startswith("wait this long for"), path


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=IDS)
def test_every_command_that_listens_logs_with_the_logging_flags(path, parser):
    names = flags(parser)
    if "--listen" in names:
        assert {"--log-level", "--log-format"} <= names, path
    assert ("--log-level" in names) == ("--log-format" in names), path


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=IDS)
def test_a_hidden_option_is_an_old_spelling_that_says_what_to_use(path, parser):
    for action in options(parser):
        if visible(action) or not action.option_strings:
            continue
        if isinstance(action, _VerboseAction):  # logs its deprecation (see test_logging)
            continue
        assert isinstance(action, (vocab._DeprecatedAlias, vocab._DeprecatedFlag)), (
            path,
            action.option_strings,
        )
        namespace = argparse.Namespace()
        old = action.option_strings[0]
        action(parser, namespace, None if action.nargs == 0 else "1", old)
        notes = vocab.deprecation_notes(namespace)
        assert len(notes) == 1
        assert notes[0].startswith(f"{path}: {old} is deprecated; use --") or notes[0] == (
            f"{path}: {old} is deprecated; use ADDRESS"
        ), notes


# --- the real command line --------------------------------------------------------------------


def wirekit(*argv: str, preamble: str = "", **kwargs) -> subprocess.CompletedProcess:
    """``wirekit ARGV`` as a process (``preamble``: Python run first, in the same process)."""
    code = f"{preamble}\nimport sys\nfrom wirekit.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=WAIT,
        cwd=kwargs.pop("cwd", ROOT),
        **kwargs,
    )


@pytest.fixture
def config(tmp_path) -> str:
    """A deployment config of one model whose backend nothing serves, its store in tmp."""
    path = tmp_path / "deployment.json"
    doc = deployment(
        tmp_path / "requests.db",
        {"m1": {"timeout": 5}},
        [{"id": "n1", "devices": ["CPU"], "models": ["m1"], "quotas": [1], "ports": [1]}],
    )
    path.write_text(json.dumps(doc))
    return str(path)


BAD_ADDRESSES = [
    ("mip serve", "--handler", "wirekit.mip.runtime:echo", "--listen", "127.0.0.1"),
    ("mip ping", "ftp://127.0.0.1:1"),
    ("mip infer", "tcp://127.0.0.1:port", "--text", "a"),
    ("clipper container", "--handler", "m:f", "--address", "tcp://127.0.0.1"),
    ("clipper frontend", "--listen", "nonsense://x"),
    ("clipper predict", "--model", "m", "--ints", "1", "127.0.0.1:70000"),
    ("y2 client", "--nodes", "1", "--listen", "127.0.0.1"),
    ("y2 service", "--client", "tcp://127.0.0.1:1", "--worker-listen", "localhost"),
    ("record", "--listen", "x:y", "--target", "127.0.0.1:1", "-w", "unused.pcapng"),
    ("serve", "--config", "CONFIG", "--listen", "[::1:8080"),
]


@pytest.mark.parametrize("argv", BAD_ADDRESSES, ids=[a[0] for a in BAD_ADDRESSES])
def test_a_bad_address_is_a_usage_error_in_every_command(argv, config, tmp_path):
    command, *rest = argv
    done = wirekit(*command.split(), *(config if a == "CONFIG" else a for a in rest), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"wirekit {command}: error: argument "), last
    assert "bad address" in last


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


LISTENERS = [
    ("mip serve", "--handler", "wirekit.mip.runtime:echo", "--listen", "127.0.0.1:PORT"),
    ("clipper frontend", "--listen", "127.0.0.1:PORT", "--query", ""),
    ("y2 client", "--nodes", "1", "--listen", "127.0.0.1:PORT"),
    ("y2 service", "--client", "tcp://127.0.0.1:1", "--worker-listen", "127.0.0.1:PORT"),
    ("record", "--listen", "127.0.0.1:PORT", "--target", "127.0.0.1:1", "-w", "out.pcapng"),
    ("serve", "--config", "CONFIG", "--listen", "127.0.0.1:PORT"),
]


@pytest.mark.parametrize("argv", LISTENERS, ids=[a[0] for a in LISTENERS])
def test_a_port_already_taken_fails_the_operation_in_every_command(argv, config, tmp_path):
    """Exit 1 and one line naming the command, in each (y2 client and record said 2)."""
    command, *rest = argv
    with taken_port() as port:
        given = [config if a == "CONFIG" else a.replace("PORT", str(port)) for a in rest]
        done = wirekit(*command.split(), *given, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"wirekit {command}: cannot listen"), done.stderr
    assert "Traceback" not in done.stderr


PG_URL = "postgresql://nobody@127.0.0.1:1/none"
MISSING_EXTRAS = [
    ("aiohttp", "serve: needs the 'serve' extra", ("serve", "--config", "CONFIG")),
    ("psycopg", "serve: a postgresql:// store needs the 'pg' extra",
     ("serve", "--config", "CONFIG", "--store-url", PG_URL)),
    ("psycopg", "serve stats: a postgresql:// store needs the 'pg' extra",
     ("serve", "stats", "--store-url", PG_URL)),
    ("uvloop", "serve: the uvloop event loop needs the 'uvloop' extra",
     ("serve", "--config", "CONFIG", "--loop", "uvloop")),
    ("uvloop", "mip serve: the uvloop event loop needs the 'uvloop' extra",
     ("mip", "serve", "--handler", "wirekit.mip.runtime:echo", "--listen", "127.0.0.1:0",
      "--loop", "uvloop")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("module", "said", "argv"), MISSING_EXTRAS, ids=[m[1] for m in MISSING_EXTRAS]
)
def test_a_missing_extra_is_a_usage_error_in_every_command(module, said, argv, config, tmp_path):
    """As after ``pip install .`` without the extra: exit 2 and one line naming it (the pg
    extra of ``serve`` and ``serve stats`` said 1)."""
    given = [config if a == "CONFIG" else a for a in argv]
    done = wirekit(*given, preamble=f"import sys; sys.modules[{module!r}] = None", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"wirekit {said}"), done.stderr
    assert "pip install 'wirekit[" in done.stderr and "Traceback" not in done.stderr


@contextlib.contextmanager
def running(*argv: str, cwd: Path = ROOT) -> Iterator[subprocess.Popen]:
    """``wirekit ARGV`` running; SIGTERM (then SIGKILL) when the block ends, if still up."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "wirekit", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_y2_client_listens_on_host_port_and_on_the_old_star():
    """``y2 client --listen 127.0.0.1:PORT`` gave ZeroMQ's raw "Invalid argument" (exit 2)."""
    with running("y2", "client", "--nodes", "1", "--listen", "127.0.0.1:0") as proc:
        line = proc.stdout.readline()
        assert re.fullmatch(r"client listening on tcp://127\.0\.0\.1:[1-9]\d*\n", line), (
            line + proc.stderr.read()
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 1  # stopped before every node finished
        assert proc.stderr.read() == ""
    with running("y2", "client", "--nodes", "1", "--listen", "tcp://127.0.0.1:*") as proc:
        line = proc.stdout.readline()
        assert re.fullmatch(r"client listening on tcp://127\.0\.0\.1:[1-9]\d*\n", line), line
        proc.send_signal(signal.SIGTERM)
        proc.wait(WAIT)
        assert proc.stderr.read() == (
            "wirekit y2 client: --listen: port * is deprecated; use 0 for any free port\n"
        )


def test_record_says_a_target_it_cannot_reach_and_stops_after_its_connections(tmp_path):
    """``record --connections 1`` with nothing at --target logged nothing and never stopped:
    now the client counts, the target is named in a WARNING, and the command ends, exit 1."""
    with taken_port() as closed:
        pass  # a port nothing listens on now
    cap = tmp_path / "cap.pcapng"
    argv = ["record", "--listen", "127.0.0.1:0", "--target", f"127.0.0.1:{closed}"]
    with running(*argv, "-w", str(cap), "--connections", "1") as proc:
        line = proc.stdout.readline()
        assert line.startswith("recording 127.0.0.1:"), line + proc.stderr.read()
        port = int(line.split()[1].rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as client:
            assert client.recv(1) == b""  # closed: nothing to forward it to
        assert proc.wait(WAIT) == 1  # it stops by itself
        out, err = proc.stdout.read(), proc.stderr.read()
    assert out == "0 connection(s) recorded\n"
    warning, said = err.splitlines()
    assert " WARNING wirekit.zmtp.record: cannot connect to the target " in warning
    assert f"127.0.0.1:{closed}" in warning
    assert said.startswith("wirekit record: nothing recorded: 1 client(s) came, but the target")


def test_decode_error_flag_before_the_file_filters_that_file(tmp_path):
    """``wirekit decode --error cap`` (README): --error's optional NAME took the file name
    and the command said no FILE was given."""
    cap = tmp_path / "cap.bin"
    bad_version = b"\x01\x01\x00\x00\x00\x00\x00\x00"
    cap.write_bytes((ROOT / "samples/mip-session.bin").read_bytes() + bad_version)
    before = wirekit("decode", "--proto", "mip", "--error", str(cap))
    after = wirekit("decode", "--proto", "mip", str(cap), "--error")
    assert before.returncode == after.returncode == 1, before.stderr
    assert before.stdout == after.stdout and "[Malformed]" in before.stdout
    assert "error SHAPE" in before.stdout  # the sample's error reply
    named = wirekit("decode", "--proto", "mip", "--error=version", str(cap))
    assert "[Malformed]" in named.stdout and "error SHAPE" not in named.stdout


def test_an_old_spelling_works_says_so_once_and_is_not_in_help():
    done = wirekit(
        "decode", "--proto", "mip", "--max-message", "1000000", "samples/mip-session.bin"
    )
    assert done.returncode == 0
    assert done.stderr == "wirekit decode: --max-message is deprecated; use --max-message-size\n"
    new = wirekit("decode", "--proto", "mip", "--max-message-size", "1000000",
                  "samples/mip-session.bin")  # fmt: skip
    assert (new.returncode, new.stdout, new.stderr) == (0, done.stdout, "")
    helped = wirekit("decode", "--help")
    assert re.search(r"--max-message\b(?!-)", helped.stdout) is None
    assert "--max-message-size" in helped.stdout


def test_serve_listen_replaces_the_configs_host_and_http_port(config, tmp_path):
    with taken_port() as port:
        pass  # free now: the dispatcher takes it
    argv = ["serve", "--config", config, "--listen", f"127.0.0.2:{port}", "--log-level", "error"]
    with running(*argv, cwd=tmp_path) as proc:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        ready = json.loads(line)
        assert (ready["host"], ready["http"]) == ("127.0.0.2", port)
        with socket.create_connection(("127.0.0.2", port), timeout=WAIT):
            pass
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 0
