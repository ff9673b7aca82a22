"""The CUDA path of the inference engine: one fused kernel a decision batch, replayed as a
CUDA graph.

Per decision batch of B rows padded to a bucket b in (1, 2, 4, ..., max_batch), the bucket's
graph runs one kernel (:mod:`agent.kernels.decide`): each thread block (or cluster of blocks)
pushes its row into the slot's window and takes it through the encoder, both heads, Thompson
and Kelly. The bucket's size picks the forward's variant
(:func:`agent.kernels.decide.decide_variant`): a window split over a cluster of four or two
blocks by heads where the device has thread-block clusters, else one block a multiprocessor
with the weights staged in shared memory, and the throughput variant for large buckets (its
projections on the tensor cores where the device has them).

Each bucket's inputs (feature rows, slots, health, positions, regime scale) are packed in one
region of pinned mapped host memory (:mod:`agent.gpu.pinned`), and the output records live in
another that the kernel writes directly. The graph of a bucket in :data:`STAGED_ROWS` first
copies the region to device memory in one copy (64 rows took 37.8 us of device time reading the
region over the bus, 28.8 from device memory, and the copy costs ~2.5 us); the others' kernel
reads the region directly. Windows, the per-slot counters (rows pushed, decisions made) and
parameters stay on the device, and the kernel keeps the counters. Padded rows carry slot -1,
which the kernel skips. A call writes the inputs, launches the bucket's graph, waits for the
stream and copies the output records once; each record carries the device's nanosecond timer
at its row's start and end, so the call's device time needs no events around the launch.

A model's buffer set (packed parameters, supports, its ring of cached rows and its graphs) is
built by :meth:`CudaRunner.prepare` on a private stream (graph capture in relaxed mode), so a
hot swap can be prepared while decisions run. The ring holds, per slot, the first layer's
per-row work on the window's rows under this model (:func:`agent.kernels.decide.ring_shape`);
it starts stale, so each slot's first decision under a new model computes it from the window.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from agent.gpu.errors import InferenceError
from agent.gpu.pinned import MappedArray, mapped_empty
from agent.gpu.runner import Batch, Costs, RawDecision, column_error
from agent.kernels.decide import RING_STALE, decide, decide_variant, out_dtype, ring_shape
from agent.kernels.loader import cupy
from agent.kernels.mamba_forward import Variant, cluster_ranks, pack_params
from agent.model.checkpoint import Checkpoint
from agent.model.config import ModelConfig
from agent.model.heads import ACTIONS, c51_support, return_bin_centres
from agent.policy.config import PolicyConfig

__all__ = ["CudaRunner", "batch_buckets"]


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Graph bucket sizes: powers of two below ``max_batch``, then ``max_batch`` itself."""
    sizes = []
    b = 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    sizes.append(max_batch)
    return tuple(sizes)


STAGED_ROWS = range(8, 1025)
"""Buckets of these sizes copy their inputs to device memory before the kernel; the others'
kernel reads them from the pinned region. Every block reads its inputs before anything else,
so their reads over the bus are on its critical path; the copy (~2.5 us, plus ~7 ns a row)
pays from a few rows to about a thousand, not for the fewest rows (it costs more than the reads)
nor for thousands (copying them costs more than waves of blocks lose to the reads).
``decide()`` on the H200, both ways in one process (wall p50 / device time, us): 1 row 47.0 /
21.6 read in place against 47.7 / 20.3 copied, 4 rows 49.1 / 23.4 against 48.5 / 20.4, 8 rows
51.6 / 25.4 against 50.0 / 21.3, 64 rows 68.7 / 37.8 against 62.8 / 28.8, 1,024 rows 214.8 /
160.1 against 207.1 / 149.7, 4,096 rows 685.9 / 550.4 against 702.7 / 536.1."""

