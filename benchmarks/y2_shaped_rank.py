"""One rank of ``benchmarks/y2_shaped.py``: every hook in turn, every seed, one process group.

Started by the benchmark (under ``ip netns exec`` in the rank's namespace), with
``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` and ``GLOO_SOCKET_IFNAME`` set;
``--device`` is the interface whose transmit counter is this rank's wire (its veth; ``lo``
when all ranks share one loopback, then the counter holds every rank's bytes and is divided
by the world size).  Rank 0 prints one JSON line: a run per seed and hook.

What is measured, on every rank, as sums over a training and over its first step alone
(DDP builds its buckets in the first): around the training steps only (forward, backward
with the hook's exchange, optimizer step; not the test that follows some steps), wall time,
CPU time of the whole process (``time.process_time``: gloo's threads included) and the
bytes the hooks handed to the collectives (:class:`CollectiveBytes`, counted as ring
algorithms send them); and the bytes that left by ``--device`` (``/proc/self/net/dev``:
TCP/IP headers, gloo's own messages, retransmissions included) from the first step until
the queues have drained after the last, less what the tests sent (measured alone before
the training: :func:`test_bytes`).  Every ``--eval-every`` steps the model is tested on
digits' held-out quarter, each rank on a slice of it, the correct answers summed by an
all-reduce.
"""

# No ``from __future__ import annotations``: DDP checks a hook's annotations as objects.
import argparse
import ctypes
import gc
import importlib.util
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from wirekit.y2.torch import Y2HookState, y2_hook

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "y2_ddp_train.py"
#: The hooks a run can name.  ``powersgd1``/``powersgd2``: PyTorch's PowerSGD at matrix rank
#: 1/2 (after 2 plain all-reduce steps, as ``examples/y2_ddp_train.py`` has it).  A y2
#: hook's name may carry :class:`Y2HookState` options: ``y2/momentum=0.9/warmup_steps=10``.
HOOKS = ("allreduce", "fp16", "powersgd1", "powersgd2", "y2", "y2-all-gather")
#: The optimizer's momentum (SGD), the example's; 0 for a hook that applies it itself.
MOMENTUM = 0.9
#: One bucket for every hook (the example's reason: PowerSGD hangs on gloo with several).
BUCKET_CAP_MB = 1024
#: Seconds for what a rank has written to its sockets to leave its queues (tbf's included:
#: the last test's all-reduce waited for the data queued before it on the same links).
DRAIN = 0.25


