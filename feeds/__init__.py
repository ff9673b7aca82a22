"""Market data: DBN I/O, streaming decode, book and health, bars and causal features, sources
(replay, NATS, Databento Live), relay/recorder and the synthetic MBP-10 generator.

``feeds`` knows nothing of ``agent``.
"""
