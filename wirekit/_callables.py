"""Import the user code a runtime serves: ``package.module:function``."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


class CallableLoadError(ValueError):
    """The user code named by ``package.module:function`` could not be loaded: the message
    says which part failed (the module's import, with its file and line for a syntax error, a
    missing attribute, an object that is not callable).  A ``ValueError``, so every command
    reports it as one usage-error line, not a traceback."""


def load_callable(spec: str) -> Any:
    """Import ``package.module:function`` (``function`` may be dotted, e.g. ``Cls.method``).

    The current directory is searched too (first), as uvicorn and gunicorn do, so
    ``--handler mymod:fn`` finds ``./mymod.py`` without ``PYTHONPATH=.``.  Any failure is a
    :class:`CallableLoadError`: the user's module may raise anything while it is imported.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CallableLoadError(f"expected package.module:function, got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else module_name
        raise CallableLoadError(
            f"cannot import {module_name}: syntax error at {where}: {exc.msg}"
        ) from None
    except ModuleNotFoundError as exc:
        raise CallableLoadError(f"cannot import {module_name}: {exc}") from None
    except Exception as exc:  # the module's own top-level code failed
        raise CallableLoadError(
            f"cannot import {module_name}: {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CallableLoadError(f"{module_name} has no {attr}") from None
    if not callable(obj):
        raise CallableLoadError(f"{spec} is not callable")
    return obj
