"""y2 DDP hook against PyTorch's own hooks, 2 gloo processes on this machine, in one run.

    python benchmarks/bench_y2_torch.py                 # ~1 M parameters, 2 epochs
    python benchmarks/bench_y2_torch.py --hidden 256    # quicker

Runs ``examples/y2_ddp_train.py`` under ``torch.distributed.run`` with every hook on the same
model, data and seeds (``allreduce`` = PyTorch's default fp32 all-reduce hook, ``fp16`` its
``fp16_compress_hook``, ``powersgd`` its PowerSGD hook at rank 2, ``y2`` wirekit's hook,
``local`` no exchange at all) and prints, against all-reduce: time per step, bytes one rank
sends per step, final accuracy; and for y2 where its time goes: compress (+ residual update
and tau) and apply per step against the exchange time it saves (all-reduce's step time
minus y2's step time without compress and apply).
Ratios only: the absolute times depend on the machine and its load.  (A standalone script,
not a pytest-benchmark group: every row is a multi-process training run.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "y2_ddp_train.py"
HOOKS = "local,allreduce,fp16,powersgd,y2"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--density", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=1200, help="seconds for the run")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    args = parser.parse_args(argv)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(EXAMPLE), "--json", "--hooks", HOOKS, "--hidden", str(args.hidden),
        "--epochs", str(args.epochs), "--density", str(args.density),
    ]  # fmt: skip
    out = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=args.timeout, check=False
    )
    if out.returncode:
        sys.stderr.write(out.stderr[-4000:])
        return out.returncode
    report = json.loads(out.stdout.strip().splitlines()[-1])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    runs = {r["hook"]: r for r in report["runs"]}
    base, local = runs["allreduce"], runs["local"]
    print(
        f"{base['parameters']:,} parameters, {base['steps']} steps, 2 gloo processes; "
        f"Bayes accuracy {report['bayes_accuracy']:.3f}"
    )
    print(
        f"{'hook':10} {'ms/step':>8} {'time×':>6} {'bytes/step':>11} {'bytes÷':>7} "
        f"{'accuracy':>8} {'Δacc pp':>7}"
    )
    for name in HOOKS.split(","):
        r = runs[name]
        fewer = base["bytes_per_step"] / r["bytes_per_step"] if r["bytes_per_step"] else 0.0
        print(
            f"{name:10} {r['ms_per_step']:8.2f} {r['ms_per_step'] / base['ms_per_step']:6.2f} "
            f"{r['bytes_per_step']:11.0f} {fewer:7.1f} {r['accuracy']:8.3f} "
            f"{(r['accuracy'] - base['accuracy']) * 100:+7.2f}"
        )
    y = runs["y2"]
    cost = y["compress_ms_per_step"] + y["apply_ms_per_step"]
    # the exchange y2 saves: all-reduce's step against y2's step without its own kernels
    saved = base["ms_per_step"] - (y["ms_per_step"] - cost)
    print(
        f"y2 per step: compress {y['compress_ms_per_step']:.2f} ms + apply "
        f"{y['apply_ms_per_step']:.2f} ms = {cost:.2f} ms, against {saved:.2f} ms of exchange "
        f"saved (all-reduce step - (y2 step - compress - apply)); cost/saved "
        f"{cost / saved if saved > 0 else float('inf'):.2f}; y2's own exchange ("
        f"all-gathers, waiting for the other rank included) {y['exchange_ms_per_step']:.2f} "
        f"ms, all-reduce step - local step {base['ms_per_step'] - local['ms_per_step']:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