def _example() -> Any:
    """``examples/y2_ddp_train.py`` as a module: its data and model, the README's."""
    spec = importlib.util.spec_from_file_location("y2_ddp_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bytes(device: str, repeat: int = 8) -> float:
    """Bytes this rank sends for one test's all-reduce of its correct answers (with the
    ACKs it sends), measured alone: taken off the training's bytes."""
    time.sleep(DRAIN)
    before = tx_bytes(device)
    count = torch.zeros(1, dtype=torch.int64)
    for _ in range(repeat):
        dist.all_reduce(count)
    time.sleep(DRAIN)
    return (tx_bytes(device) - before) / repeat


def tx_bytes(device: str) -> int:
    """Bytes sent by ``device`` so far, in this process's network namespace."""
    with open("/proc/self/net/dev") as f:
        for line in f:
            name, _, fields = line.partition(":")
            if name.strip() == device:
                return int(fields.split()[8])
    raise SystemExit(f"no interface {device!r} in /proc/self/net/dev")


class CollectiveBytes:
    """While ``counting``, the bytes this rank hands to ``torch.distributed``'s collectives,
    as ring algorithms send them: ``2 (W-1)/W × size`` per all-reduce, ``(W-1) × size`` per
    all-gather, the parts for other ranks per all-to-all, ``(W-1)/W × size`` per
    reduce-scatter.  Installed over ``torch.distributed``'s functions for the whole run."""

    def __init__(self, world: int, rank: int) -> None:
        self.bytes = 0.0
        self.counting = False
        self.world, self.rank = world, rank
        for name in (
            "all_reduce",
            "all_gather",
            "all_gather_into_tensor",
            "all_to_all_single",
            "reduce_scatter_tensor",
        ):
            if hasattr(dist, name):
                setattr(dist, name, self._wrap(name, getattr(dist, name)))

    def _size(self, name: str, args: tuple, kwargs: dict) -> float:
        w = self.world
        if name == "all_reduce":
            t = args[0] if args else kwargs["tensor"]
            return 2 * (w - 1) / w * t.numel() * t.element_size()
        if name == "all_gather":
            t = args[1] if len(args) > 1 else kwargs["tensor"]
            return (w - 1) * t.numel() * t.element_size()
        if name == "all_gather_into_tensor":
            t = args[1] if len(args) > 1 else kwargs["input_tensor"]
            return (w - 1) * t.numel() * t.element_size()
        if name == "reduce_scatter_tensor":
            t = args[1] if len(args) > 1 else kwargs["input"]
            return (w - 1) / w * t.numel() * t.element_size()
        # all_to_all_single(output, input, output_split_sizes, input_split_sizes, ...)
        t = args[1] if len(args) > 1 else kwargs["input"]
        splits = args[3] if len(args) > 3 else kwargs.get("input_split_sizes")
        row = t.element_size() * (t[0].numel() if t.dim() > 1 else 1)
        if not splits:
            return (w - 1) / w * t.numel() * t.element_size()
        return (sum(splits) - splits[self.rank]) * row

    def _wrap(self, name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.counting:
                self.bytes += self._size(name, args, kwargs)
            return fn(*args, **kwargs)

        return counted


def y2_options(hook: str) -> dict[str, Any]:
    """The :class:`Y2HookState` options a y2 hook's name carries after its base name:
    ``y2/momentum=0.9/warmup_steps=10`` → ``{"momentum": 0.9, "warmup_steps": 10}`` (whole
    numbers as int, others as float); ``{}`` for the defaults."""
    options: dict[str, Any] = {}
    for item in hook.split("/")[1:]:
        key, _, value = item.partition("=")
        try:
            options[key] = int(value)
        except ValueError:
            options[key] = float(value)
    return options


def register(ddp: DDP, hook: str) -> float:
    """Register the named hook on ``ddp`` (y2's with its state's defaults, or the options
    its name carries: :func:`y2_options`); the momentum the optimizer must use (0 when
    the hook applies it itself: y2's momentum correction)."""
    base = hook.split("/")[0]
    if base in ("y2", "y2-all-gather"):
        exchange = "all-gather" if base == "y2-all-gather" else "slots"
        state = Y2HookState(ddp, exchange=exchange, **y2_options(hook))
        ddp.register_comm_hook(state, y2_hook)
        return 0.0 if state.momentum else MOMENTUM
    if "/" in hook:
        raise SystemExit(f"options are for y2's hooks only, not {hook!r}")
    if hook == "allreduce":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook in ("powersgd1", "powersgd2"):
        ps = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(hook[-1]), start_powerSGD_iter=2
        )
        ddp.register_comm_hook(ps, powerSGD_hook.powerSGD_hook)
    else:
        raise SystemExit(f"unknown hook {hook!r} (known: {', '.join(HOOKS)})")
    return MOMENTUM


def train(hook: str, seed: int, data: Any, example: Any, args: argparse.Namespace,
          counter: CollectiveBytes) -> dict:  # fmt: skip
    """One training with ``hook``; this rank's measurements."""
    world, rank = dist.get_world_size(), dist.get_rank()
    (x, y), (tx, ty) = data
    start, stop = rank * len(x) // world, (rank + 1) * len(x) // world  # y2.partition's
    x, y = x[start:stop], y[start:stop]
    tx, ty = tx[rank::world], ty[rank::world]  # this rank's slice of the test set
    n_test = len(data[1][0])
    model = example.make_model(args.hidden, seed)
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    momentum = register(ddp, hook)
    node_batch = max(1, args.batch // world)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=momentum)
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    steps_per_epoch = len(x) // node_batch
    total = args.epochs * steps_per_epoch
    if args.max_steps:
        total = min(total, args.max_steps)
    wall = cpu = 0.0
    counter.bytes = 0.0
    curve: list[tuple[int, float, float]] = []  # (step, seconds so far, test accuracy)
    reached: tuple[int, float] | None = None
    order = torch.randperm(len(x), generator=gen)
    dist.barrier()
    per_test = test_bytes(args.device)
    tests = 0
    wire0 = tx_bytes(args.device)
    step = 0
    first: dict[str, float] = {}
    while step < total:
        k = step % steps_per_epoch
        if k == 0 and step:
            order = torch.randperm(len(x), generator=gen)
        idx = order[k * node_batch : (k + 1) * node_batch]
        c0, t0 = time.process_time(), time.perf_counter()
        counter.counting = True
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x[idx]), y[idx]).backward()
        opt.step()
        counter.counting = False
        wall += time.perf_counter() - t0
        cpu += time.process_time() - c0
        step += 1
        if step == 1:  # DDP's first step (it builds its buckets then): kept apart
            sent = float(tx_bytes(args.device) - wire0)  # about: its tail may be queued
            first = {"wall": wall, "cpu": cpu, "wire": sent, "counted": counter.bytes}
        if step % args.eval_every and step < total:
            continue
        with torch.no_grad():
            correct = torch.tensor([int((model(tx).argmax(1) == ty).sum())], dtype=torch.int64)
        dist.all_reduce(correct)
        tests += 1
        accuracy = int(correct) / n_test
        curve.append((step, wall, accuracy))
        if reached is None and accuracy >= args.target:
            reached = (step, wall)
            if args.stop_at_target:
                break
    time.sleep(DRAIN)  # the last step's bytes out of the queues
    wire = tx_bytes(args.device) - wire0 - tests * per_test
    dist.barrier()
    result = {
        "hook": hook,
        "seed": seed,
        "steps": step,
        "epochs_done": step == args.epochs * steps_per_epoch,
        "wall": wall,
        "cpu": cpu,
        "wire": wire,
        "counted": counter.bytes,
        "first": first,
        "curve": curve,
        "reached": reached,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    del ddp, opt
    gc.collect()
    return result


def die_with_the_benchmark() -> None:
    """Killed when the benchmark that started this rank dies (even by SIGKILL): a rank
    must not outlive it (the next run deletes its namespaces; Linux only)."""
    parent = int(os.environ.get("Y2_SHAPED_PARENT", "0"))
    if not parent:
        return
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before that
        raise SystemExit("the benchmark that started this rank is gone")


def main(argv: list[str] | None = None) -> None:
    die_with_the_benchmark()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hooks", default=",".join(HOOKS))
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--max-steps", type=int, default=0, help="0: the epochs' steps")
    parser.add_argument("--batch", type=int, default=64, help="samples per step, all ranks")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--split", default="shuffled")
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--stop-at-target", action="store_true")
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--device", required=True, help="the interface this rank sends by")
    parser.add_argument("--shared-device", action="store_true", help="all ranks send by it")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    example = _example()
    counter = CollectiveBytes(world, rank)
    runs = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        data = example.make_data(args.split, seed)
        for hook in args.hooks.split(","):
            mine = train(hook, seed, data, example, args, counter)
            if args.shared_device:  # one counter for every rank's bytes
                mine["wire"] /= world
            ranks: list[Any] = [None] * world if rank == 0 else []
            dist.gather_object(mine, ranks if rank == 0 else None, dst=0)
            if rank == 0:
                runs.append({**mine, "ranks": [{k: r[k] for k in ("wall", "cpu", "wire",
                             "counted", "steps", "first")} for r in ranks]})  # fmt: skip
    if rank == 0:
        print(json.dumps({"world": world, "hidden": args.hidden, "runs": runs}), flush=True)
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
