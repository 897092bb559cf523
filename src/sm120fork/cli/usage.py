"""The argument parser of every verb: a usage error is a ``UsageError``, not exit 2.

argparse exits with 2 on a bad command line, the code :class:`ConfigError` has; here
the usage is printed and a :class:`UsageError` carries its own exit code instead.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from sm120fork.errors import UsageError


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise UsageError(message, where=self.prog, fix=f"see {self.prog} --help")


def verbosity_options() -> Parser:
    """-q/-v accepted after the verb too (``nox -s build -- -q`` passes them there)."""
    parent = Parser(add_help=False)
    parent.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="only warnings and errors")
    parent.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="also every git command the toolkit runs")
    return parent
