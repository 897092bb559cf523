"""Declarations of what is pinned: ``forks/<stack>.toml`` loaded into frozen dataclasses,
with errors that name the file and the dotted key and suggest the right key for a typo.

A stack whose pins do not satisfy a project's ``upstream_requires`` (what upstream's own
metadata requires of the other projects) does not load.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
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


@dataclass(frozen=True, kw_only=True)
class KindPins:
    """What a source kind's declaration must pin (its behaviour: :mod:`sm120fork.fetch.kinds`)."""

    #: The pin table the kind builds from: ``sdist``, ``git`` or ``wheels``.
    builds_from: str
    #: Built from source (a version stamp, a git pin for the record) rather than repacked.
    built: bool


KIND_PINS: dict[str, KindPins] = {
    "sdist": KindPins(builds_from="sdist", built=True),
    "git": KindPins(builds_from="git", built=True),
    "wheel": KindPins(builds_from="wheels", built=False),
}
#: Packages that upstream ships beside a project and that must carry the project's own
#: version (FlashInfer's import refuses a flashinfer-cubin of another version).
COMPANIONS = {"flashinfer-cubin": "flashinfer-python", "flashinfer-jit-cache": "flashinfer-python"}

_SHA1 = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_LOCAL = re.compile(r"[a-z0-9]+(?:[._][a-z0-9]+)*")
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


@dataclass(frozen=True, kw_only=True)
class GitPin:
    url: str
    tag: str
    commit: str
    #: False when the SHA was not checked against the upstream repository.
    commit_verified: bool = True
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class SdistPin:
    filename: str
    sha256: str
    #: Direct download URL; when empty the package index is asked (PEP 691).
    url: str = ""


def linux_environment() -> dict[str, str]:
    """Marker variables of a Linux machine (this one's Python otherwise)."""
    env = {key: str(value) for key, value in default_environment().items()}
    env.update(sys_platform="linux", platform_system="Linux", os_name="posix")
    return env


@dataclass(frozen=True, kw_only=True)
class WheelPin:
    """One published wheel of a project (``[[projects.<key>.wheels]]``)."""

    filename: str
    sha256: str
    #: Direct download URL; when empty the package index is asked (PEP 691).
    url: str = ""

    def environments(self) -> list[dict[str, str]]:
        """Marker environments this wheel installs into (Linux, one per tag)."""
        envs = []
        for tag in parse_wheel_filename(self.filename)[3]:
            env = linux_environment()
            if tag.interpreter.startswith("cp") and tag.interpreter[2:].isdigit():
                digits = tag.interpreter[2:]
                env["python_version"] = f"{digits[0]}.{digits[1:]}"
                env["python_full_version"] = f"{digits[0]}.{digits[1:]}.0"
                env["implementation_name"] = "cpython"
                env["platform_python_implementation"] = "CPython"
            for machine in ("x86_64", "aarch64"):
                if tag.platform.endswith(machine):
                    env["platform_machine"] = machine
            envs.append(env)
        return envs


@dataclass(frozen=True, kw_only=True)
class VersionStamp:
    """How the local version label gets into the built wheel: a ``file`` (relative to the
    package root) whose quoted version is replaced, or an ``env`` variable the build
    backend reads (setuptools-scm's ``SETUPTOOLS_SCM_PRETEND_VERSION_FOR_<NAME>``)."""

    file: str = ""
    env: str = ""


@dataclass(frozen=True, kw_only=True)
class Project:
    key: str
    distribution: str
    version: str
    local_label: str
    package_root: str
    series: str
    source: SourceKind
    #: Absent only for a ``wheel`` source whose wheel records no upstream commit.
    git: GitPin | None
    #: Present for an ``sdist`` source (and allowed for others).
    sdist: SdistPin | None
    version_stamp: VersionStamp
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

    def package_path(self, repo_relative: str) -> str | None:
        """``repo_relative`` made relative to the package root, or None when outside it."""
        root = self.package_root.strip("/")
        if root in ("", "."):
            return repo_relative
        prefix = root + "/"
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
class _ProjectTable:
    """``[projects.<key>]`` as written, before the checks that need several of its keys."""

    distribution: str
    version: str
    local_label: str
    package_root: str
    series: str
    source: str = "sdist"
    requires: tuple[str, ...] = ()
    upstream_requires: tuple[str, ...] = ()
    git: GitPin | None = None
    sdist: SdistPin | None = None
    wheels: tuple[WheelPin, ...] = ()
    version_stamp: VersionStamp | None = None
    layout: str = ""
    series_record: str = ""


