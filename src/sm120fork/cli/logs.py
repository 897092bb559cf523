"""Log records on stderr, one line each."""

from __future__ import annotations

import logging

from rich.console import Console
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
