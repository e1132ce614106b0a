"""Print the ratio table of a pytest-benchmark JSON file.

    python -m pytest benchmarks --benchmark-json=bench.json --benchmark-max-time=0.5
    python benchmarks/ratios.py bench.json

For every group: each contender's median time and how many times faster "fast" is.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict


def table(report: dict) -> str:
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    for bench in report["benchmarks"]:
        match = re.search(r"\[(.+)\]$", bench["name"])
        who = match.group(1) if match else bench["name"]
        groups[bench["group"] or bench["name"]][who] = bench["stats"]["median"]
    lines = [f"{'group':<40} {'contender':<14} {'median':>12} {'fast is':>10}"]
    for group in sorted(groups):
        times = groups[group]
        base = times.get("fast")
        for who, median in sorted(times.items(), key=lambda kv: kv[1]):
            ratio = f"{median / base:.1f}x" if base and who != "fast" else ""
            lines.append(f"{group:<40} {who:<14} {_fmt(median):>12} {ratio:>10}")
    return "\n".join(lines)


def _fmt(seconds: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if seconds >= scale:
            return f"{seconds / scale:.2f} {unit}"
    return f"{seconds / 1e-9:.2f} ns"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as fh:
        print(table(json.load(fh)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
