"""The evidence record (``sm120fork-record/1``): what one run tested, on what, and what came
of each case; its one reader and writer, and its ``summary.md``.

One record per kind of run per stack: ``reports/<stack>/<kind>[/<subject>]/record.json``.
It is keyed on what was tested (wheels' sha256, patched trees, ``git patch-id --stable``),
so a commentary edit stales nothing.  Standard library and the toolkit's errors only.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sm120fork.errors import ConfigError
from sm120fork.util import typed
from sm120fork.util.files import atomic_write_text

FORMAT = "sm120fork-record/1"
RECORD_FILE = "record.json"
SUMMARY_FILE = "summary.md"
OUTCOMES = ("pass", "fail", "skip", "error")
#: How a case of the tested variant compares with the baseline (A/B runs).
AGAINST = ("fixed", "pass-both", "regressed", "fail-both")
#: Variants that are the unpatched baseline: they fail on purpose and judge nothing.
BASELINE_VARIANTS = ("upstream", "unpatched", "baseline")


@dataclass(frozen=True, kw_only=True)
class Kind:
    """A kind of run: what it is and the one command that re-makes its record."""

    name: str
    description: str
    #: ``{stack}`` and ``{subject}`` are filled in by :meth:`command`; empty: the kind has
    #: no session of its own, and a record is re-made by running its ``command`` again.
    remake: str
    #: Several records per stack, one per subject (``reports/<stack>/<kind>/<subject>/``).
    has_subjects: bool = False
    #: What its command needs beyond this CPU machine ("" : nothing).
    needs: str = "a GPU"

    def command(self, stack: str, subject: str | None = None) -> str:
        if not self.remake:
            return f"the command recorded in reports/{stack}/{self.name}/{subject or '<subject>'}"
        return self.remake.format(stack=stack, subject=subject or "<subject>")


#: The one place that names the kinds of records.
KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind(name="gpu-test", description="A/B correctness of the patched against the upstream "
                                      "build on GPUs",
         remake="nox -s gpu_test -- --stack {stack} --quick"),
    Kind(name="bench", description="fused against unfused all-reduce latency",
         remake="nox -s bench -- --stack {stack}"),
    Kind(name="sglang-layer", description="SGLang's layer path under injected workspace "
                                          "faults (the fault matrix)",
         remake="nox -s sglang_layer -- --stack {stack}"),
    Kind(name="verify-sm120", description="compile-and-inspect proof and per-patch checks",
         remake="nox -s verify_sm120 -- --stack {stack}",
         needs="nvcc >= 12.9"),
    Kind(name="upstream-pr", description="what one upstream PR was tested with",
         remake="nox -s upstream_pr -- {stack} --pr {subject}", has_subjects=True, needs=""),
    Kind(name="policy", description="a box's tuned policy measurement",
         remake="nox -s tune -- --stack {stack}"),
    Kind(name="gpu-scenario", description="A/B correctness under a forced condition (a "
                                          "test-only variant build or a shim), one per subject",
         remake="", has_subjects=True),
)}

#: An absolute path into a folder that only the machine of the run had (a POSIX folder
#: of a checkout, scratch space, a home or an environment; a Windows drive).
MACHINE_PATH = re.compile(
    r"(?<![\w<>.-])(?:/(?:opt|root|work|home|tmp|scratch|mnt|data|var/tmp|Users)/[\w.+-]"
    r"|[A-Za-z]:\\[\w.+-])")
_SEGMENT = typed.pattern(r"[A-Za-z0-9][A-Za-z0-9._+-]*", "a folder name")


@dataclass(frozen=True, kw_only=True)
class Machine:
    description: str
    gpus: tuple[str, ...] = ()
    capability: str | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    python: str | None = None
    cpus: int | None = None
    shared_gpu: bool | None = None


@dataclass(frozen=True, kw_only=True)
class TestedWheel:
    __test__ = False  # not a pytest class
    variant: str
    project: str
    file: str
    sha256: str = field(metadata=typed.pattern(r"[0-9a-f]{64}", "a sha256"))


@dataclass(frozen=True, kw_only=True)
class TestedTree:
    __test__ = False
    project: str
    tree: str


@dataclass(frozen=True, kw_only=True)
class TestedPatch:
    __test__ = False
    project: str
    patch: str
    patch_id: str = field(metadata=typed.pattern(r"[0-9a-f]{40}", "a git patch-id"))


@dataclass(frozen=True, kw_only=True)
class Tested:
    __test__ = False
    wheels: tuple[TestedWheel, ...] = ()
    trees: tuple[TestedTree, ...] = ()
    patches: tuple[TestedPatch, ...] = ()

    def patches_of(self, project: str) -> tuple[TestedPatch, ...]:
        return tuple(p for p in self.patches if p.project == project)

    @property
    def projects(self) -> tuple[str, ...]:
        """The projects of the stack the run tested as built by us (with patches or a
        patched wheel); a test-only variant build (``<project>@<variant>``) is not one."""
        return tuple(dict.fromkeys(
            [p.project for p in self.patches if "@" not in p.project]
            + [w.project for w in self.wheels
               if w.variant not in BASELINE_VARIANTS and "@" not in w.project]))


@dataclass(frozen=True, kw_only=True)
class Case:
    id: str
    variant: str
    outcome: str
    detail: str = ""
    #: A/B: how this case of the tested variant compares with the baseline's.
    against: str | None = None


@dataclass(frozen=True, kw_only=True)
class Record:
    kind: str
    stack: str = field(metadata=_SEGMENT)
    command: str
    created: str
    toolkit: str
    machine: Machine
    tested: Tested
    planned: int
    cases: tuple[Case, ...]
    subject: str | None = field(default=None, metadata=_SEGMENT)
    not_run: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    #: Derived from the cases (:func:`make`); the reader checks they agree.
    finished: bool = False
    counts: Mapping[str, int] = field(default_factory=dict)
    verdict: str = "unfinished"

    @property
    def folder(self) -> Path:
        """Where it lives, relative to ``reports/``."""
        return Path(self.stack, self.kind, *([self.subject] if self.subject else []))

    @property
    def remake(self) -> str:
        """The one command that re-makes this record."""
        return KINDS[self.kind].command(self.stack, self.subject) if KINDS[self.kind].remake \
            else self.command


def tally(cases: Iterable[Case]) -> dict[str, int]:
    counts = dict.fromkeys(OUTCOMES, 0)
    for case in cases:
        counts[case.outcome] += 1
    return counts


def is_finished(planned: int, cases: Sequence[Case]) -> bool:
    """Every planned case ran: it passed, failed, or was skipped saying why."""
    return (planned > 0 and len(cases) >= planned
            and all(c.detail.strip() for c in cases if c.outcome == "skip"))


def verdict_of(finished: bool, cases: Sequence[Case]) -> str:
    """``unfinished`` unless every planned case ran; ``fail`` when a tested case failed or
    erred, or when no tested case passed (an all-skipped run proves nothing)."""
    if not finished:
        return "unfinished"
    judged = {c.outcome for c in cases if c.variant not in BASELINE_VARIANTS}
    return "pass" if "pass" in judged and not judged & {"fail", "error"} else "fail"


def make(**fields: Any) -> Record:
    """A record with ``finished``, ``counts`` and ``verdict`` derived from its cases (pass
    everything else as :class:`Record` takes it: given one of them, it refuses the second
    value); checked as the reader checks a file."""
    cases = tuple(fields.pop("cases", ()))
    finished = is_finished(int(fields.get("planned", 0)), cases)
    record = Record(**fields, cases=cases, finished=finished, counts=tally(cases),
                    verdict=verdict_of(finished, cases))
    check(record, where="record")
    return record


def check(record: Record, *, where: str) -> None:
    """Refuse a record that breaks a rule of the format (not just its types)."""
    def bad(key: str, what: str, fix: str | None = None) -> ConfigError:
        return ConfigError(what, where=f"{where}: {key}", fix=fix)

    typed.read(Record, typed.dump(record), where)  # its types and patterns, as read

    if record.kind not in KINDS:
        raise bad("kind", f"unknown kind {record.kind!r}",
                  fix=typed.suggest(record.kind, KINDS) or f"one of {', '.join(KINDS)}")
    kind = KINDS[record.kind]
    if kind.has_subjects and not record.subject:
        raise bad("subject", f"a {record.kind} record names its subject")
    if not kind.has_subjects and record.subject:
        raise bad("subject", f"a {record.kind} record has no subject (one per stack)")
    try:
        created = datetime.datetime.fromisoformat(record.created)
    except ValueError:
        raise bad("created", f"{record.created!r} is not an ISO 8601 time") from None
    if created.tzinfo is None:
        raise bad("created", f"{record.created!r} has no time zone",
                  fix="write it as datetime.now(timezone.utc).isoformat()")
    if record.planned < 0:
        raise bad("planned", "is negative")
    for i, case in enumerate(record.cases):
        for name, value, allowed in (("outcome", case.outcome, OUTCOMES),
                                     ("against", case.against, AGAINST)):
            if value is not None and value not in allowed:
                raise bad(f"cases[{i}].{name}", f"{value!r} is not one of {', '.join(allowed)}")
    counts = tally(record.cases)
    if dict(record.counts) != counts:
        raise bad("counts", f"{dict(record.counts)} does not tally the cases ({counts})")
    finished = is_finished(record.planned, record.cases)
    if record.finished != finished:
        raise bad("finished", f"says {record.finished}, but {len(record.cases)} of "
                  f"{record.planned} planned cases ran"
                  + ("" if record.finished is False else
                     " (or a skipped case gives no reason)"))
    verdict = verdict_of(finished, record.cases)
    if record.verdict != verdict:
        raise bad("verdict", f"says {record.verdict!r}, its cases say {verdict!r}"
                  + (" (a run whose cases were all skipped fails)"
                     if verdict == "fail" and not counts["fail"] + counts["error"] else ""))
    if found := machine_paths(record):
        key, text = found[0]
        raise bad(key, f"names a path of the machine that made it: {text!r}",
                  fix="name folders by role (<tmp>, <out>) or relative to the checkout")


def machine_paths(record: Record) -> list[tuple[str, str]]:
    """(dotted key, text) of each string of the record holding an absolute machine path."""
    return [(key, text) for key, text in _strings(to_json(record), "")
            if MACHINE_PATH.search(text)]


def _strings(value: object, key: str) -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{key}.{k}" if key else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{key}[{i}]")


def to_json(record: Record) -> dict[str, object]:
    return {"format": FORMAT, **typed.dump(record)}


def dumps(record: Record) -> str:
    return json.dumps(to_json(record), sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def read_tested(path: Path) -> Tested:
    """``tested.json`` (what a build tested: its trees and each patch's id, written beside
    the build's wheels by the kit), refused naming the file and the dotted key."""
    return _once(typed.read(Tested, typed.json_file(path), path))


def _once(tested: Tested) -> Tested:
    # A tree or patch listed again (once per wheel of a multi-wheel build, as records
    # made before resolved.tested_of named each once did) is the same fact: kept once.
    return replace(tested, trees=tuple(dict.fromkeys(tested.trees)),
                   patches=tuple(dict.fromkeys(tested.patches)))


def from_json(data: object, where: str | Path) -> Record:
    """The record in ``data`` (parsed JSON), refused naming ``where`` and the dotted key."""
    fields = dict(data) if isinstance(data, dict) else data
    fmt = fields.pop("format", None) if isinstance(fields, dict) else FORMAT
    if fmt != FORMAT:
        raise typed.MalformedError(where, "format", f"{fmt!r} is not {FORMAT!r}",
                              fix="made by another toolkit version: import it with that one")
    record = typed.read(Record, fields, where)
    record = replace(record, tested=_once(record.tested))
    check(record, where=str(where))  # a verdict of no kind differs from its cases' there
    return record


def read(path: Path, *, shown: str | None = None) -> Record:
    """The record in ``path`` (a record.json); errors name ``shown`` (default: ``path``)."""
    where = shown or str(path)
    return from_json(typed.json_file(path, where), where)


def summary(record: Record) -> str:
    """The short markdown a person reads beside the record."""
    def line(c: Mapping[str, int]) -> str:
        return f"{c['pass']} pass, {c['fail']} fail, {c['skip']} skip, {c['error']} error"

    # Per variant where the run compared several (an A/B's baseline fails where the
    # patched build passes: one sum of both would read as failures of the build).
    variants = list(dict.fromkeys(c.variant for c in record.cases))
    counted = line(record.counts) if len(variants) < 2 else "; ".join(
        f"{v}{' (baseline)' if v in BASELINE_VARIANTS else ''}: "
        + line(tally(c for c in record.cases if c.variant == v)) for v in variants)
    kind = KINDS[record.kind]
    title = f"{record.stack}: {record.kind}" + (f" ({record.subject})" if record.subject else "")
    lines = [f"# {title}", "", f"{kind.description[0].upper()}{kind.description[1:]}.", "",
             f"- Verdict: **{record.verdict}** ({counted}; {len(record.cases)} of "
             f"{record.planned} planned cases ran)",
             f"- Command: `{record.command}`",
             f"- Made: {record.created} by sm120fork {record.toolkit}",
             f"- Machine: {record.machine.description}"
             + "".join(f", {k} {v}" for k, v in (
                 ("capability", record.machine.capability), ("driver", record.machine.driver),
                 ("CUDA", record.machine.cuda), ("torch", record.machine.torch),
                 ("Python", record.machine.python)) if v)
             + (" (ranks shared a GPU: timings mean nothing)"
                if record.machine.shared_gpu else ""),
             f"- Re-make: `{record.remake}`"]
    for head, rows in (("variant | wheel | sha256", [(w.variant, w.file, w.sha256[:16])
                                                     for w in record.tested.wheels]),
                       ("project | patch | patch-id", [(p.project, p.patch, p.patch_id[:12])
                                                       for p in record.tested.patches])):
        if rows:
            lines += ["", f"| {head} |", "| --- | --- | --- |",
                      *(f"| {a} | {b} | `{digest}` |" for a, b, digest in rows)]
    bad = [x for x in record.cases if x.outcome in ("fail", "error")
           and x.variant not in BASELINE_VARIANTS]
    if bad:
        lines += ["", "Failing:", "", *(f"- {x.variant} {x.id}: {x.outcome}"
                                        + (f" ({x.detail})" if x.detail else "")
                                        for x in bad[:30])]
        if len(bad) > 30:
            lines.append(f"- and {len(bad) - 30} more (record.json)")
    against = [x.against for x in record.cases if x.against]
    if against:
        lines += ["", "Against the baseline: " + ", ".join(
            f"{against.count(a)} {a}" for a in AGAINST if a in against)]
    for title, items in (("Not run", record.not_run), ("Notes", record.notes)):
        if items:
            lines += ["", f"{title}:", "", *(f"- {x}" for x in items)]
    return "\n".join(lines) + "\n"


def write(record: Record, reports: Path) -> Path:
    """Publish ``record`` under ``reports`` and return its folder: record.json and
    summary.md, each replaced in one step (a plot beside them stays)."""
    check(record, where=f"{record.folder.as_posix()}/{RECORD_FILE}")
    folder = reports / record.folder
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / RECORD_FILE, dumps(record))
    atomic_write_text(folder / SUMMARY_FILE, summary(record))
    return folder


