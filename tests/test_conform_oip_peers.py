"""``wirekit conform oip server`` against real MLServer 1.7.1 and KServe 0.21.0 processes
(installed from PyPI into their own virtualenvs, ``peer_venvs.py``), each serving the echo
model of ``tests/oip_models/``, over REST and gRPC.

Every deviation the suite reports is a known one, checked here by case and by the start of
what the server answered (so a new version that changes is noticed), and the statuses equal
the tables of ``specs/conformance.md`` ("OIP servers").  KServe runs in a network namespace
of its own (it binds 0.0.0.0); the suite reaches it through a relay on this namespace's
loopback (``Server.local_port``).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from oip_fixtures import kserve, mlserver  # noqa: F401 - the fixtures
from oip_servers import Server

from wirekit import cli

pytestmark = pytest.mark.skipif(
    os.environ.get("WIREKIT_PURE") == "1",
    reason="conform oip against real model servers' processes: the suite has no compiled "
    "twin (the pure run has the same code)",
)

CONFORMANCE_DOC = Path(__file__).resolve().parent.parent / "specs" / "conformance.md"

#: case -> the start of what the server answered, for every case that fails
DEVIATIONS: dict[tuple[str, str], dict[str, str]] = {
    ("mlserver", "rest"): {
        "infer.outputs.only-requested": "['input0', 'conform_second']",
        "error.datatype": 'HTTP 422 {"detail":[{"type":"enum"',
        "error.shape-refused": "HTTP 200 ",
        "error.malformed-json": 'HTTP 422 {"detail":[{"type":"json_invalid"',
    },
    ("mlserver", "grpc"): {
        "infer.outputs.only-requested": "['input0', 'conform_second']",
    },
    ("kserve", "rest"): {
        "infer.outputs.only-requested": "['input0', 'conform_second']",
        "error.malformed-json": 'HTTP 422 {"detail":[{"type":"json_invalid"',
    },
    ("kserve", "grpc"): {
        "infer.outputs.only-requested": "['input0', 'conform_second']",
    },
}


def conform(server: Server, protocol: str) -> tuple[int, dict[str, Any]]:
    """The suite's JSON report on ``server`` over ``protocol`` (model ``echo``, --unload)."""
    argv = ["conform", "oip", "server", server.address("grpc" if protocol == "grpc" else "http")]
    argv += ["--model", "echo", "--unload"]
    if protocol == "grpc":
        argv.append("--grpc")
    argv.append("--json")
    out, err = io.StringIO(), io.StringIO()
    status = cli.main(argv, out=out, err=err)
    doc = json.loads(out.getvalue())
    dump = os.environ.get("WIREKIT_CONFORM_OIP_DUMP")
    if dump:  # the reports, for specs/conformance.md
        Path(dump, f"{server.who}-{protocol}.json").write_text(json.dumps(doc, indent=2))
        table = io.StringIO()
        cli.main(argv[:-1], out=table, err=io.StringIO())
        Path(dump, f"{server.who}-{protocol}.txt").write_text(table.getvalue())
    return status, doc


def documented(title: str) -> dict[str, str]:
    """case -> status of the table under the heading ``title`` in conformance.md."""
    text = CONFORMANCE_DOC.read_text(encoding="utf-8")
    table = text.split(f"\n{title}\n", 1)[1].split("```")[1]
    rows = {}
    for line in table.splitlines():
        cells = line.split()
        if len(cells) >= 4 and cells[-1] in ("PASS", "FAIL", "SKIP"):
            rows[cells[0]] = cells[-1].lower()
    assert rows, f"no table under {title!r}"
    return rows


def check(server: Server, who: str, protocol: str, title: str) -> None:
    status, doc = conform(server, protocol)
    got = {c["id"]: c.get("got", "") for c in doc["cases"] if c["status"] == "fail"}
    known = DEVIATIONS[(who, protocol)]
    assert set(got) == set(known), got
    for case_id, start in known.items():
        assert got[case_id].startswith(start), (case_id, got[case_id])
    must = any(c["level"] == "MUST" for c in doc["cases"] if c["id"] in got)
    assert status == (1 if must else 0)
    assert {c["id"]: c["status"] for c in doc["cases"]} == documented(title)


def test_mlserver_grpc_deviations_are_the_known_ones(mlserver):  # noqa: F811
    check(mlserver, "mlserver", "grpc", "#### MLServer 1.7.1, gRPC")


def test_mlserver_rest_deviations_are_the_known_ones(mlserver):  # noqa: F811
    check(mlserver, "mlserver", "rest", "#### MLServer 1.7.1, REST")


def test_kserve_grpc_deviations_are_the_known_ones(kserve):  # noqa: F811
    check(kserve, "kserve", "grpc", "#### KServe 0.21.0, gRPC")


def test_kserve_rest_deviations_are_the_known_ones(kserve):  # noqa: F811
    check(kserve, "kserve", "rest", "#### KServe 0.21.0, REST")


def test_without_model_the_first_ready_model_of_the_repository_index_is_used(mlserver):  # noqa: F811
    out = io.StringIO()
    argv = ["conform", "oip", "server", mlserver.address("http"), "--case", "ready.model"]
    assert cli.main([*argv, "--json"], out=out, err=io.StringIO()) == 0
    doc = json.loads(out.getvalue())
    assert doc["target"].rsplit(" ", 1)[-1] in ("echo)", "iris)")  # ready; "broken" is not
    assert [c["status"] for c in doc["cases"]] == ["pass"]
