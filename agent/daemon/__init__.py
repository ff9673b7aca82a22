"""The trading daemon: one asyncio process from market data to orders, fills and the ledger."""
