"""Round trips/s and latency of the Clipper round-trip benchmark groups.

    python benchmarks/clipper_report.py bench.json
"""

from __future__ import annotations

import json
import re
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as fh:
        report = json.load(fh)
    rows: dict[str, dict[str, dict]] = {}
    for bench in report["benchmarks"]:
        if not (bench["group"] or "").startswith("clipper rt"):
            continue
        who = re.search(r"\[(.+)\]$", bench["name"]).group(1).split("-")[-1]
        rows.setdefault(bench["group"], {})[who] = bench
    print(f"{'group':<42} {'who':<9} {'rt/s':>9} {'median us':>10} {'p99 us':>9} {'share':>6}")
    for group in sorted(rows):
        pair = rows[group]
        rate = {w: b["extra_info"]["round_trips"] / b["stats"]["median"] for w, b in pair.items()}
        for who in ("fast", "baseline"):
            if who not in pair:
                continue
            info = pair[who]["extra_info"]
            share = f"{rate[who] / rate['baseline']:.0%}" if "baseline" in rate else ""
            print(f"{group:<42} {who:<9} {rate[who]:>9.0f} {info['latency_median_us']:>10.1f} "
                  f"{info['latency_p99_us']:>9.1f} {share:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
