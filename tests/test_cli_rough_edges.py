"""The command line's rough edges of issue 41, item 5, on the real command line
(``python -m wirekit ...`` against a real ``wirekit serve`` on loopback):

* ``serve models --url`` takes ``HOST:PORT`` as every address of the vocabulary does;
* with no ``--url`` the dispatcher is found from ``--config`` (its listen address and
  admin token settings) or, when exactly one runs here, from its token file; several, or
  none, is a usage error naming them or where it looked;
* every ``serve models`` command prints what was done, and ``--json`` the admin API's answer;
* ``serve stats --config`` reads the config's store;
* ``wirekit serve --help`` shows the dispatcher's own usage beside the subcommands';
* the address flags of the vocabulary: a command binds with ``--listen`` (one flag per
  socket), and the three flags naming a peer are the listed exceptions.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from serve_support import ROOT, TIMEOUT, DispatcherProcess, deployment

from wirekit import _vocabulary as vocab
from wirekit.cli import build_parser

#: nothing listens there: the model's backend is never called here
NO_BACKEND = 9


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]


def one_model(directory: Path, http_port: int) -> dict:
    """Model m1 on half of n1's CPU, HTTP on ``http_port``, no admin token configured."""
    node = {"id": "n1", "devices": ["CPU"], "models": ["m1"], "quotas": [0.5],
            "ports": [NO_BACKEND]}  # fmt: skip
    doc = deployment(directory / "requests.db", {"m1": {"timeout": 5}}, [node])
    doc["listen"]["http_port"] = http_port
    return doc


@pytest.fixture
def private_env(tmp_path) -> dict[str, str]:
    """A user of this test's own: its runtime directory and home, where token files go."""
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    home = tmp_path / "home"
    home.mkdir()
    return {"XDG_RUNTIME_DIR": str(runtime), "HOME": str(home)}


