"""y2 DDP hook against PyTorch's own hooks on 2, 4 and 8 gloo processes, in one run.

    python benchmarks/bench_y2_torch.py                  # the README's table (long: ~1 h)
    python benchmarks/bench_y2_torch.py --ranks 2,4 --seeds 0 --epochs 2   # quick

Runs ``examples/y2_ddp_train.py`` under ``torch.distributed.run`` once per world size and
split of the data over the ranks (``shuffled``, ``sorted`` by label), every hook on the same
model, data and seeds: ``allreduce`` (PyTorch's default fp32 all-reduce hook), ``fp16`` (its
``fp16_compress_hook``), ``powersgd`` (its PowerSGD hook at rank 2), ``y2`` (wirekit's hook,
default settings: the reduce-scatter exchange), ``y2-all-gather`` (the same with the
all-gather exchange) and ``local`` (no exchange: what the accuracy would be without one).

For each world size and split it prints, per hook: the test accuracy on digits' held-out
quarter (mean ± standard deviation over the seeds, and the worst seed against all-reduce's
on the same seed), the bytes one rank sends per step, counted at the collectives and, where
``unshare -n`` gives each run a network namespace of its own (as root), as really crossed
the loopback interface (TCP/IP headers and gloo's own messages included), how many times
fewer than all-reduce's, and the time per step against all-reduce's.  Then how each hook's
bytes per rank scale with the ranks.  The machine's cores are shared by all ranks of a run
(and maybe with other work): times are ratios within one run, bytes do not depend on it.
(A standalone script, not a pytest-benchmark group: every row is a multi-process training.)

With ``--net`` it measures instead what a user pays: time to a test accuracy, with every
rank in a network namespace of its own, its egress shaped by ``tbf`` (``--net 100mbit``,
``1gbit``, ``none``: unshaped veths; ``loopback``: one namespace's loopback), per hook
(all-reduce, fp16, PowerSGD rank 1 and 2, y2 and y2's all-gather) in one launch per
condition: ``benchmarks/y2_shaped.py`` (its doc has the details; needs root)::

    python benchmarks/bench_y2_torch.py --net 100mbit --ranks 8 --hidden 1024 --seeds 0,1
    python benchmarks/bench_y2_torch.py --net loopback,none,1gbit,100mbit --ranks 4,8 \\
        --hidden 128,256,1024 --seeds 0,1 --json y2-net.json --markdown y2-net.md
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import y2_shaped

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "y2_ddp_train.py"
HOOKS = "local,allreduce,fp16,powersgd,y2,y2-all-gather"
#: The defaults of the two modes: the loopback table, and ``--net``'s time to accuracy.
DEFAULTS = {
    "loopback": {"ranks": "2,4,8", "seeds": "0,1,2", "hooks": HOOKS, "hidden": "256"},
    "net": {"ranks": "4,8", "seeds": "0,1", "hooks": y2_shaped.HOOKS, "hidden": "128,256,1024"},
}


def own_network_namespace() -> bool:
    """Whether ``unshare -n`` works here (root, and a kernel that allows it)."""
    try:
        return (
            subprocess.run(
                ["unshare", "-n", "true"], capture_output=True, timeout=30, check=False
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_world(world: int, split: str, args: argparse.Namespace, netns: bool) -> dict:
    """One ``torch.distributed.run`` of every hook and seed; the example's JSON report."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
        str(world), str(EXAMPLE), "--json", "--hooks", args.hooks, "--split", split,
        "--seeds", args.seeds, "--epochs", str(args.epochs), "--hidden", str(args.hidden),
        "--density", str(args.density),
    ]  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    if netns:  # a namespace of its own: its loopback carries this run's bytes only
        line = shlex.join([*cmd, "--netns"])
        cmd = ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {line}"]
    out = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=args.timeout, check=False
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode and not (lines and lines[-1].startswith('{"world"')):
        raise SystemExit(f"{world} ranks, {split}: exit {out.returncode}\n{out.stderr[-4000:]}")
    if out.returncode:  # every training ran and reported; a rank failed while exiting
        print(f"{world} ranks, {split}: exit {out.returncode} after the report", file=sys.stderr)
    return json.loads(lines[-1])


def _bytes(run: dict) -> float:
    """Bytes per rank and step: on the wire where measured, else counted."""
    wire = run["wire_bytes_per_step"]
    return run["bytes_per_step"] if wire is None else wire


