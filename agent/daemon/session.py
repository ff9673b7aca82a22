"""The daemon's hold on its ledger: the lock, the database, the session with its leases, and what
a start recovers from the ledger.

:meth:`Session.start` takes, in this order, the data directory's file lock (before the database
or any socket is touched: :mod:`agent.daemon.lock`), the database (its calls on the SQL thread
of :class:`agent.daemon.store.SqlWorker`), and a daemon session holding the lease of each
instrument for the account (:mod:`storage.leases`). A live daemon holding any of them refuses
this one (:class:`agent.daemon.lock.DaemonLocked`, exit code 2 naming its pid and host); the
sessions of daemons that did not stop cleanly are closed as their leases are taken over. A task
renews the leases every third of ``daemon.lease_timeout_s``; when another daemon took them over
(this one went stale: the database unreachable, or the loop stalled, for longer than the
timeout) the session is :attr:`Session.lost` and the daemon stops with exit code 1. ``stop``
ends the session and releases its leases, closes the database and releases the lock.

:meth:`Session.recover` rebuilds positions and open orders from the ledger and restores a
latched halt (see :func:`persisted_halt`): in paper mode the orders of the previous process can
no longer fill (its simulated exchange is gone) and are closed as cancelled; in gateway mode
they stay open and the gateway's replay reconciles them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence

from agent import __version__
from agent.daemon.config import DaemonConfig
from agent.daemon.lifecycle import Component
from agent.daemon.lock import DaemonLock, holder_gone, lease_refused
from agent.daemon.metrics import DaemonMetrics
from agent.daemon.status import Recovered
from agent.daemon.store import SqlWorker
from agent.errors import AgentError
from agent.execution.orders import OpenOrder, OrderManager
from agent.execution.portfolio import Portfolio
from agent.execution.protocol import NewOrder
from agent.policy.floors import VOL_REF_FLOOR
from agent.trading.risk import HaltKind, Halts
from feeds.config import InstrumentSpec
from feeds.records import PRICE_SCALE
from storage.config import StorageConfig
from storage.errors import LeaseHeld, StorageError
from storage.schema import open_database
from storage.values import InstrumentInfo

__all__ = ["Session", "persisted_halt"]

log = logging.getLogger(__name__)


class Session(Component):
    """The lock, the database and the leased session of one daemon (see the module docstring)."""

    def __init__(
        self,
        config: DaemonConfig,
        storage: StorageConfig,
        data_dir: str,
        specs: Sequence[InstrumentSpec],
        account: str,
        *,
        on_lost: Callable[[], None],
    ) -> None:
        super().__init__("session")
        self._config = config
        self._storage = storage
        self._data_dir = data_dir
        self._specs = list(specs)
        self._ids = [s.instrument_id for s in specs]
        self._account = account
        self._on_lost = on_lost
        self.id = 0
        """The daemon session in the database (0 until started)."""
        self.lost = False
        """Another daemon took the leases over: this one must stop (exit code 1)."""
        self.end_reason = "stopped"
        """What :meth:`stop` records as the session's end."""
        self._lock: DaemonLock | None = None
        self._sql: SqlWorker | None = None

    @property
    def sql(self) -> SqlWorker:
        if self._sql is None:
            raise AgentError("the daemon's database is not open")
        return self._sql

    async def _start(self) -> None:
        self._lock = DaemonLock.acquire(self._data_dir)  # before the database and any socket
        database = await asyncio.to_thread(open_database, self._storage, self._data_dir)
        self._sql = sql = SqlWorker(database, self._data_dir)
        infos = [
            InstrumentInfo(
                instrument_id=s.instrument_id, symbol=s.symbol, tick_size=s.tick_size, tick_value=s.tick_value
            )
            for s in self._specs
        ]
        await sql.call(sql.instruments.upsert, infos)
        self.id = await self._lease(sql)
        self._task(self._keep_lease(sql), "lease")

    async def _lease(self, sql: SqlWorker) -> int:
        """Start the session with the leases of the instruments for the account:
        :class:`DaemonLocked` while another live daemon holds any."""
        try:
            leased = await sql.call(
                sql.leases.start_session,
                account=self._account,
                instrument_ids=self._ids,
                mode=self._config.mode,
                host=socket.gethostname(),
                pid=os.getpid(),
                version=__version__,
                stale_after_s=self._config.lease_timeout_s,
                gone=holder_gone,
            )
        except LeaseHeld as exc:
            raise lease_refused(exc, self._config.lease_timeout_s) from None
        for lease in leased.taken_over:
            log.warning(
                "daemon session %d (pid %d on host %s) did not stop cleanly: closed, its leases taken over",
                lease.session_id,
                lease.pid,
                lease.host,
            )
        return leased.session_id

    async def _keep_lease(self, sql: SqlWorker) -> None:
        """Renew the leases every third of ``daemon.lease_timeout_s``; a failed renewal is tried
        again at the next period; leases taken over stop the daemon."""
        period = self._config.lease_timeout_s / 3
        while True:
            await asyncio.sleep(period)
            try:
                await sql.call(sql.leases.renew, self.id, account=self._account, instrument_ids=self._ids)
            except LeaseHeld as exc:
                log.error("%s: another daemon trades this ledger now; stopping", exc)
                self.lost = True
                self._on_lost()
                return
            except StorageError as exc:
                log.warning("daemon lease not renewed (%s); next attempt in %.1f s", exc, period)

    async def _stop(self) -> None:
        await self._cancel_tasks()
        if self._sql is not None:
            if self.id:
                with contextlib.suppress(StorageError):
                    await self._sql.call(self._sql.leases.end_session, self.id, reason=self.end_reason)
            self._sql.close()
        if self._lock is not None:
            self._lock.release()

    async def regime_floors(self) -> list[float]:
        """The learned ``vol_ref`` floor of each instrument (0 where none was learned yet)."""
        sql = self.sql
        floors = await sql.call(sql.floors.all, VOL_REF_FLOOR)
        return [
            floors[(iid, VOL_REF_FLOOR)].value if (iid, VOL_REF_FLOOR) in floors else 0.0 for iid in self._ids
        ]

    async def recover(
        self,
        portfolio: Portfolio,
        orders: OrderManager,
        halts: Halts,
        metrics: DaemonMetrics,
        symbols: Mapping[int, str],
        *,
        paper: bool,
    ) -> Recovered:
        """Rebuild positions and open orders from the ledger; restore a persisted halt."""
        sql = self.sql
        state = await sql.call(sql.ledger.rebuild, self._account)
        for iid, pos in state.positions.items():
            if iid in symbols:
                portfolio.restore(
                    iid, pos.qty, pos.avg_price * PRICE_SCALE, pos.realized_points * PRICE_SCALE, pos.fees
                )
        restored: list[OpenOrder] = []
        closed = 0
        for rec in state.open_orders:
            if paper:
                await sql.call(
                    sql.ledger.update_order,
                    rec.client_order_id,
                    "cancelled",
                    ts_ns=time.time_ns(),
                    reason="paper broker restarted",
                )
                closed += 1
                continue
            order = NewOrder(
                client_order_id=rec.client_order_id,
                instrument_id=rec.instrument_id,
                side=rec.side,
                qty=rec.qty,
                order_type=rec.order_type,
                limit_price=rec.limit_price,
                ts_ns=rec.ts_created_ns,
            )
            restored.append(OpenOrder(order=order, filled=rec.filled_qty, acked=rec.status != "new"))
        orders.restore(restored)
        if closed:
            metrics.count("orders_closed_at_restart", closed)
        halt = await sql.call(persisted_halt, sql)
        if halt is not None:
            kind, reason = halt
            halts.set(kind, f"{reason} (persisted; tradeagent ctl resume to clear)")
        positions = {symbols[i]: q for i, q in portfolio.positions().items()}
        log.info(
            "recovered from the ledger: positions %s, %d open orders, halts: %s",
            {s: q for s, q in positions.items() if q},
            len(restored),
            halts.describe(),
        )
        return Recovered(
            positions=positions,
            realised_pnl=round(portfolio.realised(), 2),
            open_orders=len(restored),
            closed_paper_orders=closed,
        )


def persisted_halt(sql: SqlWorker) -> tuple[HaltKind, str] | None:
    """The latched halt (risk or operator) left by the journal: the last such ``halt`` event
    not followed by an operator ``resume`` (a database recovery's ``resume`` does not count).
    Blocking: run it on the SQL thread."""
    events = []
    for kind in ("halt", "resume"):
        after = 0
        while page := sql.journal.events(kind=kind, after_id=after, limit=1000):
            events.extend(page)
            after = page[-1].id
    latched: tuple[HaltKind, str] | None = None
    for event in sorted(events, key=lambda e: e.id):
        halt_kind = (event.details or {}).get("kind")
        if event.kind == "halt" and halt_kind in ("risk", "operator"):
            latched = ("risk" if halt_kind == "risk" else "operator"), event.message
        elif event.kind == "resume" and halt_kind != "database":
            latched = None
    return latched
