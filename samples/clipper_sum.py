"""A Clipper model for the README's example: ``--handler samples.clipper_sum:predict``.

Run from the checkout's root (the current directory is searched for the module)::

    wirekit clipper container --handler samples.clipper_sum:predict

It answers each input (an array of doubles) with the sum of its numbers, as text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def predict(inputs: Sequence[np.ndarray]) -> list[str]:
    """One output per input: the sum of its numbers."""
    return [str(float(np.sum(x))) for x in inputs]
