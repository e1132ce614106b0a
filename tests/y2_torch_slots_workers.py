"""Per-rank bodies for tests/test_y2_torch_slots.py (the ``slots`` exchange), run by
``y2_torch_workers.run("y2_torch_slots_workers:BODY", ...)``."""

from __future__ import annotations

from typing import Any

import y2_torch_workers as workers


def tight_slots(rank: int, world: int, steps: int, tau: float | None) -> dict[str, Any]:
    """``hook_steps`` with the ``slots`` exchange and slots as small as they go (one word,
    no slack) after the first step: most words and sums wait in the residuals."""
    import wirekit.y2.torch as y2_torch

    y2_torch.SLOT_SLACK, y2_torch.SLOT_SIGMAS, y2_torch.SLOT_MIN = 0.0, 0.0, 1
    return workers.hook_steps(
        rank, world, tau=tau, steps=steps, bucket_cap_mb=25.0, exchange="slots"
    )


def bad_slots_peer(rank: int, world: int, corrupt: str) -> str | None:
    """Rank 1 breaks one part of its first ``slots`` exchange (fixed tau 1e-6: every
    element sends a word): in its slot for rank 0 ``count`` (its word count), ``next``
    (its next slot), ``tau`` (NaN) or ``word`` (its first word addresses nothing); in its
    sums block to every rank ``sums`` (the nonzero count) or ``next`` (``bound``: the next
    block's size).  The error text by rank (None: the step went through)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from wirekit.y2.torch import SLOT_HEAD, SUMS_HEAD, Y2HookState, y2_hook

    real_all_to_all = dist.all_to_all_single

    def all_to_all_single(output, tensor, out_sizes, in_sizes, *args, **kwargs):
        if rank == 1 and tensor.dtype == torch.int32:  # the slots: rank 0's first
            tensor = tensor.clone()
            if corrupt == "count":
                tensor[0] = 10**6
            elif corrupt == "next":
                tensor[1] = 10**6
            elif corrupt == "tau":
                tensor[2:SLOT_HEAD] = torch.tensor([float("nan")], dtype=torch.float64).view(
                    torch.int32
                )
            elif corrupt == "word":
                tensor[SLOT_HEAD] = -1  # 0xffffffff: layer 511
        if rank == 1 and tensor.dtype == torch.uint8 and corrupt in ("sums", "bound"):
            tensor = tensor.clone().view(world, -1)
            at = SUMS_HEAD if corrupt == "sums" else 0
            value = 1000 if corrupt == "sums" else 4 * 10**9
            tensor[:, at : at + 4] = torch.tensor(
                list(value.to_bytes(4, "little")), dtype=torch.uint8
            )
            tensor = tensor.view(-1)
        return real_all_to_all(output, tensor, out_sizes, in_sizes, *args, **kwargs)

    dist.all_to_all_single = all_to_all_single
    model = workers.small_model()
    ddp = DDP(model)
    ddp.register_comm_hook(Y2HookState(ddp, tau=1e-6, exchange="slots"), y2_hook)
    try:
        ddp(torch.ones(2, 5)).sum().backward()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        dist.all_to_all_single = real_all_to_all
    return None
