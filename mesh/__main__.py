import sys

from mesh.cli.main import main

sys.exit(main())
