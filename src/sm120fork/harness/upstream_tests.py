"""Run an upstream test file as ``__main__`` on a CPU machine, as upstream's CI does, with
GPU-only packages stubbed and the caller's ``SGLANG_*`` settings dropped."""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

from sm120fork.harness import fake_gpu as fake

#: Imported by upstream's test utilities for helpers a unit test never calls: stubbed.
TEST_UTILITY_PACKAGES = ("datasets",)


def main(argv: Sequence[str]) -> int:
    (path,) = argv
    for name in [name for name in os.environ if name.startswith("SGLANG_")]:
        del os.environ[name]
    fake.fake_gpu(None)
    sys.meta_path.insert(0, fake._StubFinder(TEST_UTILITY_PACKAGES))
    sys.argv = [path]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
