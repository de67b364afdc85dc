"""``python -m registry [--port 8400] [--data-dir .mesh/registry] ...``: same as ``mesh registry``."""

from __future__ import annotations

import sys

from mesh._cli.main import main

if __name__ == "__main__":
    sys.exit(main(["registry", *sys.argv[1:]]))
