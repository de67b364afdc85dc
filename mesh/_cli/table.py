"""``format_table``: the plain-text tables of ``mesh ls``, ``mesh show``, ``mesh up`` and ``mesh ps``.

print(format_table(("NAME", "STATUS"), [("registry", "healthy")]))
NAME      STATUS
registry  healthy
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_table"]


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """``header`` and ``rows`` as left-aligned columns two spaces apart, without trailing
    blanks (an empty last column leaves none)."""
    lines = [header, *rows]
    widths = [max(len(str(r[i])) for r in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in lines
    )
