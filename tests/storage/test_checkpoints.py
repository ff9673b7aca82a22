from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from storage import CheckpointStore
from storage.errors import CheckpointCorrupt, CheckpointStoreError, NotFound


def test_put_get_is_content_addressed_and_idempotent(tmp_path: Path) -> None:
    store = CheckpointStore.for_data_dir(tmp_path)
    data = b"safetensors bytes" * 100
    digest = store.put(data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert store.put(data) == digest
    assert store.path(digest) == tmp_path / "checkpoints" / digest[:2] / digest
    assert store.get(digest) == data and store.exists(digest)
    assert store.hashes() == [digest]
    assert not any(p.name.startswith(".tmp-") for p in store.path(digest).parent.iterdir())


def test_a_corrupt_file_is_reported_and_left_untouched(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    digest = store.put(b"good bytes")
    store.path(digest).write_bytes(b"bit rot")
    with pytest.raises(CheckpointCorrupt, match="left untouched"):
        store.get(digest)
    assert store.path(digest).read_bytes() == b"bit rot"
    assert store.put(b"good bytes") == digest  # putting the right bytes repairs it
    assert store.get(digest) == b"good bytes"


def test_missing_and_malformed_hashes(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    with pytest.raises(NotFound):
        store.get("0" * 64)
    with pytest.raises(CheckpointStoreError, match="sha256"):
        store.path("../../etc/passwd")
    assert store.hashes() == []


def test_purge_keeps_referenced_files_and_removes_stale_temporaries(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    keep, drop = store.put(b"keep"), store.put(b"drop")
    stale = store.path(keep).parent / ".tmp-crashed"
    stale.write_bytes(b"partial")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    fresh = store.path(keep).parent / ".tmp-in-flight"
    fresh.write_bytes(b"being written")
    assert store.purge(keep={keep}) == [drop]
    assert store.hashes() == [keep]
    assert not stale.exists() and fresh.exists()


def test_unwritable_store_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(CheckpointStoreError, match="cannot store"):
        CheckpointStore(blocker).put(b"x")
