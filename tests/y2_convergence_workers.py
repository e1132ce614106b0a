"""The per-rank bodies of tests/test_y2_convergence.py, run by tests/y2_torch_workers.py's
launcher as ``"y2_convergence_workers:BODY"`` (importable by spawned children: tests/ is on
their sys.path)."""

from __future__ import annotations

from typing import Any


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
