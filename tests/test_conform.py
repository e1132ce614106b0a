"""``wirekit conform``: wirekit's own implementations pass every case, real peers fail the
cases of their known deviations (and pass the rest), broken targets fail the right cases.

Every target is a real process on loopback: ``wirekit mip serve`` (both twins), KubeMo's
server from PyPI, and small broken servers (``conform_peers.py``).  The reports of the real
peers are checked against the tables in ``specs/conformance.md``.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from mip_net import CliServer, SubprocessServer

from wirekit import cli
from wirekit.conform.suites import SUITES

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
CONFORMANCE_DOC = ROOT / "specs" / "conformance.md"


def conform(*argv: str) -> tuple[int, str, str]:
    """``wirekit conform ARGV`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    status = cli.main(["conform", *argv], out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def conform_json(*argv: str) -> tuple[int, dict]:
    status, out, err = conform(*argv, "--json")
    assert status in (0, 1), err
    return status, json.loads(out)


def statuses(doc: dict) -> dict[str, str]:
    return {case["id"]: case["status"] for case in doc["cases"]}


def peer(function: str) -> SubprocessServer:
    """``conform_peers.<function>()`` in a subprocess."""
    return SubprocessServer([sys.executable, str(TESTS / "conform_peers.py"), function])


@pytest.fixture(params=["fast", "pure"])
def twin(request, monkeypatch):
    """The servers started by the test run the compiled twins, or the pure ones."""
    if request.param == "pure":
        monkeypatch.setenv("WIREKIT_PURE", "1")
    else:
        monkeypatch.delenv("WIREKIT_PURE", raising=False)
    return request.param


def documented(title: str) -> dict[str, str]:
    """The case -> result column of the table under heading ``title`` in conformance.md."""
    text = CONFORMANCE_DOC.read_text(encoding="utf-8")
    section = text.split(f"\n{title}\n", 1)[1]
    table = section.split("```", 2)[1]
    rows = {}
    for line in table.splitlines():
        cells = line.split()
        if len(cells) >= 4 and cells[-1] in ("PASS", "FAIL", "SKIP"):
            rows[cells[0]] = cells[-1].lower()
    assert rows, f"no table under {title!r}"
    return rows


# --------------------------------------------------------------------------- MIP server


def test_wirekit_mip_server_passes_every_case(twin):
    with CliServer(
        "--listen", "tcp://127.0.0.1:0", handler="wirekit.conform.models:mip_model"
    ) as server:
        status, doc = conform_json("mip", "server", server.address)
    failed = {c["id"]: c["got"] for c in doc["cases"] if c["status"] != "pass"}
    assert failed == {}
    assert status == 0 and doc["summary"]["must_failed"] == 0
    assert len(doc["cases"]) >= 25


KUBEMO_DEVIATIONS = {
    "infer.other-type": "error INTERNAL",  # KeyError on a type it has no class for
    "batch.empty": "error INTERNAL",  # IndexError: batch_input[0] of an empty batch
    "shape.n-output": "a malformed reply",  # n_output = the number of inputs
    "shape.n-output-batch": "error SHAPE",  # ... checked against the outputs: BatchShapeError
    "error.memory": "no reply within",  # reads the announced payload, never answers
    "error.shape": "no reply within",  # reads the item's announced data, never answers
    "error.shape-trailing": "an inference response",  # ignores the bytes after the items
    "reserved.request": "a pong",  # ignores the reserved byte
    "stream.one-write": "the connection closed",  # one message per connection
    "stream.pipelining": "the connection closed",
    "connection.reuse": "the connection closed",
    "connection.concurrent": "no reply within",  # one connection at a time (backlog 1)
}


def test_kubemo_server_fails_its_known_deviations_and_passes_the_rest():
    # KubeMo builds its response by repeated bytes concatenation (quadratic): a batch of
    # 4096 keeps batch.max quick; the short timeout bounds the cases it never answers.
    with peer("kubemo_conform_main") as server:
        status, doc = conform_json(
            "mip", "server", server.address, "--max-batch", "4096", "--timeout", "1.5"
        )
    got = {c["id"]: c.get("got", "") for c in doc["cases"]}
    failed = {c["id"] for c in doc["cases"] if c["status"] == "fail"}
    assert failed == set(KUBEMO_DEVIATIONS)
    for case_id, start in KUBEMO_DEVIATIONS.items():
        assert got[case_id].startswith(start), (case_id, got[case_id])
    assert status == 1  # three MUST cases fail
    assert statuses(doc) == documented("### KubeMo's server")


