"""The one error boundary every entry point runs in, and its argument parser.

``python -m sm120fork``, ``python -m sm120fork.gpu`` and ``sm120fork-doctor`` each call
:func:`boundary` around their body: a :class:`~sm120fork.errors.ToolkitError` becomes one
``error: ...`` line on stderr and its class's exit code; Ctrl-C or SIGTERM (nox and
``timeout`` send it) ends the running commands and exits 130; anything else is a bug: its
traceback and :data:`~sm120fork.errors.EXIT_INTERNAL`.  So an exit code says one thing.
Paths under the checkout are shown relative to it; unless both stdout and stderr are a
terminal the error is exactly one line (a log reader greps it), never wrapped.

Stdlib only: the plugin wheel ships it with the doctor.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TextIO

from .errors import EXIT_INTERNAL, EXIT_INTERRUPTED, ToolkitError, UsageError
from .util.proc import sigterm_unwinds


def _nox_session() -> str | None:
    """The nox session running the toolkit, if nox runs it (the noxfile sets
    ``SM120FORK_FRONT_DOOR=nox``; nox names its session in ``NOX_CURRENT_SESSION``)."""
    if os.environ.get("SM120FORK_FRONT_DOOR") != "nox":
        return None
    return os.environ.get("NOX_CURRENT_SESSION") or ""


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors raise :class:`UsageError` (argparse exits 2, which is
    :class:`~sm120fork.errors.ConfigError`'s code).  The error names the command the user
    typed and its help in the same form: ``nox -s build -- --help`` under nox."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        session = _nox_session()
        if session is None:
            raise UsageError(message, where=self.prog, fix=f"see {self.prog} --help")
        if not session:  # nox, but no session named: its list of sessions
            raise UsageError(message, where="nox", fix="see nox --list")
        raise UsageError(message, where=f"nox -s {shlex.quote(session)}",
                         fix=f"see nox -s {shlex.quote(session)} -- --help")


def relative(text: str, root: Path | None) -> str:
    """``text`` with ``root/`` dropped from the paths it names (``root`` itself: ``.``)."""
    base = str(root).rstrip(os.sep) if root is not None else ""
    if not base:
        return text
    return re.sub(re.escape(base) + r"(/|(?![\w-]|\.\w))",
                  lambda m: "" if m.group(1) else ".", text)


def error_line(exc: ToolkitError, *, root: Path | None, tty: bool) -> str:
    """What the user sees of ``exc``: ``error: <message>``, one line unless on a terminal."""
    text = relative(exc.message, root)
    if not tty:
        text = " ".join(text.split())
    return f"error: {text}"


def boundary(body: Callable[[], int], *, name: str, root: Callable[[], Path | None] = lambda: None,
             on_interrupt: Callable[[], int] | None = None,
             cleanup: Callable[[], list[str]] | None = None,
             stderr: TextIO | None = None) -> int:
    """Run an entry point's ``body`` and turn how it ends into an exit code.

    ``root`` says, when asked, which checkout to show paths relative to (None: as they
    are). ``on_interrupt`` ends the running commands and says how many it ended;
    ``cleanup`` then removes the run's temporary folders and names those that remain.
    """
    err = stderr if stderr is not None else sys.stderr
    # Wrapped as written only for a person at a terminal; piped or logged: one line.
    tty = err.isatty() and sys.stdout.isatty()
    try:
        with sigterm_unwinds():  # nox forwards SIGTERM alone, after SIGINT
            return body()
    except ToolkitError as exc:
        where = root()
        if exc.detail:
            err.write(relative(exc.detail, where).rstrip("\n") + "\n")
        err.write(error_line(exc, root=where, tty=tty) + "\n")
        return exc.exit_code
    except KeyboardInterrupt:
        ended = on_interrupt() if on_interrupt is not None else 0
        left = cleanup() if cleanup is not None else []
        err.write(f"interrupted: {name} stopped"
                  + (f", {ended} running command(s) ended" if ended else "")
                  + ("; its temporary folders are removed" if cleanup is not None and not left
                     else f"; temporary folders remain, the next run removes them: "
                          f"{relative(', '.join(left), root())}" if left else
                     "; the next run removes any temporary folders it left")
                  + "\n")
        return EXIT_INTERRUPTED
    except Exception:  # a bug: say so, with where it happened
        err.write(traceback.format_exc())
        err.write(f"error: internal error in {name} (a bug: please report the traceback "
                  "above)\n")
        return EXIT_INTERNAL
