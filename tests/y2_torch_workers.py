"""Process helpers for the y2 torch tests: a bounded gloo launcher on 127.0.0.1 and the
per-rank bodies (importable by spawned children: tests/ is on their sys.path)."""

from __future__ import annotations

import copy
import gc
import multiprocessing
import os
import pickle
import socket
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

#: Seconds a whole multi-process run may take before its processes are killed.
RUN_TIMEOUT = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        result = globals()[body](rank, world, **kwargs)
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
):
    """A few backward passes with the y2 hook (weights fixed); per step the local gradients
    (from an unwrapped copy), the hook's averaged gradients and every rank's words.
    ``capacity``: (CAPACITY_SLACK, CAPACITY_MIN) to use instead of the defaults."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import wirekit.y2.torch as y2_torch
    from wirekit.y2.torch import Y2HookState, y2_hook

    if capacity is not None:
        y2_torch.CAPACITY_SLACK, y2_torch.CAPACITY_MIN = capacity

    model = small_model()
    local = copy.deepcopy(model)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    state = Y2HookState(ddp, tau=tau, density=0.25, record=True)
    ddp.register_comm_hook(state, y2_hook)
    record = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 5, generator=gen) * (1 + step)
        ddp.zero_grad()
        ddp(x).pow(2).sum().backward()
        local.zero_grad()
        local(x).pow(2).sum().backward()
        record.append(
            {
                "local": [p.grad.numpy().ravel().copy() for p in local.parameters()],
                "averaged": [p.grad.numpy().ravel().copy() for p in model.parameters()],
                "exchange": {k: [(w.copy(), t) for w, t in v] for k, v in state.last_words.items()},
            }
        )
    return {
        "steps": record,
        "bytes_sent": state.bytes_sent,
        "words_sent": state.words_sent,
        "capacity": state.capacity(39),
        "residuals": [state.residual(p).copy() for p in model.parameters()],
    }


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
    ddp.register_comm_hook(Y2HookState(ddp, tau=tau), y2_hook)
    try:
        ddp(torch.ones(2, 5)).sum().backward()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        dist.all_gather = real
    return None
