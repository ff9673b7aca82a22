"""Build the configured source (``feeds.source.kind``) from the typed configuration."""

from __future__ import annotations

from feeds.config import FeedsConfig
from feeds.errors import FeedError
from feeds.sources.base import Source
from feeds.sources.databento_live import DatabentoLiveSource
from feeds.sources.nats_source import NatsSource
from feeds.sources.replay import ReplaySource

__all__ = ["build_source", "config_symbols"]


def config_symbols(config: FeedsConfig) -> dict[int, str]:
    """instrument_id -> symbol of the configured instruments."""
    return {spec.instrument_id: spec.symbol for spec in config.instruments}


def build_source(config: FeedsConfig, *, restrict: bool = True) -> Source:
    """A new (not started) source for ``config.source``; raises :class:`FeedError` if incomplete.

    ``restrict`` (a daemon, a gateway): the source passes on only the records of
    ``feeds.source.dataset`` and of the instruments in ``feeds.instruments``; the others are
    counted and never reach the consumer. A relay builds it with ``restrict=False``: it
    publishes every instrument of its source under the source's own dataset.
    """
    src = config.source
    stale = config.health.stale_after_s
    instruments = config_symbols(config) if restrict else None
    if src.kind == "replay":
        if not src.path:
            raise FeedError("feeds.source.path is empty: give a DBN file or a directory to replay")
        return ReplaySource(
            src.path, pace=src.pace, dataset=src.dataset if restrict else None, instruments=instruments
        )
    if src.kind == "nats":
        return NatsSource(
            url=src.nats_url,
            dataset=src.dataset,
            symbols=src.symbols,
            mode=src.nats_mode,
            stream=src.stream,
            durable=src.durable,
            stream_max_age_s=config.relay.stream_max_age_s,
            max_batches=src.queue_batches,
            stale_after_s=stale,
            instruments=instruments,
        )
    return DatabentoLiveSource(
        dataset=src.dataset,
        symbols=src.symbols,
        key_file=src.databento_key_file,
        reconnect=src.databento_reconnect,
        max_batches=src.queue_batches,
        stale_after_s=stale,
        instruments=instruments,
    )