def summarize(report: dict, hooks: list[str]) -> dict[str, dict]:
    """Per hook: accuracies over the seeds, bytes and time per step (means over seeds)."""
    by_hook: dict[str, list[dict]] = {h: [] for h in hooks}
    for run in report["runs"]:
        by_hook[run["hook"]].append(run)
    base = {r["seed"]: r for r in by_hook["allreduce"]}
    rows = {}
    for hook, runs in by_hook.items():
        acc = [r["accuracy"] for r in runs]
        wire = [r["wire_bytes_per_step"] for r in runs]
        rows[hook] = {
            "accuracy_mean": statistics.fmean(acc),
            "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
            # the seed where this hook did worst against all-reduce on the same seed
            "worst_delta": min(r["accuracy"] - base[r["seed"]]["accuracy"] for r in runs),
            "bytes": statistics.fmean(r["bytes_per_step"] for r in runs),
            "wire": None if None in wire else statistics.fmean(wire),  # type: ignore[type-var]
            "measured": statistics.fmean(_bytes(r) for r in runs),
            "ms": statistics.fmean(r["ms_per_step"] for r in runs),
            "parameters": runs[0]["parameters"],
            "steps": runs[0]["steps"],
        }
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, with the defaults of the mode chosen (``--net`` or not)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default=None, help="world sizes, comma-separated")
    parser.add_argument("--splits", default="shuffled,sorted")
    parser.add_argument("--seeds", default=None)
    parser.add_argument("--hooks", default=None)
    parser.add_argument("--hidden", default=None, help="hidden width (--net: comma-separated)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--density", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per launch")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    parser.add_argument(
        "--net",
        default=None,
        help="time to accuracy under these network conditions, comma-separated: loopback, "
        "none (unshaped veths), or a tbf rate (1gbit, 100mbit); needs root",
    )
    y2_shaped.add_arguments(parser)
    args = parser.parse_args(argv)
    for name, value in DEFAULTS["net" if args.net else "loopback"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.split = args.splits.split(",")[0]  # --net: one split
    if args.net:
        try:
            y2_shaped.check_conditions(args.net)
        except ValueError as exc:
            parser.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.net:
        return y2_shaped.main_shaped(args)
    args.hidden = int(args.hidden)
    hooks = args.hooks.split(",")
    netns = own_network_namespace()
    reports, tables = [], {}
    for world in [int(w) for w in args.ranks.split(",")]:
        for split in args.splits.split(","):
            report = run_world(world, split, args, netns)
            reports.append(report)
            tables[world, split] = summarize(report, hooks)
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1))

    first = next(iter(tables.values()))["allreduce"]
    print(
        f"digits, {first['parameters']:,} parameters, seeds {args.seeds}, {args.epochs} epochs; "
        f"bytes per rank and step {'on the loopback wire' if netns else 'counted'}"
        f"{'' if netns else ' (no network namespace here: unshare -n failed)'}"
    )
    for (world, split), rows in tables.items():
        base = rows["allreduce"]
        print(f"\n{world} ranks, {split} split, {base['steps']} steps")
        print(
            f"{'hook':14} {'accuracy':>13} {'worst Δ':>8} {'counted B':>10} {'wire B':>9} "
            f"{'fewer':>6} {'time×':>6}"
        )
        for hook in hooks:
            r = rows[hook]
            fewer = base["measured"] / r["measured"] if r["measured"] else float("inf")
            wire = "-" if r["wire"] is None else f"{r['wire']:.0f}"
            print(
                f"{hook:14} {r['accuracy_mean']:7.3f}±{r['accuracy_std']:.3f} "
                f"{r['worst_delta'] * 100:+7.1f}p {r['bytes']:10.0f} {wire:>9} {fewer:6.1f} "
                f"{r['ms'] / base['ms']:6.2f}"
            )
    worlds = sorted({w for w, _s in tables})
    split = args.splits.split(",")[0]
    print(f"\nbytes per rank and step as ranks grow ({split} split; × fewer than all-reduce)")
    print(f"{'hook':14} " + " ".join(f"{f'{w} ranks':>17}" for w in worlds))
    for hook in hooks:
        if hook == "local":
            continue
        cells = []
        for w in worlds:
            r, base = tables[w, split][hook], tables[w, split]["allreduce"]
            cells.append(f"{r['measured']:9.0f} ({base['measured'] / r['measured']:4.1f}×)")
        print(f"{hook:14} " + " ".join(f"{c:>17}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
