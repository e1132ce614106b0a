"""Print the comparison table of a pytest-benchmark JSON file.

    python -m pytest benchmarks --benchmark-max-time=0.5 --benchmark-min-rounds=20 \\
        --benchmark-warmup=on --benchmark-json=bench.json
    python benchmarks/ratios.py bench.json

Every benchmark is parametrized by ``who`` (its contender: fast, construct, baseline, kubemo,
direct, dispatcher, ...); other parameters split a group into rows of like with like.  For each
row: every contender's median time and how many times slower it is than wirekit's own
contender ("fast", or "dispatcher" for the serve benchmarks; "whole" for the streaming
benchmarks, whose contenders are ways of cutting one capture and feeding it).  Network
benchmarks also record requests/s and latency percentiles in ``extra_info``; those are shown,
with wirekit's requests/s as a share of each other contender's, and where a row has a
``direct`` contender (the serve benchmarks), every contender's requests/s as a share of
direct's.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

OURS = ("fast", "dispatcher", "whole")


def _rate(bench: dict) -> float | None:
    info = bench.get("extra_info") or {}
    if info.get("requests_per_s"):
        return float(info["requests_per_s"])
    if info.get("round_trips") and bench["stats"]["median"]:
        return info["round_trips"] / bench["stats"]["median"]
    return None


def _latency(bench: dict) -> str:
    info = bench.get("extra_info") or {}
    p50 = info.get("p50_us", info.get("latency_median_us"))
    p99 = info.get("p99_us", info.get("latency_p99_us"))
    return f"{p50:.0f}/{p99:.0f} us" if p50 is not None and p99 is not None else ""


def measured(report: dict) -> str:
    """What the run measured: the compiled twins, or -- loudly -- the pure path or an
    unknown build (a report written without benchmarks/conftest.py)."""
    info = (report.get("machine_info") or {}).get("wirekit")
    if not info:
        return "wirekit: UNKNOWN which twins were measured (no machine_info.wirekit in the report)"
    if info.get("twins") == "compiled":
        return (
            f"wirekit: compiled twins ({len(info.get('loaded', []))} loaded) from {info['package']}"
        )
    return (
        f"wirekit: PURE-PYTHON PATH measured ({info['package']}), not the compiled twins: "
        "these are not wirekit's figures"
    )


def table(report: dict) -> str:
    rows: dict[str, dict[str, dict]] = defaultdict(dict)
    for bench in report["benchmarks"]:
        params = dict(bench.get("params") or {})
        who = str(params.pop("who", bench["name"]))
        extra = " ".join(f"{k}={v}" for k, v in sorted(params.items()))
        key = f"{bench['group'] or bench['name']}{' ' + extra if extra else ''}"
        rows[key][who] = bench
    w = max([20, *(len(who) for benches in rows.values() for who in benches)])
    head = (
        f"{'group':<52} {'contender':<{w}} {'median':>10} {'vs ours':>8} "
        f"{'req/s':>9} {'ours/it':>8} {'p50/p99':>16} {'of direct':>9}"
    )
    lines = [head]
    for key in sorted(rows):
        benches = rows[key]
        ours = next((benches[w] for w in OURS if w in benches), None)
        direct_rate = _rate(benches["direct"]) if "direct" in benches else None
        for who, bench in sorted(benches.items(), key=lambda kv: kv[1]["stats"]["median"]):
            median = bench["stats"]["median"]
            slower = share = ""
            rate = _rate(bench)
            if ours is not None and bench is not ours:
                slower = f"{median / ours['stats']['median']:.1f}x"
                ours_rate = _rate(ours)
                if rate and ours_rate:
                    share = f"{100 * ours_rate / rate:.0f}%"
            of_direct = f"{100 * rate / direct_rate:.0f}%" if rate and direct_rate else ""
            lines.append(
                f"{key:<52} {who:<{w}} {_fmt(median):>10} {slower:>8} "
                f"{(f'{rate:.0f}' if rate else ''):>9} {share:>8} {_latency(bench):>16} "
                f"{of_direct:>9}"
            )
    return "\n".join(lines)


def cpu_table(report: dict) -> str:
    """The server CPU per request (``extra_info["server_cpu_us"]``), where a benchmark
    measured it, with each contender's ratio to ours; empty when none did."""
    rows: dict[str, dict[str, float]] = defaultdict(dict)
    for bench in report["benchmarks"]:
        cpu = (bench.get("extra_info") or {}).get("server_cpu_us")
        if cpu is None:
            continue
        params = dict(bench.get("params") or {})
        who = str(params.pop("who", bench["name"]))
        rows[bench["group"] or bench["name"]][who] = float(cpu)
    if not rows:
        return ""
    w = max([20, *(len(who) for row in rows.values() for who in row)])
    lines = [f"{'server CPU per request':<52} {'contender':<{w}} {'CPU/req':>10} {'vs ours':>8}"]
    for key in sorted(rows):
        row = rows[key]
        ours = next((row[w] for w in OURS if w in row), None)
        for who, cpu in sorted(row.items(), key=lambda kv: kv[1]):
            ratio = f"{cpu / ours:.2f}x" if ours else ""
            lines.append(f"{key:<52} {who:<{w}} {cpu:>7.2f} us {ratio:>8}")
    return "\n".join(lines)


def paired_table(report: dict) -> str:
    """The paired rounds (``extra_info["paired"]``: contenders measured in turn, round after
    round), where a benchmark recorded them; empty when none did."""
    lines = []
    for bench in report["benchmarks"]:
        paired = (bench.get("extra_info") or {}).get("paired")
        if not paired:
            continue
        if not lines:
            lines.append(
                f"{'paired rounds':<40} {'contender':<24} {'round':>10} {'req/s':>9} "
                f"{'CPU/req':>10} {'time/ours':>9} {'ours/it':>8} {'CPU/ours':>9}"
            )
        load = bench["extra_info"].get("load", bench["name"])
        for who, row in sorted(paired.items(), key=lambda kv: kv[1]["time_vs_dispatcher"]):
            ratio = row["time_vs_dispatcher"]
            lines.append(
                f"{load:<40} {who:<24} {_fmt(row['round_s']):>10} "
                f"{row['requests_per_s']:>9.0f} {row['cpu_us']:>7.2f} us {ratio:>8.3f}x "
                f"{100 * ratio:>7.0f}%"
                # the round-by-round CPU ratio, where the benchmark recorded it
                + (f" {row['cpu_vs_dispatcher']:>8.3f}x" if "cpu_vs_dispatcher" in row else "")
            )
    return "\n".join(lines)


def _fmt(seconds: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.2f} {unit}"
    return f"{seconds / 1e-9:.1f} ns"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(argv[0]) as fh:
            report = json.load(fh)
    except OSError as exc:
        print(f"ratios.py: cannot read {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        print("make it with: python -m pytest benchmarks --benchmark-json=FILE", file=sys.stderr)
        return 2
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
        print(f"ratios.py: {argv[0]} is not a pytest-benchmark JSON file: {exc}", file=sys.stderr)
        return 2
    print(measured(report))
    print(table(report))
    cpu = cpu_table(report)
    if cpu:
        print()
        print(cpu)
    paired = paired_table(report)
    if paired:
        print()
        print(paired)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
