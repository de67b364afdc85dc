"""Bench-only servers, each run as its own process: ``python -m tests.bench.servers.<name>``."""
