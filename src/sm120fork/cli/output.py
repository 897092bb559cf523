"""What the command line shows: log records on stderr, lines and tables on stdout; a line
is never wrapped."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

_LEVEL_STYLE = {"DEBUG": "dim", "INFO": "blue", "WARNING": "yellow", "ERROR": "bold red",
                "CRITICAL": "bold red"}


class LineHandler(logging.Handler):
    """One log record, one line: never wrapped, so a command or URL in it can be pasted
    from a terminal, a pipe or a log file (rich's own handler wraps at 80 columns)."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = Text(f"{record.levelname:<8} ", style=_LEVEL_STYLE.get(record.levelname, ""))
            text.append(self.format(record))
            self.console.print(text, soft_wrap=True, highlight=False)
        except Exception:  # a log line must never raise into the program
            self.handleError(record)


def say(console: Console, *lines: str) -> None:
    """Each line as it is: no markup, never wrapped (a command in it can be pasted)."""
    for line in lines:
        console.print(line, markup=False, soft_wrap=True)


def table(title: str, columns: Iterable[str], *, fold: bool = False,
          left: bool = False) -> Table:
    """Long cells folded onto more lines (``fold``) or cut short."""
    made = Table(title=title, title_justify="left" if left else "center")
    for column in columns:
        made.add_column(column, overflow="fold" if fold else "ellipsis")
    return made
