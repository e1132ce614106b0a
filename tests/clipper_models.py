"""Predict functions for the Clipper runtime tests (also loaded by subprocess containers)."""

from __future__ import annotations

import os
import time

import numpy as np


def describe(inputs):
    """One string per input that shows its content, whatever the input type."""
    out = []
    for x in inputs:
        if isinstance(x, str):
            out.append("s:" + x)
        else:
            a = np.asarray(x)
            out.append(f"{a.dtype.kind}{a.dtype.itemsize}:" + ",".join(repr(v) for v in a.tolist()))
    return out


def total(inputs):
    """2016 outputs are float32: the sum (strings: their length)."""
    return [float(len(x)) if isinstance(x, str) else float(np.sum(x)) for x in inputs]


def slow_describe(inputs):
    """``describe`` after ``WIREKIT_TEST_DELAY`` seconds (default 0.5)."""
    time.sleep(float(os.environ.get("WIREKIT_TEST_DELAY", "0.5")))
    return describe(inputs)


def slow_total(inputs):
    time.sleep(float(os.environ.get("WIREKIT_TEST_DELAY", "0.5")))
    return total(inputs)
