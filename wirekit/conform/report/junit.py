"""The ``--junit FILE`` report: JUnit XML, so the CI of the implementation under test shows
one test per case.  A failed case is a ``<failure>`` (its type the level: a failed SHOULD
is reported too, and only the exit status tells MUST apart), a skipped one ``<skipped>``."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from ..core.runner import FAIL, SKIP, Result
from .table import hex_lines


def to_junit(protocol: str, role: str, target: str, results: Sequence[Result]) -> bytes:
    """The run as a JUnit XML document (UTF-8 bytes)."""
    name = f"wirekit conform {protocol} {role}"
    root = ET.Element("testsuites", name=name)
    suite = ET.SubElement(
        root,
        "testsuite",
        name=name,
        tests=str(len(results)),
        failures=str(sum(r.status == FAIL for r in results)),
        errors="0",
        skipped=str(sum(r.status == SKIP for r in results)),
        time=f"{sum(r.elapsed for r in results):.3f}",
    )
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="target", value=target)
    for r in results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"conform.{protocol}.{role}",
            name=f"{r.case.id} [{r.case.level.value}] {r.case.section}",
            time=f"{r.elapsed:.3f}",
        )
        if r.status == FAIL:
            failure = ET.SubElement(
                case,
                "failure",
                message=f"expected {r.expected}; got {r.got}",
                type=r.case.level.value,
            )
            text = [f"send: {r.case.send}", f"expected: {r.expected}", f"got: {r.got}"]
            if r.received:
                text.append(f"received ({len(r.received)} bytes):")
                text.extend(hex_lines(r.received))
            failure.text = "\n".join(text)
        elif r.status == SKIP:
            ET.SubElement(case, "skipped", message=r.got)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