def test_a_server_with_a_bad_version_fails_every_exchange_and_shows_the_bytes():
    with peer("bad_version_main") as server:
        status, out, _ = conform("mip", "server", server.address, "--case", "ping")
    assert status == 1
    assert "ping" in out and "FAIL" in out
    assert "got:      a malformed reply: mip: version at byte 0" in out
    assert "00000000: 01 01 01 00 00 00 00 00" in out  # the hex excerpt of what came


def test_a_server_answering_the_wrong_error_fails_the_error_cases_only():
    with peer("wrong_error_main") as server:
        status, doc = conform_json(
            "mip", "server", server.address, "--case", "error", "--case", "ping"
        )
    result = statuses(doc)
    assert result["ping"] == result["error.internal"] == "pass"
    wrong = {k for k, v in result.items() if v == "fail"}
    assert wrong == set(result) - {"ping", "error.internal"}
    by_id = {c["id"]: c for c in doc["cases"]}
    assert by_id["error.method"]["expected"] == "error METHOD"
    assert by_id["error.method"]["got"] == "error INTERNAL"
    assert by_id["error.method"]["received_hex"] == "0000050000000000"
    assert status == 1


def test_a_server_answering_samples_out_of_order_fails_the_batch_cases():
    with peer("swapped_samples_main") as server:
        _, doc = conform_json(
            "mip", "server", server.address, "--case", "batch.*", "--case", "infer.*"
        )
    result = statuses(doc)
    assert result["batch.many"] == "fail" and result["batch.max"] == "fail"
    assert result["batch.one"] == result["infer.text"] == "pass"


# --------------------------------------------------------------------------- the command


def test_the_command_line_exit_status_and_junit(tmp_path):
    junit = tmp_path / "report.xml"
    with peer("wrong_error_main") as server:
        argv = ["conform", "mip", "server", server.address, "--case", "error.m*"]
        proc = subprocess.run(
            [sys.executable, "-m", "wirekit.cli", *argv, "--junit", str(junit)],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr
        assert "error.method" in proc.stdout and "error.memory" in proc.stdout
        suite = ET.parse(junit).getroot().find("testsuite")
        assert suite is not None
        assert (suite.get("tests"), suite.get("failures")) == ("3", "3")
        names = [tc.get("name") for tc in suite.iter("testcase")]
        assert names[0] == "error.method [MUST] specs/mip.md#error-codes"
        failure = suite.find("testcase/failure")
        assert failure is not None and failure.get("type") == "MUST"
        assert "got: error INTERNAL" in (failure.text or "")
        # Only SHOULD cases failing: exit 0.
        proc = subprocess.run(
            [sys.executable, "-m", "wirekit.cli", "conform", "mip", "server", server.address,
             "--case", "error.memory"],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert proc.returncode == 0 and "FAIL" in proc.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["mip", "server"], "give the server's address"),
        (["mip", "server", "http://x:1"], "mip server:"),
        (["mip", "server", "tcp://127.0.0.1:1", "--case", "nothing.like.this"], "no case"),
        (["mip", "server", "tcp://127.0.0.1:1", "--max-batch", "0"], "--max-batch"),
        (["mip", "server", "tcp://127.0.0.1:1", "--timeout", "0"], "--timeout"),
    ],
)
def test_usage_errors_exit_2(argv, message):
    status, _, err = conform(*argv)
    assert status == 2
    assert message in err


def test_an_unreachable_server_fails_the_cases():
    status, doc = conform_json("mip", "server", "tcp://127.0.0.1:1", "--case", "ping")
    assert status == 1
    assert doc["cases"][0]["got"].startswith("connect failed")


def test_case_selection_and_list():
    status, out, _ = conform("mip", "server", "--list", "--case", "error", "--case", "ping")
    ids = [line.split("\t")[0] for line in out.splitlines()]
    assert status == 0
    assert ids[0] == "ping" and all(i == "ping" or i.startswith("error.") for i in ids)
    assert "error.shape" in ids and "error.shape-trailing" in ids


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_case_cites_an_existing_spec_section():
    import importlib

    for module_name in SUITES.values():
        suite = importlib.import_module(module_name).SUITE
        assert suite.cases
        for case in suite.cases:
            path, _, anchor = case.section.partition("#")
            spec = ROOT / path
            assert spec.is_file(), case
            if anchor:
                headings = [
                    _slug(line.lstrip("#")) for line in spec.read_text().splitlines()
                    if line.startswith("#")
                ]  # fmt: skip
                assert anchor in headings, (case.id, anchor)
