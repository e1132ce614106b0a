"""``wirekit conform oip server``: wirekit's own OIP doors (a real ``wirekit serve`` process in
front of a ``wirekit mip serve`` echo backend) pass every case the suite can run against
them, over REST and gRPC, through the real command line (``python -m wirekit conform``).

The reports of real MLServer and KServe processes are in ``test_conform_oip_peers.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from serve_support import BackendProcess, DispatcherProcess, deployment

from wirekit import cli
from wirekit.conform.suites import oip_server

#: cases that cannot run against wirekit's door, and why (the suite's own skip reasons)
DOOR_SKIPS = {
    # wirekit serve has no repository extension on its front door
    "repository.index": "the server does not offer the repository extension",
    "repository.load-unknown": "the server does not offer the repository extension",
    "repository.unload-load": "give --unload",
}
GRPC_SKIPS = {
    "error.malformed-json": "REST only",
    "binary.request": "REST only",
    "binary.output": "REST only",
    "binary.output-per-output": "REST only",
    "repository.index": "REST only",
    "repository.load-unknown": "REST only",
    "repository.unload-load": "REST only",
}


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``wirekit serve`` with its OIP REST and gRPC doors: ``echo`` (no declared tensors: any
    datatype and shape) and ``typed`` (FP32 [-1, 4], as samples/oip-deployment.json)."""
    directory = tmp_path_factory.mktemp("conform-oip")
    typed = [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    models = {
        "echo": {"timeout": 10},
        "typed": {"timeout": 10, "platform": "wirekit-echo", "inputs": typed, "outputs": typed},
    }
    with BackendProcess("wirekit.mip.runtime:echo") as backend:
        nodes = [
            {"id": "n1", "devices": ["CPU"], "models": list(models), "quotas": [0.5, 0.5],
             "ports": [backend.port, backend.port]}
        ]  # fmt: skip
        doc = deployment(directory / "requests.db", models, nodes)
        doc["listen"]["grpc_port"] = 0
        with DispatcherProcess.of(doc, directory) as process:
            yield process.addresses


def run_cli(*argv: str) -> tuple[int, dict[str, Any]]:
    """``python -m wirekit conform oip server ARGV --json`` in a subprocess (bounded)."""
    done = subprocess.run(
        [sys.executable, "-m", "wirekit", "conform", "oip", "server", *argv, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def outcomes(doc: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """case id -> (status, its reason or what came instead)."""
    return {c["id"]: (c["status"], c.get("reason") or c.get("got", "")) for c in doc["cases"]}


def check_passes_all_but(doc: dict[str, Any], skips: dict[str, str]) -> None:
    got = outcomes(doc)
    assert set(got) == {case.id for case in oip_server.SUITE.cases}
    not_passed = {case_id: out for case_id, out in got.items() if out[0] != "pass"}
    assert set(not_passed) == set(skips), not_passed
    for case_id, start in skips.items():
        status, reason = not_passed[case_id]
        assert status == "skip" and start in reason, (case_id, reason)


def test_the_rest_door_passes_every_case(door):
    status, doc = run_cli(f"http://127.0.0.1:{door['http']}", "--model", "echo")
    assert status == 0 and doc["summary"]["must_failed"] == 0
    check_passes_all_but(doc, DOOR_SKIPS)
    assert doc["target"] == f"http://127.0.0.1:{door['http']} (model echo)"


def test_the_grpc_door_passes_every_case(door):
    status, doc = run_cli(f"127.0.0.1:{door['grpc']}", "--grpc", "--model", "echo")
    assert status == 0 and doc["summary"]["must_failed"] == 0
    check_passes_all_but(doc, GRPC_SKIPS)


def test_a_model_with_declared_inputs_passes_every_must(door):
    status, doc = run_cli(f"http://127.0.0.1:{door['http']}", "--model", "typed")
    assert status == 0
    got = outcomes(doc)
    assert {k for k, (s, _) in got.items() if s == "fail"} == set()
    # what it does not take is skipped, saying what the server answered
    assert got["infer.datatype.INT32"] == ("skip", "the model's input 'x' is declared FP32")
    assert got["infer.shape.vector"][1].startswith("the server does not take shape [6]: HTTP 400")


def test_the_first_ready_model_of_those_asked_for_is_used(door):
    argv = ["--model", "nosuch", "--model", "typed", "--case", "ready.model"]
    status, doc = run_cli(f"http://127.0.0.1:{door['http']}", *argv)
    assert status == 0 and doc["target"].endswith("(model typed)")
    assert outcomes(doc) == {"ready.model": ("pass", "")}


def test_without_a_model_and_without_a_repository_index_the_model_cases_say_so(door):
    status, doc = run_cli(f"http://127.0.0.1:{door['http']}", "--case", "infer.basic")
    assert status == 0
    assert outcomes(doc)["infer.basic"] == (
        "skip",
        "no model to test: give --model NAME (the server has no repository index)",
    )


def test_a_server_that_is_not_there_is_one_error_and_exit_1():
    status, doc = run_cli(
        "127.0.0.1:1", "--model", "echo", "--case", "health", "--case-timeout", "2"
    )
    assert status == 1
    assert doc == {
        "error": "nothing takes a connection at http://127.0.0.1:1 (Connection refused): "
        "no case was run",
        "exit_status": 1,
    }


def test_usage_errors(capsys):
    assert cli.main(["conform", "oip", "server", "nothing"]) == 2
    assert "expected http://HOST:PORT or HOST:PORT" in capsys.readouterr().err
    assert cli.main(["conform", "oip", "server"]) == 2
    assert "oip server: give the server's address" in capsys.readouterr().err
    assert cli.main(["conform", "oip", "server", "h:1", "--load-timeout", "0"]) == 2


def test_the_list_names_every_case_with_its_level(capsys):
    assert cli.main(["conform", "oip", "server", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    levels = {line.split("\t")[0]: line.split("\t")[1] for line in lines}
    assert levels["error.malformed-json"] == "MUST"
    assert levels["error.shape-refused"] == "SHOULD"
    assert levels["binary.output"] == "MAY"
    assert levels["repository.unload-load"] == "MAY"
    assert len(levels) == len(oip_server.SUITE.cases)


def test_the_target_types():
    assert oip_server.server_address("http://127.0.0.1:8080/") == ("127.0.0.1", 8080)
    assert oip_server.server_address("[::1]:9") == ("::1", 9)
    assert oip_server.server_address("tcp://h:1") == ("h", 1)