def import_records(source: Path, reports: Path) -> list[Path]:
    """Validate every record under ``source`` and publish each into ``reports``.

    All are read first: one bad record publishes none (nothing half-imported).  Two
    records for the same folder are refused, as one would silently replace the other."""
    paths = sorted(source.rglob(RECORD_FILE)) if source.is_dir() else []
    if not paths:
        raise ConfigError(f"holds no {RECORD_FILE}" if source.is_dir() else "is not a folder",
                          where=str(source),
                          fix="name the folder the GPU run wrote its records into")
    records: dict[Path, tuple[Path, Record]] = {}
    for path in paths:
        rec = read(path)
        if rec.folder in records:
            raise ConfigError(f"is for {rec.folder.as_posix()}, as is "
                              f"{records[rec.folder][0]}", where=str(path),
                              fix="import one of them")
        records[rec.folder] = (path, rec)
    return [write(rec, reports) for _, rec in records.values()]


def published(reports: Path) -> list[tuple[Path, Record]]:
    """(path relative to ``reports``, record) of every record under ``reports``, each read
    strictly (a broken one is an error naming it)."""
    out = []
    for path in sorted(reports.rglob(RECORD_FILE)):
        shown = path.relative_to(reports.parent).as_posix()
        rec = read(path, shown=shown)
        expected = reports / rec.folder / RECORD_FILE
        if path != expected:
            raise ConfigError(f"is a record for {rec.folder.as_posix()}/ but lies elsewhere",
                              where=shown, fix="import it: nox -s record_import -- DIR")
        out.append((path.relative_to(reports), rec))
    return out
