"""Import the user code a runtime serves: ``package.module:function``."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def load_callable(spec: str) -> Any:
    """Import ``package.module:function`` (``function`` may be dotted, e.g. ``Cls.method``).

    The current directory is searched too (first), as uvicorn and gunicorn do, so
    ``--handler mymod:fn`` finds ``./mymod.py`` without ``PYTHONPATH=.``.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected package.module:function, got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec} is not callable")
    return obj
