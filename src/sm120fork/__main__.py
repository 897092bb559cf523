"""``python -m sm120fork``."""

import sys

from sm120fork.cli.main import main

sys.exit(main())
