"""y2 on ``torch.distributed``: a DDP communication hook and the y2 cluster roles.

Install with ``pip install 'wirekit[torch]'``.  Nothing here opens a socket of its own: the
bytes travel through the process group (gloo or NCCL) that the caller set up.

The hook (:func:`y2_hook`, state :class:`Y2HookState`) implements y2's scheme with error
feedback, per DDP bucket:

1. add each parameter's local gradient to its residual (kept per parameter, in the
   gradient's dtype, on the CPU);
2. compress the residuals into delta words: every element with ``|r| >=`` the threshold
   sends one word of ±tau and keeps the rest, the others keep all of theirs (``y2.compress``
   when the threshold is the tau: y2's own rule, and a fixed tau's; see "tau" below);
3. exchange the words and hand DDP the average of every rank's words as the gradient, by one
   of two exchanges (``exchange=``):

   * ``"slots"`` (the default): the reduce-scatter below in two collectives.  Every rank
     sends each owner a slot (one ``all_to_all_single``): a 16-byte head (its word count,
     the size of its next step's slot, its tau) then its words of the owner's range; the
     owner sends every rank its sums block behind the size of its next step's block (a
     second all-to-all).  Each size a rank receives was announced by its sender the step
     before (the largest possible on a bucket's first step), so no collective carries
     counts alone; words beyond a slot and sums beyond a block go back into the residual.
     While everything fits, the update is the reduce-scatter's bit for bit;
   * ``"reduce-scatter"`` (SparCML's and Ok-Topk's shape): rank ``r`` owns the
     ``r``-th of ``W`` equal ranges of the bucket, each rank sends each owner its words there
     (counts and taus all-gathered first, then one ``all_to_all_single``), the owner sums
     them and sends every rank its range's sums as a bitmap plus one code per nonzero sum
     (a second all-to-all): the nearest of a table of magnitudes every rank builds from the
     taus (:mod:`wirekit.y2.sums`: whole taus, exact, when all ranks have one tau; else 16
     magnitudes in equal ratios from the smallest tau to the sum of all, 5 bits a sum); what
     the table cannot say goes into the owner's residual, so nothing is lost.  A rank
     sends about ``(W - 1) / W`` of its words and of the range blocks: its bytes per step
     stay nearly flat as ranks are added (like an all-reduce's).  Three collectives per
     bucket; the owner sums, rounds and codes only its words' elements and nonzero sums;
   * ``"all-gather"``: every rank's words (and its own tau) to every rank, applied and
     averaged by each.  One collective with the adaptive tau, but each rank receives
     ``W - 1`` ranks' words: its bytes grow with the world size.

   The hook returns its future at once: each bucket's exchange runs on a thread of its
   own, after the previous bucket's (the same collective order on every rank), while the
   backward pass goes on; an exchange's error is raised by that future.

   Every size and tau a peer sends is checked before anything is allocated or read for it,
   and so is every word an owner receives (:class:`DecodeError`); an owner that refuses a
   peer's words tells every rank through its block, so that all of them raise.

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
bucket and step, estimates the ``1 - density`` quantile of ``|residual|`` (on at most
``TAU_SAMPLE`` evenly spaced elements), so about ``density`` of the elements send a word
whatever the gradients' scale, and the words' tau is ``tau_scale`` (1.5 by default) times the
mean ``|residual|`` of those elements (not the threshold itself: an element far above it
moves by more than the threshold per step, the error feedback corrects one that moved too
far; at 8 ranks on digits the mean closes the accuracy gap to all-reduce that the threshold
as tau leaves, and 1.5 times the mean most of the gap in steps to a target accuracy).  Each
rank uses its own tau (it travels with the word count).  At
most ``capacity(n)`` words go per rank and step; the rest stay in the residual.  A fixed
tau costs no estimate and gives every rank the same tau (as in y2, where it is a cluster
constant), but the bytes then follow the gradients: a tau too small for them sends up to
one word per element (as many bytes as fp32) and clips every step's move to ±tau; a tau too
large sends almost nothing and the residuals grow until they cross it (slow, stale
updates).  The density trades bytes for
accuracy; ``benchmarks/bench_y2_torch.py`` and the README have the measurements.

The kernels run on the CPU; CUDA gradients are copied to the host and back.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from wirekit import y2
from wirekit._impl import select
from wirekit.errors import DecodeError
from wirekit.y2 import _pure
from wirekit.y2 import sums as sum_blocks
from wirekit.y2.messages import MAX_ARRAY_SIZE, MAX_LAYERS, PROTOCOL

__all__ = [
    "CAPACITY_MIN",
    "CAPACITY_SLACK",
    "EXCHANGES",
    "TAU_SAMPLE",
    "TAU_SCALE",
    "WARMUP_STEPS",
    "Segment",
    "Y2Cluster",
    "Y2HookState",
    "y2_hook",
    "y2_layout",
]

#: Steps (optimizer steps: every bucket of one backward pass) that ``Y2HookState`` all-reduces
#: densely before it compresses (``warmup_steps``'s default).
WARMUP_STEPS = 0
#: The adaptive tau's words move by this many times the mean ``|residual|`` of the elements
#: selected (``tau_scale``'s default).
TAU_SCALE = 1.5
#: The adaptive tau is estimated on at most this many elements of a bucket.
TAU_SAMPLE = 65536
#: With the adaptive tau a rank's block holds ``CAPACITY_SLACK × density ×`` the bucket's
#: elements in words (plus ``CAPACITY_MIN``): the estimate is a sample's quantile.
CAPACITY_SLACK = 1.25
CAPACITY_MIN = 16
_HEAD = 4  # int32s before the words in a block: count (int64), tau (float64)
#: The ``slots`` exchange: int32s before the words in a slot (count, next slot, tau),
#: bytes before an owner's sums block (its next block's size).
SLOT_HEAD = 4
SUMS_HEAD = 4
#: The ``slots`` exchange sizes the next step's slot of ``c`` words (this step's count,
#: before any overflow) ``SLOT_SLACK × c + SLOT_SIGMAS × sqrt(c) + SLOT_MIN``, and the next
#: sums block for that many nonzero sums from this step's.
SLOT_SLACK = 1.05
SLOT_SIGMAS = 2.0
SLOT_MIN = 4
#: How the hook moves the words (:class:`Y2HookState` ``exchange``).
EXCHANGES = ("slots", "reduce-scatter", "all-gather")

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
    velocity: list[tuple[np.ndarray, np.ndarray]]  # momentum correction's (else empty)
    places: list[tuple[int, int, Segment]]  # (offset in buffer, layer entry, segment)
    layers: int
    dtype: Any
    # reduce-scatter: where each (layer, weight or bias) array of the y2 model starts in the
    # buffer and its length, at 2 × layer + (0 weights, 1 biases)
    slot_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    slot_size: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # slots: the sizes agreed one step ahead (None before the bucket's first step): words
    # this rank may send each owner, words each rank may send this one, bytes of each
    # owner's sums block
    slots_out: np.ndarray | None = None
    slots_in: np.ndarray | None = None
    sum_bounds: np.ndarray | None = None
    # slots and reduce-scatter: the owner's accumulator (float64 zeros between steps)
    sum_scratch: np.ndarray | None = None
    # the adaptive tau's sample of |residual|, taken as the step's gradient went in
    tau_sample: np.ndarray | None = None


@dataclass
class Y2HookState:
    """State of :func:`y2_hook` (pass it to ``register_comm_hook``).

    ``module``: the model (or its DDP wrapper), for the layer ids.  ``tau``: a fixed
    threshold; ``None`` (the default) adapts it so that about ``density`` of a bucket's
    elements send a word each step.  ``exchange``: ``"slots"`` (the default: the
    reduce-scatter in two collectives, sizes agreed one step ahead), ``"reduce-scatter"``
    (each rank sums the words of one range of the bucket and sends every rank the sums,
    coded compactly; the bytes per rank stay nearly flat as ranks are added; three
    collectives) or ``"all-gather"``
    (every rank's words to every rank; bytes per rank grow with the world size).
    ``process_group``: the group DDP uses (default group if None).  ``record``: keep the
    words of the last step in ``last_words`` (bucket index → ``(words, tau)`` per rank:
    every rank's words with ``all-gather``, the words this rank received from each rank,
    those of its range, with ``slots`` and ``reduce-scatter``).

    Convergence per step (specs/y2.md "Convergence per step" has the measurements):
    ``tau_scale``: with the adaptive tau, the words move by ``tau_scale ×`` the mean
    ``|residual|`` of the elements selected (at least the threshold; no bytes: the same
    words).  ``momentum``: momentum correction (DGC): the hook keeps a velocity per
    parameter, ``u = momentum × u + gradient``, and compresses ``residual += u``; the
    optimizer must then run *without* momentum (``SGD(momentum=0)``: the hook applies
    it, before compression, so that what the residual holds back is momentum's too);
    ``momentum_masking``: zero ``u`` where a word was sent (DGC's momentum factor masking).
    ``warmup_steps``: the first optimizer steps (every bucket of a backward pass) are
    all-reduced densely (``residual`` sent whole, in the gradient's dtype: a ring
    all-reduce's bytes, counted in ``bytes_sent``).

    Counters (this rank): ``steps`` (buckets hooked), ``words_sent``, ``bytes_sent``
    (what this rank puts on the wire: ``(world - 1) ×`` its block in a ring all-gather,
    sizes included; its parts for the other ranks in an all-to-all), ``elements`` (gradient
    elements seen), and the seconds spent in ``compress_seconds`` (residual update, tau,
    compress), ``exchange_seconds`` (the collectives, and with ``slots`` or
    ``reduce-scatter`` the summing and coding of its range) and ``apply_seconds`` (apply
    and average).
    """

    module: torch.nn.Module
    tau: float | None = None
    density: float = 0.05
    exchange: str = "slots"
    process_group: Any = None
    record: bool = False
    warmup_steps: int = WARMUP_STEPS
    momentum: float = 0.0
    momentum_masking: bool = False
    tau_scale: float = TAU_SCALE
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
    _velocities: dict[int, np.ndarray] = field(init=False, repr=False, default_factory=dict)
    _step_done: bool = field(init=False, repr=False, default=False)
    _optimizer_steps: int = field(init=False, repr=False, default=0)
    _running: threading.Thread | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        if self.tau is not None and not (math.isfinite(self.tau) and self.tau > 0):
            raise ValueError(f"{PROTOCOL}: tau must be a finite positive number, got {self.tau}")
        if not 0 < self.density <= 1:
            raise ValueError(f"{PROTOCOL}: density must be in (0, 1], got {self.density}")
        if isinstance(self.warmup_steps, bool) or not (
            isinstance(self.warmup_steps, int) and self.warmup_steps >= 0
        ):
            raise ValueError(
                f"{PROTOCOL}: warmup_steps must be a whole number >= 0, got {self.warmup_steps!r}"
            )
        if not 0 <= self.momentum < 1:
            raise ValueError(f"{PROTOCOL}: momentum must be in [0, 1), got {self.momentum}")
        if not (math.isfinite(self.tau_scale) and self.tau_scale >= 1):
            raise ValueError(
                f"{PROTOCOL}: tau_scale must be a finite number >= 1, got {self.tau_scale}"
            )
        if self.exchange not in EXCHANGES:
            raise ValueError(
                f"{PROTOCOL}: exchange must be one of {', '.join(EXCHANGES)}, got {self.exchange!r}"
            )
        if isinstance(self.module, torch.nn.parallel.DistributedDataParallel):
            # keep the model, not its wrapper: DDP holds this state (a cycle through the
            # wrapper would keep its process group alive until a garbage collection)
            self.module = self.module.module
        self._layout = y2_layout(self.module)

    def residual(self, param: torch.Tensor) -> np.ndarray | None:
        """The residual (flat, what was not sent yet) kept for ``param``, or None."""
        return self._residuals.get(id(param))

    def velocity(self, param: torch.Tensor) -> np.ndarray | None:
        """The momentum correction's velocity (flat) kept for ``param``, or None."""
        return self._velocities.get(id(param))

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
        speeds: dict[int, list[np.ndarray]] = {}
        empty = np.zeros(0, dtype)
        for p in params:
            segments = self._layout.get(id(p))
            if segments is None:
                raise ValueError(
                    f"{PROTOCOL}: a bucket holds a parameter of shape {tuple(p.shape)} that "
                    f"is not a trainable parameter of the module the state was built for"
                )
            res = self._residuals.setdefault(id(p), np.zeros(p.numel(), dtype))
            vel = (
                self._velocities.setdefault(id(p), np.zeros(p.numel(), dtype))
                if self.momentum
                else None
            )
            for seg in segments:
                entries.setdefault(seg.layer, [empty, empty])[0 if seg.is_weight else 1] = res[
                    seg.start : seg.stop
                ]
                if vel is not None:
                    speeds.setdefault(seg.layer, [empty, empty])[0 if seg.is_weight else 1] = vel[
                        seg.start : seg.stop
                    ]
                places.append((offset, seg.layer, seg))
                layers = max(layers, seg.layer + 1)
            offset += p.numel()
        residual = [tuple(entries.get(k, (empty, empty))) for k in range(layers)]
        velocity = [tuple(speeds.get(k, (empty, empty))) for k in range(layers)] if speeds else []
        bucket = _Bucket(residual, velocity, places, layers, dtype)  # type: ignore[arg-type]
        # the model over the buffer positions themselves: each array's first position
        positions = self._update_model(bucket, np.arange(offset, dtype=np.int64))
        arrays = [a for pair in positions for a in pair]
        bucket.slot_start = np.array([a[0] if a.size else 0 for a in arrays], np.int64)
        bucket.slot_size = np.array([a.size for a in arrays], np.int64)
        self._buckets[key] = bucket
        return bucket

    def _update_model(self, bucket: _Bucket, out: np.ndarray) -> list[tuple[np.ndarray, ...]]:
        """The bucket's y2 model over ``out`` (flat, laid out as the bucket's buffer)."""
        empty = np.zeros(0, out.dtype)
        entries: dict[int, list[np.ndarray]] = {}
        for offset, layer, seg in bucket.places:
            view = out[offset + seg.start : offset + seg.stop]
            entries.setdefault(layer, [empty, empty])[0 if seg.is_weight else 1] = view
        return [tuple(entries.get(k, (empty, empty))) for k in range(bucket.layers)]

    def _compress(self, bucket: _Bucket, n: int) -> tuple[np.ndarray, float]:
        """This step's words of the bucket and their tau; the residual keeps the rest.

        Fixed tau: ``y2.compress`` with it.  Adaptive: the elements whose ``|residual|``
        reaches the ``1 - density`` quantile (the threshold, estimated on at most
        ``TAU_SAMPLE`` evenly spaced elements) send a word, and the words' tau is the mean
        ``|residual|`` of those elements in the sample (at least the threshold): each
        selected residual moves by that tau (``compress_with_rest``: at the threshold, then
        the rest of the tau, in one pass).
        """
        words, tau = self._select(bucket, n)
        if self.momentum_masking and bucket.velocity and len(words):
            _zero_at(bucket.velocity, words)
        return words, tau

    def _select(self, bucket: _Bucket, n: int) -> tuple[np.ndarray, float]:
        """:meth:`_compress`'s words and tau, the residual updated (no masking)."""
        if self.tau is not None:
            return y2.compress(bucket.residual, self.tau), self.tau
        sample = bucket.tau_sample
        if sample is None:  # not taken by _add_gradient: take it now
            sample = _pure.tau_sample(bucket.residual, _every(n))
        bucket.tau_sample = None
        threshold, tau = _adaptive_tau(sample, self.density, self.tau_scale, bucket.dtype)
        # the words, and the selected residuals moved by the threshold then the rest of
        # the tau (what compress then apply of the flipped words by the rest did)
        words = _fused().compress_with_rest(bucket.residual, threshold, tau - threshold)
        return words, tau

    def _add_gradient(self, bucket: _Bucket, grads: np.ndarray, sample: bool) -> None:
        """A step's gradient (laid out as the bucket's buffer) into the residual; with
        momentum correction, into the velocity first (``u = momentum × u + g``), and the
        velocity into the residual.  With ``sample`` and the adaptive tau, the tau's sample
        of ``|residual|`` (every ``n // TAU_SAMPLE``-th element) in the same pass."""
        every = _every(grads.size) if sample and self.tau is None else 0
        sampled = _fused().accumulate(
            bucket.residual,
            self._update_model(bucket, grads),
            every,
            bucket.velocity or None,
            self.momentum,
        )
        bucket.tau_sample = sampled if every else None

    def _dense(self, bucket: _Bucket, n: int, device: Any, out: np.ndarray | None) -> "_Step":
        """A warm-up step: the whole residual all-reduced and averaged (into ``out`` when
        given), the residual zeroed; the velocity is kept (no masking: a dense step with
        momentum correction is momentum SGD's)."""
        t1 = time.perf_counter()
        group = self.process_group
        world = dist.get_world_size(group)
        out = _zeroed(out, n, bucket.dtype)
        model = self._update_model(bucket, out)
        for mine, theirs in zip(bucket.residual, model, strict=True):
            for res, dense in zip(mine, theirs, strict=True):
                dense[:] = res
                res.fill(0)
        tensor = torch.from_numpy(out).to(device)
        dist.all_reduce(tensor, group=group)
        if tensor.device.type != "cpu" or tensor.data_ptr() != out.ctypes.data:
            out[:] = tensor.cpu().numpy()
        out /= bucket.dtype(world)
        sent = 2 * (world - 1) * out.nbytes // world  # a ring all-reduce's
        return _Step(out, 0, sent, [], [], t1, time.perf_counter())


def _adaptive_tau(
    sample: np.ndarray, density: float, tau_scale: float, dtype: Any
) -> tuple[float, float]:
    """The adaptive tau's threshold and tau from a sample of ``|residual|``: the threshold
    is the sample's ``1 - density`` quantile (at least ``dtype``'s smallest normal), the
    tau ``tau_scale`` times the mean of the sampled values at or above it (at least the
    threshold; the threshold itself where that is not finite)."""
    k = min(len(sample) - 1, max(0, int(len(sample) * (1 - density))))
    threshold = float(np.partition(sample, k)[k])
    tiny = float(np.finfo(dtype).tiny)
    if not (math.isfinite(threshold) and threshold > tiny):
        threshold = tiny
    selected = sample[sample >= threshold]
    tau = float(selected.mean(dtype=np.float64)) if selected.size else threshold
    tau = tau if math.isfinite(tau) and tau > threshold else threshold
    if tau_scale != 1:
        scaled = tau * tau_scale
        tau = scaled if math.isfinite(scaled) and scaled > threshold else threshold
    return threshold, tau


def _fused() -> ModuleType:
    """The y2 twin (Cython, or :mod:`wirekit.y2._pure`) of the hook's passes over a whole
    bucket: ``accumulate`` (gradient into the residual, tau sample) and
    ``compress_with_rest``."""
    return select("y2", _pure)


def _every(n: int) -> int:
    """The tau sample's stride for a bucket of ``n`` elements (at most ``TAU_SAMPLE``
    elements, a few more for several arrays)."""
    return max(1, n // TAU_SAMPLE)


def _zero_at(model: list[tuple[np.ndarray, np.ndarray]], words: np.ndarray) -> None:
    """Zero the elements of a y2 model (per layer: weights, biases) that ``words``
    address."""
    layer, is_weight, index, _sign = y2.unpack(words)
    slot = 2 * layer.astype(np.int64) + ~is_weight
    for s in np.unique(slot):
        model[s // 2][s % 2][index[slot == s]] = 0


def _checked_metas(
    metas: list[tuple[float, float]], limit: int, dtype: Any
) -> tuple[list[int], list[float]]:
    """Every rank's (word count, tau), checked before anything is allocated or read for
    them: a count is a whole number from 0 to ``limit`` (the bucket's element count: one
    word per element at most; or the block's capacity), a tau a finite positive number,
    the taus' sum within ``dtype`` (:func:`_check_tau_sum`).  :class:`DecodeError` (field
    ``rank[r].words`` at byte 0 or ``rank[r].tau`` at byte 8 of that rank's 16 bytes)
    otherwise."""
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
    _check_tau_sum(taus, dtype, 8)
    return sizes, taus


class _Step(NamedTuple):
    """What one exchange did for a bucket on this rank."""

    out: np.ndarray  # the averaged update, laid out as the bucket's buffer
    words: int  # words this rank sent
    sent_bytes: int
    received: list[np.ndarray]  # the words received from each rank
    taus: list[float]  # and the tau of each rank's words
    compressed: float  # time.perf_counter() when the words were made
    exchanged: float  # ... and when the collectives were done


def y2_hook(state: Y2HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: y2 threshold compression with error feedback (see module doc).

    Returns at once: the bucket's exchange (residual update, compression, collectives,
    coding) runs on a thread of its own, after the previous bucket's (every rank issues
    its collectives in the same order), while the backward pass goes on; the returned
    future completes with the bucket's buffer, overwritten with the averaged update (or
    with the exchange's error, which DDP raises at the end of the backward pass).
    """
    buffer = bucket.buffer()
    dtype = _NUMPY_DTYPES.get(buffer.dtype)
    if dtype is None:
        raise TypeError(f"{PROTOCOL}: y2 words carry float16/32/64 updates, not {buffer.dtype}")
    b = state._bucket(list(bucket.parameters()), dtype)
    fut: torch.futures.Future[Any] = torch.futures.Future()
    result = fut.then(_buffer_or_raise)
    job = threading.Thread(
        target=_exchange_bucket,
        args=(state, b, buffer, bucket.index(), bucket.is_last(), fut, state._running),
        name=f"y2-bucket-{bucket.index()}",
        daemon=True,
    )
    state._running = job
    job.start()
    return result


def _buffer_or_raise(fut: torch.futures.Future[Any]) -> torch.Tensor:
    """The exchange's buffer; its error raised here, in a callback, so that DDP reports it
    (an exception set on a future DDP waits for is taken for the value)."""
    value = fut.value()
    if isinstance(value, BaseException):
        raise value
    return value  # type: ignore[no-any-return]


def _exchange_bucket(
    state: Y2HookState,
    b: _Bucket,
    buffer: torch.Tensor,
    index: int,
    is_last: bool,
    fut: torch.futures.Future[Any],
    previous: threading.Thread | None,
) -> None:
    """One bucket's exchange (the body of :func:`y2_hook`), after ``previous``'s; the
    buffer or the error as ``fut``'s result."""
    if previous is not None:
        previous.join()
    try:
        t0 = time.perf_counter()
        grads = buffer.detach().cpu().numpy()
        n = grads.size
        dense = state._optimizer_steps < state.warmup_steps
        state._add_gradient(b, grads, sample=not dense)
        exchange = Y2HookState._dense if dense else _EXCHANGE_FUNCTIONS[state.exchange]
        on_cpu = buffer.device.type == "cpu"  # then grads is the buffer: the update goes there
        step = exchange(state, b, n, buffer.device, grads if on_cpu else None)
        if step.out is not grads:
            buffer.copy_(torch.from_numpy(step.out).to(buffer.device))
    except BaseException as exc:  # raised by the future y2_hook returned
        fut.set_result(exc)
        return
    state.compress_seconds += step.compressed - t0
    state.exchange_seconds += step.exchanged - step.compressed
    state.apply_seconds += time.perf_counter() - step.exchanged
    state.steps += 1
    state.words_sent += step.words
    state.bytes_sent += step.sent_bytes
    state.elements += n
    if state.record:
        if state._step_done:  # the first bucket of a step: forget the last step's words
            state.last_words.clear()
        state.last_words[index] = list(zip(step.received, step.taus, strict=True))
    state._step_done = is_last
    state._optimizer_steps += is_last
    fut.set_result(buffer)


def _all_gather(
    state: Y2HookState, b: _Bucket, n: int, device: Any, out: np.ndarray | None
) -> _Step:
    """Every rank's words (and tau) to every rank; each applies them all and averages
    (into ``out``, zeroed first, when given)."""
    group = state.process_group
    world = dist.get_world_size(group)
    words, tau = state._compress(b, n)
    t1 = time.perf_counter()

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
        sizes, taus = _checked_metas(metas, capacity, b.dtype)
        received = [g[_HEAD : _HEAD + k].view(np.uint32) for g, k in zip(got, sizes, strict=True)]
        sent_bytes = (world - 1) * 4 * (_HEAD + capacity)
    else:  # fixed tau: (count, tau) first, then the words padded to the longest
        meta = torch.tensor([len(words), tau], dtype=torch.float64, device=device)
        meta_list = [torch.empty_like(meta) for _ in range(world)]
        dist.all_gather(meta_list, meta, group=group)
        sizes, taus = _checked_metas([tuple(m.tolist()) for m in meta_list], n, b.dtype)
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
    out = _zeroed(out, n, b.dtype)
    model = state._update_model(b, out)
    for rank_words, rank_tau in zip(received, taus, strict=True):
        y2.apply(model, rank_words, rank_tau)
    out /= b.dtype(world)
    return _Step(out, len(words), sent_bytes, received, taus, t1, t2)


def _capped_words(state: Y2HookState, b: _Bucket, n: int) -> tuple[np.ndarray, float, int]:
    """This rank's words of the bucket, their tau (the fixed one, or this rank's own) and
    the most words a rank may send (``n``; with the adaptive tau the capacity): past it an
    even spread of them goes, the rest back into the residual."""
    words, tau = state._compress(b, n)
    limit = n
    if state.tau is None:
        limit = state.capacity(n)
        if len(words) > limit:
            keep = np.zeros(len(words), bool)
            keep[np.arange(limit) * len(words) // limit] = True
            y2.apply(b.residual, words[~keep], tau)
            words = words[keep]
    return words, tau, limit


def _reduce_scatter(
    state: Y2HookState, b: _Bucket, n: int, device: Any, out: np.ndarray | None
) -> _Step:
    """Rank ``r`` owns the buffer's elements ``r n / W`` to ``(r + 1) n / W``: every rank
    sends it its words there (all-to-all), it sums them and sends every rank the sums, each
    the nearest magnitude of the step's table, coded by :mod:`wirekit.y2.sums` (all-to-all
    again); the update into ``out``, zeroed first, when given."""
    group = state.process_group
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    edges = np.array([r * n // world for r in range(world + 1)], np.int64)
    sizes = np.diff(edges)
    words, tau, limit = _capped_words(state, b, n)
    sent_bytes = 0
    positions = _positions(b, words, "words")
    order = np.argsort(positions, kind="stable")
    words, positions = words[order], positions[order]
    counts = np.diff(np.searchsorted(positions, edges)).astype(np.int64)
    t1 = time.perf_counter()

    # every rank's word count per range, and its tau
    head = np.concatenate([counts, np.array([tau], np.float64).view(np.int64)])
    heads = _all_gather_array(head, group, device)
    sent_bytes += (world - 1) * head.nbytes
    matrix, taus = _checked_heads(heads, sizes, limit, state.tau, b.dtype)
    # the sums' unit is the smallest tau; the table of magnitudes they are coded by
    unit = min(taus)
    table = sum_blocks.magnitudes(taus)
    # the words to the owner of their range
    incoming = matrix[:, rank]
    got = _all_to_all(words.view(np.int32), counts, incoming, group, device).view(np.uint32)
    sent_bytes += 4 * (len(words) - int(counts[rank]))
    received = np.split(got, np.cumsum(incoming)[:-1])
    # this rank's range summed and coded; a peer's bad words refused to every rank
    lo, hi = int(edges[rank]), int(edges[rank + 1])
    refusal: DecodeError | None = None
    try:
        block, _wanted = _sum_range(b, received, taus, unit, table, lo, hi)
    except DecodeError as exc:
        refusal, block = exc, sum_blocks.refused()
    bounds = [
        sum_blocks.block_size(int(sizes[j]), int(min(sizes[j], matrix[:, j].sum())), table.size)
        for j in range(world)
    ]
    padded = np.zeros(bounds[rank], np.uint8)
    padded[: block.size] = block
    blocks = _all_to_all(np.tile(padded, world), [bounds[rank]] * world, bounds, group, device)
    sent_bytes += (world - 1) * bounds[rank]
    if refusal is not None:
        raise refusal
    t2 = time.perf_counter()

    out = _zeroed(out, n, b.dtype)
    for j, part in enumerate(np.split(blocks, np.cumsum(bounds)[:-1])):
        sum_blocks.decode_into(
            out, int(edges[j]), part, int(sizes[j]), table, unit / world, f"rank[{j}].sums"
        )
    return _Step(out, len(words), sent_bytes, received, taus, t1, t2)


def _grown(count: np.ndarray) -> np.ndarray:
    """The next step's room for ``count`` items (per owner): this step's with slack."""
    count = np.asarray(count, np.float64)
    room = SLOT_SLACK * count + SLOT_SIGMAS * np.sqrt(count) + SLOT_MIN
    return np.ceil(room).astype(np.int64)


def _sums_bound(size: int, nonzeros: int, world: int) -> int:
    """Bytes of a ``slots`` sums block (its head included) with room for ``nonzeros`` sums
    of a range of ``size`` elements, with the widest codes a table can have."""
    levels = max(sum_blocks.LEVELS, world)
    return SUMS_HEAD + sum_blocks.block_size(size, min(size, nonzeros), levels)


def _room(bound: int, size: int, levels: int) -> int:
    """How many nonzero sums of a range of ``size`` fit a ``slots`` block of ``bound``
    bytes with a table of ``levels``."""
    bits = sum_blocks.value_bits(levels)
    free = (bound - SUMS_HEAD - sum_blocks.HEADER) * 8 - size
    return max(0, min(size, free // bits))


def _slots(state: Y2HookState, b: _Bucket, n: int, device: Any, out: np.ndarray | None) -> _Step:
    """The reduce-scatter exchange in two collectives: rank ``r`` owns the buffer's
    elements ``r n / W`` to ``(r + 1) n / W``; every rank sends each owner a slot of a size
    agreed one step ahead, its head (word count, the next step's slot, tau) then its words
    there (all-to-all); the owner sums them and sends every rank a block of the size it
    announced the step before, its next block's size then the sums coded by
    :mod:`wirekit.y2.sums` (all-to-all).  Words beyond a slot and sums beyond a block go
    back into the residual (nothing is lost).  The first step's sizes are the largest
    possible ones.  The update goes into ``out`` when given (each range's block writes
    every element of its range)."""
    group = state.process_group
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    edges = np.array([r * n // world for r in range(world + 1)], np.int64)
    sizes = np.diff(edges)
    words, tau, limit = _capped_words(state, b, n)
    most = np.minimum(sizes, limit)  # a slot's largest size, for each owner
    if b.slots_out is None or b.slots_in is None or b.sum_bounds is None:
        b.slots_out, b.slots_in = most.copy(), np.full(world, most[rank], np.int64)
        b.sum_bounds = np.array([_sums_bound(int(s), int(s), world) for s in sizes], np.int64)
    slots, slots_in, bounds = b.slots_out, b.slots_in, b.sum_bounds
    positions = _positions(b, words, "words")
    order = np.argsort(positions, kind="stable")
    words = words[order]
    starts = np.searchsorted(positions[order], edges)
    counts = np.diff(starts)
    next_slots = np.minimum(most, _grown(counts))
    t1 = time.perf_counter()

    # each owner's slot: head, then the words of its range that fit, an even spread
    send = np.zeros(int((SLOT_HEAD + slots).sum()), np.int32)
    tau_bits = np.array([tau], np.float64).view(np.int32)
    at, dropped, sent_words = 0, [], 0
    for j in range(world):
        part = words[starts[j] : starts[j + 1]]
        if part.size > slots[j]:
            keep = np.zeros(part.size, bool)
            keep[np.arange(slots[j]) * part.size // slots[j]] = True
            dropped.append(part[~keep])
            part = part[keep]
        send[at : at + 2] = (part.size, next_slots[j])
        send[at + 2 : at + SLOT_HEAD] = tau_bits
        send[at + SLOT_HEAD : at + SLOT_HEAD + part.size] = part.view(np.int32)
        at += SLOT_HEAD + int(slots[j])
        sent_words += part.size
    if dropped:
        y2.apply(b.residual, np.concatenate(dropped), tau)
    got = _all_to_all(send, SLOT_HEAD + slots, SLOT_HEAD + slots_in, group, device)
    sent_bytes = 4 * int((SLOT_HEAD + slots).sum() - (SLOT_HEAD + slots[rank]))

    # this rank's range summed and coded; a peer's bad slot refused to every rank
    lo, hi = int(edges[rank]), int(edges[rank + 1])
    refusal: DecodeError | None = None
    received: list[np.ndarray] = []
    taus: list[float] = []
    next_in = slots_in
    table = np.ones(1)
    try:
        parts = np.split(got, np.cumsum(SLOT_HEAD + slots_in)[:-1])
        received, taus, next_in = _checked_slots(
            parts, slots_in, int(most[rank]), state.tau, b.dtype
        )
        unit, table = min(taus), sum_blocks.magnitudes(taus)
        room = _room(int(bounds[rank]), hi - lo, table.size)
        block, wanted = _sum_range(b, received, taus, unit, table, lo, hi, room)
        next_bound = _sums_bound(hi - lo, int(_grown(np.array([wanted]))[0]), world)
    except DecodeError as exc:
        refusal, block, next_bound = exc, sum_blocks.refused(), int(bounds[rank])
    padded = np.zeros(int(bounds[rank]), np.uint8)
    padded[:SUMS_HEAD] = np.array([next_bound], "<u4").view(np.uint8)
    padded[SUMS_HEAD : SUMS_HEAD + block.size] = block
    mine = int(bounds[rank])
    blocks = _all_to_all(np.tile(padded, world), [mine] * world, bounds, group, device)
    sent_bytes += (world - 1) * mine
    if refusal is not None:
        raise refusal
    t2 = time.perf_counter()

    out = np.empty(n, b.dtype) if out is None else out  # every range's block writes it all
    next_bounds = bounds.copy()
    for j, part in enumerate(np.split(blocks, np.cumsum(bounds)[:-1])):
        size = int(sizes[j])
        field_name = f"rank[{j}].sums"
        sum_blocks.decode_into(
            out,
            int(edges[j]),
            part[SUMS_HEAD:],
            size,
            table,
            min(taus) / world,
            field_name,
            zero_rest=True,
        )
        announced = int(part[:SUMS_HEAD].view("<u4")[0])
        largest = _sums_bound(size, size, world)
        if not SUMS_HEAD + sum_blocks.HEADER <= announced <= largest:
            raise DecodeError(
                PROTOCOL,
                f"{field_name}.next",
                0,
                f"{announced} bytes for a block of {SUMS_HEAD + sum_blocks.HEADER} to {largest}",
            )
        next_bounds[j] = announced
    b.slots_out, b.slots_in, b.sum_bounds = next_slots, next_in, next_bounds
    return _Step(out, sent_words, sent_bytes, received, taus, t1, t2)


def _checked_slots(
    parts: list[np.ndarray], slots: np.ndarray, most: int, fixed: float | None, dtype: Any
) -> tuple[list[np.ndarray], list[float], np.ndarray]:
    """Every rank's words for this rank's range, their taus and each rank's next slot,
    read from the slots received (``slots[r]`` words after a head each), checked before
    anything is read for them: a count within the slot, a next slot of at most ``most``
    words (the range's elements, or the block's capacity), a tau finite and positive (and
    ``fixed`` when the tau is fixed), the taus' sum within ``dtype``.  :class:`DecodeError`
    (``rank[r].slot`` at byte 0 or 4, ``rank[r].tau`` at byte 8 of that rank's slot)
    otherwise."""
    received, taus, next_slots = [], [], np.zeros(len(parts), np.int64)
    for r, part in enumerate(parts):
        count, announced = (int(v) for v in part[:2].view(np.uint32))
        if count > slots[r]:
            raise DecodeError(
                PROTOCOL, f"rank[{r}].slot", 0, f"{count} words for a slot of {int(slots[r])}"
            )
        if announced > most:
            raise DecodeError(
                PROTOCOL,
                f"rank[{r}].slot",
                4,
                f"a next slot of {announced} words for at most {most}",
            )
        tau = float(part[2:SLOT_HEAD].view(np.float64)[0])
        if not (math.isfinite(tau) and tau > 0):
            raise DecodeError(PROTOCOL, f"rank[{r}].tau", 8, f"{tau!r} is not a positive tau")
        if fixed is not None and tau != fixed:
            raise DecodeError(
                PROTOCOL,
                f"rank[{r}].tau",
                8,
                f"{tau!r} is not this rank's fixed tau {fixed!r} (one tau for all ranks)",
            )
        received.append(part[SLOT_HEAD : SLOT_HEAD + count].view(np.uint32))
        taus.append(tau)
        next_slots[r] = announced
    _check_tau_sum(taus, dtype, 8)
    return received, taus, next_slots


def _zeroed(out: np.ndarray | None, n: int, dtype: Any) -> np.ndarray:
    """``out`` set to zeros, or a new zero array of ``n`` elements of ``dtype``."""
    if out is None:
        return np.zeros(n, dtype)
    out.fill(0)
    return out


def _sum_range(
    b: _Bucket,
    received: list[np.ndarray],
    taus: list[float],
    unit: float,
    table: np.ndarray,
    lo: int,
    hi: int,
    most: int | None = None,
) -> tuple[np.ndarray, int]:
    """The block of this rank's range ``lo:hi`` and how many nonzero sums it wanted: every
    rank's words there (checked) summed in units of ``unit`` (ranks in order), each nonzero
    sum as the nearest magnitude of the table, at most ``most`` of them (the largest); what
    that does not say goes into this rank's residual (sent later: nothing is lost).  Only
    the words' elements and the nonzero sums are touched (:func:`sum_blocks.sum_range`, the
    y2 twin's kernel)."""
    weights = np.array([t / unit for t in taus], np.float64)
    if b.sum_scratch is None or b.sum_scratch.size < min(hi - lo, sum_blocks.SCRATCH):
        b.sum_scratch = np.zeros(min(hi - lo, sum_blocks.SCRATCH), np.float64)
    block, left_at, left, wanted = sum_blocks.sum_range(
        received,
        weights,
        b.slot_start,
        b.slot_size,
        lo,
        hi,
        table,
        unit,
        -1 if most is None else most,
        b.sum_scratch,
    )
    if left_at.size:
        _add_to_residual(b, left_at, left)
    return block, wanted


def _add_to_residual(b: _Bucket, positions: np.ndarray, values: np.ndarray) -> None:
    """Add ``values`` to the residual of the buffer's elements at ``positions``
    (ascending)."""
    for offset, _layer, seg in b.places:
        first, last = offset + seg.start, offset + seg.stop
        i, j = np.searchsorted(positions, [first, last])
        if i < j:
            res = b.residual[seg.layer][0 if seg.is_weight else 1]
            res[positions[i:j] - first] += values[i:j]


def _positions(b: _Bucket, words: np.ndarray, field_name: str) -> np.ndarray:
    """Where in the bucket's buffer each word's element is; :class:`DecodeError`
    (``field_name[i]``) for a word that addresses no element of the bucket."""
    return sum_blocks.word_positions(words, b.slot_start, b.slot_size, field_name)


def _all_gather_array(array: np.ndarray, group: Any, device: Any) -> np.ndarray:
    """Every rank's ``array`` (same shape and dtype everywhere), stacked by rank."""
    tensor = torch.from_numpy(array).to(device)
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor, group=group)
    return np.stack([p.cpu().numpy() for p in parts])


def _all_to_all(
    send: np.ndarray, send_counts: Any, receive_counts: Any, group: Any, device: Any
) -> np.ndarray:
    """``send`` cut into ``send_counts`` items for each rank in turn; what each rank sent
    this one (``receive_counts`` items from each), concatenated by rank."""
    tensor = torch.from_numpy(np.ascontiguousarray(send)).to(device)
    out = torch.empty(int(sum(receive_counts)), dtype=tensor.dtype, device=device)
    dist.all_to_all_single(
        out,
        tensor,
        [int(c) for c in receive_counts],
        [int(c) for c in send_counts],
        group=group,
    )
    return out.cpu().numpy()


def _check_tau_sum(taus: list[float], dtype: Any, offset: int) -> None:
    """The ranks' taus together must fit the gradient's dtype (the average of one word per
    rank on an element is at most their sum), and the sums' table must be finite.  Every
    rank checks the same gathered taus, so every rank raises :class:`DecodeError`
    (``rank[r].tau`` at ``offset`` of the largest tau's rank) at the same point."""
    total = math.fsum(taus)
    if total <= float(np.finfo(dtype).max) and total / min(taus) < math.inf:
        return
    r = int(np.argmax(taus))
    raise DecodeError(
        PROTOCOL,
        f"rank[{r}].tau",
        offset,
        f"{taus[r]!r} makes the sum of the ranks' taus too large for {np.dtype(dtype).name}",
    )


def _checked_heads(
    heads: np.ndarray, sizes: np.ndarray, limit: int, fixed: float | None, dtype: Any
) -> tuple[np.ndarray, list[float]]:
    """Every rank's words per range (a rank × range matrix) and tau, checked: a count from
    0 to the range's elements, at most ``limit`` in all, a tau finite and positive (and
    ``fixed``, when the tau is fixed: the same on every rank), the taus' sum within
    ``dtype`` (:func:`_check_tau_sum`).  :class:`DecodeError`
    (``rank[r].counts[j]`` / ``rank[r].tau``, the offset in that rank's head) otherwise."""
    world = sizes.size
    matrix = heads[:, :world]
    taus = heads[:, world].view(np.float64)
    for r in range(world):
        row = matrix[r]
        bad = (row < 0) | (row > sizes)
        if bad.any():
            j = int(np.argmax(bad))
            raise DecodeError(
                PROTOCOL,
                f"rank[{r}].counts[{j}]",
                8 * j,
                f"{int(row[j])} words for a range of {int(sizes[j])} elements",
            )
        if int(row.sum()) > limit:
            raise DecodeError(
                PROTOCOL, f"rank[{r}].counts", 0, f"{int(row.sum())} words for at most {limit}"
            )
        tau = float(taus[r])
        if not (math.isfinite(tau) and tau > 0):
            raise DecodeError(
                PROTOCOL, f"rank[{r}].tau", 8 * world, f"{tau!r} is not a positive tau"
            )
        if fixed is not None and tau != fixed:
            raise DecodeError(
                PROTOCOL,
                f"rank[{r}].tau",
                8 * world,
                f"{tau!r} is not this rank's fixed tau {fixed!r} (one tau for all ranks)",
            )
    checked = [float(t) for t in taus]
    _check_tau_sum(checked, dtype, 8 * world)
    return matrix, checked


#: The function of each exchange name.
_EXCHANGE_FUNCTIONS: dict[str, Callable[..., _Step]] = {
    "slots": _slots,
    "reduce-scatter": _reduce_scatter,
    "all-gather": _all_gather,
}


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
