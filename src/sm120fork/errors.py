"""The toolkit's one error hierarchy.

Every error says what failed, where, and how to fix it; each class has its own exit
code so scripts can tell a bad declaration from a patch that no longer applies.
"""

from __future__ import annotations


class ToolkitError(Exception):
    """Base class: ``str(err)`` is the one-line message a user sees."""

    exit_code = 1

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


class ConfigError(ToolkitError):
    """A declaration under forks/ or a series file is malformed."""

    exit_code = 2


class SourceError(ToolkitError):
    """Fetching or unpacking an upstream source failed."""

    exit_code = 3


class ChecksumError(SourceError):
    """A download does not match its pinned sha256."""

    exit_code = 4


class UnsafeArchiveError(SourceError):
    """An archive member would land outside the extraction directory."""

    exit_code = 5


class SeriesError(ToolkitError):
    """The series file and the patch files on disk disagree, or a header is malformed."""

    exit_code = 6


class PatchError(ToolkitError):
    """A patch does not apply exactly."""

    exit_code = 7


class DirtyTreeError(ToolkitError):
    """A fork work tree has local changes that an operation would destroy."""

    exit_code = 8


class BuildError(ToolkitError):
    """Building a wheel failed."""

    exit_code = 9


class ArtifactCheckError(ToolkitError):
    """A patch's fingerprint is missing from the wheel, or already present upstream."""

    exit_code = 10


class CommandError(ToolkitError):
    """An external command failed; ``detail`` carries its captured output."""

    exit_code = 11
    #: True when it ran past its timeout (and was killed with its process group).
    timed_out = False


class LockError(ToolkitError):
    """Another toolkit run holds the lock."""

    exit_code = 12


class VerifyError(ToolkitError):
    """An SM120 proof or GPU check failed."""

    exit_code = 13


class MaintenanceError(ToolkitError):
    """A bump/refresh/upstream_pr precondition does not hold."""

    exit_code = 14


class DoctorError(ToolkitError):
    """``doctor`` found at least one blocker on this box."""

    exit_code = 15


class UsageError(ToolkitError):
    """The command line itself is wrong (unknown option, missing argument)."""

    exit_code = 16


class NoGpuError(ToolkitError):
    """A GPU harness cannot run here: this Python has no torch, a CPU-only torch, or a
    torch that sees no CUDA GPU (not a failing case: nothing was tried)."""

    exit_code = 17


#: Exit codes that belong to no error class (each means one thing: an uncaught exception
#: is EXIT_INTERNAL at every entry point, never Python's 1; a failing GPU or layer case is
#: VerifyError's).
#: A report (``status``) that lists problems, each shown in its row.
EXIT_PROBLEMS_FOUND = 1
#: A bug: an exception the toolkit did not expect (its traceback is shown). BSD's EX_SOFTWARE.
EXIT_INTERNAL = 70
#: Interrupted (Ctrl-C, SIGINT or SIGTERM): 128 + SIGINT, as shells report it.
EXIT_INTERRUPTED = 130
