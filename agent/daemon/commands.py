"""The control commands (``tradeagent ctl``) and the model the daemon serves.

:meth:`Commands.handle` answers the control socket (:class:`agent.control.server.ControlServer`):

* ``status``: the daemon's :class:`agent.daemon.status.DaemonStatus`;
* ``halt`` (operator, persisted through its journaled event), ``resume`` (clears the latched
  halts: operator, risk, inference) and ``flatten`` (halt, then close every position), each
  logged at WARNING with who asked;
* ``promote SHA256`` (verify the checkpoint, then promote it in SQL), ``rollback`` (the previous
  promoted checkpoint back) and ``reload`` (the promoted one, if it changed), each followed by a
  hot swap.

A swap goes through :meth:`agent.daemon.model_host.ModelHost.activate`, which verifies the
checkpoint's sha256 and layout fingerprint and switches the engine between two decisions; a
corrupt or mismatched checkpoint is refused (``swap_refused`` event) and the running model stays.
At start, :meth:`Commands.serve_initial` loads ``daemon.checkpoint`` or the promoted checkpoint of
the instrument set; without one a ``model`` halt holds the orders until one is promoted. After a
successful nightly retrain (:meth:`Commands.on_retrain`) the daemon reloads the promoted
checkpoint as ``reload`` would.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, NoReturn

from agent.control.errors import ControlRefused
from agent.control.messages import ControlRequest
from agent.daemon.events import Events
from agent.daemon.metrics import DaemonMetrics
from agent.daemon.model_host import ModelHost, ModelRefused
from agent.daemon.scheduler import RetrainResult
from agent.daemon.status import DaemonStatus
from agent.daemon.store import SqlWorker
from agent.daemon.supervision import RiskGuard
from storage.errors import StorageError
from storage.values import CheckpointRecord

__all__ = ["Commands"]

log = logging.getLogger(__name__)


class Commands:
    """The control socket's handler and the model swaps (see the module docstring)."""

    def __init__(
        self,
        *,
        status: Callable[[], DaemonStatus],
        guard: RiskGuard,
        models: ModelHost,
        sql: SqlWorker,
        metrics: DaemonMetrics,
        events: Events,
        instrument_set: str,
        session_id: int,
        stopping: Callable[[], bool],
    ) -> None:
        self._status = status
        self._guard = guard
        self._models = models
        self._sql = sql
        self._metrics = metrics
        self._events = events
        self._instrument_set = instrument_set
        self._session_id = session_id
        self._stopping = stopping

    async def handle(self, request: ControlRequest) -> dict[str, Any]:
        command = request.command
        if command == "status":
            return self._status().to_dict()
        halts = self._events.halts
        who = request.origin or "a client that did not name itself"
        if command == "halt":
            reason = request.args.get("reason", "operator")
            log.warning("operator halt from %s: %s (no new orders until tradeagent ctl resume)", who, reason)
            halts.set("operator", reason)
            self._events.emit("halt", reason, details={"kind": "operator", "by": who})
            return {"halted": True, "halts": dict(halts.active)}
        if command == "resume":
            cleared = halts.resume()
            log.warning(
                "operator resume from %s: cleared %s; now %s",
                who,
                ", ".join(cleared) or "no latched halt",
                halts.describe(),
            )
            self._events.emit("resume", "operator resume", details={"cleared": cleared, "by": who})
            return {"cleared": cleared, "halts": dict(halts.active)}
        if command == "flatten":
            log.warning("operator flatten from %s: new orders halted, every position closed", who)
            halts.set("operator", "flatten")
            self._events.emit("halt", "flatten", details={"kind": "operator", "by": who})
            self._guard.flatten()
            return {"flattening": True, "positions": self._status().positions}
        if command in ("reload", "promote", "rollback"):
            log.info("operator %s from %s %s", command, who, request.args or "")
            record = await self._checkpoint(request)
            return await self._swap(record.sha256)
        raise ControlRefused(f"unknown command {command}")

    async def _checkpoint(self, request: ControlRequest) -> CheckpointRecord:
        """The checkpoint a model command serves, promoted or rolled back in SQL first."""
        sql, models = self._sql, self._models
        try:
            if request.command == "promote":
                sha = request.args.get("sha256", "")
                record = await sql.call(sql.registry.get, sha)
                try:  # verify before the registry says it is promoted
                    await asyncio.to_thread(models.fetch, sha)
                except ModelRefused as exc:
                    self._refused(exc, sha)
                if record.status == "candidate":
                    return await sql.call(
                        sql.registry.promote, sha, by="tradeagent ctl", session_id=self._session_id
                    )
                if record.status != "promoted":
                    raise ControlRefused(
                        f"checkpoint {sha[:12]} is {record.status}; only a candidate can be promoted"
                    )
                return record
            if request.command == "rollback":
                return await sql.call(
                    sql.registry.rollback,
                    self._instrument_set,
                    by="tradeagent ctl",
                    reason=request.args.get("reason", "operator rollback"),
                    session_id=self._session_id,
                )
            current = await sql.call(sql.registry.current_promoted, self._instrument_set)
        except StorageError as exc:
            raise ControlRefused(str(exc)) from None
        if current is None:
            raise ControlRefused(f"no promoted checkpoint for {self._instrument_set}")
        return current

    async def _swap(self, sha: str) -> dict[str, Any]:
        previous = self._models.sha256
        try:
            changed = await self._models.activate(sha)
        except ModelRefused as exc:
            self._refused(exc, sha)
        if changed:
            self._events.halts.clear("model")
            self._metrics.set_model(sha)
            details = {"sha256": sha, "previous": previous}
            self._events.emit("swap", f"model {sha[:12]} serving", details=details)
        return {"serving": sha, "previous": previous, "swapped": changed}

    def _refused(self, exc: ModelRefused, sha: str) -> NoReturn:
        serving = self._models.sha256
        self._events.emit("swap_refused", str(exc), details={"sha256": sha, "serving": serving})
        raise ControlRefused(f"{exc}; still serving {serving[:12] or 'no model'}") from None

    async def serve_initial(self, pinned: str) -> None:
        """Load ``pinned`` (``daemon.checkpoint``) or the promoted checkpoint; without a valid
        one, a ``model`` halt until one is promoted."""
        sha = pinned
        if not sha:
            record = await self._sql.call(self._sql.registry.current_promoted, self._instrument_set)
            sha = record.sha256 if record is not None else ""
        if not sha:
            self._events.halts.set("model", f"no promoted checkpoint for {self._instrument_set}")
            log.warning(
                "no promoted checkpoint for %s: no orders until one is promoted", self._instrument_set
            )
            return
        try:
            await self._models.activate(sha)
        except ModelRefused as exc:
            self._events.halts.set("model", str(exc))
            log.error("%s; no orders until a valid checkpoint is promoted", exc)
            return
        self._metrics.set_model(sha)

    def on_retrain(self, result: RetrainResult) -> None:
        """The retrain scheduler's report: counted; a successful one is reloaded."""
        self._metrics.count(f"retrain_{result.outcome}")
        if result.outcome == "ok" and not self._stopping():
            self._events.spawn(self._reload_after_retrain())

    async def _reload_after_retrain(self) -> None:
        try:
            await self.handle(ControlRequest(command="reload", origin="the nightly retrain"))
        except ControlRefused as exc:
            log.info("after the retrain: %s", exc)