_INPUTS: tuple[tuple[str, npt.DTypeLike], ...] = (
    ("rows", np.float32),
    ("slots", np.int32),
    ("positions", np.int32),
    ("regime", np.float32),
    ("healthy", np.bool_),
)
"""The per-row inputs, in their order in a bucket's region (rows is (B, F), the others (B,))."""


def _layout(rows: int, n_features: int) -> tuple[list[tuple[str, np.dtype[Any], tuple[int, ...], int]], int]:
    """Name, dtype, shape and byte offset of each input of a ``rows``-row bucket (each on a
    16-byte boundary), and the region's size."""
    out = []
    pos = 0
    for name, dtype in _INPUTS:
        dt: np.dtype[Any] = np.dtype(dtype)
        shape: tuple[int, ...] = (rows, n_features) if name == "rows" else (rows,)
        out.append((name, dt, shape, pos))
        pos = -(-(pos + math.prod(shape) * dt.itemsize) // 16) * 16
    return out, pos


def _views(buffer: Any, entries: list[tuple[str, np.dtype[Any], tuple[int, ...], int]]) -> dict[str, Any]:
    """The inputs of a bucket in the flat uint8 ``buffer`` (NumPy or CuPy), at the offsets of
    its layout's ``entries`` (:func:`_layout`)."""
    return {
        name: buffer[at : at + math.prod(shape) * dt.itemsize].view(dt).reshape(shape)
        for name, dt, shape, at in entries
    }


@dataclass(frozen=True, slots=True)
class _Inputs:
    """One bucket's inputs, packed in one pinned mapped region: NumPy views for the host's writes
    and the views the kernel reads (of the region itself, or of its device copy: ``staged``)."""

    host: dict[str, npt.NDArray[Any]]
    device: dict[str, Any]
    region: MappedArray
    staged: Any
    """The device copy of the region (CuPy uint8), None where the kernel reads the region."""

    @classmethod
    def mapped(cls, rows: int, n_features: int) -> _Inputs:
        """Zeroed inputs, every slot padded (-1)."""
        cp = cupy()
        entries, size = _layout(rows, n_features)
        region = mapped_empty((size,), np.uint8)
        region.host[...] = 0
        host = _views(region.host, entries)
        host["slots"][...] = -1
        staged = cp.empty(size, cp.uint8) if rows in STAGED_ROWS else None
        device = _views(region.device if staged is None else staged, entries)
        return cls(host, device, region, staged)

    def copy(self) -> None:
        """Enqueue the region's copy to the device copy on the current stream (staged only)."""
        cp = cupy()
        cp.cuda.runtime.memcpyAsync(
            self.staged.data.ptr,
            self.region.device.data.ptr,
            self.staged.nbytes,
            cp.cuda.runtime.memcpyDefault,  # the region's device address: unified addressing
            cp.cuda.get_current_stream().ptr,
        )


@dataclass(frozen=True, slots=True)
class _RowViews:
    """The host views of a batch of n rows, sliced once per n (a slice costs as much as the
    write into it)."""

    bucket: int
    """The smallest bucket holding n rows (its graph runs the batch)."""
    positions: npt.NDArray[np.int32]
    regime: npt.NDArray[np.float32]
    healthy: npt.NDArray[np.bool_]
    rows: npt.NDArray[np.float32]
    slots: npt.NDArray[np.int32]
    padding: npt.NDArray[np.int32]
    """The slots of rows n to the bucket's end (kept at -1: skipped)."""
    out: npt.NDArray[np.uint8]


@dataclass(frozen=True, slots=True)
class _Weights:
    """A model's device constants."""

    config: ModelConfig
    packed: Any
    shares: dict[int, Any]
    """Cluster size -> the packing of its ranks' shares (for each split variant in use)."""
    support: Any  # (atoms,) float32
    centres32: Any  # (bins,) float32
    centres64: Any  # (bins,) float64


@dataclass(frozen=True, slots=True)
class _Ring:
    """A model's cached rows of the slots' windows (``decide()``'s ``cache`` and ``cached``)."""

    rows: Any  # (slots, K, MF_CW) float32
    held: Any  # (slots,) uint64: the rows pushed when the ring last held the window


@dataclass(frozen=True, slots=True)
class _CudaModel:
    weights: _Weights
    ring: _Ring
    graphs: dict[int, Any]
    """Bucket size -> its graph."""


class CudaRunner:
    """Device windows, pinned mapped I/O and per-model graph sets for one engine."""

    def __init__(
        self,
        window: int,
        n_features: int,
        tick_values: npt.NDArray[np.float64],
        policy: PolicyConfig,
        *,
        costs: Costs,
        max_batch: int,
    ) -> None:
        self._cp = cp = cupy()
        self.policy = policy
        self.costs = costs
        self.max_batch = max_batch
        self.buckets = batch_buckets(max_batch)
        self.stream = cp.cuda.Stream(non_blocking=True)
        with self.stream:
            self.window = cp.zeros((tick_values.size, window, n_features), dtype=cp.float32)
            self.bars = cp.zeros(tick_values.size, dtype=cp.uint64)  # rows pushed
            self.decisions = cp.zeros(tick_values.size, dtype=cp.uint64)  # the next Thompson step
            self.tick_value = cp.asarray(tick_values, dtype=cp.float64)
        self.stream.synchronize()
        self.inputs = {bucket: _Inputs.mapped(bucket, n_features) for bucket in self.buckets}
        self._record = out_dtype(len(ACTIONS))
        self.out = mapped_empty((max_batch, self._record.itemsize), np.uint8)  # bytes on both sides:
        self.out.host[...] = 0  # CuPy has no structured dtypes; the host views its copy as records
        self._views: dict[int, _RowViews] = {}
        device = cp.cuda.Device()
        capability = int(device.compute_capability)
        self._variant = functools.partial(  # (cfg, rows) -> the forward variant on this device
            decide_variant,
            multiprocessors=int(device.attributes["MultiProcessorCount"]),
            # Thread-block clusters need compute capability 9.0 (Hopper) or later, TF32 tensor
            # cores 8.0 (Ampere); attribute 97 is cudaDevAttrMaxSharedMemoryPerBlockOptin.
            clusters=capability >= 90,
            max_shared=int(cp.cuda.runtime.deviceGetAttribute(97, device.id)),
            tensor_cores=capability >= 80,
        )
        self._last: npt.NDArray[np.void] | None = None
        self._open = True

    def prepare(self, checkpoint: Checkpoint) -> object:
        cp = self._cp
        cfg = checkpoint.config
        stream = cp.cuda.Stream(non_blocking=True)
        variants = {bucket: self._variant(cfg, bucket) for bucket in self.buckets}
        with stream:
            pack = (checkpoint.params, cfg, checkpoint.norm_mean, checkpoint.norm_std)
            clusters = {cluster_ranks(cfg, variant) for variant in variants.values() if variant.split}
            weights = _Weights(
                cfg,
                cp.asarray(pack_params(*pack)),
                {ranks: cp.asarray(pack_params(*pack, ranks)) for ranks in clusters},
                c51_support(cfg, cp),
                return_bin_centres(cfg, cp),
                return_bin_centres(cfg, cp, np.float64),
            )
            slots = self.window.shape[0]
            ring = _Ring(cp.zeros(ring_shape(cfg, slots), cp.float32), cp.full(slots, RING_STALE, cp.uint64))
            # Compile and load each variant the buckets use outside capture (one bucket a
            # variant): a launch with every row padded (slot -1) on private scratch touches no
            # shared state.
            for bucket in {variant: bucket for bucket, variant in variants.items()}.values():
                scratch = {name: cp.zeros_like(view) for name, view in self.inputs[bucket].device.items()}
                scratch["slots"][...] = -1
                out = cp.zeros_like(self.out.device[:bucket])
                self._enqueue(weights, ring, variants[bucket], scratch, out)
            stream.synchronize()
            graphs = {}
            for bucket in self.buckets:
                inputs = self.inputs[bucket]
                stream.begin_capture()  # CuPy's default mode is relaxed
                try:
                    if inputs.staged is not None:
                        inputs.copy()
                    self._enqueue(weights, ring, variants[bucket], inputs.device, self.out.device[:bucket])
                finally:
                    graph = stream.end_capture()
                graphs[bucket] = graph
        return _CudaModel(weights, ring, graphs)

    def _enqueue(
        self, weights: _Weights, ring: _Ring, variant: Variant, inputs: dict[str, Any], out: Any
    ) -> None:
        """Launch the decision kernel's ``variant`` for a bucket's ``inputs`` (device views) and
        its rows of ``out`` on the current stream."""
        cfg = weights.config
        decide(
            weights.shares[cluster_ranks(cfg, variant)] if variant.split else weights.packed,
            cfg,
            variant,
            support=weights.support,
            centres32=weights.centres32,
            centres64=weights.centres64,
            window=self.window,
            bars=self.bars,
            steps=self.decisions,
            cache=ring.rows,
            cached=ring.held,
            tick_value=self.tick_value,
            rows=inputs["rows"],
            slots=inputs["slots"],
            healthy=inputs["healthy"],
            positions=inputs["positions"],
            regime=inputs["regime"],
            policy=self.policy,
            fee_per_contract=self.costs.fee_per_contract,
            spread_column=self.costs.spread_column,
            out=out,
        )

    def run(self, model: object, batch: Batch) -> RawDecision:
        if not self._open:
            raise InferenceError("the engine is closed")
        n = batch.slots.size
        io = self._views.get(n) or self._row_views(n)
        try:  # NumPy broadcasts a scalar column; a column of another length raises
            io.positions[...] = batch.positions
            io.regime[...] = batch.regime
            io.healthy[...] = batch.healthy
        except ValueError as exc:
            raise column_error(n, exc) from None
        io.rows[...] = batch.features
        io.slots[...] = batch.slots
        if n < io.bucket:
            io.padding[...] = -1
        cast(_CudaModel, model).graphs[io.bucket].launch(self.stream)
        self.stream.synchronize()
        # One copy (bytearray: the cheapest writable one); the decision's arrays are its fields.
        out = self._last = np.frombuffer(bytearray(io.out), self._record)
        return RawDecision(
            action=out["action"],
            direction=out["direction"],
            target=out["target"],
            valid=out["valid"],
            q=out["q"],
            ret_mean=out["ret_mean"],
            ret_var=out["ret_var"],
            f_star=out["f_star"],
            size=out["size"],
            regime_scale=out["regime_scale"],
            step=out["step"],
        )

    def _row_views(self, n: int) -> _RowViews:
        bucket = next(b for b in self.buckets if b >= n)
        host = self.inputs[bucket].host
        views = self._views[n] = _RowViews(
            bucket,
            host["positions"][:n],
            host["regime"][:n],
            host["healthy"][:n],
            host["rows"][:n],
            host["slots"][:n],
            host["slots"][n:bucket],
            self.out.host[:n],
        )
        return views

    def steps(self) -> npt.NDArray[np.uint64]:
        steps: npt.NDArray[np.uint64] = self.decisions.get(stream=self.stream)  # waits for the stream
        return steps

    def device_us(self) -> float | None:
        """Device time of the last :meth:`run`: its rows' span on the device's nanosecond timer
        (the first row's start to the last row's end), None before the first."""
        if self._last is None:
            return None
        return float(self._last["end_ns"].max() - self._last["start_ns"].min()) * 1e-3

    def release(self) -> None:
        if self._open:
            self._open = False  # closed even when the synchronisation below fails
            self.stream.synchronize()
