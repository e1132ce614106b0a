"""MIP handlers of the OIP gRPC door's tests (``--handler oip_grpc_handlers:NAME``)."""

from __future__ import annotations

from wirekit.mip import Item
from wirekit.oip import OipItem

#: what :func:`refuse_all` answers every sample with
REFUSAL = "the model refuses: no cats (é)"


def refuse_all(batch):
    """A MIP model answering every sample with wirekit's OIP ERROR item: the error message
    the client must read."""
    return [[Item(int(OipItem.ERROR), REFUSAL.encode())] for _ in batch]
