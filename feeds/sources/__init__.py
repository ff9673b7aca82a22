"""Market-data sources behind one async interface (:class:`Source`): replay of DBN files, NATS
(core or JetStream) and Databento Live. Each yields :class:`RecordBatch` and
:class:`HealthEvent` values and keeps :class:`SourceCounters`.
"""

from feeds.sources.base import QueuedSource, Source
from feeds.sources.databento_live import DatabentoLiveSource, load_api_key
from feeds.sources.events import HealthEvent, HealthKind, RecordBatch, SourceCounters, SourceEvent
from feeds.sources.factory import build_source, config_symbols
from feeds.sources.nats_source import NatsSource
from feeds.sources.replay import ReplaySource
from feeds.sources.subjects import dataset_subjects, subject_for, subject_token

__all__ = [
    "DatabentoLiveSource",
    "HealthEvent",
    "HealthKind",
    "NatsSource",
    "QueuedSource",
    "RecordBatch",
    "ReplaySource",
    "Source",
    "SourceCounters",
    "SourceEvent",
    "build_source",
    "config_symbols",
    "dataset_subjects",
    "load_api_key",
    "subject_for",
    "subject_token",
]
