"""The one place that decides which implementation wirekit uses.

``WIREKIT_PURE`` is read here and only here, by ``setup.py`` at build time (it loads this
file directly, without importing the package) and by the protocol facades at import time.
This module uses the standard library only, so the build can load it before anything is
installed.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

ENV_VAR = "WIREKIT_PURE"
#: Set (to 1) where a pure fallback would make results wrong rather than slow -- the
#: benchmarks set it for themselves and every process they start: a compiled twin that does
#: not load then raises :class:`FastPathRequired` instead of warning.
REQUIRE_ENV_VAR = "WIREKIT_REQUIRE_FAST"
_TRUE = {"1", "true", "yes", "on"}


def pure_requested(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``WIREKIT_PURE`` asks for the pure-Python path (build nothing, load nothing)."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return value.strip().lower() in _TRUE


def fast_required(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``WIREKIT_REQUIRE_FAST`` forbids falling back to the pure path."""
    value = (os.environ if environ is None else environ).get(REQUIRE_ENV_VAR, "")
    return value.strip().lower() in _TRUE


class FastPathMissing(RuntimeWarning):
    """Warned once per module when a Cython twin is missing and the pure path is used."""


class FastPathRequired(ImportError):
    """A compiled twin did not load while ``WIREKIT_REQUIRE_FAST`` was set."""


_loaded: dict[str, ModuleType | None] = {}
_warned: set[tuple[str, str]] = set()


def fallback(name: str, reason: str, *, stacklevel: int = 3) -> None:
    """Warn (:class:`FastPathMissing`) that the pure path of ``wirekit._fast.<name>`` is
    used although the compiled one was not declined (``WIREKIT_PURE`` unset), because of
    ``reason``.  Every fallback goes through here: the extension is not built, or a runtime
    cannot use it (for instance a library it binds to was not found).  Warned once per
    name and reason; raised as :class:`FastPathRequired` when ``WIREKIT_REQUIRE_FAST`` is
    set."""
    if fast_required():
        raise FastPathRequired(
            f"wirekit: compiled twin wirekit._fast.{name} is not used ({reason}), and "
            f"{REQUIRE_ENV_VAR} is set. Is the imported wirekit "
            f"({os.path.dirname(__file__)}) an uncompiled source tree? Build it "
            "(pip install -e .) or run from another directory."
        )
    if (name, reason) in _warned:
        return
    _warned.add((name, reason))
    warnings.warn(
        f"wirekit: compiled twin wirekit._fast.{name} is not used ({reason}); "
        f"using the pure-Python path, which is much slower.{_source_tree_hint()} "
        f"Set {ENV_VAR}=1 to choose it explicitly.",
        FastPathMissing,
        stacklevel=stacklevel,
    )


def _source_tree_hint() -> str:
    """When the imported wirekit is a source checkout's folder (``setup.py`` beside it): the
    sentence that says so and how to get its compiled twins."""
    package = os.path.dirname(os.path.abspath(__file__))
    checkout = os.path.dirname(package)
    if not os.path.isfile(os.path.join(checkout, "setup.py")):
        return ""
    return (
        f" The wirekit imported is the source tree {package}, not built: install it with "
        f"`pip install -e .` in {checkout}, or run from another directory to import an "
        "installed wirekit."
    )


def load_fast(name: str) -> ModuleType | None:
    """Import ``wirekit._fast.<name>``, or return None for the pure path.

    None is returned silently when the pure path was requested, and with a
    :class:`FastPathMissing` warning (:func:`fallback`) when the extension is not built.
    """
    if pure_requested():
        return None
    if name in _loaded:
        return _loaded[name]
    try:
        module: ModuleType | None = importlib.import_module(f"wirekit._fast.{name}")
    except ImportError as exc:
        module = None
        fallback(name, f"not available: {exc}", stacklevel=4)
    _loaded[name] = module
    return module


def load_fast_bound(name: str, bind: Callable[[ModuleType], object]) -> ModuleType | None:
    """:func:`load_fast`, then ``bind(module)``: the twin's hookup at run time (to a C
    library found while running).  When that fails (ImportError or OSError, saying why) the
    pure path is used, with a :class:`FastPathMissing` warning (:func:`fallback`) giving the
    reason."""
    module = load_fast(name)
    if module is None:
        return None
    try:
        bind(module)
    except (ImportError, OSError) as exc:
        fallback(name, f"cannot be used here: {exc}", stacklevel=4)
        return None
    return module


def select(name: str, pure: ModuleType) -> ModuleType:
    """The module that implements ``pure``'s API: ``wirekit._fast.<name>`` unless
    ``WIREKIT_PURE`` is set, else (or, with a warning, when it is not built) ``pure``.
    Codecs (through :func:`lazy_codec`) and runtimes pick their twin with this."""
    fast = load_fast(name)
    return pure if fast is None else fast


def lazy_codec(
    namespace: dict[str, Any], protocol: str, pure: ModuleType, api: tuple[str, ...]
) -> Callable[[str], Any]:
    """Return a module ``__getattr__`` that binds ``api`` from the active codec on first use.

    A facade calls this instead of importing its Cython twin at import time: the twin imports
    the facade's message types, so binding lazily keeps either import order working.  After
    the first access the names are ordinary module globals (no per-call indirection).
    ``IMPLEMENTATION`` ("fast" or "pure") is bound the same way.
    """

    def __getattr__(name: str) -> Any:
        if name not in api and name != "IMPLEMENTATION":
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        codec = select(protocol, pure)
        for attr in api:
            namespace[attr] = getattr(codec, attr)
        namespace["IMPLEMENTATION"] = "pure" if codec is pure else "fast"
        return namespace[name]

    return __getattr__


def twin(protocol: str, impl: str) -> ModuleType:
    """The ``"fast"`` (Cython) or ``"pure"`` codec module of ``protocol``, for tests/benchmarks.

    Unlike the facades this never falls back: a missing extension raises ImportError.
    """
    if impl == "fast":
        return importlib.import_module(f"wirekit._fast.{protocol}")
    if impl == "pure":
        return importlib.import_module(f"wirekit.{protocol}._pure")
    raise ValueError(f"impl must be 'fast' or 'pure', not {impl!r}")
