"""Train a small network on CPU processes (gloo) with PyTorch DDP, with and without the y2
communication hook, and print test accuracy and bytes exchanged per step.

    torchrun --nproc-per-node 2 examples/y2_ddp_train.py
    torchrun --nproc-per-node 8 examples/y2_ddp_train.py --hooks allreduce,fp16,powersgd,y2
    torchrun --nproc-per-node 4 examples/y2_ddp_train.py --split sorted --seeds 0,1,2
    torchrun --nproc-per-node 2 examples/y2_ddp_train.py --density 0.05 --y2-log run.y2
    wirekit decode --proto y2 run.y2          # NodeIndex, Runtime per node and epoch, Finished

The data is scikit-learn's ``digits`` (1797 8×8 images of handwritten digits, shipped inside
the scikit-learn wheel: no download), split once into a training set and a held-out test set
(``TEST_FRACTION``, the same for every seed).  Each node trains on its y2 partition of the
training set (``Y2Cluster.shard``) in one of two orders: ``--split shuffled`` (the training set
shuffled by the seed first: every node sees every class) or ``--split sorted`` (sorted by
label first: each node sees only a few classes, so a node that does not exchange learns only
those and the accuracy shows whether the exchange works).  Each node reports a y2 Runtime
record to rank 0 every epoch.

Hooks: ``allreduce`` (PyTorch's default hook: fp32 all-reduce of the averaged gradient),
``fp16`` (its ``fp16_compress_hook``), ``powersgd`` (its PowerSGD hook, rank 2), ``y2``
(``wirekit.y2.torch`` at its defaults: the two-collective ``slots`` exchange),
``y2-reduce-scatter`` and ``y2-all-gather`` (the same with those exchanges), ``local`` (no
exchange at all: each node trains its own model; rank 0's is tested).  ``--seeds`` runs
every hook once per seed (model initialisation, batch order, the shuffled split); every run
restarts from scratch.

Bytes per step, two ways:

* ``bytes_per_step`` counts what one rank hands to the collectives the hooks call, as ring
  algorithms send it: ``2 (W - 1) / W × size`` per all-reduce, ``(W - 1) × size`` per
  all-gather, the parts for other ranks per all-to-all;
* ``wire_bytes_per_step`` (with ``--netns``: the caller promises that this run has a network
  namespace of its own, e.g. under ``unshare -n``) is what really crossed the loopback
  interface during training (``/proc/net/dev``, TCP/IP headers included), divided by the
  number of ranks and of steps: gloo's own algorithms, not a formula.

``--json`` prints one JSON line (rank 0) instead of the table, for tests and benchmarks.
"""

# No ``from __future__ import annotations``: DDP checks a hook's annotations as objects.
import argparse
import gc
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from wirekit import y2
from wirekit.y2.torch import Y2Cluster, Y2HookState, y2_hook

CLASSES, DIM, HIDDEN = 10, 64, 128
#: Part of ``digits`` held out for the test accuracy (split once, with ``SPLIT_SEED``).
TEST_FRACTION = 0.25
SPLIT_SEED = 1797
BUCKET_CAP_MB = 1024


