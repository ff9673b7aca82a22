"""The nightly retrain: an APScheduler 3 cron job that starts ``tradeagent train --promote``.

The job only *starts* work (STYLE item 8): the retrain runs as a subprocess with a time limit,
at most one at a time (a run still going when the next one is due is skipped and logged). Its
exit code, a crash or a timeout is logged and recorded; none of it touches trading. When the
retrain promotes a checkpoint it tells the daemon over the control socket (``promote``), and
the daemon verifies and hot-swaps it between two decisions.

APScheduler notes (NOTES.md): ``AsyncIOScheduler`` is started inside the running loop and keeps
its default ``AsyncIOExecutor``, so the coroutine job is awaited on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from agent.daemon.config import ScheduleConfig

__all__ = ["RetrainResult", "RetrainScheduler", "default_command"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetrainResult:
    """How one retrain ended: ``outcome`` is ok, failed, timeout, crashed or skipped."""

    outcome: str
    returncode: int | None
    seconds: float
    tail: str


def default_command(config_path: str | None) -> list[str]:
    """``<python> -m agent.cli [--config FILE] train --promote``."""
    cmd = [sys.executable, "-m", "agent.cli"]
    if config_path:
        cmd += ["--config", config_path]
    return [*cmd, "train", "--promote"]


class RetrainScheduler:
    """Cron-triggered retrain subprocesses; ``on_result`` hears how each one ended."""

    def __init__(
        self,
        config: ScheduleConfig,
        command: Sequence[str],
        on_result: Callable[[RetrainResult], None],
        env: dict[str, str] | None = None,
    ) -> None:
        self.config = config
        self.command = list(command)
        self._on_result = on_result
        self._env = env
        self._scheduler: AsyncIOScheduler | None = None
        self._running: asyncio.Task[RetrainResult] | None = None
        self.runs = 0
        self.skipped = 0

    @property
    def busy(self) -> bool:
        return self._running is not None and not self._running.done()

    def start(self) -> None:
        if not self.config.enabled:
            log.info("nightly retrain disabled (schedule.enabled = false)")
            return
        trigger = self.config.trigger()  # checked when the configuration loaded
        self._scheduler = AsyncIOScheduler(timezone=self.config.timezone)
        self._scheduler.add_job(self.trigger, trigger, id="retrain", max_instances=1, coalesce=True)
        self._scheduler.start()
        log.info("nightly retrain scheduled: %s (%s)", self.config.cron, self.config.timezone)

    async def stop(self) -> None:
        """Stop the schedule and end a running retrain (terminate, then kill)."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        if self._running is not None and not self._running.done():
            self._running.cancel()
            await asyncio.gather(self._running, return_exceptions=True)

    async def trigger(self) -> RetrainResult:
        """Start one retrain now unless one is running (then it is skipped)."""
        if self.busy:
            self.skipped += 1
            log.warning("retrain due but the previous one is still running: skipped")
            result = RetrainResult("skipped", None, 0.0, "")
            self._on_result(result)
            return result
        self._running = asyncio.get_running_loop().create_task(self._run(), name="retrain")
        return await asyncio.shield(self._running)

    async def _run(self) -> RetrainResult:
        self.runs += 1
        started = time.monotonic()
        log.info("retrain started: %s", " ".join(self.command))
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=self._env,
            )
        except OSError as exc:
            result = RetrainResult("crashed", None, time.monotonic() - started, str(exc))
            self._finish(result)
            return result
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.config.timeout_s)
        except TimeoutError:
            await _end(proc)
            result = RetrainResult("timeout", proc.returncode, time.monotonic() - started, "")
        except asyncio.CancelledError:
            await _end(proc)
            raise
        else:
            tail = out.decode(errors="replace")[-2000:]
            code = proc.returncode
            outcome = "ok" if code == 0 else ("crashed" if code is not None and code < 0 else "failed")
            result = RetrainResult(outcome, code, time.monotonic() - started, tail)
        self._finish(result)
        return result

    def _finish(self, result: RetrainResult) -> None:
        if result.outcome == "ok":
            log.info("retrain finished in %.0f s", result.seconds)
        else:
            log.error(
                "retrain %s after %.0f s (exit %s); trading is unaffected. Output tail: %s",
                result.outcome,
                result.seconds,
                result.returncode,
                result.tail[-500:],
            )
        self._on_result(result)


async def _end(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), 5.0)
    except TimeoutError:
        proc.kill()
        await proc.wait()
