"""The model the daemon trades with: loading, verification, hot swap and failure handling.

A checkpoint is always taken from the content-addressed store by its sha256 and verified twice
before it can serve: the bytes must hash to the sha256 the registry holds, and its layout
fingerprint must equal the registry's record and the serving model's (a swap never changes the
network's shape). A refused checkpoint raises :class:`ModelRefused` and leaves the running model
untouched. The swap itself is :meth:`agent.gpu.engine.InferenceEngine.load`, which switches
between two decisions.

An inference failure (:class:`agent.gpu.errors.InferenceError`) is fail-safe: the caller halts
new orders and keeps every position and order. Only when ``daemon.cpu_fallback`` is set does
:meth:`ModelHost.fall_back_to_cpu` rebuild the engine on the CPU backend (logged as a warning;
the new engine's windows start empty, so each instrument trades again after K bars).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from agent.errors import AgentError
from agent.gpu.backend import Backend, DeviceKind, select_backend
from agent.gpu.engine import InferenceEngine
from agent.gpu.errors import GpuError
from agent.model.checkpoint import Checkpoint, checkpoint_from_bytes
from agent.model.errors import ModelError
from agent.policy.config import PolicyConfig
from storage import CheckpointStore
from storage.errors import StorageError
from storage.registry import ModelRegistry

__all__ = ["ModelHost", "ModelRefused"]

log = logging.getLogger(__name__)


class ModelRefused(AgentError):
    """A checkpoint that may not serve (unknown, corrupt, mismatched); nothing was changed."""


class ModelHost:
    """Owns the :class:`InferenceEngine` (None until a checkpoint has been loaded)."""

    def __init__(
        self,
        registry: ModelRegistry,
        store: CheckpointStore,
        policy: PolicyConfig,
        tick_values: Sequence[float],
        device: DeviceKind,
        *,
        fee_per_contract: float,
    ) -> None:
        self._registry = registry
        self._fee = fee_per_contract
        self._store = store
        self._policy = policy
        self._tick_values = list(tick_values)
        self._device = device
        self.engine: InferenceEngine | None = None
        self.checkpoint: Checkpoint | None = None
        self.swaps = 0

    @property
    def sha256(self) -> str:
        return self.checkpoint.sha256 if self.checkpoint is not None else ""

    def fetch(self, sha256: str) -> Checkpoint:
        """Read and verify a registered checkpoint (blocking; call it off the loop)."""
        try:
            record = self._registry.get(sha256)
            data = self._store.get(sha256)
        except StorageError as exc:
            raise ModelRefused(f"checkpoint {sha256[:12]}: {exc}") from None
        expected = self.checkpoint.fingerprint if self.checkpoint is not None else record.layout_fingerprint
        try:
            checkpoint = checkpoint_from_bytes(data, expected_sha256=sha256, expected_fingerprint=expected)
        except ModelError as exc:
            raise ModelRefused(f"checkpoint {sha256[:12]} refused: {exc}") from None
        if checkpoint.fingerprint != record.layout_fingerprint:
            raise ModelRefused(
                f"checkpoint {sha256[:12]}: layout fingerprint {checkpoint.fingerprint[:12]} differs from "
                f"the registry's {record.layout_fingerprint[:12]}"
            )
        return checkpoint

    async def activate(self, sha256: str) -> bool:
        """Serve ``sha256`` (first load or hot swap); False when it already serves."""
        if sha256 == self.sha256:
            return False
        checkpoint = await asyncio.to_thread(self.fetch, sha256)
        try:
            if self.engine is None:
                self.engine = await asyncio.to_thread(self._build, checkpoint, select_backend(self._device))
            else:
                await asyncio.to_thread(self.engine.load, checkpoint)
                self.swaps += 1
        except GpuError as exc:
            raise ModelRefused(f"checkpoint {sha256[:12]} cannot be served: {exc}") from None
        self.checkpoint = checkpoint
        log.info("model %s serving (%s)", sha256[:12], "hot swap" if self.swaps else "first load")
        return True

    def _build(self, checkpoint: Checkpoint, backend: Backend) -> InferenceEngine:
        return InferenceEngine(
            checkpoint,
            self._policy,
            self._tick_values,
            fee_per_contract=self._fee,
            backend=backend,
            max_batch=len(self._tick_values),
        )

    def fall_back_to_cpu(self) -> None:
        """Rebuild the engine on the CPU backend (only called when configured)."""
        if self.checkpoint is None:
            return
        old = self.engine
        self.engine = self._build(self.checkpoint, select_backend("cpu"))
        if old is not None:
            try:
                old.close()
            except GpuError as exc:
                log.warning("closing the failed engine: %s", exc)
        log.warning("inference fell back to the CPU (daemon.cpu_fallback = true); windows restart empty")

    def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            try:
                engine.close()
            except GpuError as exc:  # a failed device must not stop the shutdown
                log.warning("closing the inference engine: %s", exc)
