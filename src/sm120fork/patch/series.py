"""A patch series: a ``series`` file (the only source of order) plus ``git format-patch``
files, each with a DEP-3 header in its commit message; and the one definition of "already
upstream": ``Fingerprint`` lines (our text) matched literally, ``Effect`` /
``Effect-Absent`` lines (a fix in upstream's own words)."""

from __future__ import annotations

import email.parser
import email.policy
import fnmatch
import functools
import hashlib
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sm120fork.errors import CommandError, SeriesError
from sm120fork.fetch.kinds import UPSTREAM_TAG
from sm120fork.util import proc
from sm120fork.util.git import Git

REQUIRED_FIELDS = ("Description", "Origin", "Forwarded", "Last-Update")
KNOWN_FIELDS = (*REQUIRED_FIELDS, "Applied-Upstream", "Bug", "Bug-Upstream", "Author",
                "Reviewed-by", "Fingerprint", "Subject", "Effect", "Effect-Absent",
                "Verified-By", "Upstream-PR")
#: ``Effect`` / ``Effect-Absent`` text starting with this is a regular expression.
REGEX_PREFIX = "re:"
#: Who a patch is by when its header names nobody (patches/README.md's canonical author).
DEFAULT_AUTHOR = ("SM12x fork maintainers", "sm12x-fork@users.noreply.invalid")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DIFF = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_FIELD = re.compile(r"^([A-Za-z][A-Za-z-]*):(?: (.*))?$")


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    path: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}: {self.text}"

    def found_in(self, text: str) -> bool:
        """``re:`` text is a regex; other text matches whitespace-folded, so one header
        line names a statement upstream spreads over several lines."""
        if self.text.startswith(REGEX_PREFIX):
            return re.search(self.text[len(REGEX_PREFIX):], text, re.MULTILINE) is not None
        return " ".join(self.text.split()) in " ".join(text.split())


@dataclass(frozen=True, kw_only=True)
class Patch:
    name: str
    path: Path
    subject: str
    fields: tuple[tuple[str, str], ...]
    fingerprints: tuple[Fingerprint, ...]
    files: tuple[str, ...]
    sha256: str
    #: What any correct fix makes true (``Effect``) or false upstream: a patch upstream
    #: merged in another form.
    effects: tuple[Fingerprint, ...] = ()
    effects_absent: tuple[Fingerprint, ...] = ()
    author: tuple[str, str] = DEFAULT_AUTHOR

    def field(self, name: str) -> str:
        return next((v for k, v in self.fields if k.lower() == name.lower()), "")

    @property
    def description(self) -> str:
        return self.field("Description")

    @property
    def applied_upstream(self) -> str:
        return self.field("Applied-Upstream")

    @property
    def patch_id(self) -> str:
        """``git patch-id --stable``: evidence keyed on it survives a reworded header."""
        return _patch_id(self.sha256, self.path)

    @property
    def changed_files(self) -> list[str]:
        """The files the patch changes but does not create (each has a ``--- a/`` line)."""
        text = self.path.read_text(encoding="utf-8", errors="replace")
        return [f for f in self.files if f"--- a/{f}\n" in text]


@dataclass(frozen=True, kw_only=True)
class Series:
    directory: Path
    patches: tuple[Patch, ...]

    @property
    def digest(self) -> str:
        """Order and every patch's bytes: for build caches (evidence uses :attr:`patch_ids`)."""
        listed = "".join(f"{p.name}\0{p.sha256}\n" for p in self.patches)
        return hashlib.sha256(listed.encode()).hexdigest()

    def names(self) -> list[str]:
        return [p.name for p in self.patches]

    @property
    def patch_ids(self) -> tuple[tuple[str, str], ...]:
        return tuple((p.name, p.patch_id) for p in self.patches)


@functools.lru_cache(maxsize=4096)
def _patch_id(sha256: str, path: Path) -> str:
    return patch_id_of(path.read_bytes(), where=str(path))


def patch_id_of(data: bytes, *, where: str = "patch") -> str:
    try:
        done = proc.run(["git", "patch-id", "--stable"], quiet=True,
                        input=data.decode("utf-8", errors="replace"))
    except CommandError as exc:
        raise SeriesError(f"git patch-id failed: {exc.what}", where=where,
                          detail=exc.detail) from exc
    fields = done.stdout.split()
    if not fields or not re.fullmatch(r"[0-9a-f]{40}", fields[0]):
        raise SeriesError("git patch-id found no diff in it", where=where,
                          fix="a patch file holds a diff (git format-patch)")
    return fields[0]