@dataclass(frozen=True, kw_only=True)
class _StackTable:
    name: str
    description: str = ""
    default: bool = False


@dataclass(frozen=True, kw_only=True)
class _File:
    stack: _StackTable
    projects: Mapping[str, _ProjectTable]


_bad = typed.MalformedError


def _match(file: Path, key: str, value: str, pattern: re.Pattern[str], what: str) -> None:
    if not pattern.fullmatch(value):
        raise _bad(file, key, f"{value!r} is not {what}")


def _version(file: Path, key: str, value: str) -> str:
    try:
        parsed = Version(value)
    except InvalidVersion as exc:
        raise _bad(file, key, f"{value!r} is not a valid PEP 440 version") from exc
    if parsed.local is not None:
        raise _bad(file, key, "the upstream version must not carry a local label",
                   "put the label in local_label")
    return value


def _check_file_name(file: Path, key: str, filename: str, distribution: str, version: str,
                     parse: Callable[[str], tuple[Any, ...]]) -> None:
    """A pinned file (sdist, wheel) must be of the declared distribution and version:
    refused when the declaration loads, not later as a failed download or build."""
    try:
        file_dist, file_version = parse(filename)[:2]
    except (InvalidSdistFilename, InvalidWheelFilename, InvalidVersion) as exc:
        raise _bad(file, key, f"{filename!r} is not a valid file name: {exc}") from exc
    if canonicalize_name(str(file_dist)) != canonicalize_name(distribution):
        raise _bad(file, key, f"{filename!r} is a file of {file_dist}, not of {distribution}",
                   "fix the file name or 'distribution'")
    if file_version != Version(version):
        raise _bad(file, key, f"{filename!r} is version {file_version}, the project declares "
                   f"version = {version!r}", "make the file name and 'version' agree")


def _inside(path: str) -> bool:
    return not path.startswith("/") and ".." not in Path(path).parts


_SHA256_WHAT = "a sha256 (64 lower-case hex digits)"


def _project(file: Path, key: str, t: _ProjectTable) -> Project:
    at = f"projects.{key}"
    _match(file, f"{at}.distribution", t.distribution, _NAME, "a distribution name")
    _version(file, f"{at}.version", t.version)
    _match(file, f"{at}.local_label", t.local_label, _LOCAL,
           "a PEP 440 local label (lower-case letters, digits, '.')")
    if not _inside(t.package_root):
        raise _bad(file, f"{at}.package_root", "must be a relative path inside the repository")
    if t.source not in SOURCE_KINDS:
        raise _bad(file, f"{at}.source", f"unknown source kind {t.source!r}",
                   typed.suggest(t.source, list(SOURCE_KINDS)) or "use 'sdist' or 'git'")
    if t.layout and t.layout not in LAYOUTS:
        raise _bad(file, f"{at}.layout", f"unknown upstream layout {t.layout!r}",
                   typed.suggest(t.layout, list(LAYOUTS))
                   or f"use one of {', '.join(map(repr, LAYOUTS))}, or add an adapter "
                      "under src/sm120fork/layouts/ (CONTRIBUTING.md)")
    pins = KIND_PINS[t.source]
    if t.series_record and (not _inside(t.series_record) or not pins.built):
        raise _bad(file, f"{at}.series_record", "must be a relative path inside the package "
                   "root of a project that is built (not a wheel source)")
    if pins.built and t.git is None:
        raise _bad(file, f"{at}.git", "missing table")
    if t.git is not None:
        _match(file, f"{at}.git.commit", t.git.commit, _SHA1,
               "a full 40-hex commit SHA (lower case)")
    if pins.builds_from == "sdist" and t.sdist is None:
        raise _bad(file, f"{at}.sdist", "missing table")
    if t.sdist is not None:
        _match(file, f"{at}.sdist.sha256", t.sdist.sha256, _SHA256, _SHA256_WHAT)
        if not t.sdist.filename.endswith((".tar.gz", ".zip")):
            raise _bad(file, f"{at}.sdist.filename", "an sdist must be a .tar.gz or .zip")
        # The file this project builds from (a git pin may keep an old one).
        if pins.builds_from == "sdist":
            _check_file_name(file, f"{at}.sdist.filename", t.sdist.filename, t.distribution,
                             t.version, parse_sdist_filename)
    _check_wheels(file, f"{at}.wheels", t)
    if pins.builds_from == "wheels" and not t.wheels:
        raise _bad(file, f"{at}.wheels", "a wheel source needs at least one published wheel",
                   "add [[projects." + key + ".wheels]] with filename and sha256")
    stamp = t.version_stamp
    if not pins.built and stamp is not None:
        raise _bad(file, f"{at}.version_stamp", "a wheel source is repacked, not built: "
                   "the local version goes into its METADATA", "remove the version_stamp table")
    if pins.built and stamp is None:
        raise _bad(file, f"{at}.version_stamp", "missing table")
    if stamp is not None and bool(stamp.file) == bool(stamp.env):
        raise _bad(file, f"{at}.version_stamp", "set exactly one of 'file' or 'env'")
    requirements = []
    for i, text in enumerate(t.upstream_requires):
        try:
            requirements.append(Requirement(text))
        except InvalidRequirement as exc:
            raise _bad(file, f"{at}.upstream_requires[{i}]",
                       f"{text!r} is not a valid requirement: {exc}") from exc
    return Project(
        key=key, distribution=t.distribution, version=t.version, local_label=t.local_label,
        package_root=t.package_root, series=t.series, source=t.source,
        git=t.git, sdist=t.sdist, version_stamp=stamp or VersionStamp(), requires=t.requires,
        wheels=t.wheels, upstream_requires=tuple(requirements),
        layout=t.layout, series_record=t.series_record,
    )


