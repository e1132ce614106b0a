"""The ``--junit FILE`` report: JUnit XML, so the CI of the implementation under test shows
one test per case.

A CI marks a build failed on a ``<failure>`` (or ``<error>``) and not on a ``<skipped>``:
Jenkins' JUnit plugin, GitLab's test reports and GitHub's JUnit actions all read them so.
The report therefore fails a CI exactly when ``wirekit conform`` exits 1: a failed MUST case
is a ``<failure>``; a failed SHOULD, MAY or "wirekit's choice" case is a *finding*, a
``<skipped>`` whose message starts with ``finding (LEVEL not met)``, its details in
``<system-out>``; a skipped case a ``<skipped>`` with the reason.  ``strict`` (the
``--junit-strict`` flag) makes every failed case a ``<failure>``.  Only elements and
attributes of Jenkins' junit-10.xsd are used (``testcase`` holds ``skipped``, ``failure``
and ``system-out``; the level is in the test's name and the failure's ``type``)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from ..core.runner import FAIL, SKIP, Result
from .table import failure_lines, hex_lines, received_label

#: the start of a ``<skipped>`` message that carries a non-MUST failure
FINDING = "finding"


def finding_message(result: Result) -> str:
    """The one-line message of a failed case."""
    return f"expected {result.expected}; got {result.got}"


def details(result: Result) -> str:
    """A failed case's details, as the table prints them (sent, expected, the section it
    rests on, got, the bytes received)."""
    text = [f"level: {result.case.level.value}"]
    text += [f"{label}: {value}" for label, value in failure_lines(result)]
    if result.received:
        text.append(received_label(result.received))
        text.extend(hex_lines(result.received))
    return "\n".join(text)


def to_junit(
    protocol: str, role: str, target: str, results: Sequence[Result], *, strict: bool = False
) -> bytes:
    """The run as a JUnit XML document (UTF-8 bytes); ``strict``: every failed case is a
    ``<failure>``, whatever its level."""
    name = f"wirekit conform {protocol} {role}"

    def fails_ci(r: Result) -> bool:
        return r.status == FAIL and (strict or r.must_failed)

    failures = sum(fails_ci(r) for r in results)
    skipped = sum(r.status in (FAIL, SKIP) for r in results) - failures
    root = ET.Element("testsuites", name=name)
    suite = ET.SubElement(
        root,
        "testsuite",
        name=name,
        tests=str(len(results)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time=f"{sum(r.elapsed for r in results):.3f}",
    )
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="target", value=target)
    ET.SubElement(
        props,
        "property",
        name="failing-levels",
        value="every level (strict)" if strict else "MUST",
    )
    findings = sum(r.status == FAIL and not fails_ci(r) for r in results)
    ET.SubElement(props, "property", name="findings", value=str(findings))
    for r in results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"conform.{protocol}.{role}",
            name=f"{r.case.id} [{r.case.level.value}] {r.case.section}",
            time=f"{r.elapsed:.3f}",
        )
        if fails_ci(r):
            failure = ET.SubElement(
                case, "failure", message=finding_message(r), type=r.case.level.value
            )
            failure.text = details(r)
        elif r.status == FAIL:
            message = f"{FINDING} ({r.case.level.value} not met): {finding_message(r)}"
            ET.SubElement(case, "skipped", message=message)
            ET.SubElement(case, "system-out").text = details(r)
        elif r.status == SKIP:
            ET.SubElement(case, "skipped", message=r.got)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def nothing_connected_junit(protocol: str, role: str, target: str, why: str) -> bytes:
    """The JUnit report of a run in which no case could run (nothing connected, or a target
    conform started never served): one ``<error>`` test, so that the CI of the
    implementation fails as ``wirekit conform`` does (exit 1) rather than reading an empty
    report as a pass."""
    name = f"wirekit conform {protocol} {role}"
    root = ET.Element("testsuites", name=name)
    suite = ET.SubElement(
        root, "testsuite", name=name, tests="1", failures="0", errors="1", skipped="0", time="0"
    )
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="target", value=target)
    case = ET.SubElement(
        suite, "testcase", classname=f"conform.{protocol}.{role}", name="the peer connects"
    )
    ET.SubElement(case, "error", message=why, type="nothing-connected")
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
