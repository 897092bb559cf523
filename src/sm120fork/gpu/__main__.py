"""``python -m sm120fork.gpu``: the GPU verbs without the rest of the command line."""

import sys

from sm120fork.gpu.cli import main

sys.exit(main())
