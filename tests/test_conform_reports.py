"""The reports of ``wirekit conform``: every case cites a spec section that exists, the table
explains each failure (what was sent, what was expected and why, what came back, the bytes
labelled) within 100 columns, JUnit fails a CI only on a MUST failure (``--junit-strict``:
on any), and the levels in specs/conformance.md are the suites' own.

The command runs against real processes on loopback (``conform_peers.py``); the report
functions are also fed results built here, to reach the shapes a run rarely gives (a long
anchor, a long answer, many bytes).
"""

from __future__ import annotations

import importlib
import io
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from mip_net import SubprocessServer

from wirekit import cli
from wirekit.conform.core.cases import Case, Failed, Level
from wirekit.conform.core.net import Deadline
from wirekit.conform.core.runner import FAIL, PASS, SKIP, Result
from wirekit.conform.report import render_table, to_junit
from wirekit.conform.report.sections import github_anchor, heading_of, headings
from wirekit.conform.report.table import WIDTH
from wirekit.conform.suites import SUITES

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
CONFORMANCE_DOC = ROOT / "specs" / "conformance.md"


def all_cases() -> list[tuple[str, Case]]:
    found = []
    for (protocol, role), module_name in SUITES.items():
        for case in importlib.import_module(module_name).SUITE.cases:
            found.append((f"{protocol} {role}", case))
    return found


def peer(function: str) -> SubprocessServer:
    return SubprocessServer([sys.executable, str(TESTS / "conform_peers.py"), function])


def conform(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = cli.main(["conform", *argv], out=out, err=err)
    return status, out.getvalue(), err.getvalue()


# --------------------------------------------------------------------------- sections


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Error codes", "error-codes"),
        ("How wirekit validates (both implementations, in this order)",
         "how-wirekit-validates-both-implementations-in-this-order"),
        ("MIP — the Model Invocation Protocol (KubeMo)",
         "mip--the-model-invocation-protocol-kubemo"),
        ("The communication services (`wirekit y2 client`, `wirekit y2 service`)",
         "the-communication-services-wirekit-y2-client-wirekit-y2-service"),
        ("2017 (9f396e0e)", "2017-9f396e0e"),
        ("REST: the binary tensor data extension", "rest-the-binary-tensor-data-extension"),
        ("snake_case and [a link](x.md)", "snake_case-and-a-link"),
    ],
)  # fmt: skip
def test_anchors_follow_githubs_rules(heading, anchor):
    assert github_anchor(heading) == anchor


def test_headings_skip_code_fences_and_number_repeats():
    text = "# Title\n\n## Notes\n\n```sh\n# not a heading\n```\n\n## Notes\n### Notes\n"
    assert list(headings(text)) == ["title", "notes", "notes-1", "notes-2"]


def test_every_case_cites_a_section_that_resolves_to_a_heading():
    cases = all_cases()
    assert len(cases) > 100
    for suite, case in cases:
        path, hash_, anchor = case.section.partition("#")
        assert path.startswith("specs/") and path.endswith(".md"), (suite, case.id)
        assert hash_ and anchor, f"{suite} {case.id}: {case.section} names no section"
        assert heading_of(case.section) is not None, f"{suite} {case.id}: {case.section}"


# --------------------------------------------------------------------------- the table


def _case(section: str = "specs/mip.md#error-codes", level: Level = Level.MUST) -> Case:
    return Case(
        "error.shape",
        section,
        level,
        send="an inference whose item announces 100 data bytes past the end of remaining",
        expect="error SHAPE; a new connection still served",
        body=lambda target, deadline: None,
    )


