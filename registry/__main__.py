"""``python -m registry [--port 8400] [--data-dir .mesh/registry] ...``: the registry's command
(``registry.cli``; also the ``mesh-registry`` script, and what ``mesh registry`` runs)."""

from __future__ import annotations

import sys

from registry.cli import main

if __name__ == "__main__":
    sys.exit(main())
