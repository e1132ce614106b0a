"""Requests/s and latency of the network benchmarks in a pytest-benchmark JSON file.

    python -m pytest benchmarks -k round_trip --benchmark-max-time=0.5 \\
        --benchmark-min-rounds=20 --benchmark-warmup=on --benchmark-json=net.json
    python benchmarks/net_report.py net.json

For each group: requests/s, median and p99 latency per contender, and wirekit ("fast") as a
multiple of KubeMo's requests/s and as a share of the raw echo's.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict


def table(report: dict) -> str:
    groups: dict[str, dict[str, dict]] = defaultdict(dict)
    for bench in report["benchmarks"]:
        info = bench.get("extra_info", {})
        if "requests_per_s" not in info:
            continue
        match = re.search(r"\[(\w+)", bench["name"])
        who = match.group(1) if match else bench["name"]
        groups[bench["group"]][who] = info
    lines = [f"{'group':<26} {'contender':<10} {'req/s':>9} {'p50 us':>9} {'p99 us':>9}"]
    for group in sorted(groups):
        rows = groups[group]
        for who in ("fast", "kubemo", "baseline"):
            if who in rows:
                r = rows[who]
                lines.append(
                    f"{group:<26} {who:<10} {r['requests_per_s']:>9.0f} "
                    f"{r['p50_us']:>9.1f} {r['p99_us']:>9.1f}"
                )
        fast = rows.get("fast", {}).get("requests_per_s")
        if fast and "kubemo" in rows:
            ratio = fast / rows["kubemo"]["requests_per_s"]
            lines.append(f"{'':<26} wirekit/KubeMo requests/s: {ratio:.1f}x")
        if fast and "baseline" in rows:
            share = fast / rows["baseline"]["requests_per_s"]
            lines.append(f"{'':<26} wirekit/raw echo requests/s: {share:.0%}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as fh:
        print(table(json.load(fh)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
