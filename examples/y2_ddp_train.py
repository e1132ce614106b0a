"""Train a small network on 2 CPU processes (gloo) with PyTorch DDP, with and without the y2
communication hook, and print accuracy and bytes exchanged per step.

    torchrun --nproc-per-node 2 examples/y2_ddp_train.py
    torchrun --nproc-per-node 2 examples/y2_ddp_train.py --hooks allreduce,fp16,powersgd,y2
    torchrun --nproc-per-node 2 examples/y2_ddp_train.py --density 0.05 --y2-log run.y2
    wirekit decode --proto y2 run.y2          # NodeIndex, Runtime per node and epoch, Finished

The data is synthetic with a known answer (offline, no download): 10 Gaussian classes in 32
dimensions whose means are drawn from a fixed seed; the best possible accuracy is printed
(the Bayes classifier knows the means).  Each node trains on its y2 partition of the
training set (``Y2Cluster.shard``) and reports a y2 Runtime record to rank 0 every epoch.

Hooks: ``allreduce`` (PyTorch's default hook: fp32 all-reduce of the averaged gradient),
``fp16`` (its ``fp16_compress_hook``), ``powersgd`` (its PowerSGD hook, rank 2), ``y2``
(``wirekit.y2.torch``), ``local`` (no exchange at all: each node's compute time alone).
Bytes per step are counted, for every hook, as what one rank sends in ring collectives:
``2 (W - 1) / W × size`` per all-reduce, ``(W - 1) × size`` per all-gather.

``--json`` prints one JSON line (rank 0) instead of the table, for tests and benchmarks.
"""

# No ``from __future__ import annotations``: DDP checks a hook's annotations as objects.
import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from wirekit import y2
from wirekit.y2.torch import Y2Cluster, Y2HookState, y2_hook

CLASSES, DIM, HIDDEN = 10, 32, 64
BUCKET_CAP_MB = 1024


