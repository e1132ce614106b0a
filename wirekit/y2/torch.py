"""y2 on ``torch.distributed``: a DDP communication hook and the y2 cluster roles.

Install with ``pip install 'wirekit[torch]'``.  Nothing here opens a socket of its own: the
bytes travel through the process group (gloo or NCCL) that the caller set up.

The hook (:func:`y2_hook`, state :class:`Y2HookState`) implements y2's scheme with error
feedback, per DDP bucket:

1. add each parameter's local gradient to its residual (kept per parameter, in the
   gradient's dtype, on the CPU);
2. ``y2.compress`` the residuals with tau into delta words (every element with
   ``|r| >= tau`` sends one word of ±tau and keeps the rest; the others keep all of theirs);
3. send every rank's words to every rank with ``all_gather`` (works on gloo and NCCL),
   sizes first: with a fixed tau, an all-gather of ``(word count, tau)`` (16 bytes) then
   one of the words padded to the longest; with the adaptive tau, *one* all-gather of a
   fixed block per rank, ``(word count, tau)`` then room for ``capacity(n)`` words
   (``CAPACITY_SLACK × density × n + CAPACITY_MIN``): one round trip instead of two, since
   on a fast link the exchange is latency-bound.  Words beyond the block are not sent this
   step: they are added back into the residual (sent later, nothing is lost).  Each rank
   checks every peer's count (at most the bucket's elements, or the block) and tau (finite,
   positive) before it allocates or reads anything for them (:class:`DecodeError`);
4. ``y2.apply`` every rank's words (with that rank's tau) to a zero update and divide by the
   world size: the averaged update DDP then hands to the optimizer as the gradient.

The words are y2's (y2's trainer's layout: parameter index ``2 × layer`` for a weight,
``2 × layer + 1`` for a bias, bit 0 set for +tau): ``y2.encode(y2.Delta(words))`` of a
step's words (``Y2HookState.last_words``) is read by ``wirekit decode --proto y2``.

Layer ids (:func:`y2_layout`): modules in ``module.modules()`` order; a module whose
trainable parameters are a ``weight`` and/or a ``bias`` of at most 2^21 elements each is one
y2 layer (weight in the weights slot, bias in the biases slot), as y2 numbers a dense layer.
Any other parameter gets layers of its own, in the weights slot, one per 2^21 elements
(a larger array is *split*, not refused).  A model needing more than 512 layers is refused
with :class:`ValueError` when the state is built, since words cannot address it.

tau: fixed (``tau=``) or adaptive (``density=``, the default, 5 %).  Adaptive: each rank, per
bucket and step, takes as tau the ``1 - density`` quantile of ``|residual|`` (estimated on at
most ``TAU_SAMPLE`` evenly spaced elements), so about ``density`` of the elements send a word:
the bytes per step stay near ``4 × density × parameters`` per rank whatever the gradients'
scale, and the tau travels with the word count.  A fixed tau costs no estimate and gives
every rank the same tau (as in y2, where it is a cluster constant), but the bytes then follow
the gradients: a tau too small for them sends up to one word per element (as many bytes as
fp32) and clips every step's move to ±tau; a tau too large sends almost nothing and the
residuals grow until they cross it (slow, stale updates).  The density trades bytes for
accuracy: on ``benchmarks/bench_y2_torch.py`` (1 M parameters, 2 ranks) 0.05 sent 16× fewer
bytes than fp32 all-reduce at 0.55 points less accuracy, 0.02 sent 40× fewer at 1.6 less.

The kernels run on the CPU; CUDA gradients are copied to the host and back.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from wirekit import y2
from wirekit.errors import DecodeError
from wirekit.y2.messages import MAX_ARRAY_SIZE, MAX_LAYERS, PROTOCOL

__all__ = [
    "CAPACITY_MIN",
    "CAPACITY_SLACK",
    "TAU_SAMPLE",
    "Segment",
    "Y2Cluster",
    "Y2HookState",
    "y2_hook",
    "y2_layout",
]

#: The adaptive tau is estimated on at most this many elements of a bucket.
TAU_SAMPLE = 65536
#: With the adaptive tau a rank's block holds ``CAPACITY_SLACK × density ×`` the bucket's
#: elements in words (plus ``CAPACITY_MIN``): the estimate is a sample's quantile.
CAPACITY_SLACK = 1.25
CAPACITY_MIN = 16
_HEAD = 4  # int32s before the words in a block: count (int64), tau (float64)

_NUMPY_DTYPES = {
    torch.float16: np.float16,
    torch.float32: np.float32,
    torch.float64: np.float64,
}


@dataclass(frozen=True)
class Segment:
    """Elements ``start:stop`` (flat) of a parameter, addressed as y2 ``layer``'s weights
    (``is_weight``) or biases."""

    layer: int
    is_weight: bool
    start: int
    stop: int


def y2_layout(module: torch.nn.Module) -> dict[int, list[Segment]]:
    """The y2 address of every trainable parameter of ``module``: ``id(param)`` → segments.

    Raises :class:`ValueError` if the model needs more than 512 layers.
    """
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        module = module.module
    layout: dict[int, list[Segment]] = {}
    layer = 0
    for mod in module.modules():
        direct = [
            (name, p)
            for name, p in mod.named_parameters(recurse=False)
            if p.requires_grad and id(p) not in layout
        ]
        if not direct:
            continue
        names = {name for name, _ in direct}
        if names <= {"weight", "bias"} and all(p.numel() <= MAX_ARRAY_SIZE for _, p in direct):
            for name, p in direct:
                layout[id(p)] = [Segment(layer, name == "weight", 0, p.numel())]
            layer += 1
            continue
        for _name, p in direct:
            n = p.numel()
            segments = []
            for start in range(0, max(n, 1), MAX_ARRAY_SIZE):
                segments.append(Segment(layer, True, start, min(start + MAX_ARRAY_SIZE, n)))
                layer += 1
            layout[id(p)] = segments
    if layer > MAX_LAYERS:
        raise ValueError(
            f"{PROTOCOL}: the model needs {layer} layers (one per module holding a weight and "
            f"a bias, one per other parameter or per {MAX_ARRAY_SIZE} of its elements); delta "
            f"words address {MAX_LAYERS}"
        )
    return layout


@dataclass
class _Bucket:
    """A bucket's y2 model over its residuals, and where each parameter sits in the buffer."""

    residual: list[tuple[np.ndarray, np.ndarray]]
    places: list[tuple[int, int, Segment]]  # (offset in buffer, layer entry, segment)
    layers: int
    dtype: Any


