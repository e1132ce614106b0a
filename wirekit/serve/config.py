"""The deployment config of ``wirekit serve``: nodes, devices, models, quotas, backends.

The design's example is the core of it: each node lists its devices and the models it hosts,
and ``quotas`` gives, per device and per model *in that order*, the share of the device given
to the model (0 disables the pair, a GPU is 0 or 1)::

    {"nodes": [{"id": "n1", "devices": ["CPU", "GPU", "GPU"], "models": ["m1", "m2"],
                "quotas": [0.5, 0.5, 1, 0, 0, 1]}]}

reads: CPU 0 gives half to m1 and half to m2, GPU 1 is m1's, GPU 2 is m2's.  Where each
(device, model) backend listens is ``endpoint`` (the node's host) and ``ports`` (a list
parallel to ``quotas``; ``null`` or 0 where the quota is 0).  Clipper containers connect to the
dispatcher's Clipper RPC port instead: for a Clipper model the ``ports`` entry is the model
name the device's container registers under (``null``: the model's own name).  An ``oip``
model's server may answer gRPC on another port: ``grpc_ports`` (optional, shaped as
``ports``) gives it; ``tfserving`` and ``oip`` servers know the model by ``server_model``
(default: its own name).  A model's ``handler`` (``module:function``) names the code its
backends run: the dispatcher does not use it, ``wirekit serve --with-backends`` and
``wirekit serve k8s`` start backends with it.

Validation, in two steps:

* :func:`load_config` reads JSON or TOML (by file suffix) and :func:`parse_config` checks a
  parsed document; both raise :class:`ConfigError` naming the file and the path of the bad
  value (``nodes[0].quotas[3]``).  Each table (``store``, ``cache``, ``http``, ``admin``,
  ``controller``, ``controller.actuator``, ``health``, ``listen``, a model's) is read from
  its dataclass: a field made by :func:`setting` holds its default, its key and the check of
  its value (the range of a number), written once; the table's allowed keys are its fields'
  keys.  What involves several values (the quotas of a device, a port used twice) is
  checked after.
* :func:`validate` checks what the document alone cannot say: it loads the controller's
  policy and actuator plugins and checks the admin token and the store URL.  ``wirekit
  serve`` (the :class:`~wirekit.serve.service.Service`) and ``wirekit serve check`` both call
  it, so the check refuses what the dispatcher would refuse at its start.

The result lists one :class:`DeviceRow` per (device, model) pair: the design's models
metadata.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import string
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from wirekit.errors import WirekitError
from wirekit.mip.limits import Limits
from wirekit.oip.messages import DATATYPES
from wirekit.oip.metadata import TensorSpec

from .record.storedb import is_url

BACKEND_KINDS = ("mip", "kubemo", "clipper", "oip", "tfserving")
#: the backend kinds that are model servers speaking a tensor protocol (OIP, TF Serving's
#: REST API) rather than MIP: they take OIP tensors only, and know a model by a name of their
#: own (``server_model``)
SERVER_KINDS = ("oip", "tfserving")
#: what a model's backends run when its config names no ``handler``
DEFAULT_HANDLER = "wirekit.mip.runtime:echo"
DEVICE_TYPES = ("CPU", "GPU")


class ConfigError(WirekitError, ValueError):
    """A deployment config that cannot be used: ``where`` is the path of the bad value."""

    def __init__(self, where: str, message: str, source: str = "") -> None:
        self.where = where
        self.reason = message
        self.source = source
        prefix = f"{source}: " if source else ""
        super().__init__(f"{prefix}{where or 'config'}: {message}")


class ConfigUnreadable(ConfigError):
    """A config file that cannot be read at all (missing, no permission): the command names a
    file it cannot use, a usage error (exit 2), where a config that reads but is not valid is
    bad input (exit 1)."""


# --- the checks of one value -----------------------------------------------------------------


def _table(doc: Any, where: str, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise ConfigError(where, f"expected a table/object, got {_kind(doc)}")
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise ConfigError(
            _join(where, unknown[0]),
            f"unknown key (allowed: {', '.join(sorted(allowed))})",
        )
    return doc


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", str: "a string", int: "an integer", float: "a number"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(where, f"expected a non-empty string, got {_kind(value)}")
    return value


#: the longest name (model, app, node id, Clipper container name, backend host) in characters
MAX_NAME_LENGTH = 128
#: the longest duration (seconds) a setting may ask for: 30 days (an event loop's timer
#: cannot be set much further; uvloop refuses beyond about 1.8e16 s)
MAX_SECONDS = 30 * 86400.0
#: the characters a name may not hold besides those :meth:`str.isprintable` refuses: path
#: separators (a name is a path segment of the HTTP API and of a row key ``node/device/model``)
_PATH_CHARS = ("/", "\\")


def name_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a name, or None when it can (see :func:`check_name`)."""
    if not isinstance(value, str):
        return f"expected a name (a string), got {_kind(value)}"
    if not value:
        return "a name cannot be empty"
    if len(value) > MAX_NAME_LENGTH:
        return f"a name is {MAX_NAME_LENGTH} characters at most, got {len(value)}"
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        return (
            f"a name holds printable characters only, got U+{ord(bad):04X} at"
            f" {value.index(bad)} (control, format, separator, surrogate or unassigned)"
        )
    if value != value.strip():
        return "a name cannot start or end with a space"
    for char in _PATH_CHARS:
        if char in value:
            return f"a name cannot hold {char!r} at {value.index(char)} (a path separator)"
    if value in (".", ".."):
        return f"a name cannot be {value!r}"
    return None


def check_name(value: Any, where: str) -> str:
    """``value`` if it is a valid name, else :class:`ConfigError` at ``where`` saying why.

    The one rule of every name ``wirekit serve`` takes -- model names, app names, node ids,
    Clipper container names, backend hosts -- from the config file and the admin API alike:
    1 to :data:`MAX_NAME_LENGTH` printable Unicode characters (:meth:`str.isprintable`: no
    control, format, line or paragraph separator, surrogate, private-use or unassigned code
    point, the space alone of the separators), no leading or trailing space, no ``/`` or
    ``\\``, and neither ``.`` nor ``..``.  Such a name can be written to the store, the
    journal, the metrics and a log line, and named in a URL path."""
    problem = name_problem(value)
    if problem is not None:
        raise ConfigError(where, problem)
    return value


