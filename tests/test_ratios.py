"""benchmarks/ratios.py: the comparison table printed from a pytest-benchmark report."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "ratios", Path(__file__).resolve().parent.parent / "benchmarks" / "ratios.py"
)
ratios = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ratios)


def _bench(group: str, who: str, median: float, rate: float | None = None) -> dict:
    return {
        "group": group,
        "name": f"test[{who}]",
        "params": {"who": who},
        "stats": {"median": median},
        "extra_info": {"requests_per_s": rate} if rate else {},
    }


def _row(table: str, who: str) -> list[str]:
    return next(line.split() for line in table.splitlines() if f" {who} " in line)


def test_shares_against_ours_and_against_direct():
    report = {
        "benchmarks": [
            _bench("serve", "direct", 1e-4, 10000.0),
            _bench("serve", "dispatcher", 2e-4, 5000.0),
            _bench("serve", "relay", 1.25e-4, 8000.0),
        ]
    }
    table = ratios.table(report)
    assert _row(table, "relay")[-3:-1] == ["8000", "62%"]  # dispatcher's rate / relay's
    assert _row(table, "relay")[-1] == "80%"  # relay's rate / direct's
    assert _row(table, "dispatcher")[-1] == "50%"
    assert _row(table, "direct")[-1] == "100%"


def test_codec_rows_compare_with_fast_and_have_no_direct_column():
    report = {
        "benchmarks": [
            _bench("decode", "fast", 1e-6),
            _bench("decode", "construct", 1e-4),
        ]
    }
    table = ratios.table(report)
    assert _row(table, "construct")[-1] == "100.0x"
    assert _row(table, "fast")[-1] == "us"  # nothing after the median: no ratios for ours


def test_streaming_rows_compare_with_feeding_whole():
    report = {
        "benchmarks": [
            _bench("zmtp feed", "whole", 1e-3),
            _bench("zmtp feed", "byte-by-byte", 2.5e-2),
        ]
    }
    assert "25.0x" in _row(ratios.table(report), "byte-by-byte")


def test_the_table_says_what_was_measured():
    compiled = {"twins": "compiled", "package": "/x/wirekit", "loaded": ["mip", "y2"]}
    pure = {"twins": "pure", "package": "/x/wirekit", "loaded": []}
    assert "compiled twins (2 loaded)" in ratios.measured({"machine_info": {"wirekit": compiled}})
    assert "PURE-PYTHON" in ratios.measured({"machine_info": {"wirekit": pure}})
    assert "UNKNOWN" in ratios.measured({"benchmarks": []})


def test_server_cpu_rows_compare_with_ours():
    def bench(who: str, cpu: float) -> dict:
        return {**_bench("cpu", who, 1e-3), "extra_info": {"server_cpu_us": cpu}}

    report = {"benchmarks": [bench("fast", 2.0), bench("pure-connection", 2.5), bench("x", 1.0)]}
    rows = {line.split()[1]: line.split()[-1] for line in ratios.cpu_table(report).splitlines()[1:]}
    assert rows == {"fast": "1.00x", "pure-connection": "1.25x", "x": "0.50x"}
    assert ratios.cpu_table({"benchmarks": [_bench("decode", "fast", 1e-6)]}) == ""


def test_a_missing_or_broken_report_is_one_line_and_exit_2(tmp_path):
    """Run as the README runs it: a wrong path or a file that is no JSON is a usage error
    naming the file (it was a FileNotFoundError / JSONDecodeError traceback)."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "ratios.py"
    broken = tmp_path / "bench.json"
    broken.write_text("{")
    for path, said in ((tmp_path / "nope.json", "cannot read"), (broken, "not a pytest-benchmark")):
        proc = subprocess.run(
            [sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 2
        assert said in proc.stderr and str(path) in proc.stderr
        assert "Traceback" not in proc.stderr