def make_data(n_train: int, n_test: int, noise: float, seed: int = 7):
    """Gaussian classes around fixed means; returns train, test and the Bayes accuracy."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 1, (CLASSES, DIM)).astype(np.float32)

    def draw(n: int):
        y = rng.integers(0, CLASSES, n)
        x = means[y] + rng.normal(0, noise, (n, DIM)).astype(np.float32)
        return torch.from_numpy(x), torch.from_numpy(y)

    train, test = draw(n_train), draw(n_test)
    dists = ((test[0].numpy()[:, None, :] - means[None]) ** 2).sum(-1)
    bayes = float((dists.argmin(1) == test[1].numpy()).mean())
    return train, test, bayes


def make_model(hidden: int = HIDDEN, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, CLASSES),
    )


class ByteCounter:
    """Counts what this rank sends through ``dist.all_reduce`` / ``dist.all_gather`` (the
    collectives the hooks call), as a ring algorithm sends it."""

    def __init__(self) -> None:
        self.bytes = 0.0
        self._reduce, self._gather = dist.all_reduce, dist.all_gather

    def __enter__(self) -> "ByteCounter":
        world = dist.get_world_size()

        def all_reduce(tensor, *args, **kwargs):
            self.bytes += 2 * (world - 1) / world * tensor.numel() * tensor.element_size()
            return self._reduce(tensor, *args, **kwargs)

        def all_gather(outputs, tensor, *args, **kwargs):
            self.bytes += (world - 1) * tensor.numel() * tensor.element_size()
            return self._gather(outputs, tensor, *args, **kwargs)

        dist.all_reduce, dist.all_gather = all_reduce, all_gather
        return self

    def __exit__(self, *exc) -> None:
        dist.all_reduce, dist.all_gather = self._reduce, self._gather


def _local_hook(_state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def register(ddp: DDP, hook: str, density: float, tau: float | None):
    """Register the named hook; the y2 state (or None)."""
    if hook == "y2":
        state = Y2HookState(ddp, tau=tau, density=density)
        ddp.register_comm_hook(state, y2_hook)
        return state
    if hook == "allreduce":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        ps = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2
        )
        ddp.register_comm_hook(ps, powerSGD_hook.powerSGD_hook)
    elif hook == "local":
        ddp.register_comm_hook(None, _local_hook)
    else:
        raise SystemExit(f"unknown hook {hook!r}")
    return None


def train(
    hook: str,
    *,
    epochs: int,
    batch: int,
    lr: float,
    density: float,
    tau: float | None,
    data,
    hidden: int = HIDDEN,
    log=None,
) -> dict:
    """Train once with ``hook``; rank 0 gets the results."""
    (x, y), (tx, ty), _bayes = data
    cluster = Y2Cluster(log=log)
    part = cluster.shard(len(x))
    x, y = x[part.start : part.stop], y[part.start : part.stop]
    model = make_model(hidden)
    # One bucket for every hook (after DDP's first step): with several buckets PowerSGD's
    # callbacks, which all-reduce from callback threads, hang on gloo here.
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    state = register(ddp, hook, density, tau)
    counter = ByteCounter().__enter__()
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    gen = torch.Generator().manual_seed(cluster.node.node_id)
    steps_per_epoch = len(x) // batch
    steps, started = 0, time.perf_counter()
    for _epoch in range(epochs):
        t0 = time.perf_counter()
        c0, a0 = (state.compress_seconds, state.apply_seconds) if state else (0.0, 0.0)
        order = torch.randperm(len(x), generator=gen)
        total = 0.0
        for k in range(steps_per_epoch):
            idx = order[k * batch : (k + 1) * batch]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach())
            steps += 1
        cluster.report(
            y2.Runtime(
                sample_count=steps_per_epoch * batch,
                decompression_ms=round((state.apply_seconds - a0) * 1000) if state else 0,
                training_ms=round((time.perf_counter() - t0) * 1000),
                compression_ms=round((state.compress_seconds - c0) * 1000) if state else 0,
                loss_milli=round(total / max(1, steps_per_epoch) * 1000),
            )
        )
    elapsed = time.perf_counter() - started
    counter.__exit__()
    with torch.no_grad():
        accuracy = float((model(tx).argmax(1) == ty).float().mean())
    cluster.finish()
    per_step = {
        f"{what}_ms_per_step": getattr(state, f"{what}_seconds") / steps * 1000
        for what in ("compress", "exchange", "apply")
        if state
    }
    return {
        "hook": hook,
        "accuracy": accuracy,
        "bytes_per_step": counter.bytes / steps,
        "ms_per_step": elapsed / steps * 1000,
        "steps": steps,
        "parameters": sum(p.numel() for p in model.parameters()),
        **per_step,
        "runtimes": [[r.loss_milli for r in epoch] for epoch in cluster.runtimes],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hooks", default="allreduce,y2", help="comma-separated runs")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="per node")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--density", type=float, default=0.05, help="y2 adaptive tau")
    parser.add_argument("--tau", type=float, default=None, help="y2 fixed tau")
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="hidden layer width")
    parser.add_argument("--train", type=int, default=6000)
    parser.add_argument("--noise", type=float, default=1.6)
    parser.add_argument("--y2-log", default=None, help="rank 0 writes y2 messages here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    data = make_data(args.train, 2000, args.noise)
    results = []
    log = open(args.y2_log, "wb") if args.y2_log and dist.get_rank() == 0 else None  # noqa: SIM115
    try:
        for hook in args.hooks.split(","):
            results.append(
                train(
                    hook,
                    epochs=args.epochs,
                    batch=args.batch,
                    lr=args.lr,
                    density=args.density,
                    tau=args.tau,
                    data=data,
                    hidden=args.hidden,
                    log=log if hook == "y2" else None,
                )
            )
    finally:
        if log is not None:
            log.close()
    if dist.get_rank() == 0:
        if args.json:
            print(json.dumps({"bayes_accuracy": data[2], "runs": results}))
        else:
            print(f"best possible accuracy (Bayes): {data[2]:.3f}")
            print(f"{'hook':10} {'accuracy':>8} {'bytes/step':>11} {'ms/step':>8}")
            for r in results:
                print(
                    f"{r['hook']:10} {r['accuracy']:8.3f} {r['bytes_per_step']:11.0f} "
                    f"{r['ms_per_step']:8.2f}"
                )
    # Every rank through with the group before any tears it down: a rank that destroyed
    # its gloo group and exited while the other still held the connection aborted once
    # ("terminate called without an active exception", SIGABRT) in about 30 CI runs.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