def _shown(value: float) -> str:
    """A number for a message: an integer too long to print is told by its size."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {len(str(abs(value)))} digits"
    return f"{value}"


def _num(
    value: Any, where: str, *, lo: float, hi: float = MAX_SECONDS, lo_open: bool = False
) -> float:
    """A finite number from ``lo`` to ``hi`` (:data:`MAX_SECONDS` unless given: most
    numbers are durations), as a float; :class:`ConfigError` at ``where`` otherwise (an
    integer too large for a float included, never an ``OverflowError``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(where, f"expected a number, got {_kind(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf if value > 0 else -math.inf
    if not math.isfinite(number):
        raise ConfigError(where, f"expected a finite number, got {_shown(value)}")
    if number < lo or (lo_open and number == lo) or number > hi:
        low = f"> {lo}" if lo_open else f">= {lo}"
        high = "" if hi == math.inf else f" and <= {hi:g}"
        raise ConfigError(where, f"must be {low}{high}, got {_shown(value)}")
    return number


def _int(value: Any, where: str, *, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(where, f"expected an integer, got {_kind(value)}")
    if not lo <= value <= hi:
        raise ConfigError(where, f"must be between {lo} and {hi}, got {_shown(value)}")
    return value


def _port(value: Any, where: str, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    return _int(value, where, lo=0, hi=65535)


def _handler(value: Any, where: str) -> str:
    if value is None:
        return DEFAULT_HANDLER
    module, sep, function = _str(value, where).partition(":")
    if not sep or not module or not function:
        raise ConfigError(where, f"expected module:function, got {value!r}")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(where, f"expected true or false, got {_kind(value)}")
    return value


def _list(value: Any, where: str, *, nonempty: bool = True) -> list[Any]:
    if not isinstance(value, list):
        raise ConfigError(where, f"expected a list, got {_kind(value)}")
    if nonempty and not value:
        raise ConfigError(where, "must not be empty")
    return value


def _host_names(value: Any, where: str) -> tuple[str, ...]:
    """A list of host names or address literals (``admin.allowed_hosts``), lowercase."""
    names = []
    for index, name in enumerate(_list(value, where, nonempty=False)):
        name = _str(name, f"{where}[{index}]").strip().lower().strip("[]").rstrip(".")
        if not re.fullmatch(r"[a-z0-9._:%-]{1,253}", name):
            raise ConfigError(f"{where}[{index}]", f"expected a host name, got {name!r}")
        names.append(name)
    return tuple(names)


#: whether a value is a ``postgresql://`` (or ``postgres://``) URL: a shared store
#: (``store.url``, ``--store-url``); the store's own test of its target
is_postgresql_url = is_url


def _store_url(value: Any, where: str) -> str:
    url = _str(value, where)
    if not is_postgresql_url(url):
        raise ConfigError(where, "expected a postgresql:// URL")
    return url


def _names(value: Any, where: str) -> tuple[str, ...]:
    """A list of names (a model's ``apps``), each checked by :func:`check_name`."""
    items = _list(value, where, nonempty=False)
    return tuple(check_name(name, f"{where}[{k}]") for k, name in enumerate(items))


def _free_table(value: Any, where: str) -> tuple[tuple[str, Any], ...]:
    """A table of any keys and values (a plugin's ``options``), as its items."""
    keys = set(value) if isinstance(value, Mapping) else set()
    return tuple(_table(value, where, keys).items())


def _name_table(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    """A table of any keys whose values are non-empty strings, as its items."""
    keys = set(value) if isinstance(value, Mapping) else set()
    table = _table(value, where, keys)
    return tuple((k, _str(v, f"{where}.{k}")) for k, v in table.items())


def _plugin(value: Any, where: str) -> str:
    """A plugin's ``module:Class``."""
    spec = _str(value, where)
    if spec.count(":") != 1 or not all(spec.split(":")):
        raise ConfigError(where, f"expected module:Class, got {spec!r}")
    return spec


#: ``check(value, where)``: the value to keep, or :class:`ConfigError` at ``where``
Check = Callable[[Any, str], Any]


def _number(*, lo: float, hi: float = MAX_SECONDS, lo_open: bool = False) -> Check:
    """The check of a finite number from ``lo`` to ``hi`` (see :func:`_num`)."""
    return functools.partial(_num, lo=lo, hi=hi, lo_open=lo_open)


def _integer(*, lo: int, hi: int) -> Check:
    """The check of an integer from ``lo`` to ``hi``."""
    return functools.partial(_int, lo=lo, hi=hi)


def _optional(check: Check) -> Check:
    """``check``, with null allowed (kept as None)."""

    def optional(value: Any, where: str) -> Any:
        return None if value is None else check(value, where)

    return optional


def _one_of(choices: tuple[str, ...]) -> Check:
    """The check of one of ``choices``."""

    def one_of(value: Any, where: str) -> Any:
        if value not in choices:
            raise ConfigError(where, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    return one_of


def setting(
    default: Any = dataclasses.MISSING,
    *,
    check: Check | None,
    key: str | None = None,
    table: str | None = None,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A field of a config table: its default, and what reads it from a document.

    ``check(value, where)`` checks the value the document gives and returns the one to keep
    (None: the field is read by its table's own function, being checked against other
    values); ``key`` is its key in the table (default: the field's name; ``""``: not a key
    of the table); ``table`` the sub-table it is in (``listen``).  A key the document leaves
    out keeps the dataclass's default: defaults are written here only."""
    metadata = {"check": check, "key": key, "table": table}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _keys(cls: Any, table: str | None = None) -> dict[str, dataclasses.Field]:
    """Key -> field of each setting of the dataclass ``cls`` that a document's table gives
    (``table``: those of that sub-table), in the order of the fields."""
    keys = {}
    for f in dataclasses.fields(cls):
        key = f.metadata.get("key")
        key = f.name if key is None else key
        if key and f.metadata.get("table") == table:
            keys[key] = f
    return keys


def _settings(
    cls: Any, doc: Mapping[str, Any], where: str, table: str | None = None
) -> dict[str, Any]:
    """Field name -> checked value of each setting of ``cls`` that ``doc`` gives (and that
    has a check); the others keep their defaults."""
    values = {}
    for key, f in _keys(cls, table).items():
        check = f.metadata.get("check")
        if key in doc and check is not None:
            values[f.name] = check(doc[key], _join(where, key))
    return values


def _parse_table(cls: Any, doc: Any, where: str, **given: Any) -> Any:
    """The dataclass ``cls`` read from the table ``doc`` (at ``where``): its keys, no other,
    each checked; ``given``: the values of fields the table does not hold."""
    return cls(**_settings(cls, _table(doc, where, set(_keys(cls))), where), **given)


#: the dimensions a declared tensor shape may have at most
MAX_TENSOR_DIMS = 64
#: the largest size a declared dimension may give (a signed 64-bit integer's largest)
MAX_DIMENSION = (1 << 63) - 1
#: the ways an OIP request becomes MIP samples (``models.<name>.tensors``): ``sample``, the
#: whole request is one MIP sample; ``rows``, dim 0 of every input is the batch, each row a
#: sample (``specs/oip.md``)
TENSOR_RULES = ("sample", "rows")
#: the highest model version a config may name (a signed 64-bit integer's largest, as TF
#: Serving's and OIP's version numbers)
MAX_VERSION = (1 << 63) - 1
#: the keys of one declared tensor (an entry of ``models.<name>.inputs`` / ``outputs``)
TENSOR_KEYS = frozenset({"name", "datatype", "shape"})


def _tensor_shape(value: Any, where: str) -> tuple[int, ...]:
    """A declared shape: a list of at most :data:`MAX_TENSOR_DIMS` integers, each a size
    (>= 0) or -1 (any size)."""
    dims = _list(value, where, nonempty=False)
    if len(dims) > MAX_TENSOR_DIMS:
        raise ConfigError(where, f"{MAX_TENSOR_DIMS} dimensions at most, got {len(dims)}")
    return tuple(_int(dim, f"{where}[{k}]", lo=-1, hi=MAX_DIMENSION) for k, dim in enumerate(dims))


def _tensor_specs(value: Any, where: str) -> tuple[TensorSpec, ...]:
    """A model's declared ``inputs`` or ``outputs``: a list of ``{name, datatype, shape}``,
    each name once."""
    specs: list[TensorSpec] = []
    for k, entry in enumerate(_list(value, where, nonempty=False)):
        at = f"{where}[{k}]"
        table = _table(entry, at, set(TENSOR_KEYS))
        missing = sorted(TENSOR_KEYS - set(table))
        if missing:
            raise ConfigError(
                _join(at, missing[0]), "missing (a tensor needs name, datatype, shape)"
            )
        name = _str(table["name"], f"{at}.name")
        if len(name) > MAX_NAME_LENGTH or not name.isprintable():
            raise ConfigError(
                f"{at}.name",
                f"a tensor name is 1 to {MAX_NAME_LENGTH} printable characters, got {name!r}",
            )
        if any(spec.name == name for spec in specs):
            raise ConfigError(f"{at}.name", f"tensor {name!r} is declared twice")
        datatype = table["datatype"]
        if datatype not in DATATYPES:
            raise ConfigError(
                f"{at}.datatype",
                f"must be one of {', '.join(DATATYPES)}, got {_shown_value(datatype)}",
            )
        specs.append(TensorSpec(name, datatype, _tensor_shape(table["shape"], f"{at}.shape")))
    return tuple(specs)


def _shown_value(value: Any) -> str:
    """A value for a message: a string quoted, anything else by its kind."""
    return repr(value) if isinstance(value, str) else _kind(value)


def _server_model(value: Any, where: str) -> str:
    """A model's name on its backend's server: a name (:func:`check_name`), or "" for the
    model's own."""
    return "" if value == "" else check_name(value, where)


def _versions(value: Any, where: str) -> tuple[int, ...]:
    """A model's ``versions``: a non-empty list of integers >= 1, each once."""
    versions: list[int] = []
    for k, version in enumerate(_list(value, where)):
        version = _int(version, f"{where}[{k}]", lo=1, hi=MAX_VERSION)
        if version in versions:
            raise ConfigError(f"{where}[{k}]", f"version {version} is listed twice")
        versions.append(version)
    return tuple(versions)


@dataclass(frozen=True, slots=True)
class DeviceRow:
    """One row of the models metadata: a model on one device of one node."""

    model: str
    node: str
    device: int  #: index of the device on its node
    device_type: str  #: "CPU" or "GPU"
    endpoint: str  #: host of the backend (MIP kinds)
    port: int | None  #: port of the backend (MIP kinds, OIP's REST or gRPC); None for Clipper
    quota: float  #: share of the device given to the model, 0..1
    backend: str  #: one of :data:`BACKEND_KINDS`
    clipper_name: str | None = None  #: the name its Clipper container registers under
    #: the gRPC port of an ``oip`` backend's server (the node's ``grpc_ports``), if any
    grpc_port: int | None = None
    #: ``node/device/model``: the name of this row in the store and the metrics (derived)
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.node}/{self.device}/{self.model}")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Per-model settings: the MIP front door port, the backend kind, resubmission."""

    name: str = setting(check=None, key="")
    #: MIP front door (0: any free port, None: no MIP front door); key ``port``
    mip_port: int | None = setting(0, check=_port, key="port")
    backend: str = setting("mip", check=_one_of(BACKEND_KINDS))
    #: seconds one attempt may take before it is resubmitted
    timeout: float = setting(5.0, check=_number(lo=0, lo_open=True))
    #: attempts per request, the first one included
    attempts: int = setting(3, check=_integer(lo=1, hi=100))
    #: extra names for Clipper's ``POST /{app}/predict``
    apps: tuple[str, ...] = setting((), check=_names)
    #: adaptive batching to MIP backends: requests from the MIP front door waiting for the
    #: same device in one loop pass go out as one MIP batch of at most this many samples
    #: (1: off, every request is sent on its own)
    max_batch: int = setting(1, check=_integer(lo=1, hi=65535))
    #: the code a backend of this model runs (``module:function``); the dispatcher does not
    #: use it: ``wirekit serve --with-backends`` and ``wirekit serve k8s`` start backends
    #: with it (default: the built-in echo)
    handler: str = setting(DEFAULT_HANDLER, check=_handler)
    #: the response time (seconds) the controller holds the model to (None: none, the
    #: controller leaves its quotas alone); ``controller.targets`` gives it too
    target: float | None = setting(None, check=_optional(_number(lo=0, lo_open=True)))
    #: the inputs the model takes (none declared: a request's tensors are not checked
    #: against any): requests of the tensor doors (OIP, TF Serving's REST API) with another
    #: input, datatype or shape are refused at the door (400), and OIP's model metadata
    #: lists them
    inputs: tuple[TensorSpec, ...] = setting((), check=_tensor_specs)
    #: the outputs the model answers (listed by the model metadata; not checked)
    outputs: tuple[TensorSpec, ...] = setting((), check=_tensor_specs)
    #: the versions of the model (TF Serving's model status, OIP's model metadata): a
    #: request naming another version in its path is answered 404
    versions: tuple[int, ...] = setting((1,), check=_versions)
    #: OIP's model metadata ``platform``
    platform: str = setting("wirekit", check=_str)
    #: how an OIP request becomes MIP samples: ``sample`` (the whole request is one MIP
    #: sample) or ``rows`` (dim 0 of every input is the batch, one MIP sample per row)
    tensors: str = setting("sample", check=_one_of(TENSOR_RULES))
    #: ``oip`` backends only: infer over OIP's gRPC (the node's ``grpc_ports``, else its
    #: ``ports``) rather than its REST API
    grpc: bool = setting(False, check=_bool)
    #: ``oip``/``tfserving`` backends only: the model's name on the backend's server ("": the
    #: model's own name)
    server_model: str = setting("", check=_server_model)
    #: ``oip`` backends only: ask each device's server to load the model (the repository
    #: extension) when it is added, and to unload it when removed, where wirekit loaded it
    load: bool = setting(False, check=_bool)
    #: seconds a server may take to load the model and say it is ready
    load_timeout: float = setting(60.0, check=_number(lo=0, lo_open=True))


#: the model keys that apply to some backend kinds only, and those kinds
_KIND_KEYS = {
    "grpc": ("oip",),
    "server_model": SERVER_KINDS,
    "load": ("oip",),
    "load_timeout": ("oip",),
}


def _kind_key_problem(key: str, kinds: tuple[str, ...], backend: str) -> str:
    """Why ``key`` is refused for a model whose backend kind is ``backend``."""
    return (
        f"applies to {' and '.join(kinds)} backends only, and this model's backend is {backend!r}"
    )


#: the per-model settings that change while the model is served (``PATCH
#: /admin/models/{name}``): new requests use them, requests in flight keep theirs
LIVE_SETTINGS = ("timeout", "attempts", "max_batch", "target")
#: the config keys of a model (``models.<name>``): the ones not in :data:`LIVE_SETTINGS`
#: (``port``, ``backend``, ``apps``, ``handler``, and what the model declares of itself:
#: ``inputs``, ``outputs``, ``versions``, ``platform``, ``tensors``) change only by removing
#: and adding the model -- a client that read the model's metadata keeps reading it true
MODEL_KEYS = tuple(_keys(ModelConfig))


def model_from_fields(fields: Mapping[str, Any]) -> ModelConfig:
    """The :class:`ModelConfig` of ``dataclasses.asdict(model)`` read back from JSON (a
    shared store's change log): its lists made tuples again, the declared tensors and
    versions checked as the config's own values are (:class:`ConfigError` at the field's
    name).  A field left out (a document written before it existed) keeps its default."""
    values = dict(fields)
    if "apps" in values:
        values["apps"] = tuple(values["apps"])
    for key, check in (("inputs", _tensor_specs), ("outputs", _tensor_specs)):
        if key in values:
            values[key] = check(values[key], key)
    if "versions" in values:
        values["versions"] = _versions(values["versions"], "versions")
    return ModelConfig(**values)


def live_settings(model: ModelConfig) -> dict[str, Any]:
    """The :data:`LIVE_SETTINGS` of ``model``, by name."""
    return {key: getattr(model, key) for key in LIVE_SETTINGS}


@dataclass(frozen=True, slots=True)
class StoreConfig:
    #: the SQLite file; with ``url``, the base name of this replica's local journal files
    path: str = setting("requests.db", check=_str)
    #: a ``postgresql://`` URL: the store several replicas share (None: the SQLite file)
    url: str | None = setting(None, check=_optional(_store_url))
    #: this replica's name in the shared store (default ``<host>:<absolute path>``)
    replica: str = setting("", check=_str)
    #: also keep request payloads in the store
    payloads: bool = setting(False, check=_bool)
    #: journal each completion before answering (crash-safe)
    journal: bool = setting(True, check=_bool)
    #: rows per write transaction at most
    batch_max: int = setting(1024, check=_integer(lo=1, hi=1_000_000))
    #: seconds between hand-overs to the writer thread
    flush_interval: float = setting(0.05, check=_number(lo=0, hi=60))
    #: requests journaled but not yet in the store (written while the database was away,
    #: replayed once it is back) past which ``/readyz`` says not ready
    max_backlog: int = setting(10_000, check=_integer(lo=0, hi=10**9))
    #: with ``url``: seconds between two compactions of the catalog's change log by this
    #: replica (0: never)
    compact_every: float = setting(300.0, check=_number(lo=0))
    #: with ``url``: the changes younger than this (seconds) stay in the log when compacted
    compact_keep: float = setting(60.0, check=_number(lo=0))
    #: with ``url``: seconds this replica's lease lasts after a renewal; once it has expired
    #: the leader ends the replica's queued rows ``lost``
    lease: float = setting(10.0, check=_number(lo=0, lo_open=True))
    #: with ``url``: seconds between two renewals of the lease, and between two sweeps of
    #: the expired leases by the leader (below ``lease``): rows end within lease + period;
    #: not given, it is this or half the lease, whichever is shorter
    lease_period: float = setting(2.0, check=_number(lo=0, lo_open=True))


def _store(doc: Any, where: str) -> StoreConfig:
    """The ``store`` table."""
    table = _table(doc, where, set(_keys(StoreConfig)))
    store = StoreConfig(**_settings(StoreConfig, table, where))
    if "lease_period" not in table:
        lease_period = min(StoreConfig().lease_period, store.lease / 2)
        store = dataclasses.replace(store, lease_period=lease_period)
    if store.lease_period >= store.lease:
        raise ConfigError(
            _join(where, "lease_period"),
            f"must be below {_join(where, 'lease')} ({store.lease:g}): a lease would expire"
            f" between two renewals, got {store.lease_period:g}",
        )
    return store


@dataclass(frozen=True, slots=True)
class CacheConfig:
    #: 0 disables the cache
    max_entries: int = setting(4096, check=_integer(lo=0, hi=10**9))
    #: seconds an entry stays valid
    ttl: float = setting(60.0, check=_number(lo=0, lo_open=True))
    #: total size of cached responses at most
    max_bytes: int = setting(64 * 1024 * 1024, check=_integer(lo=0, hi=1 << 40))


ACTUATOR_KINDS = ("log", "command", "cgroup", "repository")
#: the placeholders of a ``command`` actuator's argv templates
ACTUATOR_FIELDS = ("node", "model", "share", "cpus", "gpus", "container")
METRICS = ("avg", "p50", "p95", "p99")


def _actuator_kind(value: Any, where: str) -> str:
    """A shipped actuator kind, or a plugin's ``module:Class``."""
    custom = isinstance(value, str) and value.count(":") == 1 and all(value.split(":"))
    if value not in ACTUATOR_KINDS and not custom:
        raise ConfigError(
            where, f"must be one of {', '.join(ACTUATOR_KINDS)} or module:Class, got {value!r}"
        )
    return value


def _template(value: Any, where: str) -> str:
    """One argument of a ``command`` actuator: text with :data:`ACTUATOR_FIELDS` placeholders."""
    text = _str(value, where)
    allowed = ", ".join(f"{{{f}}}" for f in ACTUATOR_FIELDS)
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
        bad = [n for n in names if n not in ACTUATOR_FIELDS]
        if bad:
            raise ConfigError(where, f"unknown placeholder {{{bad[0]}}} (allowed: {allowed})")
        text.format(**dict.fromkeys(ACTUATOR_FIELDS, "1"))
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(where, f"not a template of {allowed}: {exc}") from None
    return text


def _templates(value: Any, where: str) -> tuple[str, ...]:
    """A ``command`` actuator's argv: a list of :func:`_template`."""
    items = _list(value, where, nonempty=False)
    return tuple(_template(a, f"{where}[{k}]") for k, a in enumerate(items))


@dataclass(frozen=True, slots=True)
class ActuatorConfig:
    """The ``controller.actuator`` table: how a decision reaches the node (see
    :mod:`wirekit.serve.control.actuators`)."""

    kind: str = setting("log", check=_actuator_kind)
    #: ``command``: the argv template run for a CPU share, and the one for a GPU count
    #: (``{node} {model} {share} {cpus} {gpus} {container}``; empty: that kind is not run)
    argv: tuple[str, ...] = setting((), check=_templates)
    gpu_argv: tuple[str, ...] = setting((), check=_templates)
    #: ``command``: seconds a command may run before it is killed
    timeout: float = setting(10.0, check=_number(lo=0, lo_open=True))
    #: ``command``: ``{container}`` per ``node/model`` (default ``<node>-<model>``)
    containers: tuple[tuple[str, str], ...] = setting((), check=_name_table)
    #: ``cgroup``: the cgroup directory per ``node/model`` (or ``model``)
    cgroups: tuple[tuple[str, str], ...] = setting((), check=_name_table)
    #: ``cgroup``/``command``: the CPUs a share of 1 stands for
    cpus: float = setting(1.0, check=_number(lo=0, lo_open=True, hi=4096))
    #: ``cgroup``: the CFS period written with the quota
    period_us: int = setting(100_000, check=_integer(lo=1000, hi=1000000))
    #: ``module:Class`` kinds: the ``options`` table, given to ``Class(options)``
    options: tuple[tuple[str, Any], ...] = setting((), check=_free_table)


def _actuator(doc: Any, where: str) -> ActuatorConfig:
    """The ``controller.actuator`` table."""
    cfg = _parse_table(ActuatorConfig, doc, where)
    if cfg.kind == "command" and not (cfg.argv or cfg.gpu_argv):
        raise ConfigError(f"{where}.argv", "the command actuator needs argv (or gpu_argv)")
    if cfg.kind == "cgroup" and not cfg.cgroups:
        raise ConfigError(f"{where}.cgroups", "the cgroup actuator needs a cgroup per model")
    return cfg


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """The ``controller`` table (absent: no controller).  The built-in policy's keys are
    explained in :mod:`wirekit.serve.control.controller`."""

    #: seconds between two looks at the metrics
    period: float = setting(5.0, check=_number(lo=0.05, hi=86400))
    #: seconds of requests the metrics snapshot covers (at least ``period``)
    window: float = setting(30.0, check=None)
    #: ``module:Class``
    policy: str = setting("wirekit.serve.control.controller:TargetPolicy", check=_plugin)
    #: model -> response time target, seconds (the models' names: read with the models)
    targets: tuple[tuple[str, float], ...] = setting((), check=None)
    #: which response time is held to the target
    metric: str = setting("p95", check=_one_of(METRICS))
    #: no change while within target × (1 ± tolerance)
    tolerance: float = setting(0.1, check=_number(lo=0, hi=0.9))
    #: largest change of a CPU share in one decision
    max_step: float = setting(0.1, check=_number(lo=0.01, hi=1))
    #: floor: a CPU share in use never goes below it
    min_share: float = setting(0.05, check=_number(lo=0.001, hi=1))
    #: seconds a row is left alone after a change
    cooldown: float = setting(10.0, check=_number(lo=0))
    #: seconds of recommendations a decrease must agree with
    stabilization: float = setting(30.0, check=_number(lo=0))
    #: fewer answered in the window: no figure to act on
    min_requests: int = setting(5, check=_integer(lo=1, hi=10**9))
    actuator: ActuatorConfig = setting(default_factory=ActuatorConfig, check=_actuator)
    #: anything else for a custom policy (the ``options`` table, unchecked)
    options: tuple[tuple[str, Any], ...] = setting((), check=_free_table)

    def target(self, model: str) -> float | None:
        return dict(self.targets).get(model)


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """The admin API (``/admin/models``) of the HTTP front door: models added and removed
    while the dispatcher runs.  It always needs a bearer token: ``token``, else one
    generated at start and written to ``token_file``; any HTTP bind but loopback needs a
    configured ``token`` (see :mod:`wirekit.serve.doors.adminauth`)."""

    enabled: bool = setting(True, check=_bool)
    #: the bearer token (or env WIREKIT_ADMIN_TOKEN)
    token: str | None = setting(None, check=_optional(_str))
    #: where a generated token is written (None: the runtime directory, named after the
    #: HTTP address)
    token_file: str | None = setting(None, check=_optional(_str))
    #: host names a client may use besides the listening address and localhost
    allowed_hosts: tuple[str, ...] = setting((), check=_host_names)
    #: seconds a removal waits for requests in flight at most
    drain_timeout: float = setting(30.0, check=_number(lo=0, hi=3600))


#: the check of an HTTP door's timeout: > 0 (no "off": an HTTP door exposed without one can
#: be held open for ever), a day at most
_http_timeout = _number(lo=0, hi=86400, lo_open=True)


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The ``http`` table: the HTTP front door's time limits, connection cap and body size
    (what each does when hit: ``SECURITY.md``, "HTTP front door"), and its access log.
    Every timeout is in seconds and must be > 0: an HTTP door exposed without one can be
    held open for ever."""

    #: a request's headers not complete this long after the connection opened, or after the
    #: first byte of a request on a kept-alive connection: the connection is dropped
    header_timeout: float = setting(10.0, check=_http_timeout)
    #: a request's body not received in full this long after its headers: 408, closed
    body_timeout: float = setting(60.0, check=_http_timeout)
    #: a kept-alive connection with no request this long after the last answer: closed
    idle_timeout: float = setting(75.0, check=_http_timeout)
    #: connections open at once at most; one more is answered 503 and closed at once
    max_connections: int = setting(512, check=_integer(lo=1, hi=1 << 20))
    #: a request body of more bytes: 413
    max_body_size: int = setting(64 * 1024 * 1024, check=_integer(lo=1, hi=1 << 40))
    #: an answer the client does not read (the transport holds it unsent) and no progress
    #: writing it this long: the connection is dropped (as ``mip.write_stall_timeout``)
    write_stall_timeout: float = setting(30.0, check=_http_timeout)
    #: log one line per request answered (logger ``wirekit.serve.access``, INFO; the
    #: ``--access-log`` flag sets it too); off: no cost at all
    access_log: bool = setting(False, check=_bool)


#: the keys of the ``http`` table, in the order of :class:`HttpLimits`
HTTP_KEYS = tuple(_keys(HttpLimits))


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """The ``grpc`` table: the OIP gRPC door's limits (``listen.grpc_port`` opens the door).
    A request over either is refused by gRPC itself with RESOURCE_EXHAUSTED."""

    #: a request message of more bytes is refused (as ``http.max_body_size`` for a body)
    max_message_size: int = setting(64 * 1024 * 1024, check=_integer(lo=1, hi=(1 << 31) - 1))
    #: RPCs handled at once at most; one more is refused at once
    max_in_flight: int = setting(512, check=_integer(lo=1, hi=1 << 20))


#: the policies of ``/readyz`` (``health.ready``): ``all``, ready when every model has a
#: reachable device; ``any``, when at least one has (the store takes writes in both)
READY_POLICIES = ("all", "any")


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """The ``health`` table: what the whole-dispatcher ``/readyz`` asks of the models (and
    so OIP's ``/v2/health/ready``, gRPC ``ServerReady`` and the ``wirekit_serve_ready``
    gauge, which say what it says).  A model's own readiness (``/readyz?model=``) does not
    depend on it.  Which endpoint a load balancer should probe: ``specs/serve.md``,
    "Readiness"."""

    #: ``all`` (the default): every model has a reachable device; ``any``: at least one
    ready: str = setting("all", check=_one_of(READY_POLICIES))


CLIPPER_GENERATIONS = ("2016", "2017", "v3")


def _clipper_generation(value: Any, where: str) -> str:
    if value not in CLIPPER_GENERATIONS:
        raise ConfigError(where, f"must be 2016, 2017 or v3, got {value!r}")
    return value


# --- the Kubernetes settings (``wirekit serve k8s``; the dispatcher ignores them) -----------

#: a Kubernetes quantity: a decimal number with a binary (``Ki`` .. ``Ei``) or decimal (``n``
#: .. ``E``) suffix, or an exponent (``1e3``); negative amounts are no resource
_K8S_QUANTITY = re.compile(
    r"^(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)(?P<suffix>[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$"
)
_K8S_SUFFIXES = {
    **{s: 1024**k for k, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
    **{s: 1000**k for k, s in enumerate(("k", "M", "G", "T", "P", "E"), 1)},
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
}
#: a label value, or the name part of a label key or resource name
_K8S_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_K8S_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: the keys of a toleration (Kubernetes' own names: a toleration is copied into the pods)
TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
#: the most ports ``k8s.runtime_mip_ports`` may give the dispatcher's Service
MAX_RUNTIME_PORTS = 100


def k8s_quantity(text: str) -> Decimal:
    """The amount a Kubernetes quantity (``500m``, ``1Gi``, ``2``) stands for; ValueError if
    ``text`` is not one."""
    match = _K8S_QUANTITY.match(text)
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, suffix = Decimal(match["number"]), match["suffix"] or ""
    if suffix[:1] in ("e", "E") and suffix not in _K8S_SUFFIXES:
        return number * Decimal(10) ** int(suffix[1:])
    return number * _K8S_SUFFIXES.get(suffix, 1)


def _qualified_name(value: Any, where: str, what: str) -> str:
    """A label key or resource name: ``[prefix/]name``, the prefix a DNS subdomain."""
    text = _str(value, where)
    prefix, _, name = text.rpartition("/")
    if (
        not name
        or len(name) > 63
        or not _K8S_NAME.match(name)
        or (prefix and (len(prefix) > 253 or not _K8S_SUBDOMAIN.match(prefix)))
    ):
        raise ConfigError(
            where, f"{what} {text!r} is not a Kubernetes name ([prefix/]name, 63 at most)"
        )
    return text


def _quantities(value: Any, where: str) -> tuple[tuple[str, str | None], ...]:
    """A ``requests`` or ``limits`` table: resource name -> a quantity (a string such as
    ``"500m"`` or ``"1Gi"``, or a number >= 0), or null (the default's entry removed)."""
    keys = set(value) if isinstance(value, Mapping) else set()
    items = []
    for name, amount in _table(value, where, keys).items():
        at = f"{where}.{name}"
        _qualified_name(name, at, "resource")
        if amount is not None:
            if isinstance(amount, int | float) and not isinstance(amount, bool):
                number = _num(amount, at, lo=0, hi=1e15)
                amount = str(int(number)) if number.is_integer() else repr(number)
            if not isinstance(amount, str) or not _K8S_QUANTITY.match(amount):
                raise ConfigError(
                    at, f"expected a Kubernetes quantity (such as 500m or 1Gi), got {amount!r}"
                )
        items.append((name, amount))
    return tuple(items)


def _labels(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    """A ``node_selector``: label key -> label value, as Kubernetes takes them."""
    keys = set(value) if isinstance(value, Mapping) else set()
    items = []
    for key, label in _table(value, where, keys).items():
        at = f"{where}.{key}"
        _qualified_name(key, at, "label")
        if not isinstance(label, str) or len(label) > 63 or not _K8S_NAME.match(label):
            raise ConfigError(
                at,
                "expected a label value (letters, digits, '-', '_', '.'; 63 at most), got "
                + _shown_value(label),
            )
        items.append((key, label))
    return tuple(items)


def _tolerations(value: Any, where: str) -> tuple[tuple[tuple[str, Any], ...], ...]:
    """A list of tolerations, each with Kubernetes' own keys (``key``, ``operator``
    ``Exists`` or ``Equal``, ``value``, ``effect``, ``tolerationSeconds``)."""
    tolerations = []
    for k, entry in enumerate(_list(value, where, nonempty=False)):
        at = f"{where}[{k}]"
        table = dict(_table(entry, at, set(TOLERATION_KEYS)))
        if "key" in table:
            _qualified_name(table["key"], f"{at}.key", "taint key")
        operator = _one_of(("Exists", "Equal"))(table.get("operator", "Equal"), f"{at}.operator")
        if operator == "Exists" and table.get("value"):
            raise ConfigError(f"{at}.value", "an Exists toleration has no value")
        if "value" in table and not isinstance(table["value"], str):
            raise ConfigError(f"{at}.value", f"expected a string, got {_kind(table['value'])}")
        if "key" not in table and operator != "Exists":
            raise ConfigError(f"{at}.operator", "a toleration without a key must be Exists")
        if "effect" in table:
            _one_of(TAINT_EFFECTS)(table["effect"], f"{at}.effect")
        if "tolerationSeconds" in table:
            _int(table["tolerationSeconds"], f"{at}.tolerationSeconds", lo=0, hi=(1 << 63) - 1)
            if table.get("effect") != "NoExecute":
                raise ConfigError(
                    f"{at}.tolerationSeconds", "applies to a NoExecute toleration only"
                )
        tolerations.append(tuple(table.items()))
    return tuple(tolerations)


def _runtime_ports(value: Any, where: str) -> tuple[int, int] | None:
    """``[first, last]``: the MIP ports (inclusive) kept for models added at run time;
    ``[]`` or null: none."""
    if value is None or value == []:
        return None
    pair = _list(value, where)
    if len(pair) != 2:
        raise ConfigError(where, f"expected [first, last] (or [] for none), got {len(pair)} values")
    first = _int(pair[0], f"{where}[0]", lo=1, hi=65535)
    last = _int(pair[1], f"{where}[1]", lo=first, hi=min(65535, first + MAX_RUNTIME_PORTS - 1))
    return first, last


@dataclass(frozen=True, slots=True)
class K8sResources:
    """What a container asks of its Kubernetes node: ``requests`` (what the scheduler finds
    room for) and ``limits`` (what it may use at most), resource name -> quantity."""

    requests: tuple[tuple[str, str], ...] = ()
    limits: tuple[tuple[str, str], ...] = ()


#: the dispatcher's container's resources unless ``k8s.dispatcher`` says otherwise
K8S_DISPATCHER_RESOURCES = K8sResources(
    requests=(("cpu", "250m"), ("memory", "256Mi")), limits=(("cpu", "2"), ("memory", "1Gi"))
)
#: a CPU backend's container's, besides its CPU (its quota); ``k8s.cpu_backend``
K8S_CPU_BACKEND_RESOURCES = K8sResources(
    requests=(("memory", "256Mi"),), limits=(("memory", "1Gi"),)
)
#: a GPU backend's container's, besides its GPU; ``k8s.gpu_backend``
K8S_GPU_BACKEND_RESOURCES = K8sResources(
    requests=(("cpu", "1"), ("memory", "2Gi")), limits=(("cpu", "4"), ("memory", "8Gi"))
)


def _resources(where: str, default: K8sResources, table: Mapping[str, Any]) -> K8sResources:
    """``default`` with the ``requests`` and ``limits`` of ``table`` (at ``where``) merged
    in, entry by entry (null removes one); a request above its limit is refused, as
    Kubernetes would."""
    merged: dict[str, dict[str, str]] = {}
    for key in ("requests", "limits"):
        entries: dict[str, Any] = dict(getattr(default, key))
        if key in table:
            entries.update(_quantities(table[key], _join(where, key)))
        merged[key] = {k: v for k, v in entries.items() if v is not None}
    for name, request in merged["requests"].items():
        limit = merged["limits"].get(name)
        if limit is not None and k8s_quantity(request) > k8s_quantity(limit):
            raise ConfigError(
                _join(where, f"requests.{name}"),
                f"{request} is above its limit ({limit}): Kubernetes refuses the pod",
            )
    return K8sResources(tuple(merged["requests"].items()), tuple(merged["limits"].items()))


@dataclass(frozen=True, slots=True)
class K8sPlacement:
    """Where a pod may run: the labels its Kubernetes node must have (``node_selector``;
    none: any node) and the taints it tolerates (``tolerations``)."""

    node_selector: tuple[tuple[str, str], ...] = setting((), check=_labels)
    tolerations: tuple[tuple[tuple[str, Any], ...], ...] = setting((), check=_tolerations)


@dataclass(frozen=True, slots=True)
class K8sConfig:
    """The ``k8s`` table and the nodes' ``k8s`` tables: what ``wirekit serve k8s`` makes of
    the deployment beyond the config's own meaning (specs/k8s.md).  The dispatcher reads
    and ignores them."""

    #: the labels (``node_selector``) and taints (``tolerations``) of every backend pod;
    #: a node's ``k8s`` table adds its own (its labels win on the same key)
    node_selector: tuple[tuple[str, str], ...] = setting((), check=_labels)
    tolerations: tuple[tuple[tuple[str, Any], ...], ...] = setting((), check=_tolerations)
    #: the dispatcher's pod: its resources (``requests``, ``limits``) and placement
    #: (``node_selector``, ``tolerations``); key ``dispatcher``
    dispatcher: K8sResources = setting(K8S_DISPATCHER_RESOURCES, check=None)
    dispatcher_placement: K8sPlacement = setting(default_factory=K8sPlacement, check=None, key="")
    #: a CPU backend's resources besides its CPU (its quota × ``--cpu-cores``)
    cpu_backend: K8sResources = setting(K8S_CPU_BACKEND_RESOURCES, check=None)
    #: a GPU backend's resources besides its GPU
    gpu_backend: K8sResources = setting(K8S_GPU_BACKEND_RESOURCES, check=None)
    #: the extended resource a GPU device is (one per GPU container)
    gpu_resource: str = setting(
        "nvidia.com/gpu", check=functools.partial(_qualified_name, what="resource")
    )
    #: MIP ports the dispatcher's Service exposes for models added at run time (first,
    #: last; None: none)
    runtime_mip_ports: tuple[int, int] | None = setting((9900, 9915), check=_runtime_ports)
    #: node id -> the node's own placement (its ``k8s`` table)
    nodes: tuple[tuple[str, K8sPlacement], ...] = setting((), check=None, key="")

    def placement(self, node: str) -> K8sPlacement:
        """Where the pod of ``node`` may run: the ``k8s`` table's placement with the node's
        own added."""
        own = dict(self.nodes).get(node, K8sPlacement())
        return K8sPlacement(
            tuple({**dict(self.node_selector), **dict(own.node_selector)}.items()),
            self.tolerations + tuple(t for t in own.tolerations if t not in self.tolerations),
        )


#: the keys of a ``k8s.dispatcher`` table
K8S_DISPATCHER_KEYS = frozenset({"requests", "limits", *_keys(K8sPlacement)})
#: the keys of a ``k8s.cpu_backend`` / ``k8s.gpu_backend`` table
K8S_RESOURCE_KEYS = frozenset({"requests", "limits"})


def _k8s(doc: Any, nodes: list[tuple[str, Any, str]]) -> K8sConfig:
    """The ``k8s`` table, and each node's (``nodes``: node id, its ``k8s`` table, where)."""
    where = "k8s"
    table = _table(doc, where, {*_keys(K8sConfig), "dispatcher", "cpu_backend", "gpu_backend"})
    values = _settings(K8sConfig, table, where)
    dispatcher = _table(
        table.get("dispatcher", {}), f"{where}.dispatcher", set(K8S_DISPATCHER_KEYS)
    )
    values["dispatcher"] = _resources(f"{where}.dispatcher", K8S_DISPATCHER_RESOURCES, dispatcher)
    values["dispatcher_placement"] = _parse_table(
        K8sPlacement,
        {k: v for k, v in dispatcher.items() if k in _keys(K8sPlacement)},
        f"{where}.dispatcher",
    )
    gpu_resource = values.get("gpu_resource", K8sConfig().gpu_resource)
    for key, default, fixed in (
        ("cpu_backend", K8S_CPU_BACKEND_RESOURCES, "cpu"),
        ("gpu_backend", K8S_GPU_BACKEND_RESOURCES, gpu_resource),
    ):
        at = f"{where}.{key}"
        sub = _table(table.get(key, {}), at, set(K8S_RESOURCE_KEYS))
        for part in ("requests", "limits"):
            if isinstance(sub.get(part), Mapping) and fixed in sub[part]:
                raise ConfigError(
                    f"{at}.{part}.{fixed}",
                    "is the device itself: a CPU backend's CPU is its quota × --cpu-cores, a"
                    " GPU backend's GPU is one of k8s.gpu_resource",
                )
        values[key] = _resources(at, default, sub)
    values["nodes"] = tuple(
        (node_id, _parse_table(K8sPlacement, node_doc, at)) for node_id, node_doc, at in nodes
    )
    return K8sConfig(**values)


@dataclass(frozen=True, slots=True)
class Deployment:
    """A validated deployment: listeners, store, cache, models and the metadata rows."""

    host: str = setting("127.0.0.1", check=_str, table="listen")
    http_port: int | None = setting(0, check=_port, table="listen")
    clipper_rpc_port: int | None = setting(None, check=_port, table="listen")
    #: the OIP gRPC door's port (``inference.GRPCInferenceService``): None (the default) no
    #: gRPC door, 0 any free port (the ready line says which)
    grpc_port: int | None = setting(None, check=_port, table="listen")
    #: Clipper RPC generation the containers speak
    clipper_generation: str = setting("v3", check=_clipper_generation, table="listen")
    #: seconds a failing device stays out of rotation
    backoff: float = setting(5.0, check=_number(lo=0))
    #: requests in flight per MIP backend at most
    connections: int = setting(128, check=_integer(lo=1, hi=4096))
    store: StoreConfig = setting(default_factory=StoreConfig, check=_store)
    cache: CacheConfig = setting(
        default_factory=CacheConfig, check=functools.partial(_parse_table, CacheConfig)
    )
    #: the MIP front doors' limits (the ``mip`` table; the names and defaults of
    #: ``wirekit mip serve``'s flags, see :mod:`wirekit.mip.limits`), and the process's
    #: memory budget every door charges (``memory_budget``, the top-level key)
    mip: Limits = setting(default_factory=Limits, check=None)
    #: the HTTP front door's limits (the ``http`` table)
    http: HttpLimits = setting(
        default_factory=HttpLimits, check=functools.partial(_parse_table, HttpLimits)
    )
    #: the OIP gRPC door's limits (the ``grpc`` table)
    grpc: GrpcLimits = setting(
        default_factory=GrpcLimits, check=functools.partial(_parse_table, GrpcLimits)
    )
    models: dict[str, ModelConfig] = setting(default_factory=dict, check=None)
    #: the metadata rows (read from ``nodes``)
    rows: tuple[DeviceRow, ...] = setting((), check=None, key="nodes")
    admin: AdminConfig = setting(
        default_factory=AdminConfig, check=functools.partial(_parse_table, AdminConfig)
    )
    #: the ``controller`` table (None: off)
    controller: ControllerConfig | None = setting(None, check=None)
    #: the ``health`` table: the policy of ``/readyz``
    health: HealthConfig = setting(
        default_factory=HealthConfig, check=functools.partial(_parse_table, HealthConfig)
    )
    #: the ``k8s`` table and the nodes' ``k8s`` tables: ``wirekit serve k8s`` only
    k8s: K8sConfig = setting(default_factory=K8sConfig, check=None)

    def rows_of(self, model: str) -> list[DeviceRow]:
        """The metadata rows of ``model`` (quota 0 included)."""
        return [r for r in self.rows if r.model == model]

    def app_models(self) -> dict[str, str]:
        """Clipper application name -> model (each model is also an app of its own name)."""
        apps = {name: name for name in self.models}
        for m in self.models.values():
            for app in m.apps:
                apps[app] = m.name
        return apps


#: the top-level keys of a config document: the :class:`Deployment`'s, its sub-tables
#: (``listen``), and ``memory_budget`` (read with the ``mip`` table)
TOP_KEYS = frozenset(
    {*_keys(Deployment), "memory_budget"}
    | {f.metadata["table"] for f in dataclasses.fields(Deployment) if f.metadata.get("table")}
)


def load_config(path: str | Path) -> Deployment:
    """Read and validate a deployment config (``.toml`` is TOML, anything else JSON); its
    relative file paths are made relative to the file's directory (:func:`beside`)."""
    doc = read_document(path)
    try:
        return beside(parse_config(doc), Path(path).parent)
    except ConfigError as exc:
        raise ConfigError(exc.where, exc.reason, str(path)) from None


#: ``store.path`` values that name no file (SQLite's in-memory database)
_NOT_FILES = frozenset({"", ":memory:"})


def beside(dep: Deployment, directory: Path) -> Deployment:
    """``dep`` with its relative file paths -- ``store.path``, ``admin.token_file``, the
    ``cgroup`` actuator's directories -- taken from ``directory`` (the config file's), as
    its models' handler modules are: a config means the same from any working directory.

    A store that is not there but is in the working directory, where a relative
    ``store.path`` was before, is refused (:class:`ConfigError`) rather than left behind
    for a new empty one."""
    if directory == Path("."):
        return dep

    def place(value: str) -> str:
        return value if os.path.isabs(value) else os.path.join(directory, value)

    store = dep.store
    if store.path not in _NOT_FILES and not store.path.startswith("file:"):
        moved = place(store.path)
        old = Path(store.path)
        if old.exists() and not Path(moved).exists():  # two files: the directory is not "."
            raise ConfigError(
                "store.path",
                f"a relative path is taken from the config file's directory: {moved};"
                f" the store is at {old.resolve()}, where earlier versions put it (the"
                " working directory): move it (and its .journal.* files) there, or give"
                " store.path as an absolute path",
            )
        store = dataclasses.replace(store, path=moved)
    admin = dep.admin
    if admin.token_file:
        admin = dataclasses.replace(admin, token_file=place(admin.token_file))
    controller = dep.controller
    if controller is not None and controller.actuator.cgroups:
        cgroups = tuple((key, place(path)) for key, path in controller.actuator.cgroups)
        actuator = dataclasses.replace(controller.actuator, cgroups=cgroups)
        controller = dataclasses.replace(controller, actuator=actuator)
    return dataclasses.replace(dep, store=store, admin=admin, controller=controller)


def loads_toml(text: str) -> Any:
    """Parse TOML text: ``tomllib`` (Python 3.11+), else ``tomli`` (the ``serve`` extra), so
    that wirekit imports without it.  ValueError for text that is not TOML;
    :class:`ConfigError` when no TOML parser is installed."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only (scripts/test-pythons.sh)
        try:
            import tomli as tomllib
        except ImportError:
            raise ConfigError(
                "",
                f"reading TOML on Python {sys.version_info[0]}.{sys.version_info[1]} needs "
                "tomli (pip install 'wirekit[serve]'), or give the config as JSON",
            ) from None
    return tomllib.loads(text)


def read_document(path: str | Path) -> Any:
    """The parsed, not yet validated document of a config file (``.toml`` is TOML, anything
    else JSON); :class:`ConfigError` naming the file if it cannot be read or parsed."""
    path = Path(path)
    source = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigUnreadable("", f"cannot read: {exc.strerror or exc}", source) from None
    if path.suffix.lower() == ".toml":
        try:
            doc = loads_toml(raw.decode("utf-8"))
        except ConfigError as exc:
            raise ConfigError(exc.where, exc.reason, source) from None
        except ValueError as exc:  # UnicodeDecodeError, TOMLDecodeError
            raise ConfigError("", f"not valid TOML: {exc}", source) from None
    else:
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError("", f"not valid JSON: {exc}", source) from None
    return doc


# --- the document ----------------------------------------------------------------------------

#: the keys of an entry of ``nodes``
NODE_KEYS = frozenset(
    {"id", "endpoint", "devices", "models", "quotas", "ports", "grpc_ports", "k8s"}
)


def parse_config(doc: Any) -> Deployment:
    """Validate a parsed JSON/TOML document and build the :class:`Deployment`."""
    top = _table(doc, "", set(TOP_KEYS))
    listen = _table(top.get("listen", {}), "listen", set(_keys(Deployment, "listen")))
    values = _settings(Deployment, listen, "listen", table="listen")
    values.update(_settings(Deployment, top, ""))
    values["mip"] = _mip_limits(top.get("mip", {}), top.get("memory_budget"))
    http_port = values.get("http_port", Deployment().http_port)
    clipper_rpc_port = values.get("clipper_rpc_port")

    model_docs = _table(top.get("models", {}), "models", set(top.get("models", {}) or ()))
    for name in model_docs:
        check_name(name, "models")
    nodes = _list(top.get("nodes"), "nodes")

    # First pass over the nodes: which models exist at all.
    seen_models: list[str] = []
    for n, node in enumerate(nodes):
        where = f"nodes[{n}]"
        node = _table(node, where, set(NODE_KEYS))
        for m, name in enumerate(_list(node.get("models"), f"{where}.models")):
            name = check_name(name, f"{where}.models[{m}]")
            if name not in seen_models:
                seen_models.append(name)
    for name in model_docs:
        if name not in seen_models:
            raise ConfigError(f"models.{name}", "no node serves this model")

    models: dict[str, ModelConfig] = {}
    used_ports: dict[int, str] = {}
    for name in seen_models:
        where = f"models.{name}"
        models[name] = model = _model_config(name, model_docs.get(name, {}), where)
        if model.mip_port:
            if model.mip_port in used_ports:
                raise ConfigError(
                    f"{where}.port", f"port {model.mip_port} is also {used_ports[model.mip_port]}"
                )
            used_ports[model.mip_port] = where
    listen_ports = {
        "http_port": http_port,
        "clipper_rpc_port": clipper_rpc_port,
        "grpc_port": values.get("grpc_port"),
    }
    for port_key, listen_port in listen_ports.items():
        if listen_port and listen_port in used_ports:
            raise ConfigError(
                f"listen.{port_key}", f"port {listen_port} is also {used_ports[listen_port]}"
            )
    grpc_port = listen_ports["grpc_port"]
    for port_key in ("http_port", "clipper_rpc_port"):
        if grpc_port and grpc_port == listen_ports[port_key]:
            raise ConfigError("listen.grpc_port", f"port {grpc_port} is also listen.{port_key}")
    app_names: dict[str, str] = {}
    for mc in models.values():
        for app in (mc.name, *mc.apps):
            if app in app_names and app_names[app] != mc.name:
                raise ConfigError(
                    f"models.{mc.name}.apps", f"app {app!r} already names {app_names[app]}"
                )
            app_names[app] = mc.name

    rows: list[DeviceRow] = []
    node_ids: set[str] = set()
    clipper_names: dict[str, str] = {}
    for n, node in enumerate(nodes):
        rows.extend(_node_rows(node, f"nodes[{n}]", models, node_ids, clipper_names))
    node_k8s = [
        (node["id"], node["k8s"], f"nodes[{n}].k8s")
        for n, node in enumerate(nodes)
        if "k8s" in node
    ]
    values["k8s"] = _k8s(top.get("k8s", {}), node_k8s)
    if any(m.backend == "clipper" for m in models.values()) and clipper_rpc_port is None:
        clipper_rpc_port = 0
    for name in models:
        if not any(r.quota > 0 for r in rows if r.model == name):
            raise ConfigError(f"models.{name}", "no device has a quota > 0 for this model")
    controller = None
    if top.get("controller") is not None:
        controller = _controller(top["controller"], models)
        # controller.targets seeds each model's target: the catalog's, from then on
        for name, target in controller.targets:
            if models[name].target not in (None, target):
                raise ConfigError(
                    f"controller.targets.{name}",
                    f"also given as models.{name}.target ({models[name].target:g}): give it once",
                )
            models[name] = dataclasses.replace(models[name], target=target)
        controller = dataclasses.replace(
            controller,
            targets=tuple((m.name, m.target) for m in models.values() if m.target is not None),
        )
    values.update(
        clipper_rpc_port=clipper_rpc_port, models=models, rows=tuple(rows), controller=controller
    )
    return Deployment(**values)


def _model_config(name: str, doc: Any, where: str) -> ModelConfig:
    """One model's table (``models.<name>``; ``where``: its path in the document) -- the one
    validator of a model's settings, for the config file, ``POST /admin/models`` and
    ``PATCH /admin/models/{name}`` alike.  A key that applies to some backend kinds only
    (``grpc``, ``server_model``, ``load``, ``load_timeout``) is refused, named, for a model
    of another kind."""
    model = _parse_table(ModelConfig, doc, where, name=name)
    for key, kinds in _KIND_KEYS.items():
        if key in doc and model.backend not in kinds:
            raise ConfigError(_join(where, key), _kind_key_problem(key, kinds, model.backend))
    return model


def parse_settings(doc: Any, model: ModelConfig) -> ModelConfig:
    """``model`` with the settings of ``doc`` changed (``PATCH /admin/models/{name}``): a
    table of :data:`LIVE_SETTINGS` (absent: unchanged; ``target`` null: no target),
    validated by the config's own validator of a model's table.  A key that cannot change
    while the model is served (``port``, ``backend``, ``apps``, ``handler``, ``inputs``,
    ``outputs``, ``versions``, ``platform``, ``tensors``) is refused, named, with a
    :class:`ConfigError`; the others keep their values."""
    table = _table(doc, "", set(MODEL_KEYS))
    fixed = [key for key in MODEL_KEYS if key in table and key not in LIVE_SETTINGS]
    if fixed:
        nor = f", nor can {', '.join(fixed[1:])}" if len(fixed) > 1 else ""
        raise ConfigError(
            fixed[0],
            f"cannot change while the model is served{nor}: remove the model and add it"
            f" again (what can change: {', '.join(LIVE_SETTINGS)})",
        )
    changed = _model_config(model.name, {**live_settings(model), **table}, "")
    return dataclasses.replace(model, **live_settings(changed))


#: the highest device index a document may name (the store's INTEGER column holds it)
MAX_DEVICE_INDEX = (1 << 31) - 1


def parse_quota(doc: Any) -> tuple[str, int, float]:
    """The body of ``PUT /admin/models/{name}/quota``, ``{"node": NODE, "device": INDEX,
    "quota": SHARE}``, validated as the config file's values are (the node's id by
    :func:`check_name`, the share a finite number from 0 to 1): ``(node, device, quota)``,
    or :class:`ConfigError` naming the bad field (``body.quota``)."""
    if not isinstance(doc, Mapping) or set(doc) - {"node", "device", "quota"}:
        raise ConfigError("body", 'expected {"node": NODE, "device": INDEX, "quota": SHARE}')
    node = check_name(doc.get("node"), "body.node")
    device = _int(doc.get("device"), "body.device", lo=0, hi=MAX_DEVICE_INDEX)
    quota = _num(doc.get("quota"), "body.quota", lo=0, hi=1)
    return node, device, quota


def _controller(doc: Any, models: Mapping[str, ModelConfig]) -> ControllerConfig:
    """The ``controller`` table: its settings, the window (at least the period) and the
    targets (of the models served)."""
    where = "controller"
    t = _table(doc, where, set(_keys(ControllerConfig)))
    cfg = ControllerConfig(**_settings(ControllerConfig, t, where))
    window = _num(t.get("window", cfg.window), f"{where}.window", lo=cfg.period, hi=86400)
    targets = _table(t.get("targets", {}), f"{where}.targets", set(models))
    return dataclasses.replace(
        cfg,
        window=window,
        targets=tuple(
            (m, _num(v, f"{where}.targets.{m}", lo=0, lo_open=True)) for m, v in targets.items()
        ),
    )


def parse_model(
    doc: Any,
    devices: Mapping[tuple[str, int], str] | None = None,
    endpoints: Mapping[str, str] | None = None,
) -> tuple[ModelConfig, list[DeviceRow]]:
    """One model added while the dispatcher runs (``POST /admin/models``): validated by
    :func:`parse_config`, as the same model in a config file would be.

    ``doc`` is a config document reduced to one model: ``{"models": {name: {...}}, "nodes":
    [...]}`` (``models`` may be left out when the defaults do), where a node the dispatcher
    already knows (``devices``: ``(node, index) -> type``; ``endpoints``: node -> host) may
    leave out ``devices`` and ``endpoint``.  Or, shorter, ``{"name": ..., "model": {...},
    "placements": [{"node": ..., "device": i, "quota": q, "port": p}, ...]}`` on known
    devices (an ``oip`` model's placement may give a ``grpc_port`` too); it is rewritten into
    the first form (one quota and port per device of each node named, 0 and null where not
    placed) before the same validation."""
    devices = devices or {}
    endpoints = endpoints or {}
    if isinstance(doc, Mapping) and ("placements" in doc or "name" in doc):
        doc = _placements_doc(doc, devices)
    top = _table(doc, "", {"models", "nodes"})
    known: dict[str, list[str]] = {}
    for (node, _index), kind in sorted(devices.items()):
        known.setdefault(node, []).append(kind)
    nodes: list[Any] = []
    for entry in _list(top.get("nodes"), "nodes"):
        if isinstance(entry, Mapping) and entry.get("id") in known:
            filled = dict(entry)
            filled.setdefault("devices", known[filled["id"]])
            if filled["id"] in endpoints:
                filled.setdefault("endpoint", endpoints[filled["id"]])
            entry = filled
        nodes.append(entry)
    dep = parse_config({"models": top.get("models", {}), "nodes": nodes})
    if len(dep.models) != 1:
        raise ConfigError("nodes", f"one model at a time, got {len(dep.models)}")
    (model,) = dep.models.values()
    return model, list(dep.rows)


def _placements_doc(
    doc: Mapping[str, Any], devices: Mapping[tuple[str, int], str]
) -> dict[str, Any]:
    """The short form of :func:`parse_model` as the config document it stands for."""
    top = _table(doc, "", {"name", "model", "placements"})
    name = check_name(top.get("name"), "name")
    count: dict[str, int] = {}
    for node, index in devices:
        count[node] = max(count.get(node, 0), index + 1)
    quotas: dict[str, list[Any]] = {}
    ports: dict[str, list[Any]] = {}
    grpc_ports: dict[str, list[Any]] = {}
    seen: set[tuple[str, int]] = set()
    for k, place in enumerate(_list(top.get("placements"), "placements")):
        where = f"placements[{k}]"
        place = _table(place, where, {"node", "device", "quota", "port", "grpc_port"})
        node = check_name(place.get("node"), f"{where}.node")
        if node not in count:
            raise ConfigError(
                f"{where}.node",
                f"unknown node {node!r} (known: {', '.join(sorted(count)) or 'none'};"
                " a new node needs the long form, with its devices)",
            )
        index = _int(place.get("device"), f"{where}.device", lo=0, hi=count[node] - 1)
        if (node, index) in seen:
            raise ConfigError(f"{where}.device", f"device {index} of {node!r} is placed twice")
        seen.add((node, index))
        if node not in quotas:
            quotas[node] = [0] * count[node]
            ports[node] = [None] * count[node]
            grpc_ports[node] = [None] * count[node]
        quotas[node][index] = place.get("quota")
        ports[node][index] = place.get("port")
        grpc_ports[node][index] = place.get("grpc_port")
    nodes = []
    for node in quotas:
        entry = {"id": node, "models": [name], "quotas": quotas[node], "ports": ports[node]}
        if any(port is not None for port in grpc_ports[node]):
            entry["grpc_ports"] = grpc_ports[node]
        nodes.append(entry)
    return {"models": {name: top.get("model", {})}, "nodes": nodes}


def _mip_limits(doc: Any, memory_budget: Any = None) -> Limits:
    """The ``mip`` table: the MIP front doors' limits (a timeout of 0 or null is off), with
    the process's ``memory_budget`` (the top-level key; ``mip.max_buffered`` is its old
    name)."""
    timeouts = ("request_timeout", "idle_timeout", "write_stall_timeout")
    sizes = ("max_message_size", "max_items")
    t = _table(doc, "mip", {*timeouts, *sizes, "max_buffered"})
    default = Limits()
    values: dict[str, Any] = {}
    for key in timeouts:
        value = t.get(key, getattr(default, key))
        if value is not None:
            value = _num(value, f"mip.{key}", lo=0) or None
        values[key] = value
    for key in sizes:
        values[key] = _int(t.get(key, getattr(default, key)), f"mip.{key}", lo=1, hi=1 << 40)
    where = "memory_budget"
    if "max_buffered" in t:
        if memory_budget is not None:
            raise ConfigError(
                "mip.max_buffered", "is the old name of memory_budget: give memory_budget only"
            )
        memory_budget, where = t["max_buffered"], "mip.max_buffered"
    if memory_budget is None:
        memory_budget = default.memory_budget
    values["memory_budget"] = _int(memory_budget, where, lo=1, hi=1 << 40)
    try:
        return Limits(**values)
    except ValueError as exc:
        raise ConfigError(where, str(exc)) from None


def _node_rows(
    node: Mapping[str, Any],
    where: str,
    models: dict[str, ModelConfig],
    node_ids: set[str],
    clipper_names: dict[str, str],
) -> list[DeviceRow]:
    node_id = check_name(node.get("id"), f"{where}.id")
    if node_id in node_ids:
        raise ConfigError(f"{where}.id", f"duplicate node id {node_id!r}")
    node_ids.add(node_id)
    endpoint = check_name(node.get("endpoint", "127.0.0.1"), f"{where}.endpoint")
    devices = []
    for d, dev in enumerate(_list(node.get("devices"), f"{where}.devices")):
        dev = _str(dev, f"{where}.devices[{d}]").upper()
        if dev not in DEVICE_TYPES:
            raise ConfigError(f"{where}.devices[{d}]", f"must be CPU or GPU, got {dev!r}")
        devices.append(dev)
    names = [str(m) for m in node["models"]]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}.models", "a model is listed twice")
    quotas = _list(node.get("quotas"), f"{where}.quotas")
    expected = len(devices) * len(names)
    if len(quotas) != expected:
        raise ConfigError(
            f"{where}.quotas",
            f"expected {expected} values ({len(devices)} devices × {len(names)} models, "
            f"per device then per model), got {len(quotas)}",
        )
    needs_ports = any(models[m].backend != "clipper" for m in names)
    ports_doc = node.get("ports")
    if ports_doc is None and needs_ports:
        raise ConfigError(
            f"{where}.ports", "missing: a port per device and model, parallel to quotas"
        )
    ports = _list(ports_doc if ports_doc is not None else [None] * expected, f"{where}.ports")
    if len(ports) != expected:
        raise ConfigError(
            f"{where}.ports", f"expected {expected} values (parallel to quotas), got {len(ports)}"
        )
    grpc_ports = _list(
        node.get("grpc_ports", [None] * expected), f"{where}.grpc_ports", nonempty=False
    )
    if len(grpc_ports) != expected:
        raise ConfigError(
            f"{where}.grpc_ports",
            f"expected {expected} values (parallel to quotas), got {len(grpc_ports)}",
        )
    rows = []
    for d, dev in enumerate(devices):
        total = 0.0
        for m, model in enumerate(names):
            k = d * len(names) + m
            q = _num(quotas[k], f"{where}.quotas[{k}]", lo=0, hi=1)
            if dev == "GPU" and q not in (0.0, 1.0):
                raise ConfigError(
                    f"{where}.quotas[{k}]", f"a GPU is given 0 or 1 of itself, got {q}"
                )
            total += q
            backend = models[model].backend
            clipper_name = None
            if backend == "clipper":
                # Containers connect to the dispatcher: the entry names the Clipper model
                # the device's container registers as (default: the model's own name).
                entry = ports[k]
                if entry is not None and not isinstance(entry, str):
                    raise ConfigError(
                        f"{where}.ports[{k}]",
                        "Clipper containers connect to the dispatcher: give the name the"
                        " container registers as (a string), or null for the model's name",
                    )
                if entry:
                    check_name(entry, f"{where}.ports[{k}]")
                port = None
                clipper_name = entry or model
                if q > 0:
                    if clipper_name in clipper_names:
                        raise ConfigError(
                            f"{where}.ports[{k}]",
                            f"Clipper name {clipper_name!r} is also {clipper_names[clipper_name]}"
                            ": each device needs its own container name",
                        )
                    clipper_names[clipper_name] = f"{node_id}/{d}/{model}"
            else:
                port = _port(ports[k], f"{where}.ports[{k}]") or None  # 0 is "none" (TOML)
            if backend != "clipper" and q > 0 and not port:
                raise ConfigError(
                    f"{where}.ports[{k}]",
                    f"device {d} serves {model} (quota {q}): a backend port 1..65535 is needed",
                )
            grpc_port = _port(grpc_ports[k], f"{where}.grpc_ports[{k}]") or None
            if grpc_port and backend != "oip":
                raise ConfigError(
                    f"{where}.grpc_ports[{k}]",
                    f"only oip backends have a gRPC port, and {model}'s backend is {backend!r}",
                )
            rows.append(
                DeviceRow(
                    model, node_id, d, dev, endpoint, port, q, backend, clipper_name, grpc_port
                )
            )
        if total > 1 + 1e-9:
            raise ConfigError(
                f"{where}.quotas", f"device {d} ({dev}) is given {total:g} of itself (> 1)"
            )
    return rows


# --- what the document alone cannot say ------------------------------------------------------


@dataclass(frozen=True)
class Validated:
    """What :func:`validate` loaded, for the service to use (loaded once)."""

    #: the admin API's configured bearer token (None: none configured)
    admin_token: str | None = None
    #: the controller's actuator and policy (None: no controller)
    actuator: Any = None
    policy: Any = None


def validate(deployment: Deployment, environ: Mapping[str, str] = os.environ) -> Validated:
    """Check what ``wirekit serve`` needs beyond a valid document, as it would at its start:
    the store URL, the admin token (:func:`~wirekit.serve.doors.adminauth.admin_token`: one
    is needed on an HTTP bind beyond loopback), the controller's actuator and policy plugins
    (imported and built).  :class:`ConfigError` naming the key when one cannot be used.

    The one check of a deployment before it is served: the
    :class:`~wirekit.serve.service.Service` calls it (and uses what it loaded), and so does
    ``wirekit serve check``, which therefore refuses what ``wirekit serve`` refuses."""
    from .doors.adminauth import admin_token

    if deployment.store.url is not None:
        _store_url(deployment.store.url, "store.url")
    token = admin_token(deployment, environ)
    ctl = deployment.controller
    if ctl is None:
        return Validated(token)
    from .control.actuators import build_actuator
    from .control.controller import load_policy

    try:
        actuator = build_actuator(ctl.actuator)
    except ValueError as exc:
        raise _plugin_error("controller.actuator.kind", exc) from None
    try:
        policy = load_policy(ctl.policy, ctl)
    except ValueError as exc:
        raise _plugin_error("controller.policy", exc) from None
    return Validated(token, actuator, policy)


def _plugin_error(key: str, exc: ValueError) -> ConfigError:
    """The :class:`ConfigError` of a plugin at ``key`` that cannot be loaded; the loader's
    message names the key too, which the error says once."""
    message = str(exc)
    if message.startswith(f"{key} "):
        message = message[len(key) + 1 :]
    return ConfigError(key, message)
