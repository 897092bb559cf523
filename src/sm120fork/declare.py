"""Declarations of what is pinned: ``forks/<stack>.toml`` loaded into frozen dataclasses,
with errors that name the file and the dotted key and suggest the right key for a typo.

A stack whose pins do not satisfy a project's ``upstream_requires`` (what upstream's own
metadata requires of the other projects) does not load.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import Tag
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from sm120fork.errors import ConfigError
from sm120fork.layouts import LAYOUTS
from sm120fork.util import typed

SourceKind = Literal["sdist", "git", "wheel"]
SOURCE_KINDS: tuple[SourceKind, ...] = ("sdist", "git", "wheel")


#: The pin table each source kind builds from; all but a ``wheel`` source (repacked) are
#: built from source: a version stamp, a git pin for the record.  Its behaviour:
#: :mod:`sm120fork.fetch.kinds`.
KIND_PINS: dict[str, str] = {"sdist": "sdist", "git": "git", "wheel": "wheels"}
#: Packages that upstream ships beside a project and that must carry the project's own
#: version (FlashInfer's import refuses a flashinfer-cubin of another version).
COMPANIONS = {"flashinfer-cubin": "flashinfer-python", "flashinfer-jit-cache": "flashinfer-python"}

_NAME = r"[a-z0-9][a-z0-9._-]*"


@dataclass(frozen=True, kw_only=True)
class GitPin:
    url: str
    tag: str
    commit: str = field(metadata=typed.pattern(r"[0-9a-f]{40}",
                                               "a full 40-hex commit SHA (lower case)"))
    #: False when the SHA was not checked against the upstream repository.
    commit_verified: bool = True
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class FilePin:
    """A pinned file: the project's sdist (``[projects.<key>.sdist]``) or one of its
    published wheels (``[[projects.<key>.wheels]]``), named for its table below."""

    filename: str
    sha256: str = field(metadata=typed.pattern(r"[0-9a-f]{64}",
                                               "a sha256 (64 lower-case hex digits)"))
    #: Direct download URL; when empty the package index is asked (PEP 691).
    url: str = ""


SdistPin = FilePin
WheelPin = FilePin


@dataclass(frozen=True, kw_only=True)
class VersionStamp:
    """How the local version label gets into the built wheel: a ``file`` (relative to the
    package root) whose quoted version is replaced, or an ``env`` variable the build
    backend reads (setuptools-scm's ``SETUPTOOLS_SCM_PRETEND_VERSION_FOR_<NAME>``)."""

    file: str = ""
    env: str = ""


@dataclass(frozen=True, kw_only=True)
class Project:
    """``[projects.<key>]``, as read and checked (:func:`_checked`)."""

    #: The table's name: the reader fills it in.
    key: str = ""
    distribution: str = field(metadata=typed.pattern(_NAME, "a distribution name"))
    version: str
    local_label: str = field(metadata=typed.pattern(
        r"[a-z0-9]+(?:[._][a-z0-9]+)*", "a PEP 440 local label (lower-case letters, digits, '.')"))
    package_root: str
    series: str
    source: SourceKind = "sdist"
    #: Absent only for a ``wheel`` source whose wheel records no upstream commit.
    git: GitPin | None = None
    #: Present for an ``sdist`` source (and allowed for others).
    sdist: SdistPin | None = None
    #: Empty for a ``wheel`` source (repacked, not built).
    version_stamp: VersionStamp = VersionStamp()
    requires: tuple[str, ...] = ()
    #: Published wheels: the input of a ``wheel`` source, and what a project with an
    #: empty series ships as published.
    wheels: tuple[WheelPin, ...] = ()
    #: Upstream's own requirements on the stack's projects, as its metadata states them.
    upstream_requires: tuple[Requirement, ...] = ()
    #: The upstream layout (:mod:`sm120fork.layouts`) whose adapter checks this project's
    #: behaviour; empty for a project without behaviour checks.
    layout: str = ""
    #: A file (relative to the package root) the build writes the files the series
    #: changes into, for the patched code to read at run time ("" for none).
    series_record: str = ""

    def build_inputs(self) -> dict[str, object]:
        """The declaration's fields that shape the wheel (build caches are keyed on them;
        the layout only chooses how the behaviour is checked)."""
        return {k: v for k, v in asdict(self).items() if k != "layout"}

    @property
    def local_version(self) -> str:
        return f"{self.version}+{self.local_label}"

    @property
    def normalized_name(self) -> str:
        return canonicalize_name(self.distribution)

    @property
    def sdist_pin(self) -> SdistPin:
        if self.sdist is None:
            raise ConfigError("no sdist pinned", where=f"project {self.key}",
                              fix=f"add [projects.{self.key}.sdist] with filename and sha256")
        return self.sdist

    @property
    def git_pin(self) -> GitPin:
        if self.git is None:
            raise ConfigError("no git revision pinned", where=f"project {self.key}",
                              fix=f"add [projects.{self.key}.git] with url, tag and commit")
        return self.git

    @property
    def package_prefix(self) -> str:
        """What precedes the package's paths in the tree (``python/`` for SGLang; "" at the top)."""
        root = self.package_root.strip("/")
        return "" if root in ("", ".") else root + "/"

    def package_path(self, repo_relative: str) -> str | None:
        """``repo_relative`` made relative to the package root, or None when outside it."""
        prefix = self.package_prefix
        return repo_relative[len(prefix):] if repo_relative.startswith(prefix) else None


@dataclass(frozen=True, kw_only=True)
class Stack:
    name: str
    description: str
    default: bool
    projects: tuple[Project, ...]
    path: Path
    #: Where the pins disagree with a project's ``upstream_requires`` (the stack loads so
    #: that ``status`` and ``bump --abort`` can say so; every other command refuses it).
    pin_problems: tuple[ConfigError, ...] = ()

    def check_pins(self) -> Stack:
        """The stack, unless its pins disagree: then the first disagreement, as an error."""
        if self.pin_problems:
            raise self.pin_problems[0]
        return self

    def project(self, key: str) -> Project:
        for p in self.projects:
            if p.key == key:
                return p
        raise ConfigError(
            f"unknown project {key!r}", where=f"stack {self.name}",
            fix=typed.suggest(key, [p.key for p in self.projects]) or
            f"choose one of: {', '.join(p.key for p in self.projects)}",
        )


@dataclass(frozen=True, kw_only=True)
class _StackTable:
    name: str = field(metadata=typed.pattern(_NAME, "a stack name"))
    description: str = ""
    default: bool = False


@dataclass(frozen=True, kw_only=True)
class _File:
    stack: _StackTable
    projects: Mapping[str, Project]


def _inside(path: str) -> bool:
    return not path.startswith("/") and ".." not in Path(path).parts


def _checked(file: Path, key: str, p: Project, keys: list[str]) -> Project:
    """``[projects.<key>]`` as read, refused at the first key whose value is wrong
    (``keys``: the stack's projects, in order)."""
    def bad(name: str, what: str, fix: str | None = None) -> typed.MalformedError:
        return typed.MalformedError(file, f"projects.{key}.{name}", what, fix)

    def pinned_file(name: str, filename: str, parse: Callable[[str], tuple[Any, ...]]) -> None:
        # A pinned file is of the declared distribution and version: refused now, not
        # later as a failed download or build.
        try:
            dist, version = parse(filename)[:2]
        except (InvalidSdistFilename, InvalidWheelFilename, InvalidVersion) as exc:
            raise bad(name, f"{filename!r} is not a valid file name: {exc}") from exc
        if canonicalize_name(str(dist)) != canonicalize_name(p.distribution):
            raise bad(name, f"{filename!r} is a file of {dist}, not of {p.distribution}",
                      "fix the file name or 'distribution'")
        if version != Version(p.version):
            raise bad(name, f"{filename!r} is version {version}, the project declares "
                      f"version = {p.version!r}", "make the file name and 'version' agree")

    if p.key:
        raise bad("key", "unknown key")
    try:
        if Version(p.version).local is not None:
            raise bad("version", "the upstream version must not carry a local label",
                      "put the label in local_label")
    except InvalidVersion as exc:
        raise bad("version", f"{p.version!r} is not a valid PEP 440 version") from exc
    if not _inside(p.package_root):
        raise bad("package_root", "must be a relative path inside the repository")
    if p.layout and p.layout not in LAYOUTS:
        raise bad("layout", f"unknown upstream layout {p.layout!r}",
                  typed.suggest(p.layout, LAYOUTS)
                  or f"use one of {', '.join(map(repr, LAYOUTS))}, or add an adapter "
                     "under src/sm120fork/layouts/ (CONTRIBUTING.md)")
    builds_from = KIND_PINS[p.source]
    built = builds_from != "wheels"
    if p.series_record and (not _inside(p.series_record) or not built):
        raise bad("series_record", "must be a relative path inside the package root of a "
                  "project that is built (not a wheel source)")
    if built and p.git is None:
        raise bad("git", "missing table")
    if builds_from == "sdist" and p.sdist is None:
        raise bad("sdist", "missing table")
    if p.sdist is not None:
        if not p.sdist.filename.endswith((".tar.gz", ".zip")):
            raise bad("sdist.filename", "an sdist must be a .tar.gz or .zip")
        if builds_from == "sdist":  # the file it builds from (a git pin may keep one)
            pinned_file("sdist.filename", p.sdist.filename, parse_sdist_filename)
    for i, pin in enumerate(p.wheels):
        pinned_file(f"wheels[{i}].filename", pin.filename, parse_wheel_filename)
        if pin.filename in (w.filename for w in p.wheels[:i]):
            raise bad(f"wheels[{i}].filename", f"{pin.filename} is listed twice")
    if builds_from == "wheels" and not p.wheels:
        raise bad("wheels", "a wheel source needs at least one published wheel",
                  f"add [[projects.{key}.wheels]] with filename and sha256")
    stamp = p.version_stamp
    if not built and (stamp.file or stamp.env):
        raise bad("version_stamp", "a wheel source is repacked, not built: the local version "
                  "goes into its METADATA", "remove the version_stamp table")
    if built and bool(stamp.file) == bool(stamp.env):
        raise bad("version_stamp", "set exactly one of 'file' or 'env'")
    for dep in p.requires:
        if dep not in keys:
            raise bad("requires", f"unknown project {dep!r}", typed.suggest(dep, keys) or None)
        if keys.index(dep) >= keys.index(key):
            raise bad("requires", f"{dep!r} must be declared before {key!r}")
    return replace(p, key=key)


def load_stack(file: Path, text: str | None = None, *, strict: bool = True) -> Stack:
    """Load and validate one stack declaration (or ``text`` as ``file`` would hold it: a bump
    checks the pins it is about to write before writing them); with ``strict`` (the
    default) pins that disagree are refused, otherwise recorded in ``Stack.pin_problems``."""
    try:
        text = file.read_text(encoding="utf-8") if text is None else text
    except FileNotFoundError as exc:
        raise ConfigError("no such declaration file", where=str(file)) from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", where=str(file)) from exc
    try:
        raw = typed.read(_File, data, file)
    except typed.MalformedError as exc:
        if exc.what != "is missing":
            raise
        raise typed.MalformedError(file, exc.key, "missing required key") from None
    name = raw.stack.name
    if name != file.stem:
        raise typed.MalformedError(file, "stack.name", f"stack name {name!r} differs from "
                                   f"the file name {file.stem!r}")
    if not raw.projects:
        raise ConfigError("a stack needs at least one project", where=f"{file}: projects")
    keys = list(raw.projects)
    projects = [_checked(file, key, table, keys) for key, table in raw.projects.items()]
    problems = tuple(e for p in projects for e in coordinated_pin_problems(file, p, projects))
    stack = Stack(name=name, description=raw.stack.description, default=raw.stack.default,
                  projects=tuple(projects), path=file, pin_problems=problems)
    return stack.check_pins() if strict else stack


def pinned_for(requirement: Requirement, projects: Sequence[Project]) -> Project | None:
    """The stack's project that ``requirement`` constrains (itself or a companion)."""
    name = str(canonicalize_name(requirement.name))
    wanted = COMPANIONS.get(name, name)
    return next((p for p in projects if p.normalized_name == wanted), None)


def requirement_applies(requirement: Requirement, project: Project) -> bool:
    """Whether the marker holds where ``project`` installs: Linux, under any tag of its
    wheels (of this Python when it pins none)."""
    if requirement.marker is None:
        return True
    linux = {key: str(value) for key, value in default_environment().items()}
    linux.update(sys_platform="linux", platform_system="Linux", os_name="posix", extra="")
    tags: list[Tag | None] = [t for pin in project.wheels
                              for t in parse_wheel_filename(pin.filename)[3]]
    return any(requirement.marker.evaluate({**linux, **_tag_environment(tag)})
               for tag in tags or [None])


def _tag_environment(tag: Tag | None) -> dict[str, str]:
    """The marker variables a wheel tag fixes: CPython's version, the machine."""
    if tag is None:
        return {}
    machine = [m for m in ("x86_64", "aarch64") if tag.platform.endswith(m)]
    env = {"platform_machine": machine[0]} if machine else {}
    digits = tag.interpreter[2:]
    if tag.interpreter.startswith("cp") and digits.isdigit():
        env.update(python_version=f"{digits[0]}.{digits[1:]}",
                   python_full_version=f"{digits[0]}.{digits[1:]}.0",
                   implementation_name="cpython", platform_python_implementation="CPython")
    return env


def coordinated_pin_problems(file: Path, project: Project, projects: Sequence[Project]
                             ) -> list[ConfigError]:
    """Where the stack's pins do not satisfy ``project``'s own requirements on them."""
    problems: list[ConfigError] = []
    for i, req in enumerate(project.upstream_requires):
        where = f"{file}: projects.{project.key}.upstream_requires[{i}]"
        target = pinned_for(req, projects)
        if target is None or target is project:
            raise ConfigError(
                f"{req} names no other project of this stack", where=where,
                fix="list only upstream's requirements on the stack's own projects")
        if not requirement_applies(req, project):
            continue
        pin = f"{target.distribution} {target.version} (projects.{target.key}.version)"
        companion = canonicalize_name(req.name) != target.normalized_name
        # A companion ships stock, at the project's upstream version; the project
        # itself may ship with our local label.
        versions = (target.version,) if companion else (target.version, target.local_version)
        refused = [v for v in versions if not req.specifier.contains(v, prereleases=True)]
        if refused:
            problems.append(ConfigError(
                f"{project.distribution} {project.version} requires {req}, which the "
                f"stack's pin {pin} does not satisfy"
                + ("" if refused[0] == target.version else f" once labelled {refused[0]}"),
                where=where,
                fix=f"pin the {target.distribution} release that {project.distribution} "
                    f"{project.version} requires, or bump {project.distribution}"))
    return problems


def load_stacks(forks_dir: Path) -> dict[str, Stack]:
    """All stacks under ``forks_dir``, checking that exactly one is the default."""
    files = sorted(forks_dir.glob("*.toml"))
    if not files:
        raise ConfigError("no stack declarations (*.toml)", where=str(forks_dir))
    stacks = {s.name: s for s in (load_stack(f, strict=False) for f in files)}
    defaults = [s.name for s in stacks.values() if s.default]
    if len(defaults) != 1:
        raise ConfigError(f"exactly one stack must set default = true, found {defaults or 'none'}",
                          where=str(forks_dir))
    return stacks


def select_stack(stacks: Mapping[str, Stack], name: str | None, *,
                 strict: bool = True) -> Stack:
    """The stack ``name`` (default: the default one); with ``strict``, refused when its
    pins disagree (another stack's disagreement never blocks this one)."""
    if name is None:
        chosen = next(s for s in stacks.values() if s.default)
    elif name not in stacks:
        raise ConfigError(f"unknown stack {name!r}",
                          fix=typed.suggest(name, list(stacks))
                          or f"choose one of: {', '.join(stacks)}")
    else:
        chosen = stacks[name]
    return chosen.check_pins() if strict else chosen
