"""The toolkit's one error hierarchy.

Every error says what failed, where, and how to fix it; each class has its own exit
code so scripts can tell a bad declaration from a patch that no longer applies.
"""

from __future__ import annotations

from typing import Any


class ToolkitError(Exception):
    """Base class: ``str(err)`` is the one-line message a user sees; a subclass names its
    exit code in its header (``class ConfigError(ToolkitError, exit_code=2)``)."""

    exit_code = 1

    def __init_subclass__(cls, exit_code: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.exit_code = exit_code or cls.exit_code

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None,
                 detail: str | None = None) -> None:
        self.what = what
        self.where = where
        self.fix = fix
        self.detail = detail
        super().__init__(self.message)

    @property
    def message(self) -> str:
        where = f"{self.where}: " if self.where else ""
        fix = f" ({self.fix})" if self.fix else ""
        return f"{where}{self.what}{fix}"


class ConfigError(ToolkitError, exit_code=2):
    """A declaration under forks/ or a series file is malformed."""


class SourceError(ToolkitError, exit_code=3):
    """Fetching or unpacking an upstream source failed."""


class ChecksumError(SourceError, exit_code=4):
    """A download does not match its pinned sha256."""


class UnsafeArchiveError(SourceError, exit_code=5):
    """An archive member would land outside the extraction directory."""


class SeriesError(ToolkitError, exit_code=6):
    """The series file and the patch files on disk disagree, or a header is malformed."""


class PatchError(ToolkitError, exit_code=7):
    """A patch does not apply exactly."""


class DirtyTreeError(ToolkitError, exit_code=8):
    """A fork work tree has local changes that an operation would destroy."""


class BuildError(ToolkitError, exit_code=9):
    """Building a wheel failed."""


class ArtifactCheckError(ToolkitError, exit_code=10):
    """A patch's fingerprint is missing from the wheel, or already present upstream."""


class CommandError(ToolkitError, exit_code=11):
    """An external command failed; ``detail`` carries its captured output."""

    #: True when it ran past its timeout (and was killed with its process group).
    timed_out = False


class LockError(ToolkitError, exit_code=12):
    """Another toolkit run holds the lock."""


class VerifyError(ToolkitError, exit_code=13):
    """An SM120 proof or GPU check failed."""


class MaintenanceError(ToolkitError, exit_code=14):
    """A bump/refresh/upstream_pr precondition does not hold."""


class DoctorError(ToolkitError, exit_code=15):
    """``doctor`` found at least one blocker on this box."""


class UsageError(ToolkitError, exit_code=16):
    """The command line itself is wrong (unknown option, missing argument)."""


class NoGpuError(ToolkitError, exit_code=17):
    """A GPU harness cannot run here: this Python has no torch, a CPU-only torch, or a
    torch that sees no CUDA GPU (not a failing case: nothing was tried)."""


#: Exit codes that belong to no error class (each means one thing: an uncaught exception
#: is EXIT_INTERNAL at every entry point, never Python's 1; a failing GPU or layer case is
#: VerifyError's).
#: A report (``status``) that lists problems, each shown in its row.
EXIT_PROBLEMS_FOUND = 1
#: A bug: an exception the toolkit did not expect (its traceback is shown). BSD's EX_SOFTWARE.
EXIT_INTERNAL = 70
#: Interrupted (Ctrl-C, SIGINT or SIGTERM): 128 + SIGINT, as shells report it.
EXIT_INTERRUPTED = 130
