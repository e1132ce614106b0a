"""A bounded gloo launcher and the per-rank bodies of tests/test_y2_convergence.py
(importable by spawned children: tests/ is on their sys.path)."""

from __future__ import annotations

import gc
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
        result = globals()[body](rank, world, **kwargs)
        gc.collect()  # free the DDP wrappers (and their use of the group) before it goes
        dist.destroy_process_group()
        Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    except BaseException:
        Path(out, f"rank{rank}.err").write_text(traceback.format_exc())
        raise


def run(body: str, out: Path, world: int = 2, **kwargs: Any) -> list[Any]:
    """Run ``body(rank, world, **kwargs)`` on ``world`` gloo processes; their results by
    rank.  Bounded by ``RUN_TIMEOUT``: stragglers are killed and the run fails."""
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


def option_steps(rank: int, world: int, steps: int, **options: Any) -> dict:
    """A few backward passes of the small model with the y2 hook and ``options`` (weights
    fixed); per step this rank's local gradients, the averaged ones DDP got, the words this
    rank received and its residuals and velocities after the step."""
    import copy

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from y2_torch_workers import ByteCounter, small_model

    from wirekit.y2.torch import Y2HookState, y2_hook

    model = small_model()
    local = copy.deepcopy(model)
    ddp = DDP(model, bucket_cap_mb=25.0)
    state = Y2HookState(ddp, record=True, exchange="all-gather", **options)
    ddp.register_comm_hook(state, y2_hook)
    counter = ByteCounter(rank, world)
    record = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 5, generator=gen) * (1 + step)
        ddp.zero_grad()
        bytes_before = state.bytes_sent
        with counter:
            ddp(x).pow(2).sum().backward()
        local.zero_grad()
        local(x).pow(2).sum().backward()
        velocities = [state.velocity(p) for p in model.parameters()]
        record.append(
            {
                "local": [p.grad.numpy().ravel().copy() for p in local.parameters()],
                "averaged": [p.grad.numpy().ravel().copy() for p in model.parameters()],
                "words": {k: [(w.copy(), t) for w, t in v] for k, v in state.last_words.items()},
                "residuals": [state.residual(p).copy() for p in model.parameters()],
                "velocities": [None if v is None else v.copy() for v in velocities],
                "bytes": state.bytes_sent - bytes_before,
            }
        )
    return {"steps": record, "bytes_counted": counter.bytes, "bytes_sent": state.bytes_sent}