def wirekit(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m wirekit ARGV`` (the environment: this one's without the admin variables,
    and ``env``)."""
    environ = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    for name in ("WIREKIT_ADMIN_TOKEN", "WIREKIT_ADMIN_TOKEN_FILE", "WIREKIT_ADMIN_URL"):
        if name not in (env or {}):
            environ.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "wirekit", *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 3,
        env=environ,
    )


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_models_commands_take_host_port_and_find_the_dispatcher(tmp_path, private_env):
    port = free_port()
    one = tmp_path / "one"
    one.mkdir()
    with DispatcherProcess.of(one_model(one, port), one, env=private_env) as proc:
        config = str(proc.config)
        table = ok(wirekit("serve", "models", "list", "--url", proc.http, env=private_env))
        assert table.startswith("m1: mip, MIP port ") and "devices:" in table
        # HOST:PORT, tcp://HOST:PORT, the environment variable, the config: the same dispatcher
        for given in ([f"127.0.0.1:{port}"], [f"tcp://localhost:{port}"], ["--config", config]):
            argv = ["--url", *given] if len(given) == 1 else given
            done = wirekit("serve", "models", "list", *argv, env=private_env)
            assert (done.returncode, done.stdout, done.stderr) == (0, table, ""), argv
        env = {**private_env, "WIREKIT_ADMIN_URL": f"127.0.0.1:{port}"}
        assert ok(wirekit("serve", "models", "list", env=env)) == table
        done = wirekit("serve", "--config", config, "models", "list", env=private_env)
        assert (done.stdout, done.stderr) == (table, "")
        # nothing given: the one dispatcher running here, named on standard error
        done = wirekit("serve", "models", "list", env=private_env)
        assert done.stdout == table
        token_file = (
            Path(private_env["XDG_RUNTIME_DIR"]) / "wirekit" / f"serve-127.0.0.1-{port}.token"
        )
        assert done.stderr == (
            f"wirekit serve models list: the dispatcher at http://127.0.0.1:{port}"
            f" (token file {token_file})\n"
        )

        # what each command did, in words; --json: the admin API's answer, as before
        url = ["--url", f"127.0.0.1:{port}"]
        added = ok(wirekit("serve", "models", "add", "--name", "m2", "--place",
                           f"n1:0:0.25:{NO_BACKEND}", *url, env=private_env))  # fmt: skip
        assert re.fullmatch(
            rf"added m2: mip, MIP port \d+\n  n1/0    CPU quota 0.25   127.0.0.1:{NO_BACKEND}\n",
            added,
        ), added
        done = ok(wirekit("serve", "models", "set", "m2", "--attempts", "2", "--target", "0.5",
                          *url, env=private_env))  # fmt: skip
        assert done == "m2: timeout 5 s, attempts 2, max_batch 1, target 0.5 s\n"
        done = ok(wirekit("serve", "models", "set", "m2", "--no-target", "--json", *url,
                          env=private_env))  # fmt: skip
        changed = json.loads(done)
        assert changed["model"] == "m2" and changed["target"] is None
        done = ok(wirekit("serve", "models", "quota", "m2", "n1:0", "0.5", *url, env=private_env))
        assert done == "m2 on n1/0 (CPU): quota 0.25 -> 0.5 (applied)\n"
        done = ok(wirekit("serve", "models", "quota", "m2", "n1:0", "0.25", "--json", *url,
                          env=private_env))  # fmt: skip
        assert json.loads(done)["after"] == 0.25
        done = ok(wirekit("serve", "models", "remove", "m2", *url, env=private_env))
        assert done == "removed m2: its requests in flight answered\n"
        done = ok(wirekit("serve", "models", "add", "--json", "--name", "m3", "--place",
                          f"n1:0:0.25:{NO_BACKEND}", *url, env=private_env))  # fmt: skip
        assert json.loads(done)["added"]["rows"][0]["quota"] == 0.25
        done = ok(wirekit("serve", "models", "remove", "m3", "--json", *url, env=private_env))
        assert json.loads(done)["removed"] == "m3"

        # a second dispatcher here: which one is not guessed
        two = tmp_path / "two"
        two.mkdir()
        second = free_port()
        with DispatcherProcess.of(one_model(two, second), two, env=private_env):
            done = wirekit("serve", "models", "list", env=private_env)
            assert (done.returncode, done.stdout) == (2, ""), done.stderr
            assert done.stderr.startswith("wirekit serve models list: 2 dispatchers run here: ")
            assert f"http://127.0.0.1:{port} " in done.stderr
            assert f"http://127.0.0.1:{second} " in done.stderr
            assert done.stderr.endswith(
                "; give the dispatcher's --url (or WIREKIT_ADMIN_URL) or its --config\n"
            )
            done = wirekit("serve", "models", "list", "--config", str(two / "deployment.json"),
                           env=private_env)  # fmt: skip
            assert ok(done).startswith("m1: mip")


def test_no_dispatcher_found_is_a_usage_error_saying_where_it_looked(tmp_path, private_env):
    runtime = Path(private_env["XDG_RUNTIME_DIR"]) / "wirekit"
    home = Path(private_env["HOME"]) / ".local/share/wirekit/runtime"
    done = wirekit("serve", "models", "remove", "m1", env=private_env)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "wirekit serve models remove: give the dispatcher's --url (or WIREKIT_ADMIN_URL) or its"
        f" --config: no dispatcher's token file in {runtime} and {home}\n"
    )
    # the file a dispatcher killed left behind: nothing answers there
    runtime.mkdir(mode=0o700)
    (runtime / f"serve-127.0.0.1-{free_port()}.token").write_text("stale\n")
    done = wirekit("serve", "models", "list", env=private_env)
    assert done.returncode == 2
    assert done.stderr.endswith(f"none of the token files in {runtime} and {home} is a running"
                                " dispatcher's\n")  # fmt: skip
    # a config whose HTTP port is "any free port" cannot say where the dispatcher is
    config = tmp_path / "deployment.json"
    config.write_text(json.dumps(one_model(tmp_path, 0)))
    done = wirekit("serve", "models", "list", "--config", str(config), env=private_env)
    assert (done.returncode, done.stderr) == (
        2,
        f"wirekit serve models list: {config}: listen.http_port: HTTP port 0 (any free port);"
        " give the dispatcher's --url (the http port of its ready line)\n",
    )
    done = wirekit("serve", "models", "list", "--url", "127.0.0.1", env=private_env)
    assert done.returncode == 2
    assert done.stderr == (
        "wirekit serve models list: --url must start with http:// or https:// (or be"
        " HOST:PORT), got '127.0.0.1'\n"
    )


def test_serve_stats_reads_the_store_of_the_config(tmp_path, private_env):
    port = free_port()
    with DispatcherProcess.of(one_model(tmp_path, port), tmp_path, env=private_env) as proc:
        config = str(proc.config)
    by_file = ok(wirekit("serve", "stats", "--store", str(tmp_path / "requests.db")))
    assert ok(wirekit("serve", "stats", "--config", config)) == by_file
    assert ok(wirekit("serve", "--config", config, "stats")) == by_file
    as_json = ok(wirekit("serve", "stats", "--config", config, "--json"))
    assert isinstance(json.loads(as_json), dict)
    done = wirekit("serve", "stats")
    assert (done.returncode, done.stderr) == (
        2,
        "wirekit serve stats: give --store FILE, --store-url URL or --config FILE\n",
    )
    done = wirekit("serve", "stats", "--config", str(tmp_path / "missing.json"))
    assert done.returncode == 2 and "cannot read" in done.stderr


def test_serve_usage_shows_the_dispatcher_and_the_subcommands():
    usage = ok(wirekit("serve", "--help")).split("\n\n", 1)[0]
    assert usage == (
        "usage: wirekit serve --config FILE [--listen ADDRESS] [--with-backends] [OPTION ...]\n"
        "       wirekit serve {stats,check,models,k8s} ..."
    )
    # the subcommands' own usage lines are theirs, not the parent's usage
    stats = ok(wirekit("serve", "stats", "--help"))
    assert stats.startswith("usage: wirekit serve stats [-h]")
    done = wirekit("serve", "models", "list", "--timeout", "x")
    assert done.stderr.splitlines()[-1] == (
        "wirekit serve models list: error: argument --timeout: invalid float value: 'x'"
    )


#: the flags of an address a command binds: one per socket (``--query``: Clipper's query
#: door; ``--inbox``: where y2 takes the other nodes' Deltas; ``--advertise``: the inbox's
#: address as the others reach it)
BINDS = {"--listen", "--worker-listen", "--query", "--inbox", "--advertise"}


def test_an_address_flag_binds_or_is_a_listed_exception():
    """The vocabulary: where a command calls a server the address is an argument; the flags
    that name a peer anyway are listed (``_vocabulary.PEER_FLAGS``, README's table)."""
    peers: dict[str, str] = {}

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif (
                action.type in vocab.ADDRESS_TYPES
                and action.option_strings
                and action.help is not argparse.SUPPRESS
                and not set(action.option_strings) & BINDS
            ):
                peers[path] = action.option_strings[0]

    walk(build_parser(), "wirekit")
    assert peers == {path: flag for path, (flag, _why) in vocab.PEER_FLAGS.items()}


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("tcp://localhost:80", "http://localhost:80"),
        ("[::1]:8080", "http://[::1]:8080"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/"),
        ("https://dispatcher.lan", "https://dispatcher.lan"),
    ],
)
def test_an_http_url_or_host_port(text, url):
    assert vocab.parse_http_url(text) == url


@pytest.mark.parametrize("text", ["127.0.0.1", "ftp://x:1", "http://", "http://h:99999", "h:x"])
def test_not_an_http_url(text):
    with pytest.raises(ValueError):
        vocab.parse_http_url(text)


def test_relative_paths_of_the_config_are_the_config_files_directory(tmp_path, private_env):
    """``store.path`` and ``admin.token_file`` relative: beside the config file, as its
    handler modules are, whatever the working directory (issue 41: the store went to the
    working directory)."""
    here = tmp_path / "config"
    here.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    port = free_port()
    doc = one_model(here, port)
    doc["store"]["path"] = "requests.db"
    doc["admin"] = {"token_file": "secret/admin.token"}
    config = here / "deployment.json"
    config.write_text(json.dumps(doc))
    proc = DispatcherProcess(config, env=private_env)
    proc.cwd = elsewhere  # not the config's directory
    with proc:
        assert proc.addresses["admin_token_file"] == str(here / "secret" / "admin.token")
        # the token found from the config's admin.token_file, the address from its listen
        done = wirekit("serve", "models", "list", "--config", str(config), env=private_env)
        assert ok(done).startswith("m1: mip")
        assert proc.stop() == 0
    assert (here / "requests.db").is_file()
    assert not (elsewhere / "requests.db").exists()
    assert ok(wirekit("serve", "stats", "--config", str(config))) == ok(
        wirekit("serve", "stats", "--store", str(here / "requests.db"))
    )

    # a store left in the working directory by an earlier version is not left behind
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "deployment.json").write_text(json.dumps(doc))
    done = subprocess.run(
        [sys.executable, "-m", "wirekit", "serve", "check", "--config", "../moved/deployment.json"],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=here,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr == (
        "wirekit serve check: ../moved/deployment.json: store.path: a relative path is taken"
        " from the config file's directory: ../moved/requests.db; the store is at"
        f" {here / 'requests.db'}, where earlier versions put it (the working directory): move"
        " it (and its .journal.* files) there, or give store.path as an absolute path\n"
    )
