"""Content-addressed file store for checkpoint bytes under ``<data_dir>/checkpoints/``.

A checkpoint is stored as ``<root>/<sha256[:2]>/<sha256>`` where ``sha256`` is the hex
SHA-256 of its bytes. ``put`` writes a temporary file in the same directory, fsyncs it,
renames it into place and fsyncs the directory, so a file under its final name is always
complete (a crash leaves at most a ``.tmp-*`` file, removed by ``purge``). ``get`` verifies
the bytes against the name: a mismatch raises :class:`CheckpointCorrupt` and changes nothing.
The store does not know the checkpoint format (the model owns it: safetensors bytes); the
registry (:class:`storage.registry.ModelRegistry`) records which hashes are in use.

Safe for concurrent use by several threads and processes: writers of the same content race
harmlessly (same bytes, atomic rename).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from storage.errors import CheckpointCorrupt, CheckpointStoreError, NotFound

__all__ = ["CheckpointStore"]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_TMP_PREFIX = ".tmp-"
_STALE_TMP_S = 3600.0


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStore:
    """Checkpoint bytes addressed by their SHA-256."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @classmethod
    def for_data_dir(cls, data_dir: str | Path) -> CheckpointStore:
        """The store of a data directory: ``<data_dir>/checkpoints``."""
        return cls(Path(data_dir) / "checkpoints")

    def path(self, sha256: str) -> Path:
        """Where the checkpoint with this hash lives (whether or not it exists)."""
        if not _SHA256.match(sha256):
            raise CheckpointStoreError(f"not a lower-case hex sha256: {sha256!r}")
        return self.root / sha256[:2] / sha256

    def exists(self, sha256: str) -> bool:
        """True when a file for this hash is stored (its content is checked by ``get``)."""
        return self.path(sha256).is_file()

    def put(self, data: bytes) -> str:
        """Store ``data`` durably and return its sha256 (idempotent).

        An existing file with the right content is left alone; one whose content does not
        match its name is replaced by the correct bytes.
        """
        sha256 = _digest(data)
        target = self.path(sha256)
        try:
            if target.is_file() and _digest(target.read_bytes()) == sha256:
                return sha256
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
            try:
                with open(tmp, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, target)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
            _fsync_dir(target.parent)
        except OSError as exc:
            raise CheckpointStoreError(
                f"cannot store checkpoint {sha256[:12]} under {self.root}: {exc}"
            ) from None
        return sha256

    def get(self, sha256: str) -> bytes:
        """The stored bytes, verified against ``sha256``.

        Raises ``NotFound`` when absent and ``CheckpointCorrupt`` when the content does not
        hash to its name (the file is left in place for inspection).
        """
        target = self.path(sha256)
        try:
            data = target.read_bytes()
        except FileNotFoundError:
            raise NotFound(f"checkpoint {sha256} is not in the store {self.root}") from None
        except OSError as exc:
            raise CheckpointStoreError(f"cannot read checkpoint {sha256[:12]}: {exc}") from None
        actual = _digest(data)
        if actual != sha256:
            raise CheckpointCorrupt(
                f"checkpoint file {target} is corrupt: its content hashes to {actual[:12]}..., "
                f"not {sha256[:12]}...; left untouched"
            )
        return data

    def hashes(self) -> list[str]:
        """Hashes of every stored checkpoint, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.glob("*/*")
            if p.is_file() and _SHA256.match(p.name) and p.parent.name == p.name[:2]
        )

    def purge(self, keep: Iterable[str]) -> list[str]:
        """Delete stored checkpoints whose hash is not in ``keep``; return the deleted hashes.

        ``keep`` is normally ``ModelRegistry.referenced_hashes()`` (everything not rejected).
        Temporary files older than an hour (left by a crash) are removed too.
        """
        kept = set(keep)
        removed: list[str] = []
        try:
            for sha256 in self.hashes():
                if sha256 not in kept:
                    self.path(sha256).unlink(missing_ok=True)
                    removed.append(sha256)
            now = time.time()
            for tmp in self.root.glob(f"*/{_TMP_PREFIX}*") if self.root.is_dir() else ():
                with contextlib.suppress(FileNotFoundError):
                    if now - tmp.stat().st_mtime > _STALE_TMP_S:
                        tmp.unlink()
        except OSError as exc:
            raise CheckpointStoreError(f"cannot purge checkpoints under {self.root}: {exc}") from None
        return removed
