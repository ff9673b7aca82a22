"""The packed input region of a CUDA engine bucket (agent/gpu/cuda_runner.py): each input on a
16-byte boundary, none overlapping another, the region no larger than needed. Runs on the CPU
(the layout is NumPy); the engine's parity tests on a device cover both ways the kernel reads
it (tests/gpu/test_engine_cuda.py: buckets of 1-4 rows read in place, 32 and 64 copied)."""

from __future__ import annotations

import numpy as np
import pytest

from agent.gpu.cuda_runner import STAGED_ROWS, _layout, _views


@pytest.mark.parametrize(("rows", "features"), [(1, 32), (3, 5), (64, 24), (4096, 32)])
def test_each_input_has_its_own_aligned_bytes(rows: int, features: int) -> None:
    entries, size = _layout(rows, features)
    buffer = np.zeros(size, np.uint8)
    views = _views(buffer, entries)
    assert views["rows"].shape == (rows, features) and views["slots"].shape == (rows,)
    for i, (name, _, _, at) in enumerate(entries):
        assert at % 16 == 0, name
        views[name][...] = i + 1  # (True for the bool column)
    for i, (name, dtype, _, _) in enumerate(entries):
        assert (views[name] == np.asarray(i + 1).astype(dtype)).all(), f"{name} overwritten"
    _, last_dtype, last_shape, last_at = entries[-1]
    assert size - (last_at + int(np.prod(last_shape)) * last_dtype.itemsize) < 16


def test_the_staged_buckets_are_those_measured_to_gain() -> None:
    assert 1 not in STAGED_ROWS and 4 not in STAGED_ROWS
    assert all(rows in STAGED_ROWS for rows in (8, 16, 32, 64, 128, 1024))
    assert 2048 not in STAGED_ROWS and 4096 not in STAGED_ROWS
