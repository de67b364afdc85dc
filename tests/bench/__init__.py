"""Benchmarks: ``python -m tests.bench`` (what ``make bench`` runs). See docs/performance.md."""
