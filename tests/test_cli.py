"""The ``wirekit`` command line, driven through ``main()`` and once as a real process."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

from wirekit import mip
from wirekit.cli import hex_excerpt, main

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "mip-session.bin"


def run(argv, stdin: bytes | None = None):
    out, err = io.StringIO(), io.StringIO()
    if stdin is not None:
        real = sys.stdin
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
        try:
            code = main(argv, out=out, err=err)
        finally:
            sys.stdin = real
    else:
        code = main(argv, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_decode_mip_sample_human():
    code, out, err = run(["decode", "--proto", "mip", str(SAMPLE)])
    assert code == 0, err
    assert out.splitlines()[0] == "@0 ping request"
    assert "'the quick brown fox'" in out
    assert "error SHAPE (4)" in out
    assert out.rstrip().endswith(f"4 message(s), {SAMPLE.stat().st_size} bytes")


def test_decode_mip_json_lines_carry_every_byte(tmp_path):
    payload = bytes(range(256)) * 3
    path = tmp_path / "one.bin"
    path.write_bytes(mip.encode(mip.Inference.request([[mip.Item.image(payload)]])))
    code, out, _ = run(["decode", "--proto", "mip", "--json", str(path)])
    assert code == 0
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert record["offset"] == 0 and record["kind"] == "inference"
    assert bytes.fromhex(record["items"][0]["data_hex"]) == payload


def test_decode_mip_from_stdin():
    code, out, _ = run(["decode", "--proto", "mip", "-"], stdin=mip.encode(mip.Ping(True)))
    assert code == 0 and out.startswith("@0 ping response")


def test_decode_mip_truncated_tail_is_shown_malformed(tmp_path):
    data = SAMPLE.read_bytes()[:60]
    path = tmp_path / "cut.bin"
    path.write_bytes(data)
    code, out, err = run(["decode", "--proto", "mip", str(path)])
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "@0 ping request"
    assert lines[1].startswith("@8 inference [Malformed]")
    assert "! mip: payload at byte 60: truncated" in out and "[..end]" in out
    assert lines[-1] == "2 message(s), 60 bytes, 1 malformed"
    assert "1 malformed message(s)" in err


def test_usage_errors_exit_2(tmp_path):
    assert run(["decode", "--proto", "nope", "x"])[0] == 2
    assert run([])[0] == 2
    code, _, err = run(["decode", "--proto", "mip", str(tmp_path / "missing.bin")])
    assert code == 2 and "cannot read" in err


def test_hex_excerpt_marks_the_offset():
    assert hex_excerpt(bytes(range(40)), 20, radius=2) == "  00000012: 12 13 [14] 15"


def test_entry_point_runs_as_a_process():
    exe = shutil.which("wirekit")
    cmd = [exe] if exe else [sys.executable, "-m", "wirekit.cli"]
    proc = subprocess.run(
        [*cmd, "decode", "--proto", "mip", "--json", str(SAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    kinds = [json.loads(line)["kind"] for line in proc.stdout.splitlines()]
    assert kinds == ["ping", "inference", "inference", "error"]


def _parsers(parser, path=("wirekit",)):
    """Every (command path, parser) of the command line, subcommands included."""
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_help_reads_as_plain_text():
    # issue 21: no reStructuredText backticks, no ARGUMENT_NAME metavars, every option with
    # a help line
    import re

    from wirekit.cli import build_parser

    seen = 0
    for path, parser in _parsers(build_parser()):
        text = parser.format_help()
        where = " ".join(path)
        assert "`" not in text, f"{where}: backticks in --help"
        assert not re.search(r"--[a-z-]+ [A-Z]+_[A-Z_]+\b", text), f"{where}: a raw metavar"
        for action in parser._actions:
            if action.option_strings and action.help is None:
                raise AssertionError(f"{where} {action.option_strings[0]}: no help line")
        seen += 1
    assert seen > 20
