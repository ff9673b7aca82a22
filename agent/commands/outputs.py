"""Output paths of the commands, checked before any work starts.

Every command that writes files (``synth --out``, ``backtest --out``, ``train --summary`` and
``--report``, ``record --out``, ``demo --out``) passes each of its output paths, given or
defaulted, through :func:`output_dir` or :func:`output_file` before it does anything else. The
rule: the path must be of the right kind (a directory, or a file that is not a directory), and
the nearest part of it that exists must be a directory in which a file can be created (a file
is created there and removed at once: the only check that holds for every user, root included,
and every file system, read-only mounts included). Missing directories are left to the command,
which creates them when it writes. A path that fails stops the command with a
:class:`~agent.errors.CommandError` naming the option, the path and why; nothing is written.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from agent.errors import CommandError

__all__ = ["output_dir", "output_file"]

_PROBE_PREFIX = ".tradeagent-write-check-"


def output_dir(option: str, path: str | Path) -> Path:
    """The output directory ``path`` of ``option``, checked (see the module docstring)."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise CommandError(f"{option} {target}: is a file, not a directory; choose a directory")
    _check_writable(option, target, target)
    return target


def output_file(option: str, path: str | Path) -> Path:
    """The output file ``path`` of ``option``, checked: not a directory, and its directory
    writable (outputs are written to a temporary file beside it, then renamed)."""
    target = Path(path)
    if target.is_dir():
        raise CommandError(f"{option} {target}: is a directory; give a file name")
    _check_writable(option, target, target.parent)
    return target


def _check_writable(option: str, target: Path, directory: Path) -> None:
    existing = next((p for p in (directory, *directory.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise CommandError(
            f"{option} {target}: cannot create the directory {directory}: {existing} is a file; "
            "choose another path"
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=_PROBE_PREFIX, dir=existing)
    except OSError as exc:
        what = "is not writable" if existing == directory else f"cannot be created in {existing}"
        raise CommandError(
            f"{option} {target}: the directory {directory} {what} ({exc.strerror or exc}); "
            "choose another path"
        ) from None
    os.close(fd)
    os.unlink(probe)
