"""Time to accuracy on a shaped network: what a user of gradient compression pays.

    python benchmarks/bench_y2_torch.py --net 100mbit --ranks 8 --hidden 1024 --seeds 0,1
    python benchmarks/bench_y2_torch.py --net loopback,none,1gbit,100mbit --ranks 4,8 \\
        --hidden 128,256,1024 --seeds 0,1 --json y2-net.json --markdown y2-net.md

Per condition (``--net``), world size and model, ONE launch: every rank runs every hook in
turn (``allreduce``, ``fp16``, ``powersgd1``, ``powersgd2``, ``y2``, ``y2-all-gather``), for
every seed, on the same data (``examples/y2_ddp_train.py``'s digits and MLP
64-hidden-hidden-10), in the same process group.  A y2 hook's name may carry
``Y2HookState`` options (``--hooks allreduce,y2/tau_scale=1,y2/momentum=0.9``: the
measurements of specs/y2.md "Convergence per step"); with ``momentum`` (the hook's momentum
correction) the optimizer runs without momentum.  Conditions:

* ``loopback``: every rank in one network namespace of this run's own, over its loopback;
* ``none``: a namespace per rank behind a veth pair and a bridge (``netns_lab.py``), unshaped;
* a rate (``1gbit``, ``100mbit``, any rate ``tc`` reads): the same, every rank's egress
  shaped by ``tbf`` at that rate.

The ranks are started by this process, each with ``ip netns exec`` in its namespace
(``benchmarks/y2_shaped_rank.py``), gloo over the namespaces' addresses (``MASTER_ADDR``:
rank 0's).  Everything created is deleted when the launch ends, also on Ctrl-C, SIGTERM or a
failure.  Needs root (said plainly otherwise).

Reported per condition, world, model and hook (means over the seeds; per seed in the JSON):
time per step and CPU time per step (rank average, gloo's threads included), both after
the first step (DDP builds its buckets in the first: a cost of the start, counted in the
time to the target only); bytes per rank and step on the wire (the rank's veth transmit
counter: TCP/IP headers and retransmissions included) and as handed to the collectives,
over every step (PowerSGD's first 2 are plain all-reduces); steps and seconds of training
(evaluation excluded) to the first test accuracy ``>= --target`` (95 %), tested every
``--eval-every`` steps; the accuracy after ``--epochs`` (30: the README's) unless
``--stop-at-target`` or ``--max-steps`` cut the training short.  The machine's cores are
shared by all ranks: where the CPU and not the wire is the bottleneck, times say so
(compare the CPU column).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import netns_lab

RANK_SCRIPT = Path(__file__).resolve().parent / "y2_shaped_rank.py"
HOOKS = "allreduce,fp16,powersgd1,powersgd2,y2,y2-all-gather"
MASTER_PORT = 29517


def check_conditions(nets: str) -> None:
    """:class:`ValueError` unless every condition of ``--net`` is one this mode knows."""
    for net in nets.split(","):
        if net not in ("loopback", "none"):
            try:
                netns_lab.rate_bits(net)
            except ValueError:
                raise ValueError(
                    f"--net: {net!r} is not loopback, none or a rate (100mbit, 1gbit, ...)"
                ) from None


def condition_network(net: str, world: int) -> contextlib.AbstractContextManager:
    """The lab a condition runs in (see the module doc)."""
    if net == "loopback":
        return netns_lab.loopback(world)
    return netns_lab.shaped_network(world, None if net == "none" else net)


def rank_command(args: argparse.Namespace, lab: netns_lab.Lab, rank: int, hidden: int,
                 seeds: str) -> list[str]:  # fmt: skip
    cmd = [
        *lab.exec(rank), sys.executable, str(RANK_SCRIPT), "--device", lab.device,
        "--hooks", args.hooks, "--seeds", seeds, "--hidden", str(hidden),
        "--epochs", str(args.epochs), "--max-steps", str(args.max_steps),
        "--target", str(args.target), "--eval-every", str(args.eval_every),
        "--split", args.split,
    ]  # fmt: skip
    if args.stop_at_target:
        cmd.append("--stop-at-target")
    if lab.shared:
        cmd.append("--shared-device")
    return cmd


def launch(args: argparse.Namespace, lab: netns_lab.Lab, hidden: int) -> dict:
    """Every rank of one launch, to its end; rank 0's report.  A rank that fails or a
    launch past ``--timeout`` stops every rank (then :class:`RuntimeError`)."""
    world = lab.ranks
    env = {
        **os.environ,
        "MASTER_ADDR": lab.address(0),
        "MASTER_PORT": str(MASTER_PORT),
        "WORLD_SIZE": str(world),
        "GLOO_SOCKET_IFNAME": lab.device,
        "OMP_NUM_THREADS": "1",
        "Y2_SHAPED_PARENT": str(os.getpid()),  # the ranks die with this process
    }
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="y2-shaped-") as tmp:
        logs = [Path(tmp, f"rank{r}.err") for r in range(world)]
        out_path = Path(tmp, "rank0.out")
        try:
            for r in range(world):
                sink = out_path if r == 0 else os.devnull
                with open(logs[r], "wb") as err, open(sink, "wb") as out:
                    procs.append(
                        subprocess.Popen(
                            rank_command(args, lab, r, hidden, args.seeds),
                            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                            stdout=out,
                            stderr=err,
                            start_new_session=True,
                        )
                    )
            _wait(procs, args.timeout, logs)
        finally:
            for p in procs:  # only after a failure or an interrupt are any still running
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, 9)
                    p.wait()
        lines = out_path.read_text().strip().splitlines()
        if not lines:
            raise RuntimeError(f"rank 0 reported nothing\n{logs[0].read_text()[-3000:]}")
        return json.loads(lines[-1])


def _wait(procs: list[subprocess.Popen], timeout: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            r = failed[0]
            raise RuntimeError(f"rank {r} exited with {codes[r]}\n{logs[r].read_text()[-3000:]}")
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the launch took more than {timeout} s")
        time.sleep(0.2)


def _per_step(run: dict, measure: str) -> float:
    """A time per step after the first (DDP's first step builds its buckets: a cost of
    the start, in the time to the target but not in the steady step)."""
    if run["steps"] < 2:
        return run[measure] / max(1, run["steps"])
    return (run[measure] - run["first"][measure]) / (run["steps"] - 1)


def summarize(report: dict, target: float) -> dict[str, dict[str, Any]]:
    """Per hook: means over the seeds of every measure (None where a seed lacks it), and
    the per-seed steps and seconds to the target."""
    by_hook: dict[str, list[dict]] = {}
    for run in report["runs"]:
        by_hook.setdefault(run["hook"], []).append(run)
    rows: dict[str, dict[str, Any]] = {}
    for hook, runs in by_hook.items():

        def mean(values: list[Any]) -> float | None:
            return None if not values or None in values else statistics.fmean(values)

        per_rank = [rk for r in runs for rk in r["ranks"]]
        rows[hook] = {
            "parameters": runs[0]["parameters"],
            "seeds": [r["seed"] for r in runs],
            "steps": [r["steps"] for r in runs],
            "ms_per_step": mean([_per_step(r, "wall") * 1000 for r in runs]),
            "wire_per_step": mean([rk["wire"] / rk["steps"] for rk in per_rank]),
            "counted_per_step": mean([rk["counted"] / rk["steps"] for rk in per_rank]),
            "cpu_ms_per_step": mean([_per_step(rk, "cpu") * 1000 for rk in per_rank]),
            "steps_to_target": [r["reached"][0] if r["reached"] else None for r in runs],
            "seconds_to_target": [r["reached"][1] if r["reached"] else None for r in runs],
            "final_accuracy": mean([r["curve"][-1][2] if r["epochs_done"] else None for r in runs]),
            "best_accuracy": max(max(a for _s, _t, a in r["curve"]) for r in runs),
            "target": target,
        }
    return rows


def run(args: argparse.Namespace) -> list[dict]:
    """Every condition × world × model: one launch each; their reports and summaries."""
    results = []
    for net in args.net.split(","):
        for world in [int(w) for w in args.ranks.split(",")]:
            with condition_network(net, world) as lab:
                for hidden in [int(h) for h in args.hidden.split(",")]:
                    report = launch(args, lab, hidden)
                    results.append(
                        {
                            "net": net,
                            "world": world,
                            "hidden": hidden,
                            "report": report,
                            "summary": summarize(report, args.target),
                            # what shaped each rank's egress, and what it held back
                            "qdiscs": lab.qdiscs(),
                        }
                    )
                    if args.progress:
                        print(markdown([results[-1]], args), flush=True)
    return results


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _ratio(value: float | None, base: float | None) -> str:
    return "" if value is None or not base else f" ({value / base:.2f}×)"


def markdown(results: list[dict], args: argparse.Namespace) -> str:
    """One table per condition × world × model; ratios against all-reduce in the cell."""
    out = []
    for res in results:
        rows = res["summary"]
        base = rows.get("allreduce", {})
        first = next(iter(rows.values()))
        out.append(
            f"\n**{res['net']}, {res['world']} ranks, 64-{res['hidden']}-{res['hidden']}-10 "
            f"({first['parameters']:,} parameters)**, {args.split} split, seeds {args.seeds}, "
            f"target {args.target:.0%}\n"
        )
        out.append(
            "| hook | ms/step (× all-reduce) | wire B/step (× fewer) | counted B/step | "
            "steps to target | s to target (× all-reduce) | CPU ms/step (×) | final acc. |"
        )
        out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for hook, r in rows.items():
            wire = r["wire_per_step"]
            fewer = (
                f" ({base['wire_per_step'] / wire:.1f}×)"
                if wire and base.get("wire_per_step")
                else ""
            )
            secs = r["seconds_to_target"]
            base_secs = base.get("seconds_to_target", [])
            ratios = [f"{s / b:.2f}" for s, b in zip(secs, base_secs, strict=False) if s and b]
            steps = "/".join("–" if s is None else str(s) for s in r["steps_to_target"])
            seconds = "/".join("–" if s is None else f"{s:.1f}" for s in secs)
            out.append(
                f"| {hook} | {_fmt(r['ms_per_step'], '.1f')}"
                f"{_ratio(r['ms_per_step'], base.get('ms_per_step'))} "
                f"| {_fmt(wire, ',.0f')}{fewer} | {_fmt(r['counted_per_step'], ',.0f')} "
                f"| {steps} | {seconds}{' (' + '/'.join(ratios) + '×)' if ratios else ''} "
                f"| {_fmt(r['cpu_ms_per_step'], '.1f')}"
                f"{_ratio(r['cpu_ms_per_step'], base.get('cpu_ms_per_step'))} "
                f"| {_fmt(r['final_accuracy'], '.3f')} |"
            )
    return "\n".join(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The shaped mode's own options (``bench_y2_torch.py`` shares --ranks, --seeds, ...)."""
    parser.add_argument("--target", type=float, default=0.95, help="test accuracy to reach")
    parser.add_argument("--stop-at-target", action="store_true",
                        help="end a training at the target (no final accuracy then)")  # fmt: skip
    parser.add_argument("--max-steps", type=int, default=0, help="cap per training (0: none)")
    parser.add_argument("--eval-every", type=int, default=1, help="steps between tests")
    parser.add_argument("--markdown", default=None, help="also write the tables here")
    parser.add_argument("--progress", action="store_true", help="print each table at once")


def main_shaped(args: argparse.Namespace) -> int:
    """``bench_y2_torch.py --net ...``: run, print the tables, write JSON / markdown."""
    try:
        netns_lab.require_root()
    except netns_lab.LabError as exc:
        print(f"bench_y2_torch --net: {exc}", file=sys.stderr)
        return 2
    try:
        results = run(args)
    except KeyboardInterrupt:
        print("bench_y2_torch --net: interrupted; every rank stopped, the lab deleted",
              file=sys.stderr)  # fmt: skip
        return 130
    table = markdown(results, args)
    if not args.progress:  # else every table is printed already
        print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0
