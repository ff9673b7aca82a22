"""A real writer process for the storage tests (run as a script, never imported by pytest).

``python worker.py MODE URL DATA_DIR GO_FD [N]``: opens the database as a production process
would (``URL`` empty: the embedded SQLite file under ``DATA_DIR``), waits until the pipe it reads
at file descriptor ``GO_FD`` is closed (the parent closes it once every worker is started, so
that they start writing together), then:

* ``daemon``: like the trading daemon: N orders in batches, each acknowledged and filled, every
  fill batch re-sending the previous one (duplicates), an event per batch;
* ``retrain``: like the nightly retrain: N runs, each with folds, gate events, learned floor
  updates, a candidate checkpoint that is promoted (even runs) or rejected (odd runs);
* ``ack``: records N fills, prints ``ACK <fill ids>`` once they are acknowledged, then waits to
  be killed.

Any exception ends the process with a traceback and a non-zero exit code.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys

from storage import Journal, LearnedFloors, Ledger, ModelRegistry, StorageConfig, open_database
from storage.values import LedgerFill, LedgerOrder

BATCH = 20
PX = 1_000_000_000


def _orders(prefix: str, start: int, count: int) -> list[LedgerOrder]:
    return [
        LedgerOrder(
            client_order_id=f"{prefix}{i}",
            instrument_id=1001 + i % 2,
            side="buy" if i % 3 else "sell",
            qty=1,
            ts_ns=i,
        )
        for i in range(start, start + count)
    ]


def _fills(prefix: str, start: int, count: int) -> list[LedgerFill]:
    return [
        LedgerFill(
            fill_id=f"F{prefix}{i}", client_order_id=f"{prefix}{i}", qty=1, price=(5000 + i % 7) * PX, ts_ns=i
        )
        for i in range(start, start + count)
    ]


def daemon(database_args: tuple[StorageConfig, str], n: int) -> dict[str, int]:
    with open_database(*database_args) as db:
        ledger, journal = Ledger(db), Journal(db)
        session = journal.start_session(mode="paper", host="test", pid=0, version="test")
        previous: list[LedgerFill] = []
        for start in range(0, n, BATCH):
            count = min(BATCH, n - start)
            ledger.record_orders(_orders("o", start, count))
            for order in _orders("o", start, count):
                ledger.update_order(order.client_order_id, "acked", ts_ns=order.ts_ns)
            batch = _fills("o", start, count)
            ledger.record_fills(previous + batch)
            previous = batch
            journal.record_event("heartbeat", f"batch at {start}", session_id=session)
        journal.end_session(session, reason="done")
    return {"orders": n}


def retrain(database_args: tuple[StorageConfig, str], n: int) -> dict[str, int]:
    with open_database(*database_args) as db:
        registry, floors = ModelRegistry(db), LearnedFloors(db)
        for k in range(n):
            run = registry.start_run(instrument_set="ES,NQ", config={"k": k})
            for fold in range(3):
                registry.record_fold(
                    run, fold, train_ns=(0, 10), test_ns=(11, 20), metrics={"sharpe": 0.1 * fold}
                )
            registry.record_gate_event(run, "q_drift", passed=True, values={"q": 0.5})
            registry.record_gate_event(run, "kill_q_spread", passed=k % 2 == 0, values={"spread": 0.01 * k})
            for instrument in (1001, 1002):
                floors.update(instrument, "vol_ref", 1e-8 * (k + 1), run_id=run)
            digest = hashlib.sha256(f"ckpt-{k}".encode()).hexdigest()
            registry.register_candidate(
                sha256=digest,
                instrument_set="ES,NQ",
                layout_fingerprint="fp",
                path=digest,
                metrics={},
                run_id=run,
            )
            if k % 2 == 0:
                registry.promote(digest, by="retrain")
            else:
                registry.reject(digest, reason="kill criterion")
            registry.finish_run(run, status="succeeded")
    return {"runs": n}


def ack(database_args: tuple[StorageConfig, str], n: int) -> None:
    with open_database(*database_args) as db:
        ledger = Ledger(db)
        ledger.record_orders(_orders("k", 0, n))
        result = ledger.record_fills(_fills("k", 0, n))
        sys.stdout.write("ACK " + " ".join(result.inserted) + "\n")
        sys.stdout.flush()
        signal.pause()  # until the kill


def main() -> int:
    mode, url, data_dir, go_fd = sys.argv[1:5]
    n = int(sys.argv[5]) if len(sys.argv) > 5 else 100
    database_args = (StorageConfig(url=url), data_dir)
    os.read(int(go_fd), 1)  # end of file: the parent closed the pipe
    if mode == "daemon":
        print(json.dumps(daemon(database_args, n)))
    elif mode == "retrain":
        print(json.dumps(retrain(database_args, n)))
    elif mode == "ack":
        ack(database_args, n)
    else:
        raise SystemExit(f"unknown mode {mode}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
