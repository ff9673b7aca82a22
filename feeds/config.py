"""Typed settings of the market-data layer.

These structs are frozen and reject unknown keys; ``agent.config`` composes them into the
process configuration loaded from ``config/*.toml``. ``feeds`` never imports ``agent``.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = [
    "BarConfig",
    "FeedsConfig",
    "HealthConfig",
    "InstrumentSpec",
    "RecorderConfig",
    "RelayConfig",
    "SourceConfig",
    "SynthConfig",
]


class InstrumentSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One tradable instrument: how its prices and sessions are read."""

    symbol: str
    instrument_id: int
    tick_size: float = 0.25
    tick_value: float = 12.5
    """Currency value of one tick for one contract."""
    session_start: str = "13:30"
    """Session open, ``HH:MM`` UTC (synthetic data and time-of-day features)."""
    session_end: str = "20:00"


class BarConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The decision clock: a bar closes every ``interval_s`` seconds (time bars) or every
    ``events`` book updates (event bars)."""

    clock: Literal["time", "events"] = "time"
    interval_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    """Time bars: seconds per bar, > 0."""
    events: Annotated[int, msgspec.Meta(ge=1)] = 100
    """Event bars: book updates per bar, >= 1."""


class HealthConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Thresholds of the per-instrument book health checks (DESIGN section 4)."""

    stale_after_s: float = 5.0
    max_price_jump_ticks: int = 2000
    """A top-of-book move larger than this many ticks in one record is an absurd price."""
    max_sequence_gap: int = 0
    """A forward jump of an instrument's ``sequence`` larger than this is a gap; 0 disables the
    forward check (Databento's sequence is per venue channel, shared by its instruments, so a
    partial subscription jumps by design). A backward sequence is always a fault."""


class SourceConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Where records come from."""

    kind: Literal["replay", "nats", "databento"] = "replay"
    path: str = ""
    """Replay: a DBN file or a directory of daily files."""
    pace: float = 0.0
    """Replay pacing: 0 = as fast as possible, N = real time x N."""
    nats_url: str = "nats://127.0.0.1:4222"
    dataset: str = "GLBX.MDP3"
    stream: str = "MBP10"
    """JetStream stream name that records the market-data subjects."""
    symbols: tuple[str, ...] = ()
    """Symbols to subscribe to (NATS and Databento Live); empty = every symbol of the dataset on
    NATS (Databento Live needs them)."""
    nats_mode: Literal["jetstream", "core"] = "jetstream"
    """NATS consumer: ``jetstream`` (pull consumer on ``stream``, redeliveries skipped by stream
    sequence, gaps measured) or ``core`` (plain subscription: lowest latency, at-most-once)."""
    durable: str = ""
    """JetStream durable consumer name: resume where it stopped; empty = ephemeral, new data only."""
    queue_batches: Annotated[int, msgspec.Meta(ge=1)] = 1024
    """Record batches buffered for a slow consumer before new ones are dropped (counted)."""
    databento_key_file: str = ""
    """Databento Live: file holding the API key (e.g. a systemd credential); empty = the
    ``DATABENTO_API_KEY`` environment variable. The key is never logged."""
    databento_reconnect: bool = True
    """Databento Live: reconnect automatically (the gap is reported as a health event)."""


class RelayConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``tradeagent relay``: how a source is published onto NATS JetStream."""

    batch_records: Annotated[int, msgspec.Meta(ge=1, le=2800)] = 512
    """Records per NATS message at most (368 bytes each; must stay under the server's 1 MiB
    ``max_payload``). One source batch is never held back to fill a message."""
    max_in_flight: Annotated[int, msgspec.Meta(ge=1)] = 512
    """JetStream publishes awaiting their acknowledgement."""
    stream_max_age_s: Annotated[float, msgspec.Meta(gt=0)] = 7 * 86400.0
    """How long the JetStream stream keeps messages (created with this if missing)."""
    stop_timeout_s: Annotated[float, msgspec.Meta(ge=3)] = 10.0
    """SIGTERM: the relay exits within this (>= 3); acknowledgements still missing 2 s before
    it are abandoned (a relay restarted on the same files publishes them again)."""


class RecorderConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``tradeagent record``: the durable JetStream consumer writing daily ``.dbn.zst`` files."""

    out_dir: str = ""
    """Archive directory; empty = ``<data_dir>/recordings``."""
    durable: str = "recorder"
    """Durable consumer name: a restarted recorder resumes after its last acknowledged message."""
    rotate_hour_utc: Annotated[int, msgspec.Meta(ge=0, le=23)] = 0
    """Hour (UTC, 0-23) at which a new daily file starts; the file is named by the day it starts."""
    flush_interval_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    """Written records are flushed to disk (and their messages acknowledged) this often."""
    fetch_batch: Annotated[int, msgspec.Meta(ge=1)] = 64
    """NATS messages pulled per fetch (each up to ``relay.batch_records`` x 368 bytes)."""


class SynthConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The synthetic MBP-10 generator (``tradeagent synth``); ``feeds/synth.py`` states the model.

    Instruments, tick sizes and session hours come from ``feeds.instruments``.
    """

    days: Annotated[int, msgspec.Meta(ge=1)] = 5
    """Trading days to write (weekdays from ``start_date``), one file per day."""
    start_date: Annotated[str, msgspec.Meta(pattern=r"^\d{4}-\d{2}-\d{2}$")] = "2024-01-02"
    events_per_second: Annotated[float, msgspec.Meta(gt=0)] = 6.0
    """Base book-event rate per instrument (x the regime's activity); ~125k records per 6.5-hour day."""
    signal: Annotated[float, msgspec.Meta(ge=0)] = 0.5
    """Strength of the planted order-flow-imbalance signal; 0 gives a martingale mid."""
    signal_window_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    """The order-flow imbalance that leads price moves is summed over this many seconds."""
    pressure_s: Annotated[float, msgspec.Meta(ge=1)] = 30.0
    """Order flow is persistent: its buy/sell pressure lasts about this many seconds."""
    pressure_tilt: Annotated[float, msgspec.Meta(ge=0)] = 0.5
    """How strongly the pressure tilts order flow to one side (0: no persistence)."""
    dataset: str = "SYNTH"
    calm_minutes: Annotated[float, msgspec.Meta(gt=0)] = 40.0
    """Mean length of an ordinary calm stretch."""
    long_calm_minutes: Annotated[float, msgspec.Meta(gt=0)] = 180.0
    """Mean length of a long calm stretch."""
    long_calm_probability: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.35
    """Chance that a calm stretch is a long one."""
    active_minutes: Annotated[float, msgspec.Meta(gt=0)] = 20.0
    """Mean length of an active stretch."""
    calm_activity: Annotated[float, msgspec.Meta(gt=0)] = 0.5
    """Event-rate multiplier in calm stretches."""
    active_activity: Annotated[float, msgspec.Meta(gt=0)] = 2.5
    calm_move_probability: Annotated[float, msgspec.Meta(gt=0, lt=1)] = 0.02
    """Chance that a book event in a calm stretch moves the price by one tick."""
    active_move_probability: Annotated[float, msgspec.Meta(gt=0, lt=1)] = 0.06
    mean_order_size: Annotated[float, msgspec.Meta(ge=1)] = 4.0
    """Mean size (contracts) of one add, cancel or trade."""
    start_prices: dict[str, float] = msgspec.field(default_factory=lambda: {"ES": 5000.0, "NQ": 18000.0})
    """Opening price of the first day per symbol; later days open at the previous close."""
    default_start_price: Annotated[float, msgspec.Meta(gt=0)] = 1000.0
    """Opening price of symbols missing from ``start_prices``."""


class FeedsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    bars: BarConfig = msgspec.field(default_factory=BarConfig)
    health: HealthConfig = msgspec.field(default_factory=HealthConfig)
    source: SourceConfig = msgspec.field(default_factory=SourceConfig)
    relay: RelayConfig = msgspec.field(default_factory=RelayConfig)
    recorder: RecorderConfig = msgspec.field(default_factory=RecorderConfig)
    instruments: tuple[InstrumentSpec, ...] = (
        InstrumentSpec(symbol="ES", instrument_id=1001, tick_size=0.25, tick_value=12.5),
        InstrumentSpec(symbol="NQ", instrument_id=1002, tick_size=0.25, tick_value=5.0),
    )
