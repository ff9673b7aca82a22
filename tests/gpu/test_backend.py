"""Device selection: cpu always works, cuda without a GPU is an error that says how to fix it,
auto logs its choice."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from agent.gpu.backend import cuda_probe, select_backend
from agent.gpu.errors import DeviceUnavailable

HAS_GPU = cuda_probe()[0] is not None


def test_cpu_is_numpy() -> None:
    backend = select_backend("cpu")
    assert backend.xp is np and not backend.is_cuda


@pytest.mark.skipif(HAS_GPU, reason="a usable CUDA device is present")
def test_cuda_without_a_gpu_says_how_to_fix_it() -> None:
    with pytest.raises(DeviceUnavailable) as info:
        select_backend("cuda")
    message = str(info.value)
    assert "tradeagent[gpu]" in message and "tradeagent[gpu13]" in message
    assert 'device = "cpu"' in message and "nvidia-smi" in message


def test_auto_logs_its_choice(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="agent.gpu.backend"):
        backend = select_backend("auto")
    assert backend.kind == ("cuda" if HAS_GPU else "cpu")
    assert any("device auto: using" in r.getMessage() for r in caplog.records)


@pytest.mark.gpu
def test_cuda_backend_is_cupy() -> None:
    backend = select_backend("cuda")
    assert backend.is_cuda and backend.xp.__name__ == "cupy"


def test_unknown_device_is_refused() -> None:
    with pytest.raises(DeviceUnavailable, match="not one of"):
        select_backend("tpu")  # type: ignore[arg-type]
