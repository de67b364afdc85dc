"""Which idempotency keys a node's SQLite file may hold, in memory: a Bloom filter.

A send's key is looked up before its skill runs (``mesh._a2a.idempotency``), and on SQLite
that read was a trip to the database thread for every new message although almost every
``messageId`` is new. The filter answers "certainly not there" for a key it never saw, with
no trip; "maybe" (a key it saw, or ~0.2 % of new keys while it holds fewer keys than its
capacity) still reads the row. It never forgets a key: it is built from the file's keys at
start-up and gets every key this process records before the write is queued, so a duplicate
(also one sent again after a restart) always reaches the read. A key deleted since (retention,
a release) stays "maybe": one read, which finds nothing. It is only sound while one process
writes the file (docs/node.md: a node's data dir belongs to one process); replicas sharing
PostgreSQL claim their keys in the database instead.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

__all__ = ["KnownKeys"]

_HASHES = 4
# 16 bits per key at capacity: ~0.24 % false "maybe" with 4 hashes. It is sized at start-up and
# forgets nothing, so past capacity the rate grows (the smallest filter: ~2 % at 500,000 keys
# recorded, ~14 % at 1 M) until the next start sizes it anew: more reads, never a wrong answer.
_BITS_PER_KEY = 16
_MIN_BITS = 1 << 22  # 512 KiB: 262,144 keys at capacity


class KnownKeys:
    """A Bloom filter of hashable keys (Python's ``hash``: per process, as the filter is)."""

    def __init__(self, keys: Iterable[Hashable] = (), *, expected: int = 0) -> None:
        bits = _MIN_BITS
        while bits < expected * _BITS_PER_KEY:
            bits <<= 1
        self._mask = bits - 1
        self._bits = bytearray(bits >> 3)
        for key in keys:
            self.add(key)

    def _indexes(self, key: Hashable) -> tuple[int, int, int, int]:
        # Double hashing (Kirsch-Mitzenmacher): two hashes give all four (_HASHES) positions,
        # written out (every send looks its key up: no range, no list).
        first, second, mask = hash(key), hash((key, _HASHES)) | 1, self._mask
        return (
            first & mask,
            (first + second) & mask,
            (first + 2 * second) & mask,
            (first + 3 * second) & mask,
        )

    def add(self, key: Hashable) -> None:
        bits = self._bits
        for index in self._indexes(key):
            bits[index >> 3] |= 1 << (index & 7)

    def __contains__(self, key: object) -> bool:
        """False: ``key`` was never added. True: it may have been."""
        bits = self._bits
        a, b, c, d = self._indexes(key)
        return bool(
            bits[a >> 3] & (1 << (a & 7))
            and bits[b >> 3] & (1 << (b & 7))
            and bits[c >> 3] & (1 << (c & 7))
            and bits[d >> 3] & (1 << (d & 7))
        )
