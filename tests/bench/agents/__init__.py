"""Bench-only agents: a deterministic specialist and a coordinator that calls it (remote) or
the same function in-process (local), so the difference is exactly one delegation hop."""
