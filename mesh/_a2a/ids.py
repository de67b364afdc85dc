"""``uuid4_text``: a random (version 4) UUID as its canonical text, what ``str(uuid.uuid4())``
gives, without the ``uuid.UUID`` object (its validating constructor and ``__str__`` are Python
code; a typed request makes three of these ids: its task, its context, its status message)."""

from __future__ import annotations

import os

__all__ = ["uuid4_text"]


def uuid4_text() -> str:
    """A new random UUID, ``xxxxxxxx-xxxx-4xxx-[89ab]xxx-xxxxxxxxxxxx``, from ``os.urandom``
    with the version and variant bits set as ``uuid.uuid4`` sets them."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40
    raw[8] = raw[8] & 0x3F | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