@dataclass
class Y2HookState:
    """State of :func:`y2_hook` (pass it to ``register_comm_hook``).

    ``module``: the model (or its DDP wrapper), for the layer ids.  ``tau``: a fixed
    threshold; ``None`` (the default) adapts it so that about ``density`` of a bucket's
    elements send a word each step.  ``process_group``: the group DDP uses (default group if
    None).  ``record``: keep every rank's words of the last step in ``last_words``
    (bucket index → ``(words, tau)`` per rank).

    Counters (this rank): ``steps`` (buckets hooked), ``words_sent``, ``bytes_sent``
    (what this rank puts on the wire in a ring all-gather: ``(world - 1) ×`` its padded
    block, sizes included), ``elements`` (gradient elements seen), and the seconds spent in
    ``compress_seconds`` (residual update, tau, compress), ``exchange_seconds`` (the two
    all-gathers) and ``apply_seconds`` (apply and average).
    """

    module: torch.nn.Module
    tau: float | None = None
    density: float = 0.05
    process_group: Any = None
    record: bool = False
    steps: int = 0
    words_sent: int = 0
    bytes_sent: int = 0
    elements: int = 0
    compress_seconds: float = 0.0
    exchange_seconds: float = 0.0
    apply_seconds: float = 0.0
    last_words: dict[int, list[tuple[np.ndarray, float]]] = field(default_factory=dict)
    _layout: dict[int, list[Segment]] = field(init=False, repr=False)
    _residuals: dict[int, np.ndarray] = field(init=False, repr=False, default_factory=dict)
    _buckets: dict[tuple[int, ...], _Bucket] = field(init=False, repr=False, default_factory=dict)
    _step_done: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        if self.tau is not None and not (math.isfinite(self.tau) and self.tau > 0):
            raise ValueError(f"{PROTOCOL}: tau must be a finite positive number, got {self.tau}")
        if not 0 < self.density <= 1:
            raise ValueError(f"{PROTOCOL}: density must be in (0, 1], got {self.density}")
        if isinstance(self.module, torch.nn.parallel.DistributedDataParallel):
            # keep the model, not its wrapper: DDP holds this state (a cycle through the
            # wrapper would keep its process group alive until a garbage collection)
            self.module = self.module.module
        self._layout = y2_layout(self.module)

    def residual(self, param: torch.Tensor) -> np.ndarray | None:
        """The residual (flat, what was not sent yet) kept for ``param``, or None."""
        return self._residuals.get(id(param))

    def capacity(self, n: int) -> int:
        """Words a rank may send for a bucket of ``n`` elements with the adaptive tau."""
        return min(n, math.ceil(CAPACITY_SLACK * self.density * n) + CAPACITY_MIN)

    def _bucket(self, params: list[torch.Tensor], dtype: Any) -> _Bucket:
        key = tuple(id(p) for p in params)
        cached = self._buckets.get(key)
        if cached is not None:
            return cached
        places: list[tuple[int, int, Segment]] = []
        offset, layers = 0, 0
        entries: dict[int, list[np.ndarray]] = {}
        empty = np.zeros(0, dtype)
        for p in params:
            segments = self._layout.get(id(p))
            if segments is None:
                raise ValueError(
                    f"{PROTOCOL}: a bucket holds a parameter of shape {tuple(p.shape)} that "
                    f"is not a trainable parameter of the module the state was built for"
                )
            res = self._residuals.setdefault(id(p), np.zeros(p.numel(), dtype))
            for seg in segments:
                entries.setdefault(seg.layer, [empty, empty])[0 if seg.is_weight else 1] = res[
                    seg.start : seg.stop
                ]
                places.append((offset, seg.layer, seg))
                layers = max(layers, seg.layer + 1)
            offset += p.numel()
        residual = [tuple(entries.get(k, (empty, empty))) for k in range(layers)]
        bucket = _Bucket(residual, places, layers, dtype)  # type: ignore[arg-type]
        self._buckets[key] = bucket
        return bucket

    def _update_model(self, bucket: _Bucket, out: np.ndarray) -> list[tuple[Any, Any]]:
        """The bucket's y2 model over ``out`` (flat, laid out as the bucket's buffer)."""
        empty = np.zeros(0, bucket.dtype)
        entries: dict[int, list[np.ndarray]] = {}
        for offset, layer, seg in bucket.places:
            view = out[offset + seg.start : offset + seg.stop]
            entries.setdefault(layer, [empty, empty])[0 if seg.is_weight else 1] = view
        return [tuple(entries.get(k, (empty, empty))) for k in range(bucket.layers)]

    def _tau_for(self, bucket: _Bucket, n: int) -> float:
        if self.tau is not None:
            return self.tau
        flat = [a for pair in bucket.residual for a in pair if a.size]
        step = max(1, n // TAU_SAMPLE)
        sample = np.abs(np.concatenate([a[::step] for a in flat]))
        k = min(len(sample) - 1, max(0, int(len(sample) * (1 - self.density))))
        tau = float(np.partition(sample, k)[k])
        tiny = float(np.finfo(bucket.dtype).tiny)
        return tau if math.isfinite(tau) and tau > tiny else tiny


def _checked_metas(metas: list[tuple[float, float]], limit: int) -> tuple[list[int], list[float]]:
    """Every rank's (word count, tau), checked before anything is allocated or read for
    them: a count is a whole number from 0 to ``limit`` (the bucket's element count: one
    word per element at most; or the block's capacity), a tau a finite positive number.
    :class:`DecodeError` (field ``rank[r].words`` at byte 0 or ``rank[r].tau`` at byte 8 of
    that rank's 16 bytes) otherwise."""
    sizes, taus = [], []
    for r, (count, tau) in enumerate(metas):
        if not (math.isfinite(count) and count.is_integer() and 0 <= count <= limit):
            raise DecodeError(
                PROTOCOL, f"rank[{r}].words", 0, f"{count!r} words for at most {limit}"
            )
        if not (math.isfinite(tau) and tau > 0):
            raise DecodeError(PROTOCOL, f"rank[{r}].tau", 8, f"{tau!r} is not a positive tau")
        sizes.append(int(count))
        taus.append(tau)
    return sizes, taus


def y2_hook(state: Y2HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: y2 threshold compression with error feedback (see module doc).

    Synchronous (the exchange is done when the hook returns); the returned future holds the
    bucket's buffer, overwritten with the averaged update.
    """
    buffer = bucket.buffer()
    dtype = _NUMPY_DTYPES.get(buffer.dtype)
    if dtype is None:
        raise TypeError(f"{PROTOCOL}: y2 words carry float16/32/64 updates, not {buffer.dtype}")
    group = state.process_group
    world = dist.get_world_size(group)
    params = list(bucket.parameters())
    b = state._bucket(params, dtype)
    t0 = time.perf_counter()
    grads = buffer.detach().cpu().numpy()
    n = grads.size
    for offset, _layer, seg in b.places:  # residual += gradient
        res = b.residual[seg.layer][0 if seg.is_weight else 1]
        res += grads[offset + seg.start : offset + seg.stop]
    tau = state._tau_for(b, n)
    words = y2.compress(b.residual, tau)
    t1 = time.perf_counter()

    device = buffer.device
    if state.tau is None:  # one all-gather: (count, tau) and the words in a fixed block
        capacity = state.capacity(n)
        if len(words) > capacity:  # not sent this step: back into the residual
            y2.apply(b.residual, words[capacity:], tau)
            words = words[:capacity]
        head = np.concatenate(
            [np.array([len(words)], np.int64).view(np.int32), np.array([tau]).view(np.int32)]
        )
        block = torch.zeros(_HEAD + capacity, dtype=torch.int32, device=device)
        block[:_HEAD] = torch.from_numpy(head)
        block[_HEAD : _HEAD + len(words)] = torch.from_numpy(words.view(np.int32))
        blocks = [torch.empty_like(block) for _ in range(world)]
        dist.all_gather(blocks, block, group=group)
        got = [blk.cpu().numpy() for blk in blocks]
        metas = [(float(g[:2].view(np.int64)[0]), float(g[2:4].view(np.float64)[0])) for g in got]
        sizes, taus = _checked_metas(metas, capacity)
        received = [g[_HEAD : _HEAD + k].view(np.uint32) for g, k in zip(got, sizes, strict=True)]
        sent_bytes = (world - 1) * 4 * (_HEAD + capacity)
    else:  # fixed tau: (count, tau) first, then the words padded to the longest
        meta = torch.tensor([len(words), tau], dtype=torch.float64, device=device)
        meta_list = [torch.empty_like(meta) for _ in range(world)]
        dist.all_gather(meta_list, meta, group=group)
        sizes, taus = _checked_metas([tuple(m.tolist()) for m in meta_list], n)
        longest = max(sizes)
        received = [np.zeros(0, np.uint32)] * world
        if longest:
            block = torch.zeros(longest, dtype=torch.int32, device=device)
            block[: len(words)] = torch.from_numpy(words.view(np.int32)).to(device)
            blocks = [torch.empty_like(block) for _ in range(world)]
            dist.all_gather(blocks, block, group=group)
            received = [
                blk.cpu().numpy()[:size].view(np.uint32)
                for blk, size in zip(blocks, sizes, strict=True)
            ]
        sent_bytes = (world - 1) * (16 + 4 * longest)

    t2 = time.perf_counter()
    out = np.zeros(n, dtype)
    model = state._update_model(b, out)
    for rank_words, rank_tau in zip(received, taus, strict=True):
        y2.apply(model, rank_words, rank_tau)
    out /= dtype(world)
    buffer.copy_(torch.from_numpy(out).to(device))

    state.compress_seconds += t1 - t0
    state.exchange_seconds += t2 - t1
    state.apply_seconds += time.perf_counter() - t2
    state.steps += 1
    state.words_sent += len(words)
    state.bytes_sent += sent_bytes
    state.elements += n
    if state.record:
        if state._step_done:  # the first bucket of a step: forget the last step's words
            state.last_words.clear()
        state.last_words[bucket.index()] = list(zip(received, taus, strict=True))
    state._step_done = bucket.is_last()
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buffer)
    return fut


class Y2Cluster:
    """y2's cluster roles over ``torch.distributed`` (after :func:`dist.init_process_group`).

    Rank and world size are y2's NodeIndex; :meth:`shard` is the node's part of the data
    (``y2.partition``); :meth:`report` gathers every node's Runtime record to rank 0 (the
    y2 client's role) once an epoch; :meth:`finish` ends the run.  With ``log`` (a binary
    file, used on rank 0 only) rank 0 writes the y2 messages a y2 client would have received:
    every node's NodeIndex, then each epoch's Runtime records, optionally Delta messages
    (:meth:`log_delta`), and a Finished per node; ``wirekit decode --proto y2`` reads it.
    """

    def __init__(self, group: Any = None, log: Any = None) -> None:
        self.group = group
        self.node = y2.NodeIndex(dist.get_rank(group), dist.get_world_size(group))
        self.runtimes: list[list[y2.Runtime]] = []
        self._log = log if self.node.node_id == 0 else None
        if self._log is not None:
            for k in range(self.node.node_count):
                self._write(y2.NodeIndex(k, self.node.node_count))

    def _write(self, msg: y2.Message) -> None:
        if self._log is not None:
            self._log.write(y2.encode(msg))

    def shard(self, n: int) -> range:
        """This node's samples of a training set of ``n``: ``range(*y2.partition(...))``."""
        return range(*y2.partition(self.node.node_id, self.node.node_count, n))

    def report(self, runtime: y2.Runtime) -> list[y2.Runtime] | None:
        """Gather every node's Runtime record for the epoch: the list (by rank) on rank 0,
        None on the others."""
        wire = y2.encode(runtime)
        gathered: list[Any] | None = (
            [None] * self.node.node_count if self.node.node_id == 0 else None
        )
        dist.gather_object(wire, gathered, dst=0, group=self.group)
        if gathered is None:
            return None
        records = [y2.decode(w) for w in gathered]
        self.runtimes.append(records)  # type: ignore[arg-type]
        for r in records:
            self._write(r)
        return records  # type: ignore[return-value]

    def log_delta(self, words: Iterable[np.ndarray]) -> None:
        """On rank 0 with a log: write each array of words as a y2 Delta message."""
        for w in words:
            self._write(y2.Delta(np.asarray(w, np.uint32)))

    def finish(self) -> None:
        """Every node is done: a barrier; rank 0 logs a Finished per node."""
        dist.barrier(group=self.group)
        for _ in range(self.node.node_count):
            self._write(y2.Finished())
