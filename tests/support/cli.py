"""What a ``tradeagent`` command run as a subprocess says when it refuses."""

from __future__ import annotations

import subprocess

__all__ = ["refusal"]


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    """The one line on stderr of a command that refused (exit code 2, no traceback)."""
    err = result.stderr.strip()
    assert result.returncode == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err
