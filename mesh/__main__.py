import sys

from mesh._cli.main import main

sys.exit(main())