def test_a_failure_shows_what_was_sent_expected_why_and_got():
    result = Result(_case(), FAIL, "error SHAPE", "an inference response", b"\x00\x02\x01" * 30)
    text = render_table("MIP server at tcp://x: 1 cases", [result])
    lines = text.splitlines()
    at = next(k for k, line in enumerate(lines) if line.startswith("error.shape"))
    details = lines[at + 1 : at + 7]
    assert [line.split(":")[0].strip() for line in details] == [
        "sent", "expected", "waited for", "rests on", "got",
        "bytes received from the target before the verdict (90)",
    ]  # fmt: skip
    assert details[2] == "    waited for: error SHAPE"
    assert details[3].endswith('rests on:   specs/mip.md, section "Error codes"')
    assert "00000000: 00 02 01 00 02 01" in text and "... (90 bytes in all)" in text


def test_the_step_waited_for_is_shown_when_it_is_not_the_cases_expectation():
    result = Result(_case(), FAIL, "the response to msg_id 1011", "nothing within 5 s")
    text = render_table("t", [result])
    assert "    waited for: the response to msg_id 1011" in text
    assert "bytes the target sent" not in text  # nothing received: nothing shown


def test_every_line_fits_100_columns():
    long_section = "specs/y2.md#the-communication-services-wirekit-y2-client-wirekit-y2-service"
    results = [
        Result(_case(long_section, Level.WIREKIT), FAIL, "x " * 80, "HTTP 200 " + "y" * 300),
        Result(_case(long_section, Level.SHOULD), SKIP, got="REST only " * 30),
        Result(_case(), PASS),
    ]
    for _, case in all_cases():
        results.append(Result(case, PASS))
    text = render_table("OIP server at http://127.0.0.1:PORT (model echo): many cases", results)
    too_wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert too_wide == []
    assert "y2.md#the-communication-services" in text  # shortened in the row ...
    assert 'specs/y2.md, section "The communication services' in text  # in the details


def test_the_documented_reports_fit_100_columns():
    text = CONFORMANCE_DOC.read_text(encoding="utf-8")
    blocks = text.split("## Reports of real peers", 1)[1].split("```")[1::2]
    assert blocks
    for block in blocks:
        assert max(len(line) for line in block.splitlines()) <= WIDTH


# --------------------------------------------------------------------------- JUnit

#: the children Jenkins' junit-10.xsd allows a <testcase>
TESTCASE_CHILDREN = {"skipped", "error", "failure", "system-out", "system-err"}


def _junit(results: list[Result], strict: bool = False) -> ET.Element:
    root = ET.fromstring(to_junit("mip", "server", "tcp://x", results, strict=strict))
    suite = root.find("testsuite")
    assert root.tag == "testsuites" and suite is not None
    for case in suite.iter("testcase"):
        assert {child.tag for child in case} <= TESTCASE_CHILDREN
        assert set(case.attrib) <= {"name", "classname", "time", "assertions", "status"}
        assert len(case.findall("failure")) + len(case.findall("skipped")) <= 1
    return suite


def _levelled_results() -> list[Result]:
    return [
        Result(_case(level=Level.MUST), FAIL, "error SHAPE", "no reply within 5 s"),
        Result(_case(level=Level.SHOULD), FAIL, "error MEMORY", "no reply within 5 s"),
        Result(_case(level=Level.MAY), FAIL, "a pipelined answer", "the connection closed"),
        Result(_case(level=Level.WIREKIT), FAIL, "error PROTOCOL", "a pong", b"\x00\x01"),
        Result(_case(level=Level.MUST), SKIP, got="REST only"),
        Result(_case(level=Level.MUST), PASS),
    ]


def test_junit_fails_a_ci_only_on_must_failures():
    suite = _junit(_levelled_results())
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("6", "1", "4")
    cases = suite.findall("testcase")
    assert cases[0].find("failure") is not None and cases[0].find("failure").get("type") == "MUST"
    for case, level in zip(cases[1:4], ("SHOULD", "MAY", "wirekit's choice"), strict=True):
        assert case.find("failure") is None
        skipped = case.find("skipped")
        assert skipped is not None
        assert skipped.get("message").startswith(f"finding ({level} not met): expected ")
        out = case.find("system-out").text
        assert f"level: {level}" in out and "sent: " in out and "rests on: " in out
    assert "bytes received from the target before the verdict (2):" in (
        cases[3].find("system-out").text
    )
    assert cases[4].find("skipped").get("message") == "REST only"
    assert list(cases[5]) == []
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["failing-levels"] == "MUST" and props["findings"] == "3"


