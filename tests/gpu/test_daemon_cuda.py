"""A real CUDA error inside the daemon's inference (GPU only).

Each case runs ``tests/gpu/cuda_fault_daemon.py`` in a subprocess of its own (an illegal address
poisons the CUDA context of the process that caused it): the daemon trades a replayed feed on
the GPU, then every decision graph is swapped for a kernel that fails for real. Without CPU
fallback the daemon halts new orders, keeps its positions and keeps running; with it, the
engine is rebuilt on the CPU, the fall-back is logged and trading goes on. Either way it exits
0 at the stop and its fill count equals the ledger's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

_CUDA_ERROR = re.compile(r"CUDA_ERROR_\w+|cudaError\w+")


@pytest.mark.parametrize(
    ("fault", "fallback"), [("launch", False), ("launch", True), ("illegal", False), ("illegal", True)]
)
def test_a_real_cuda_error_halts_or_falls_back_and_keeps_state(
    tmp_path: Path, fault: str, fallback: bool
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.gpu.cuda_fault_daemon", str(tmp_path), fault, "1" if fallback else "0"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["backend_before"].startswith("CuPy"), out
    assert out["inference_failures"] >= 1
    failures = [line for line in out["log"] if "rows failed" in line]
    assert failures and _CUDA_ERROR.search(failures[0]), out["log"]
    assert out["exit_code"] == 0
    assert out["fills_in_ledger"] == out["fills_counted"]
    assert out["state"] == "running"
    if fallback:
        assert out["backend_after"].startswith("NumPy"), out
        assert "inference" not in out["halts"]
        assert out["orders_after"] > out["orders_at_failure"]
        assert any("fell back to the CPU" in line for line in out["log"])
    else:
        assert "inference" in out["halts"]
        assert out["orders_after"] == out["orders_at_failure"]
        assert out["positions_kept"]
        assert not any("fell back" in line for line in out["log"])
