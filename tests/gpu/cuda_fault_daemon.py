"""Run the trading daemon on the GPU in this process, provoke a real CUDA error inside a decision
and print what the daemon did as one JSON line.

Run by ``tests/gpu/test_daemon_cuda.py`` as ``python -m tests.gpu.cuda_fault_daemon DIR FAULT
FALLBACK`` in a subprocess of its own, because an illegal address poisons the process's CUDA
context for good. The faults are real device errors, not raised exceptions: once the daemon has
filled orders, every batch bucket's CUDA graph of the serving model is replaced by a launcher
of a small kernel that fails:

``launch``
    launched with 4096 threads per block (over the device's limit of 1024): the driver refuses
    the launch (``CUDA_ERROR_INVALID_VALUE``); the context stays usable.
``illegal``
    writes through the address 0x10: the decision's stream synchronisation fails with an illegal
    address (``cudaErrorIllegalAddress``), a sticky error after which every call on the context
    fails, the engine's release at the CPU fallback or at shutdown included.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import cupy as cp
import numpy as np

from agent.daemon.app import Daemon
from agent.daemon.lifecycle import State
from storage import Ledger, open_database
from tests.daemon.support import (
    config_text,
    install_model,
    model_checkpoint,
    quiet,
    replay_source,
    synth_feed,
    write_config,
)
from tests.support.wait import wait_until_async

_SOURCE = r"""
extern "C" __global__ void fault(int* p) { p[threadIdx.x] = 1; }
"""


class _FaultyGraph:
    """Stands in for a captured decision graph: ``launch(stream)`` runs the failing kernel."""

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.kernel = cp.RawKernel(_SOURCE, "fault")
        self.buffer = cp.zeros(4096, dtype=cp.int32)

    def launch(self, stream: Any) -> None:
        with stream:
            if self.fault == "launch":
                self.kernel((1,), (4096,), (self.buffer,))
            else:
                self.kernel((1,), (32,), (np.uint64(0x10),))


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def _session(root: Path, fault: str, fallback: bool, messages: _Messages) -> dict[str, Any]:
    feed = root / "synth"
    synth_feed(feed)
    text = config_text(root / "data", replay_source(feed, pace=20.0)).replace(
        'device = "cpu"', 'device = "cuda"'
    )
    text = text.replace("[daemon]\n", f"[daemon]\ncpu_fallback = {str(fallback).lower()}\n")
    config = write_config(root / "daemon.toml", text)
    assert config.device == "cuda" and config.daemon.cpu_fallback is fallback
    blob, fingerprint = model_checkpoint()
    install_model(config, blob, fingerprint)
    daemon = Daemon(config)
    task = asyncio.create_task(daemon.run())
    out: dict[str, Any] = {}
    try:
        await wait_until_async(lambda: daemon.state is State.RUNNING or task.done(), 120, "the daemon to run")
        if task.done():
            task.result()
        await wait_until_async(lambda: daemon.counts["fills"] >= 2, 120, "2 fills")
        engine = daemon.engine
        assert engine is not None
        out["backend_before"] = engine.backend.description
        graphs = engine._model.graphs  # type: ignore[attr-defined]
        for bucket in graphs:
            graphs[bucket] = _FaultyGraph(fault)
        await wait_until_async(lambda: daemon.counts["inference_failures"] >= 1, 60, "an inference failure")
        if fallback:
            await wait_until_async(lambda: daemon.engine is not engine, 60, "the CPU engine")
        await wait_until_async(lambda: quiet(daemon), 60, "no open order or pending write")
        orders, positions = daemon.counts["orders"], daemon.positions
        await asyncio.sleep(1.5)  # an observation window: orders_after tells what it saw
        after = daemon.engine
        out.update(
            orders_at_failure=orders,
            orders_after=daemon.counts["orders"],
            positions_kept=daemon.positions == positions,
            halts=sorted(daemon.halts),
            state=str(daemon.state),
            backend_after=after.backend.description if after is not None else None,
        )
    finally:
        daemon.request_stop()
        out["exit_code"] = await asyncio.wait_for(task, 120)
    out["fills_counted"] = daemon.counts["fills"]
    out["inference_failures"] = daemon.counts["inference_failures"]
    database = open_database(config.storage, config.data_dir)
    try:
        out["fills_in_ledger"] = Ledger(database).count_fills("paper")
    finally:
        database.close()
    return out


def main() -> int:
    root, fault, fallback = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
    if fault not in ("launch", "illegal"):
        raise SystemExit(f"unknown fault {fault!r}")
    messages = _Messages()
    logging.getLogger("agent").addHandler(messages)
    logging.getLogger("agent").setLevel(logging.INFO)
    out = asyncio.run(_session(root, fault, fallback, messages))
    out["log"] = [m for m in messages.lines if "inference" in m or "engine" in m or "CPU" in m]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
