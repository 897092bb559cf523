"""Options every verb of ``python -m sm120fork`` accepts (the parser is :mod:`sm120fork.entry`)."""

from __future__ import annotations

import argparse

from sm120fork.entry import Parser


def verbosity_options() -> Parser:
    """-q/-v accepted after the verb too (``nox -s build -- -q`` passes them there)."""
    parent = Parser(add_help=False)
    parent.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="only warnings and errors")
    parent.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="also every git command the toolkit runs")
    return parent
