"""Benchmarks run by ``tradeagent bench <name>``; one module per benchmark."""
