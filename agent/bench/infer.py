"""``tradeagent bench infer``: decision latency and throughput of the inference engine, and the
training-step throughput of the model code, on the CPU or a CUDA device.

Keys (README "Benchmarks"):

* ``device``: the backend measured; ``floor_kind`` says what the floor is.
* ``floor_us``: CUDA: one empty kernel launch + stream synchronisation from Python (median);
  CPU: one trivial NumPy call (``np.add`` on one element), the CPU's equivalent floor.
* CUDA only: ``resident_floor_us``, ``resident_floor_p99_us``: p50 and p99 of a round trip
  to a resident kernel through pinned mapped memory (:func:`resident_round_trip_us`): the floor
  of a decision served by a kernel that stays on the device, which the engine does not do
  (docs/gpu.md, "What the targets still need").
* ``p50_us_b1``, ``p99_us_b1``, ``p50_us_b64``, ``p99_us_b64``: wall time of one
  :meth:`InferenceEngine.decide` call (window push to sized targets, host in and out) at 1 and
  64 instruments; ``*_vs_floor``: the same over ``floor_us``.
* CUDA only: ``device_us_b1``, ``device_us_b64``: median device time of those calls (the
  span of the kernel's rows on the device's nanosecond timer, first row's start to last row's
  end); ``host_us_b1``, ``host_us_b64``: median of each call's time less its device time (input
  checks, pinned writes, the graph launch until the kernel starts, synchronisation wake-up,
  output copy and bookkeeping).
* ``decisions_per_s_b4096``: decisions per second at 4096 instruments per call (K from the model
  configuration, 32 by default); CUDA only: ``device_us_b4096`` and ``host_us_b4096``, the
  split of such a call as for 1 and 64 rows.
* ``train_samples_per_s``: samples per second of the trainer's update at batch ``--train-batch``
  (4096): on a CUDA device the fused kernels ``train`` runs (:mod:`agent.kernels.train`: target
  networks on s', forward, losses, backward, clipping, Adam, target sync), replayed from a
  captured graph as the trainer replays it, else (and for models
  too large for them) the array code's forward + backward + clipping + Adam; ``train_kind`` says
  which.
* With ``--device cuda``, ``decisions_per_s_vs_cpu`` and ``train_vs_cpu``: the ratios to the
  CPU path measured in the same run (``cpu_decisions_per_s_b4096``, ``cpu_train_samples_per_s``),
  unless ``--no-cpu-reference``.

The model has random weights of the configured shape (speed does not depend on the values).
The CPU figures run with ``train.cpu_threads`` BLAS threads (1 by default), as the daemon, the
backtest drivers and the trainer do.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from threadpoolctl import threadpool_limits

from agent.errors import AgentError
from agent.gpu.backend import Backend, select_backend
from agent.gpu.engine import SPREAD_FEATURE, InferenceEngine
from agent.gpu.pinned import mapped_empty
from agent.kernels.loader import cupy, kernel
from agent.kernels.train import INPUTS, FusedUpdate, UpdateSettings, input_shape, pack_train, train_layout
from agent.model.checkpoint import Checkpoint, checkpoint_from_bytes, checkpoint_to_bytes
from agent.model.config import ModelConfig
from agent.model.losses import c51_loss_and_grad, return_loss_and_grad
from agent.model.network import backward, forward
from agent.model.optim import Adam, clip_grad_norm
from agent.model.params import init_params
from agent.train.cuda_learner import fused_fits

if TYPE_CHECKING:  # the benchmark reads only config.device, .model and .policy
    from agent.config import Config

__all__ = ["add_arguments", "resident_round_trip_us", "run"]

_THROUGHPUT_BATCH = 4096


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), help="backend to measure (default: the config's device)"
    )
    parser.add_argument("--features", type=int, default=32, help="features per bar F (default 32)")
    parser.add_argument("--iterations", type=int, default=2000, help="timed decisions per latency figure")
    parser.add_argument("--train-batch", type=int, default=4096, help="batch of the training-step figure")
    parser.add_argument(
        "--no-cpu-reference", action="store_true", help="with --device cuda, skip the CPU path's figures"
    )


def _checkpoint(cfg: ModelConfig, seed: int) -> Checkpoint:
    rng = np.random.default_rng(seed)
    params = init_params(cfg, rng)
    data = checkpoint_to_bytes(
        params,
        cfg,
        feature_names=[SPREAD_FEATURE if i == 2 else f"f{i}" for i in range(cfg.n_features)],
        norm_mean=np.zeros(cfg.n_features, dtype=np.float32),
        norm_std=np.ones(cfg.n_features, dtype=np.float32),
    )
    return checkpoint_from_bytes(data)


def _percentiles_us(samples: list[float]) -> tuple[float, float]:
    us = np.asarray(samples) * 1e6
    return float(np.percentile(us, 50)), float(np.percentile(us, 99))


def _floor_us(backend: Backend, iterations: int) -> float:
    samples: list[float] = []
    if backend.is_cuda:
        cp = cupy()
        noop = cp.RawKernel('extern "C" __global__ void noop() {}', "noop")
        stream = cp.cuda.Stream(non_blocking=True)
        for _ in range(100):
            noop((1,), (1,), (), stream=stream)
            stream.synchronize()
        for _ in range(iterations):
            t0 = time.perf_counter()
            noop((1,), (1,), (), stream=stream)
            stream.synchronize()
            samples.append(time.perf_counter() - t0)
    else:
        one = np.zeros(1)
        for _ in range(iterations):
            t0 = time.perf_counter()
            np.add(one, 1.0, out=one)
            samples.append(time.perf_counter() - t0)
    return float(np.median(samples) * 1e6)


_RESIDENT_ECHO = r"""
extern "C" __global__ void resident_echo(const volatile unsigned long long* inbox,
                                         volatile unsigned long long* outbox) {
    // One thread, resident until the host writes 0: each number the host writes after the 1 it
    // starts with is written back, past a system-wide fence.
    unsigned long long seen = 1ull;
    for (;;) {
        const unsigned long long s = *inbox;
        if (s == seen) continue;
        if (s == 0ull) return;
        *outbox = s;
        __threadfence_system();
        seen = s;
    }
}
"""


def resident_round_trip_us(iterations: int, *, timeout_s: float = 5.0) -> tuple[float, float]:
    """p50 and p99 of one round trip to a resident kernel: the host writes a number into pinned
    mapped memory, a kernel that never leaves between calls polls it and writes it back, the
    host polls for it. The floor of a decision that is not a launch (a persistent kernel
    serving decisions); ``floor_us`` is the launch's. Needs a CUDA device; raises
    :class:`~agent.errors.AgentError` if the kernel does not answer within ``timeout_s``."""
    cp = cupy()
    echo = cp.RawKernel(_RESIDENT_ECHO, "resident_echo")
    boxes = mapped_empty((2,), np.uint64)
    inbox, outbox = boxes.host[0:1], boxes.host[1:2]
    inbox[0] = outbox[0] = 1
    stream = cp.cuda.Stream(non_blocking=True)
    echo((1,), (1,), (boxes.device[0:1], boxes.device[1:2]), stream=stream)
    samples: list[float] = []
    try:
        for n in range(2, iterations + 102):  # the first 100 untimed
            t0 = time.perf_counter()
            inbox[0] = n
            while outbox[0] != n:
                if time.perf_counter() - t0 > timeout_s:
                    raise AgentError(f"the resident kernel did not answer within {timeout_s:g} s")
            if n > 101:
                samples.append(time.perf_counter() - t0)
    finally:
        inbox[0] = 0  # the kernel returns
        stream.synchronize()
    return _percentiles_us(samples)


def _decide_timer(engine: InferenceEngine, batch: int, seed: int) -> Callable[[], float]:
    rng = np.random.default_rng(seed)
    slots = np.arange(batch)
    rows = rng.normal(size=(16, batch, engine.n_features)).astype(np.float32)
    positions = np.zeros(batch, dtype=np.int32)
    calls = [0]

    def one() -> float:
        i = calls[0] = calls[0] + 1
        t0 = time.perf_counter()
        engine.decide(slots, rows[i % 16], positions, 0.8)
        return time.perf_counter() - t0

    return one


def _latency(
    cfg: ModelConfig, config: Config, backend: Backend, batch: int, iterations: int
) -> dict[str, float]:
    """p50 and p99 of one decide() call at ``batch`` rows; on CUDA also the median device time
    and the median host share (call time less device time)."""
    engine = InferenceEngine(
        _checkpoint(cfg, 1),
        config.policy,
        [12.5] * batch,
        fee_per_contract=config.broker.fee_per_contract,
        backend=backend,
        max_batch=max(batch, 64),
    )
    timer = _decide_timer(engine, batch, 2)
    for _ in range(cfg.window + 50):  # fill the windows, warm caches and graphs
        timer()
    walls, out = _timed_calls(engine, timer, batch, iterations)
    engine.close()
    out[f"p50_us_b{batch}"], out[f"p99_us_b{batch}"] = _percentiles_us(walls)
    return out


def _timed_calls(
    engine: InferenceEngine, timer: Callable[[], float], batch: int, calls: int
) -> tuple[list[float], dict[str, float]]:
    """``calls`` timed decide() calls (seconds each) and, on CUDA, ``device_us_b{batch}`` (the
    median device time) and ``host_us_b{batch}`` (the median of each call's time less its
    device time); the device timer is read between calls, outside the timed span."""
    walls: list[float] = []
    devices: list[float] = []
    for _ in range(calls):
        walls.append(timer())
        device = engine.device_us()
        if device is not None:
            devices.append(device * 1e-6)
    out: dict[str, float] = {}
    if devices:
        out[f"device_us_b{batch}"] = float(np.median(devices) * 1e6)
        out[f"host_us_b{batch}"] = float(np.median(np.subtract(walls, devices)) * 1e6)
    return walls, out


def _decisions_per_s(cfg: ModelConfig, config: Config, backend: Backend, calls: int) -> dict[str, float]:
    """``decisions_per_s_b4096`` over ``calls`` calls of 4096 rows, and on CUDA their device
    and host split (:func:`_timed_calls`)."""
    engine = InferenceEngine(
        _checkpoint(cfg, 1),
        config.policy,
        [12.5] * _THROUGHPUT_BATCH,
        fee_per_contract=config.broker.fee_per_contract,
        backend=backend,
        max_batch=_THROUGHPUT_BATCH,
    )
    timer = _decide_timer(engine, _THROUGHPUT_BATCH, 3)
    for _ in range(3):
        timer()
    walls, out = _timed_calls(engine, timer, _THROUGHPUT_BATCH, calls)
    engine.close()
    out[f"decisions_per_s_b{_THROUGHPUT_BATCH}"] = _THROUGHPUT_BATCH * calls / sum(walls)
    return out


def _train_samples_per_s(cfg: ModelConfig, backend: Backend, batch: int, steps: int) -> float:
    """Samples per second of the trainer's update at ``batch``: the fused kernels on a CUDA
    device where the model fits them (what ``train`` runs there), else the array code."""
    if backend.is_cuda and fused_fits(cfg):
        return _fused_samples_per_s(cfg, batch, steps)
    xp = backend.xp
    rng = np.random.default_rng(4)
    params = init_params(cfg, rng, xp)
    opt = Adam(params)
    x = xp.asarray(rng.normal(size=(batch, cfg.window, cfg.n_features)).astype(np.float32))
    actions = xp.asarray(rng.integers(0, cfg.n_actions, size=batch))
    target = rng.random((batch, cfg.n_atoms)).astype(np.float32)
    target_m = xp.asarray(target / target.sum(axis=1, keepdims=True))
    bins = xp.asarray(rng.integers(0, cfg.return_bins, size=batch))

    def step() -> None:
        q, r, cache = forward(params, cfg, x)
        _, gq = c51_loss_and_grad(q, actions, target_m)
        _, gr = return_loss_and_grad(r, bins)
        grads, _ = backward(params, cfg, cache, gq, gr)
        clip_grad_norm(grads, 10.0)  # reads the norm back: one synchronisation per step
        opt.update(params, grads)

    step()
    if backend.is_cuda:
        cupy().cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if backend.is_cuda:
        cupy().cuda.Device().synchronize()
    return batch * steps / (time.perf_counter() - t0)


def _fused_samples_per_s(cfg: ModelConfig, batch: int, steps: int) -> float:
    """The fused update (agent.kernels.train) on random windows of a 100k-bar feature table,
    replayed from a captured CUDA graph on a stream of its own, as the trainer runs it
    (:class:`agent.train.cuda_learner.CudaLearner`)."""
    cp = cupy()
    rng = np.random.default_rng(4)
    layout = train_layout(cfg)
    rows = 100_000

    def get(name: str) -> Any:
        return kernel("train.cu", name, options=layout.options)

    inputs: dict[str, Any] = {}
    for name, (_, dtype) in INPUTS.items():
        inputs[name] = cp.zeros(input_shape(name, batch, cfg), dtype=dtype)
    inputs["t_obs"][...] = cp.asarray(rng.integers(cfg.window, rows - 4, batch))
    inputs["t_next"][...] = inputs["t_obs"] + 1
    inputs["agent_obs"][...] = cp.asarray(rng.normal(size=inputs["agent_obs"].shape).astype(np.float32))
    inputs["agent_next"][...] = inputs["agent_obs"]
    inputs["action"][...] = cp.asarray(rng.integers(0, cfg.n_actions, batch).astype(np.int32))
    inputs["reward"][...] = cp.asarray(rng.normal(size=batch).astype(np.float32))
    inputs["discount"][...] = np.float32(0.9**3)
    inputs["label"][...] = cp.asarray(rng.normal(size=batch) * 3.0)
    settings = UpdateSettings(
        lr=2.5e-4, eps=3.125e-4, max_norm=10.0, target_mode=1, rho=0.005, hard_every=1000, ret_weight=1.0
    )
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        update = FusedUpdate(
            cfg,
            settings,
            xp=cp,
            get=get,
            packed=pack_train(init_params(cfg, rng), cfg),
            inputs=inputs,
            ring_size=steps + 2,
        )
        update.feat = cp.asarray(rng.normal(size=(rows, cfg.n_features - 2)).astype(np.float32))
        update.enqueue()
        stream.synchronize()
        stream.begin_capture()
        update.enqueue()
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            graph.launch(stream)
        stream.synchronize()
        return batch * steps / (time.perf_counter() - t0)


def run(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    backend = select_backend(args.device or config.device)
    cfg = config.model.with_features(args.features) if not config.model.n_features else config.model
    out: dict[str, Any] = {"device": backend.kind, "device_name": backend.description}
    with contextlib.ExitStack() as stack:
        if config.train.cpu_threads:
            stack.enter_context(threadpool_limits(config.train.cpu_threads, user_api="blas"))
        out |= _measure(args, config, backend, cfg)
    out["window"] = cfg.window
    out["features"] = cfg.n_features
    return out


def _measure(args: argparse.Namespace, config: Config, backend: Backend, cfg: ModelConfig) -> dict[str, Any]:
    cuda = backend.is_cuda
    iterations = max(args.iterations, 100)
    out: dict[str, Any] = {}
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("bench infer", total=6)

        def phase(name: str) -> None:
            progress.update(task, description=f"bench infer: {name}", advance=1)

        out["floor_kind"] = "empty kernel launch + stream sync" if cuda else "trivial NumPy call (CPU)"
        out["floor_us"] = _floor_us(backend, iterations)
        if cuda:
            out["resident_floor_us"], out["resident_floor_p99_us"] = resident_round_trip_us(iterations)
        phase("latency B=1")
        out |= _latency(cfg, config, backend, 1, iterations)
        phase("latency B=64")
        out |= _latency(cfg, config, backend, 64, iterations)
        for key in ("p50_us_b1", "p99_us_b1", "p50_us_b64", "p99_us_b64"):
            out[f"{key}_vs_floor"] = out[key] / out["floor_us"]
        phase("throughput B=4096")
        out |= _decisions_per_s(cfg, config, backend, 50 if cuda else 2)
        phase("training step")
        out["train_batch"] = args.train_batch
        out["train_samples_per_s"] = _train_samples_per_s(cfg, backend, args.train_batch, 20 if cuda else 3)
        out["train_kind"] = "fused CUDA kernels" if cuda and fused_fits(cfg) else "array code"
        phase("CPU reference")
        if cuda and not args.no_cpu_reference:
            cpu = select_backend("cpu")
            out["cpu_decisions_per_s_b4096"] = _decisions_per_s(cfg, config, cpu, 1)["decisions_per_s_b4096"]
            out["cpu_train_samples_per_s"] = _train_samples_per_s(cfg, cpu, args.train_batch, 1)
            out["decisions_per_s_vs_cpu"] = out["decisions_per_s_b4096"] / out["cpu_decisions_per_s_b4096"]
            out["train_vs_cpu"] = out["train_samples_per_s"] / out["cpu_train_samples_per_s"]
        phase("done")
    return out