_HEADERS = email.parser.BytesHeaderParser(policy=email.policy.default)


def _split_message(data: bytes, where: str) -> tuple[str, tuple[str, str], list[str]]:
    """Subject, author and the message's lines (the ``email`` package decodes the RFC 2047
    words git writes for non-ASCII names)."""
    head, _, rest = data.replace(b"\r\n", b"\n").partition(b"\n\n")
    headers = _HEADERS.parsebytes(head + b"\n\n")
    subject = headers["Subject"]
    if subject is None:
        raise SeriesError("not a git format-patch file (no Subject header)", where=where)
    subj = re.sub(r"^\[PATCH[^\]]*\]\s*", "", str(subject))
    author = DEFAULT_AUTHOR
    if addresses := getattr(headers["From"], "addresses", ()):
        author = (addresses[0].display_name or addresses[0].username, addresses[0].addr_spec)
    body = itertools.takewhile(lambda line: line != "---" and not line.startswith("diff --git "),
                               rest.decode("utf-8", errors="replace").splitlines())
    return subj, author, list(body)


def parse_dep3(body: list[str], where: str) -> list[tuple[str, str]]:
    fields: list[tuple[str, str]] = []
    for line in body:
        if not line.strip():
            continue
        m = _FIELD.match(line)
        if m and (m.group(1) in KNOWN_FIELDS or m.group(1).startswith("X-")):
            fields.append((m.group(1), (m.group(2) or "").strip()))
        elif line.startswith(" ") and fields:
            name, value = fields[-1]
            cont = line[1:]
            fields[-1] = (name, f"{value}\n{'' if cont.strip() == '.' else cont}".strip("\n"))
        elif fields:
            raise SeriesError(f"unexpected line in the DEP-3 header: {line!r}", where=where,
                              fix="continuation lines start with one space")
    return fields


def parse_patch(path: Path) -> Patch:
    where = str(path)
    data = path.read_bytes()
    text = data.decode("utf-8", errors="replace")
    subject, author, body = _split_message(data, where)
    fields = parse_dep3(body, where)
    names = [k for k, _ in fields]
    for required in REQUIRED_FIELDS:
        if required not in names:
            close = [n for n in names if n.lower() == required.lower()]
            raise SeriesError(f"DEP-3 header lacks {required!r}", where=where,
                              fix=f"rename {close[0]!r} to {required!r}" if close else
                              "see patches/README.md")
    last_update = next(v for k, v in fields if k == "Last-Update")
    if not _DATE.fullmatch(last_update):
        raise SeriesError(f"Last-Update {last_update!r} is not YYYY-MM-DD", where=where)
    marks: dict[str, list[Fingerprint]] = {"Fingerprint": [], "Effect": [], "Effect-Absent": []}
    for key, value in fields:
        if key not in marks:
            continue
        mpath, sep, mtext = value.partition(": ")
        if not sep or not mpath or not mtext.strip():
            raise SeriesError(f"malformed {key} {value!r}", where=where,
                              fix=f"write '{key}: <path>: <text>'" + (
                                  "" if key == "Fingerprint" else " (text may be 're:<regex>')"))
        if key != "Fingerprint" and mtext.startswith(REGEX_PREFIX):
            try:
                re.compile(mtext[len(REGEX_PREFIX):])
            except re.error as exc:
                raise SeriesError(f"{key} regex {mtext!r} is invalid: {exc}", where=where) from exc
        marks[key].append(Fingerprint(path=mpath.strip(), text=mtext))
    fingerprints = marks["Fingerprint"]
    if not fingerprints:
        raise SeriesError("no Fingerprint field", where=where,
                          fix="name a string the patch puts into a shipped file")
    files = tuple(dict.fromkeys(m.group(2) for m in _DIFF.finditer(text)))
    if not files:
        raise SeriesError("patch changes no file", where=where)
    if stray := [fp.path for fp in fingerprints if fp.path not in files]:
        raise SeriesError(f"Fingerprint names {stray[0]}, which the patch does not change",
                          where=where)
    return Patch(name=path.name, path=path, subject=subject, author=author, fields=tuple(fields),
                 fingerprints=tuple(fingerprints), files=files,
                 sha256=hashlib.sha256(data).hexdigest(),
                 effects=tuple(marks["Effect"]), effects_absent=tuple(marks["Effect-Absent"]))


