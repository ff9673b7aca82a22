"""Shared test configuration.

Service-backed tests never skip when ``CI=true``: they start the service or fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
DBN_SAMPLES = SHARED / "data" / "dbn-samples"


def skip_or_fail(reason: str) -> None:
    """Skip locally; fail under CI, where every service must be there."""
    if IN_CI:
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(reason)
