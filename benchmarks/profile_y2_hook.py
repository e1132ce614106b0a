"""CPU and time per step of the y2 DDP hook against PyTorch's all-reduce hook, in one run,
and where the hook's CPU goes (specs/y2.md, "Where the hook's CPU goes").

    python benchmarks/profile_y2_hook.py --ranks 4                       # ratios
    python benchmarks/profile_y2_hook.py --ranks 4 --profile             # + rank 0's profile
    python benchmarks/profile_y2_hook.py --ranks 4 --before /work/main   # + another tree's hook
    python benchmarks/profile_y2_hook.py --ranks 8 --hooks allreduce,y2,y2/momentum=0.9/density=0.03

Starts ``--ranks`` gloo processes on loopback (``torch.distributed.run``); each trains the
MLP of ``examples/y2_ddp_train.py`` (``--hidden 1024``: 1.13 M parameters, one DDP bucket)
on random data for ``--steps`` steps per hook, after 3 of warm-up.  Prints, per hook, the
slowest rank's time per step and the ranks' mean CPU per step (the whole process: forward,
backward, optimizer, hook and its threads), each also as a ratio to all-reduce's.  With
``--before PATH`` the hook of the wirekit checkout at PATH (its ``wirekit/y2/torch.py`` and
``sums.py``, and the owner kernels of its compiled ``wirekit/_fast/y2`` when built, loaded
beside this tree's) runs too, as ``y2-before``.  A y2 hook's name may carry
``Y2HookState`` options as in ``bench_y2_torch.py`` (``y2/momentum=0.9/density=0.03``;
with ``momentum`` the optimizer runs without it).  With ``--profile``
rank 0's y2 exchange threads run under ``cProfile`` timed by thread CPU.  The machine's
cores are shared by every rank: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.machinery
import importlib.util
import io
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: The optimizer's momentum (the README's example's), unless a y2 hook applies it.
MOMENTUM = 0.9


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _register(ex: Any, ddp: Any, hook: str, before: str | None) -> float:
    """Register ``hook`` on ``ddp``; the momentum the optimizer must use (0 when a y2 hook
    with ``momentum=`` applies it itself)."""
    if hook.startswith("y2/"):  # options: y2/momentum=0.9/density=0.03
        from y2_shaped_rank import register

        return register(ddp, hook)
    if hook != "y2-before":
        ex.register(ddp, hook, 0.05, None)
        return MOMENTUM
    assert before is not None
    old_sums = _load("wirekit.y2.sums_before", Path(before, "wirekit", "y2", "sums.py"))
    old = _load("wirekit.y2.torch_before", Path(before, "wirekit", "y2", "torch.py"))
    old.sum_blocks = old_sums
    compiled = sorted(Path(before, "wirekit", "_fast").glob("y2.*.so"))
    if compiled and not os.environ.get("WIREKIT_PURE"):  # its owner kernels too
        import wirekit._fast.y2  # noqa: F401  (this tree's, first: the name stays its)

        loader = importlib.machinery.ExtensionFileLoader("wirekit._fast.y2", str(compiled[0]))
        spec = importlib.util.spec_from_file_location(
            "wirekit._fast.y2", compiled[0], loader=loader
        )
        assert spec is not None
        kernels = importlib.util.module_from_spec(spec)
        loader.exec_module(kernels)
        old_sums._kernels = lambda: kernels
    ddp.register_comm_hook(old.Y2HookState(ddp, density=0.05), old.y2_hook)
    return MOMENTUM


def _profile_exchanges(profiler: cProfile.Profile) -> None:
    """Run this tree's y2 exchange threads (and a synchronous hook's body) under
    ``profiler``."""
    import wirekit.y2.torch as y2_torch

    inner = y2_torch._exchange_bucket

    def profiled(*args: Any) -> None:
        profiler.enable()
        try:
            inner(*args)
        finally:
            profiler.disable()

    y2_torch._exchange_bucket = profiled  # type: ignore[assignment]


def rank_main(args: argparse.Namespace) -> None:
    """One rank: every hook in turn; rank 0 prints the table (and the profile)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, str(ROOT / "examples"))
    import y2_ddp_train as ex

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    profiler = cProfile.Profile(time.thread_time) if args.profile and rank == 0 else None
    if profiler is not None:
        _profile_exchanges(profiler)
    results: dict[str, tuple[float, float]] = {}
    for hook in args.hooks.split(","):
        model = ex.make_model(args.hidden, 0)
        ddp = DDP(model, bucket_cap_mb=ex.BUCKET_CAP_MB)
        momentum = _register(ex, ddp, hook, args.before)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=momentum)
        gen = torch.Generator().manual_seed(rank)
        batch = max(1, args.batch // world)
        x = torch.randn(args.steps + 3, batch, ex.DIM, generator=gen)
        y = torch.randint(0, ex.CLASSES, (args.steps + 3, batch), generator=gen)

        def step(k: int, ddp: Any = ddp, opt: Any = opt, x: Any = x, y: Any = y) -> None:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x[k]), y[k]).backward()
            opt.step()

        for k in range(3):
            step(k)
        dist.barrier()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for k in range(3, args.steps + 3):
            step(k)
        wall = (time.perf_counter() - wall0) / args.steps
        cpu = (time.process_time() - cpu0) / args.steps
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, (wall, cpu))
        results[hook] = (max(w for w, _ in everyone), sum(c for _, c in everyone) / world)
        del ddp, opt
    if rank == 0:
        base = results.get("allreduce")
        print(f"{world} ranks, hidden {args.hidden}, {args.steps} steps")
        for hook, (wall, cpu) in results.items():
            ratio = f"  x{wall / base[0]:.2f} step  x{cpu / base[1]:.2f} CPU" if base else ""
            print(f"{hook:16s} step {wall * 1000:7.1f} ms  CPU {cpu * 1000:7.1f} ms{ratio}")
        if profiler is not None:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
            print(out.getvalue())
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument(
        "--hooks",
        default=None,
        help="default: allreduce,[y2-before,]y2; a y2 hook may carry options: "
        "y2/momentum=0.9/density=0.03",
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64, help="samples per step, all ranks")
    parser.add_argument("--before", default=None, help="a wirekit checkout to compare")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hooks is None:
        args.hooks = "allreduce,y2-before,y2" if args.before else "allreduce,y2"
    if args.rank_main:
        rank_main(args)
        return
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
        str(args.ranks), __file__, "--rank-main", "--hooks", args.hooks, "--steps",
        str(args.steps), "--hidden", str(args.hidden), "--batch", str(args.batch),
    ]  # fmt: skip
    if args.before:
        cmd += ["--before", args.before]
    if args.profile:
        cmd.append("--profile")
    raise SystemExit(subprocess.run(cmd, env=env, check=False, timeout=3600).returncode)


if __name__ == "__main__":
    main()