def read_series_file(directory: Path) -> list[str]:
    series_file = directory / "series"
    if not series_file.is_file():
        raise SeriesError("no series file", where=str(directory),
                          fix="create 'series' listing the patches in order")
    names: list[str] = []
    for lineno, raw in enumerate(series_file.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name = line.split()[0]
        if "/" in name or name in names:
            raise SeriesError(f"bad entry {name!r}" + (" (listed twice)" if name in names else ""),
                              where=f"{series_file}:{lineno}")
        if len(line.split()) > 1:
            raise SeriesError("patch options are not supported (only exact -p1 patches)",
                              where=f"{series_file}:{lineno}")
        names.append(name)
    return names


def load_series(directory: Path) -> Series:
    if not directory.is_dir():
        raise SeriesError("series directory does not exist", where=str(directory))
    names = read_series_file(directory)
    on_disk = {p.name for p in directory.glob("*.patch")}
    if missing := [n for n in names if not (directory / n).is_file()]:
        raise SeriesError(f"listed in series but missing: {', '.join(missing)}",
                          where=str(directory / "series"))
    if unlisted := sorted(on_disk - set(names)):
        raise SeriesError(f"patch files not listed in series: {', '.join(unlisted)}",
                          where=str(directory / "series"),
                          fix="add them to series in the right order, or delete them")
    return Series(directory=directory, patches=tuple(parse_patch(directory / n) for n in names))


_DOUBLED_NUMBER = re.compile(r"^(\d{4})-\1-")


def display_name(name: str) -> str:
    """Without ``.patch`` and the number format-patch doubles (``0001-0001-x`` -> ``0001-x``)."""
    return _DOUBLED_NUMBER.sub(r"\1-", name.removesuffix(".patch"))


def text_at(repo: Git, path: str, rev: str = UPSTREAM_TAG) -> str:
    try:
        return repo.show(rev, path) or ""
    except CommandError:  # no such revision
        return ""


def fingerprint_in(fp: Fingerprint, text: str) -> bool:
    return fp.text in text


@dataclass(frozen=True, kw_only=True)
class UpstreamMatch:
    fingerprints: tuple[bool, ...]
    #: None when the patch has no Effect lines.
    effect: bool | None
    evidence: tuple[str, ...]

    @property
    def fingerprints_present(self) -> int:
        return sum(self.fingerprints)

    @property
    def already_upstream(self) -> bool:
        if self.effect is not None:
            return self.effect
        return all(self.fingerprints)


def match_upstream(repo: Git, patch: Patch, rev: str = UPSTREAM_TAG) -> UpstreamMatch:
    @functools.cache
    def text(path: str) -> str:
        return text_at(repo, path, rev)

    def found(eff: Fingerprint) -> bool:
        if "*" not in eff.path:
            return eff.found_in(text(eff.path))
        prefix = eff.path.split("*", 1)[0].rpartition("/")[0]
        names = repo.files(rev, under=prefix)
        return any(eff.found_in(text(n)) for n in names if fnmatch.fnmatchcase(n, eff.path))

    fingerprints = tuple(fingerprint_in(fp, text(fp.path)) for fp in patch.fingerprints)
    if not patch.effects and not patch.effects_absent:
        return UpstreamMatch(fingerprints=fingerprints, effect=None, evidence=tuple(
            f"Fingerprint {fp}: {'present' if hit else 'absent'}"
            for fp, hit in zip(patch.fingerprints, fingerprints, strict=True)))
    effect, evidence = True, []
    for label, effects, wanted in (("Effect", patch.effects, True),
                                   ("Effect-Absent", patch.effects_absent, False)):
        for eff in effects:
            hit = found(eff)
            effect &= hit == wanted
            said = "present" if hit else "absent"  # in capitals when not as wanted
            evidence.append(f"{label} {eff}: {said if hit == wanted else said.upper()}")
    return UpstreamMatch(fingerprints=fingerprints, effect=effect, evidence=tuple(evidence))


def applied_upstream_version(patch: Patch) -> Version | None:
    """The release named first in ``Applied-Upstream`` (``0.6.17, <url>``)."""
    token = re.split(r"[,\s]+", patch.applied_upstream.strip(), maxsplit=1)[0]
    try:
        return Version(token.removeprefix("v")) if token else None
    except InvalidVersion:
        return None
