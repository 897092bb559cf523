"""``python -m sm120fork``."""

import sys

from sm120fork.cli import main

sys.exit(main())
