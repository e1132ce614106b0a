"""Process helpers for the y2 torch tests: a bounded gloo launcher on 127.0.0.1 and the
per-rank bodies (importable by spawned children: tests/ is on their sys.path)."""

from __future__ import annotations

import copy
import gc
import importlib
import multiprocessing
import os
import pickle
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from support.ports import free_port

#: Seconds a whole multi-process run may take before its processes are killed.
RUN_TIMEOUT = 240


def _child(rank: int, world: int, port: int, body: str, out: str, kwargs: dict) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=60),
        )
        module, _, name = body.rpartition(":")  # "module:body" for another module's body
        function = getattr(importlib.import_module(module), name) if module else globals()[body]
        result = function(rank, world, **kwargs)
        gc.collect()  # free the DDP wrappers (and their use of the group) before it goes
        dist.destroy_process_group()
        Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    except BaseException:
        Path(out, f"rank{rank}.err").write_text(traceback.format_exc())
        raise


def run(body: str, out: Path, world: int = 2, **kwargs: Any) -> list[Any]:
    """Run ``body(rank, world, **kwargs)`` on ``world`` gloo processes; their results by rank.

    Bounded by ``RUN_TIMEOUT``: stragglers are killed and the run fails.
    """
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=_child, args=(r, world, port, body, str(out), kwargs))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(RUN_TIMEOUT)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    errors = [f.read_text() for f in sorted(out.glob("rank*.err"))]
    assert not errors, "\n".join(errors)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return [pickle.loads(Path(out, f"rank{r}.pkl").read_bytes()) for r in range(world)]


# --- bodies ---------------------------------------------------------------------------------


def small_model():
    import torch

    class Gain(torch.nn.Module):  # a parameter that is neither a weight nor a bias
        def __init__(self) -> None:
            super().__init__()
            self.gain = torch.nn.Parameter(torch.linspace(0.5, 1.5, 3))

        def forward(self, x):
            return x * self.gain

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 4),
        torch.nn.Tanh(),
        torch.nn.Linear(4, 3, bias=False),
        Gain(),
    )


def hook_steps(
    rank: int,
    world: int,
    tau: float | None,
    steps: int,
    bucket_cap_mb: float,
    capacity: tuple[float, int] | None = None,
    exchange: str = "all-gather",
):
    """A few backward passes with the y2 hook (weights fixed); per step the local gradients
    (from an unwrapped copy), the hook's averaged gradients and the words this rank received
    (every rank's with ``all-gather``).  ``capacity``: (CAPACITY_SLACK, CAPACITY_MIN) to use
    instead of the defaults."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import wirekit.y2.torch as y2_torch
    from wirekit.y2.torch import Y2HookState, y2_hook

    if capacity is not None:
        y2_torch.CAPACITY_SLACK, y2_torch.CAPACITY_MIN = capacity

    model = small_model()
    local = copy.deepcopy(model)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    state = Y2HookState(ddp, tau=tau, density=0.25, record=True, exchange=exchange)
    number = {id(p): i for i, p in enumerate(model.parameters())}
    buckets: list[list[int]] = []

    def hook(state, bucket):  # y2's, noting the parameters' order in the bucket
        buckets.append([number[id(p)] for p in bucket.parameters()])
        return y2_hook(state, bucket)

    ddp.register_comm_hook(state, hook)
    counter = ByteCounter(rank, world)
    record = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 5, generator=gen) * (1 + step)
        ddp.zero_grad()
        with counter:
            ddp(x).pow(2).sum().backward()
        local.zero_grad()
        local(x).pow(2).sum().backward()
        record.append(
            {
                "local": [p.grad.numpy().ravel().copy() for p in local.parameters()],
                "averaged": [p.grad.numpy().ravel().copy() for p in model.parameters()],
                "exchange": {k: [(w.copy(), t) for w, t in v] for k, v in state.last_words.items()},
                "bucket": buckets[-1],
            }
        )
    return {
        "steps": record,
        "bytes_sent": state.bytes_sent,
        "bytes_counted": counter.bytes,
        "words_sent": state.words_sent,
        "capacity": state.capacity(39),
        "residuals": [state.residual(p).copy() for p in model.parameters()],
    }


class ByteCounter:
    """Counts the bytes this rank hands to ``dist.all_gather`` and ``dist.all_to_all_single``
    for the other ranks (what a ring all-gather and a direct all-to-all send), while entered."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world, self.bytes = rank, world, 0

    def __enter__(self) -> ByteCounter:
        import torch.distributed as dist

        self._saved = dist.all_gather, dist.all_to_all_single
        gather, all_to_all = self._saved

        def all_gather(outputs, tensor, *args, **kwargs):
            self.bytes += (self.world - 1) * tensor.numel() * tensor.element_size()
            return gather(outputs, tensor, *args, **kwargs)

        def all_to_all_single(output, tensor, out_sizes, in_sizes, *args, **kwargs):
            self.bytes += (sum(in_sizes) - in_sizes[self.rank]) * tensor.element_size()
            return all_to_all(output, tensor, out_sizes, in_sizes, *args, **kwargs)

        dist.all_gather, dist.all_to_all_single = all_gather, all_to_all_single
        return self

    def __exit__(self, *exc: object) -> None:
        import torch.distributed as dist

        dist.all_gather, dist.all_to_all_single = self._saved


