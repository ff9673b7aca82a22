"""Everything the system must remember: SQL ledger, model registry, learned floors, events.

``storage`` knows nothing of ``agent``.
"""
