"""Train a small network on 2 CPU processes (gloo) with PyTorch DDP, with and without the y2
communication hook, and print accuracy and bytes exchanged per step.

    torchrun --nproc-per-node 2 examples/y2_ddp_train.py
    torchrun --nproc-per-node 2 examples/y2_ddp_train.py --density 0.05 --y2-log run.y2
    wirekit decode --proto y2 run.y2          # NodeIndex, Runtime per node and epoch, Finished

The data is synthetic with a known answer (offline, no download): 10 Gaussian classes in 32
dimensions whose means are drawn from a fixed seed; the best possible accuracy is printed
(the Bayes classifier knows the means).  Each node trains on its y2 partition of the
training set (``Y2Cluster.shard``) and reports a y2 Runtime record to rank 0 every epoch.

``--json`` prints one JSON line (rank 0) instead of the table, for tests and benchmarks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from wirekit import y2
from wirekit.y2.torch import Y2Cluster, Y2HookState, y2_hook

CLASSES, DIM, HIDDEN = 10, 32, 64


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


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES)
    )


def allreduce_bytes(model: torch.nn.Module, world: int) -> int:
    """Bytes one rank sends per step in a ring all-reduce of fp32 gradients."""
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return math.ceil(2 * (world - 1) / world * 4 * n)


def train(
    hook: str,
    *,
    epochs: int,
    batch: int,
    lr: float,
    density: float,
    tau: float | None,
    data,
    log=None,
) -> dict:
    """Train once (``hook``: "allreduce" or "y2"); rank 0 gets the results."""
    (x, y), (tx, ty), _bayes = data
    cluster = Y2Cluster(log=log)
    part = cluster.shard(len(x))
    x, y = x[part.start : part.stop], y[part.start : part.stop]
    model = make_model()
    ddp = DDP(model)
    state = None
    if hook == "y2":
        state = Y2HookState(ddp, tau=tau, density=density)
        ddp.register_comm_hook(state, y2_hook)
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
    with torch.no_grad():
        accuracy = float((model(tx).argmax(1) == ty).float().mean())
    cluster.finish()
    world = cluster.node.node_count
    sent = state.bytes_sent / steps if state else allreduce_bytes(model, world)
    return {
        "hook": hook,
        "accuracy": accuracy,
        "bytes_per_step": sent,
        "ms_per_step": elapsed / steps * 1000,
        "steps": steps,
        "runtimes": [[r.loss_milli for r in epoch] for epoch in cluster.runtimes],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hooks", default="allreduce,y2", help="comma-separated runs")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="per node")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--density", type=float, default=0.02, help="y2 adaptive tau")
    parser.add_argument("--tau", type=float, default=None, help="y2 fixed tau")
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
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