def byte_scaling(rank: int, world: int, steps: int, hidden: int):
    """The bytes one rank sends per step with each exchange (counted at the collectives and
    by the state) and PyTorch's all-reduce (its ring: ``2 (W - 1) / W`` of the gradient)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from wirekit.y2.torch import EXCHANGES, Y2HookState, y2_hook

    out: dict[str, Any] = {}
    for exchange in EXCHANGES:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
        )
        ddp = DDP(model, bucket_cap_mb=1024)
        state = Y2HookState(ddp, exchange=exchange)
        ddp.register_comm_hook(state, y2_hook)
        counter = ByteCounter(rank, world)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(steps):
            x = torch.randn(32, 64, generator=gen)
            y = torch.randint(0, 10, (32,), generator=gen)
            ddp.zero_grad()
            with counter:
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
        n = sum(p.numel() for p in model.parameters())
        out[exchange] = {"counted": counter.bytes / steps, "state": state.bytes_sent / steps}
        out["allreduce"] = 2 * (world - 1) / world * 4 * n
        del ddp, state
        gc.collect()
    return out


def cluster_roles(rank: int, world: int, log_path: str, n: int):
    """Y2Cluster on its own: NodeIndex, shard, two epochs of Runtime, a Delta, Finished."""
    import numpy as np

    from wirekit import y2
    from wirekit.y2.torch import Y2Cluster

    with open(log_path, "wb") if rank == 0 else open(os.devnull, "wb") as log:
        cluster = Y2Cluster(log=log)
        shard = cluster.shard(n)
        reports = [
            cluster.report(y2.Runtime(len(shard), rank, 100 * epoch + rank, 7, -5 * rank))
            for epoch in range(2)
        ]
        cluster.log_delta([np.array([0x01C00055, rank], np.uint32)])
        cluster.finish()
    return {"node": cluster.node, "shard": (shard.start, shard.stop), "reports": reports}


def bad_peer(rank: int, world: int, corrupt: int, value: float, tau: float | None = 0.5):
    """Rank 1 announces a bad (word count, tau): field ``corrupt`` set to ``value``.  Every
    rank's hook raises before the words are exchanged; the error text by rank."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from wirekit.y2.torch import Y2HookState, y2_hook

    real = dist.all_gather

    def all_gather(outputs, tensor, *args, **kwargs):
        if rank == 1 and tensor.dtype == torch.float64:  # (count, tau)
            tensor = tensor.clone()
            tensor[corrupt] = value
        if rank == 1 and tensor.dtype == torch.int32 and tau is None:  # a one-block exchange
            tensor = tensor.clone()
            tensor[corrupt] = int(value)
        return real(outputs, tensor, *args, **kwargs)

    dist.all_gather = all_gather
    model = small_model()
    ddp = DDP(model)
    ddp.register_comm_hook(Y2HookState(ddp, tau=tau, exchange="all-gather"), y2_hook)
    try:
        ddp(torch.ones(2, 5)).sum().backward()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        dist.all_gather = real
    return None


def bad_reduce_scatter_peer(rank: int, world: int, corrupt: str):
    """Rank 1 breaks one part of the reduce-scatter exchange (fixed tau: every element sends
    a word): ``count`` (its word count for range 0), ``word`` (its first word for rank 0
    addresses nothing), ``order`` (its second word for rank 0 repeats the first), ``sums``
    (the nonzero count of its sums block, to every rank) or, with the adaptive tau, ``tau``
    (its tau 1e308, beyond float32).  The error text by rank (None:
    the step went through)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from wirekit.y2.torch import Y2HookState, y2_hook

    real_gather, real_all_to_all = dist.all_gather, dist.all_to_all_single

    def all_gather(outputs, tensor, *args, **kwargs):
        if rank == 1 and corrupt == "count" and tensor.dtype == torch.int64:
            tensor = tensor.clone()
            tensor[0] = 10**6
        if rank == 1 and corrupt == "tau" and tensor.dtype == torch.int64:
            tensor = tensor.clone()
            tensor[-1] = torch.tensor([1e308], dtype=torch.float64).view(torch.int64)[0]
        return real_gather(outputs, tensor, *args, **kwargs)

    def all_to_all_single(output, tensor, out_sizes, in_sizes, *args, **kwargs):
        if rank == 1 and tensor.dtype == torch.int32 and corrupt == "word":
            tensor = tensor.clone()
            tensor[0] = -1  # 0xffffffff: layer 511
        if rank == 1 and tensor.dtype == torch.int32 and corrupt == "order":
            tensor = tensor.clone()
            tensor[1] = tensor[0]
        if rank == 1 and tensor.dtype == torch.uint8 and corrupt == "sums":
            tensor = tensor.clone().view(world, -1)
            tensor[:, :4] = torch.tensor([0xE8, 0x03, 0, 0], dtype=torch.uint8)  # 1000
            tensor = tensor.view(-1)
        return real_all_to_all(output, tensor, out_sizes, in_sizes, *args, **kwargs)

    dist.all_gather, dist.all_to_all_single = all_gather, all_to_all_single
    model = small_model()
    ddp = DDP(model)
    tau = None if corrupt == "tau" else 1e-6  # the adaptive tau: each rank its own
    ddp.register_comm_hook(Y2HookState(ddp, tau=tau, exchange="reduce-scatter"), y2_hook)
    try:
        ddp(torch.ones(2, 5)).sum().backward()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        dist.all_gather, dist.all_to_all_single = real_gather, real_all_to_all
    return None