def make_data(split: str, seed: int):
    """digits scaled to [0, 1]: ``((x, y) train, (x, y) test)``, the training set in the
    order the nodes partition it (``split``: ``shuffled`` by ``seed`` or ``sorted`` by
    label); the test set is the same for every seed."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_test = round(len(x) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    if split == "shuffled":
        train = np.random.default_rng(seed).permutation(train)
    elif split == "sorted":
        train = train[np.argsort(y[train], kind="stable")]
    else:
        raise SystemExit(f"unknown split {split!r}")

    def pick(idx: np.ndarray):
        return torch.from_numpy(x[idx]), torch.from_numpy(y[idx])

    return pick(train), pick(test)


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
    """Counts what this rank sends through ``dist.all_reduce`` / ``dist.all_gather`` /
    ``dist.all_to_all_single`` (the collectives the hooks call), as a ring algorithm (or, for
    all-to-all, a direct exchange) sends it."""

    def __init__(self) -> None:
        self.bytes = 0.0
        self._saved = (dist.all_reduce, dist.all_gather, dist.all_to_all_single)

    def __enter__(self) -> "ByteCounter":
        world, rank = dist.get_world_size(), dist.get_rank()
        reduce, gather, all_to_all = self._saved

        def all_reduce(tensor, *args, **kwargs):
            self.bytes += 2 * (world - 1) / world * tensor.numel() * tensor.element_size()
            return reduce(tensor, *args, **kwargs)

        def all_gather(outputs, tensor, *args, **kwargs):
            self.bytes += (world - 1) * tensor.numel() * tensor.element_size()
            return gather(outputs, tensor, *args, **kwargs)

        def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None,
                              *args, **kwargs):  # fmt: skip
            row = tensor.element_size() * (tensor[0].numel() if tensor.dim() > 1 else 1)
            if input_split_sizes is None:
                self.bytes += (world - 1) / world * tensor.numel() * tensor.element_size()
            else:
                self.bytes += (sum(input_split_sizes) - input_split_sizes[rank]) * row
            return all_to_all(output, tensor, output_split_sizes, input_split_sizes,
                              *args, **kwargs)  # fmt: skip

        dist.all_reduce, dist.all_gather, dist.all_to_all_single = (
            all_reduce,
            all_gather,
            all_to_all_single,
        )
        return self

    def __exit__(self, *exc) -> None:
        dist.all_reduce, dist.all_gather, dist.all_to_all_single = self._saved


def loopback_bytes() -> int:
    """Bytes sent on ``lo`` so far (this network namespace's ``/proc/net/dev``)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, fields = line.partition(":")
            if name.strip() == "lo":
                return int(fields.split()[8])
    raise SystemExit("no loopback interface in /proc/net/dev")


def _local_hook(_state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def register(ddp: DDP, hook: str, density: float, tau: float | None):
    """Register the named hook; the y2 state (or None)."""
    if hook in ("y2", "y2-all-gather", "y2-reduce-scatter"):
        exchange = {"y2": "slots"}.get(hook, hook[3:])
        state = Y2HookState(ddp, tau=tau, density=density, exchange=exchange)
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
    seed: int = 0,
    hidden: int = HIDDEN,
    netns: bool = False,
    log=None,
) -> dict:
    """Train once with ``hook`` (``batch`` samples per step over all nodes); rank 0 gets
    the results."""
    (x, y), (tx, ty) = data
    cluster = Y2Cluster(log=log)
    part = cluster.shard(len(x))
    x, y = x[part.start : part.stop], y[part.start : part.stop]
    model = make_model(hidden, seed)
    # One bucket for every hook (after DDP's first step): with several buckets PowerSGD's
    # callbacks, which all-reduce from callback threads, hang on gloo here.
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    state = register(ddp, hook, density, tau)
    node_batch = max(1, batch // cluster.node.node_count)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 * seed + cluster.node.node_id)
    steps_per_epoch = len(x) // node_batch
    dist.barrier()
    wire0 = loopback_bytes() if netns else 0
    counter = ByteCounter().__enter__()
    steps, started = 0, time.perf_counter()
    for _epoch in range(epochs):
        t0 = time.perf_counter()
        c0, a0 = (state.compress_seconds, state.apply_seconds) if state else (0.0, 0.0)
        order = torch.randperm(len(x), generator=gen)
        total = 0.0
        for k in range(steps_per_epoch):
            idx = order[k * node_batch : (k + 1) * node_batch]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach())
            steps += 1
        counter.__exit__()  # the Runtime reports are not the hook's traffic
        elapsed = time.perf_counter() - t0
        cluster.report(
            y2.Runtime(
                sample_count=steps_per_epoch * node_batch,
                decompression_ms=round((state.apply_seconds - a0) * 1000) if state else 0,
                training_ms=round(elapsed * 1000),
                compression_ms=round((state.compress_seconds - c0) * 1000) if state else 0,
                loss_milli=round(total / max(1, steps_per_epoch) * 1000),
            )
        )
        counter.__enter__()
    counter.__exit__()
    elapsed = time.perf_counter() - started
    dist.barrier()
    wire = (loopback_bytes() - wire0) / cluster.node.node_count if netns else None
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
        "seed": seed,
        "accuracy": accuracy,
        "bytes_per_step": counter.bytes / steps,
        # the Runtime reports' gather and the barriers are in it too (a few hundred bytes an
        # epoch): small against any hook's traffic
        "wire_bytes_per_step": None if wire is None else wire / steps,
        "ms_per_step": elapsed / steps * 1000,
        "steps": steps,
        "parameters": sum(p.numel() for p in model.parameters()),
        **per_step,
        "runtimes": [[r.loss_milli for r in epoch] for epoch in cluster.runtimes],
        "y2_words_per_step": state.words_sent / steps if state else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hooks", default="allreduce,y2", help="comma-separated runs")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="samples per step, all nodes")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--density", type=float, default=0.05, help="y2 adaptive tau")
    parser.add_argument("--tau", type=float, default=None, help="y2 fixed tau")
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="hidden layer width")
    parser.add_argument("--split", default="shuffled", help="shuffled or sorted (by label)")
    parser.add_argument("--seeds", default="0", help="comma-separated: one run per seed")
    parser.add_argument(
        "--netns", action="store_true", help="this run has its own network namespace"
    )
    parser.add_argument("--y2-log", default=None, help="rank 0 writes y2 messages here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    results = []
    log = open(args.y2_log, "wb") if args.y2_log and dist.get_rank() == 0 else None  # noqa: SIM115
    try:
        for seed in [int(s) for s in args.seeds.split(",")]:
            data = make_data(args.split, seed)
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
                        seed=seed,
                        hidden=args.hidden,
                        netns=args.netns,
                        log=log if hook == "y2" else None,
                    )
                )
    finally:
        if log is not None:
            log.close()
    if dist.get_rank() == 0:
        world = dist.get_world_size()
        if args.json:
            print(json.dumps({"world": world, "split": args.split, "runs": results}))
        else:
            print(f"digits, {world} ranks, {args.split} split")
            print(
                f"{'hook':10} {'seed':>4} {'accuracy':>8} {'bytes/step':>11} "
                f"{'wire/step':>11} {'ms/step':>8}"
            )
            for r in results:
                wire = r["wire_bytes_per_step"]
                print(
                    f"{r['hook']:10} {r['seed']:4} {r['accuracy']:8.3f} "
                    f"{r['bytes_per_step']:11.0f} {'-' if wire is None else f'{wire:.0f}':>11} "
                    f"{r['ms_per_step']:8.2f}"
                )
    # Every rank through with the group before any tears it down: a rank that destroyed
    # its gloo group and exited while the other still held the connection aborted once
    # ("terminate called without an active exception", SIGABRT) in about 30 CI runs.  The
    # DDP wrappers of the runs go first (a hook's state and its wrapper can hold each other
    # until a garbage collection, and with them the group's work).
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