def test_junit_strict_fails_on_every_failure():
    suite = _junit(_levelled_results(), strict=True)
    assert (suite.get("failures"), suite.get("skipped")) == ("4", "1")
    types = [f.get("type") for f in suite.iter("failure")]
    assert types == ["MUST", "SHOULD", "MAY", "wirekit's choice"]


def test_the_command_writes_junit_by_level_and_strict(tmp_path):
    plain, strict = tmp_path / "plain.xml", tmp_path / "strict.xml"
    with peer("wrong_error_main") as server:
        argv = ["mip", "server", server.address, "--case", "error.m*"]
        status, out, _ = conform(*argv, "--junit", str(plain))
        status_strict, _, _ = conform(*argv, "--junit", str(strict), "--junit-strict")
    assert status == status_strict == 1  # error.method (MUST) fails: the flag changes no exit
    by_level = ET.parse(plain).getroot().find("testsuite")
    assert by_level is not None
    memory = next(c for c in by_level.iter("testcase") if c.get("name").startswith("error.mem"))
    assert memory.find("failure") is None
    assert memory.find("skipped").get("message").startswith("finding (SHOULD not met)")
    every = ET.parse(strict).getroot().find("testsuite")
    assert every is not None and every.get("failures") == "3"
    assert "    sent:" in out and '    rests on:   specs/mip.md, section "Error codes"' in out


# --------------------------------------------------------------------------- received bytes


def test_a_wait_that_times_out_shows_no_bytes_of_an_earlier_answer():
    from wirekit.clipper import Generation
    from wirekit.conform.suites.clipper_container import ClipperSide

    side = ClipperSide("tcp://127.0.0.1:*", Generation.V3, 1.0)
    try:
        side.received += b"the answer to an earlier request"
        with pytest.raises(Failed) as caught:
            side.recv(Deadline(0.05), "the response to msg_id 1011")
    finally:
        side.close()
    assert caught.value.got == "nothing within 0.05 s"
    assert caught.value.received == b""


# --------------------------------------------------------------------------- levels


def documented_levels(title: str) -> dict[str, str]:
    """id -> level of the case table under ``title`` in conformance.md (rows with a level
    column: ``| ids | level | ...``)."""
    text = CONFORMANCE_DOC.read_text(encoding="utf-8")
    section = text.split(f"\n{title}\n", 1)[1].split("\n## ", 1)[0]
    levels = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[1] not in {lvl.value for lvl in Level}:
            continue
        for case_id in re.findall(r"`([a-z0-9.\-]+)`", cells[0]):
            levels[case_id] = cells[1]
    assert levels, title
    return levels


@pytest.mark.parametrize(
    ("title", "module"),
    [
        ("## MIP server cases", "wirekit.conform.suites.mip_server"),
        ("## MIP client cases", "wirekit.conform.suites.mip_client"),
        ("## Clipper container cases", "wirekit.conform.suites.clipper_container"),
        ("## Clipper frontend cases", "wirekit.conform.suites.clipper_frontend"),
        ("## y2 service cases", "wirekit.conform.suites.y2_service"),
    ],
)
def test_the_documented_levels_are_the_suites(title, module):
    levels = {c.id: c.level.value for c in importlib.import_module(module).SUITE.cases}
    documented = documented_levels(title)
    assert {k: levels.get(k) for k in documented} == documented


def test_kubemos_shape_cases_are_not_must():
    # KubeMo's protocol text says only that `remaining` is the payload's size; its SHAPE
    # error is its check of the model's outputs: answering SHAPE for a payload that
    # disagrees with its header is wirekit's error table.
    suite = importlib.import_module("wirekit.conform.suites.mip_server").SUITE
    levels = {c.id: c.level for c in suite.cases}
    assert levels["error.shape"] is levels["error.shape-trailing"] is Level.WIREKIT
