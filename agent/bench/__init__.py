"""Benchmarks run by ``tradeagent bench <name>``; one module per benchmark, and
:mod:`agent.bench.scratch_db`, the throwaway PostgreSQL database ``bench db`` measures in."""
