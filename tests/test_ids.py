"""``uuid4_text`` is what ``str(uuid.uuid4())`` gives: canonical text of a version 4, RFC 4122
UUID, random."""

from __future__ import annotations

import uuid

from mesh._a2a.ids import uuid4_text


def test_ids_are_canonical_random_version_4_uuids() -> None:
    made = [uuid4_text() for _ in range(2000)]
    for text in made:
        parsed = uuid.UUID(text)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text
    assert len(set(made)) == len(made)
    assert all(text[14] == "4" and text[19] in "89ab" for text in made)
    # The other digits are random: each takes several values over the ids made.
    for i in range(36):
        if i not in (8, 13, 14, 18, 23):
            assert len({text[i] for text in made}) > 1