def _check_wheels(file: Path, key: str, t: _ProjectTable) -> None:
    seen: set[str] = set()
    for i, pin in enumerate(t.wheels):
        _match(file, f"{key}[{i}].sha256", pin.sha256, _SHA256, _SHA256_WHAT)
        _check_file_name(file, f"{key}[{i}].filename", pin.filename, t.distribution,
                         t.version, parse_wheel_filename)
        if pin.filename in seen:
            raise _bad(file, f"{key}[{i}].filename", f"{pin.filename} is listed twice")
        seen.add(pin.filename)


def load_stack(file: Path, *, strict: bool = True) -> Stack:
    """Load and validate one stack declaration; with ``strict`` (the default) pins that
    disagree are refused, otherwise recorded in ``Stack.pin_problems``."""
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError("no such declaration file", where=str(file)) from exc
    return parse_stack(file, text, strict=strict)


def parse_stack(file: Path, text: str, *, strict: bool = True) -> Stack:
    """:func:`load_stack` of ``text`` as the declaration ``file`` would hold it (a bump
    checks the pins it is about to write before writing them)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", where=str(file)) from exc
    try:
        raw = typed.read(_File, data, file)
    except typed.MalformedError as exc:
        if exc.what != "is missing":
            raise
        raise _bad(file, exc.key, "missing required key") from None
    name = raw.stack.name
    _match(file, "stack.name", name, _NAME, "a stack name")
    if name != file.stem:
        raise _bad(file, "stack.name",
                   f"stack name {name!r} differs from the file name {file.stem!r}")
    if not raw.projects:
        raise ConfigError("a stack needs at least one project", where=f"{file}: projects")
    projects = [_project(file, key, table) for key, table in raw.projects.items()]
    keys = [p.key for p in projects]
    for i, p in enumerate(projects):
        for dep in p.requires:
            if dep not in keys:
                raise ConfigError(f"unknown project {dep!r}",
                                  where=f"{file}: projects.{p.key}.requires",
                                  fix=typed.suggest(dep, keys) or None)
            if keys.index(dep) >= i:
                raise ConfigError(f"{dep!r} must be declared before {p.key!r}",
                                  where=f"{file}: projects.{p.key}.requires")
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
    """Whether the marker holds where ``project`` installs (any of its wheels' tags)."""
    if requirement.marker is None:
        return True
    envs = [env for pin in project.wheels for env in pin.environments()]
    if not envs:
        envs = [linux_environment()]
    return any(requirement.marker.evaluate({**env, "extra": ""}) for env in envs)


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
        for version in versions:
            if not req.specifier.contains(version, prereleases=True):
                problems.append(ConfigError(
                    f"{project.distribution} {project.version} requires {req}, which the "
                    f"stack's pin {pin} does not satisfy"
                    + ("" if version == target.version else f" once labelled {version}"),
                    where=where,
                    fix=f"pin the {target.distribution} release that {project.distribution} "
                        f"{project.version} requires, or bump {project.distribution}"))
                break
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
