"""MIP handlers that speak the Open Inference Protocol mapping, for the OIP door tests'
backends (``wirekit mip serve --handler oip_handlers:NAME``)."""

from __future__ import annotations

from wirekit import oip

#: what :func:`model_error` answers: a message a client must read back intact
MODEL_ERROR_MESSAGE = 'the model refuses: input "x" is not a cat (ünïcode, "quotes", 100%)'


def model_error(batch):
    """Every sample answered with the OIP ERROR item of :data:`MODEL_ERROR_MESSAGE`."""
    items = list(oip.error_to_mip(MODEL_ERROR_MESSAGE).items)
    return [items for _sample in batch]
