"""The evidence record: what one run tested, on what, and what came of each case.

One record per kind of run per stack, ``reports/<stack>/<kind>/record.json`` (with a
``<subject>/`` level for kinds of several subjects per stack) and a ``summary.md`` rendered
from it here.  The record is keyed on what was tested (the wheels' sha256, the patched
trees, each patch's ``git patch-id --stable``), never on how a patch is described, so a
commentary edit stales nothing.  The format is
``sm120fork-record/1``; this module is its one reader and writer, below every stage:
standard library and the toolkit's errors only.
"""

from __future__ import annotations

import datetime
import difflib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sm120fork.errors import ConfigError

FORMAT = "sm120fork-record/1"
RECORD_FILE = "record.json"
SUMMARY_FILE = "summary.md"
OUTCOMES = ("pass", "fail", "skip", "error")
VERDICTS = ("pass", "fail", "unfinished")
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
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_HEX = re.compile(r"[0-9a-f]+")


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
    sha256: str


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
    patch_id: str


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
    stack: str
    command: str
    created: str
    toolkit: str
    machine: Machine
    tested: Tested
    planned: int
    cases: tuple[Case, ...]
    subject: str | None = None
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


# --------------------------------------------------------------------------- the rules


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
    judged = [c for c in cases if c.variant not in BASELINE_VARIANTS]
    if any(c.outcome in ("fail", "error") for c in judged):
        return "fail"
    if not any(c.outcome == "pass" for c in judged):
        return "fail"
    return "pass"


def make(**fields: Any) -> Record:
    """A record with ``finished``, ``counts`` and ``verdict`` derived from its cases (pass
    everything else as :class:`Record` takes it); checked as the reader checks a file."""
    cases = tuple(fields.pop("cases", ()))
    for derived in ("finished", "counts", "verdict"):
        if derived in fields:
            raise TypeError(f"{derived} is derived from the cases, not given")
    finished = is_finished(int(fields.get("planned", 0)), cases)
    record = Record(**fields, cases=cases, finished=finished, counts=tally(cases),
                    verdict=verdict_of(finished, cases))
    check(record, where="record")
    return record


def check(record: Record, *, where: str) -> None:
    """Refuse a record that breaks a rule of the format (not just its types)."""
    def bad(key: str, what: str, fix: str | None = None) -> ConfigError:
        return ConfigError(what, where=f"{where}: {key}", fix=fix)

    if record.kind not in KINDS:
        raise bad("kind", f"unknown kind {record.kind!r}",
                  fix=_suggest(record.kind, KINDS) or f"one of {', '.join(KINDS)}")
    kind = KINDS[record.kind]
    if kind.has_subjects and not record.subject:
        raise bad("subject", f"a {record.kind} record names its subject")
    if not kind.has_subjects and record.subject:
        raise bad("subject", f"a {record.kind} record has no subject (one per stack)")
    for key, value in (("stack", record.stack), ("subject", record.subject)):
        if value is not None and not _SEGMENT.fullmatch(value):
            raise bad(key, f"{value!r} is not a folder name")
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
        if case.outcome not in OUTCOMES:
            raise bad(f"cases[{i}].outcome", f"{case.outcome!r} is not one of "
                      f"{', '.join(OUTCOMES)}")
        if case.against is not None and case.against not in AGAINST:
            raise bad(f"cases[{i}].against", f"{case.against!r} is not one of "
                      f"{', '.join(AGAINST)}")
    for i, wheel in enumerate(record.tested.wheels):
        if len(wheel.sha256) != 64 or not _HEX.fullmatch(wheel.sha256):
            raise bad(f"tested.wheels[{i}].sha256", f"{wheel.sha256!r} is not a sha256")
    for i, patch in enumerate(record.tested.patches):
        if len(patch.patch_id) != 40 or not _HEX.fullmatch(patch.patch_id):
            raise bad(f"tested.patches[{i}].patch_id",
                      f"{patch.patch_id!r} is not a git patch-id")
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


def _strings(value: Any, key: str) -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{key}.{k}" if key else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{key}[{i}]")


# --------------------------------------------------------------------------- JSON


def _drop_none(data: dict[str, object], keep: Sequence[str] = ()) -> dict[str, object]:
    return {k: v for k, v in data.items() if v is not None or k in keep}


def to_json(record: Record) -> dict[str, object]:
    m = record.machine
    return {
        "format": FORMAT,
        "kind": record.kind,
        "subject": record.subject,
        "stack": record.stack,
        "command": record.command,
        "created": record.created,
        "toolkit": record.toolkit,
        "machine": _drop_none({"description": m.description, "gpus": list(m.gpus) or None,
                               "capability": m.capability, "driver": m.driver,
                               "cuda": m.cuda, "torch": m.torch, "python": m.python,
                               "cpus": m.cpus, "shared_gpu": m.shared_gpu}),
        "tested": tested_to_json(record.tested),
        "planned": record.planned,
        "finished": record.finished,
        "counts": dict(record.counts),
        "verdict": record.verdict,
        "cases": [_drop_none({"id": c.id, "variant": c.variant, "outcome": c.outcome,
                              "detail": c.detail, "against": c.against})
                  for c in record.cases],
        "not_run": list(record.not_run),
        "notes": list(record.notes),
    }


def dumps(record: Record) -> str:
    return json.dumps(to_json(record), sort_keys=True, indent=1, ensure_ascii=False) + "\n"


_T = TypeVar("_T")


class _Reader:
    """Typed access to one JSON object, each error naming the file and the dotted key."""

    def __init__(self, data: Any, where: str, key: str = "") -> None:
        self.where = where
        self.key = key
        if not isinstance(data, dict):
            raise self.error(f"is {_type_name(data)}, not an object")
        self.data: dict[str, object] = data
        self.seen: set[str] = set()

    def error(self, what: str, key: str | None = None, fix: str | None = None) -> ConfigError:
        shown = key if key is not None else self.key
        return ConfigError(what, where=f"{self.where}: {shown or '(top level)'}", fix=fix)

    def dotted(self, name: str) -> str:
        return f"{self.key}.{name}" if self.key else name

    def get(self, name: str, types: tuple[type, ...], *, required: bool = True,
            default: Any = None) -> Any:
        self.seen.add(name)
        if name not in self.data:
            if required:
                raise self.error("is missing", self.dotted(name))
            return default
        value = self.data[name]
        if value is None and not required:
            return default
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            wanted = " or ".join(t.__name__ for t in types)
            raise self.error(f"is {_type_name(value)}, not {wanted}", self.dotted(name))
        return value

    def string(self, name: str, *, required: bool = True) -> Any:
        value = self.get(name, (str,), required=required)
        if required and not value:
            raise self.error("is empty", self.dotted(name))
        return value

    def strings(self, name: str) -> tuple[str, ...]:
        items = self.get(name, (list,), required=False, default=[])
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise self.error(f"is {_type_name(item)}, not str", f"{self.dotted(name)}[{i}]")
        return tuple(items)

    def objects(self, name: str, build: Callable[[_Reader], _T], *,
                required: bool = False) -> tuple[_T, ...]:
        items = self.get(name, (list,), required=required, default=[])
        out = []
        for i, item in enumerate(items):
            reader = _Reader(item, self.where, f"{self.dotted(name)}[{i}]")
            out.append(build(reader))
            reader.done()
        return tuple(out)

    def child(self, name: str) -> _Reader:
        self.seen.add(name)
        if name not in self.data:
            raise self.error("is missing", self.dotted(name))
        return _Reader(self.data[name], self.where, self.dotted(name))

    def done(self) -> None:
        """Refuse keys the format does not have, suggesting the one meant."""
        for key in self.data:
            if key not in self.seen:
                hint = _suggest(key, self.seen)
                raise self.error("is not a key of the format", self.dotted(key),
                                 fix=hint or f"known here: {', '.join(sorted(self.seen))}")


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", type(None): "null"}.get(
        type(value), type(value).__name__)


def _suggest(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1)
    return f"did you mean {close[0]!r}?" if close else ""


def _machine(r: _Reader) -> Machine:
    return Machine(description=r.string("description"),
                   gpus=r.strings("gpus"),
                   capability=r.get("capability", (str,), required=False),
                   driver=r.get("driver", (str,), required=False),
                   cuda=r.get("cuda", (str,), required=False),
                   torch=r.get("torch", (str,), required=False),
                   python=r.get("python", (str,), required=False),
                   cpus=r.get("cpus", (int,), required=False),
                   shared_gpu=r.get("shared_gpu", (bool,), required=False))


def _tested(r: _Reader) -> Tested:
    # A tree or patch listed again (once per wheel of a multi-wheel build, as records
    # made before gpu/records.tested_of named each once did) is the same fact: kept once.
    return Tested(
        wheels=r.objects("wheels", lambda w: TestedWheel(
            variant=w.string("variant"), project=w.string("project"), file=w.string("file"),
            sha256=w.string("sha256"))),
        trees=tuple(dict.fromkeys(r.objects("trees", lambda t: TestedTree(
            project=t.string("project"), tree=t.string("tree"))))),
        patches=tuple(dict.fromkeys(r.objects("patches", lambda p: TestedPatch(
            project=p.string("project"), patch=p.string("patch"),
            patch_id=p.string("patch_id"))))))


def tested_to_json(tested: Tested) -> dict[str, list[dict[str, str]]]:
    """``tested`` as the record's ``tested`` block and ``tested.json`` hold it."""
    return {
        "wheels": [{"variant": w.variant, "project": w.project, "file": w.file,
                    "sha256": w.sha256} for w in tested.wheels],
        "trees": [{"project": t.project, "tree": t.tree} for t in tested.trees],
        "patches": [{"project": p.project, "patch": p.patch, "patch_id": p.patch_id}
                    for p in tested.patches],
    }


def read_tested(path: Path) -> Tested:
    """``tested.json`` (what a build tested: its trees and each patch's id, written beside
    the build's wheels by the kit), refused naming the file and the dotted key."""
    where = str(path)
    reader = _Reader(_json_file(path, where), where)
    tested = _tested(reader)
    reader.done()
    return tested


def _case(r: _Reader) -> Case:
    return Case(id=r.string("id"), variant=r.string("variant"), outcome=r.string("outcome"),
                detail=r.get("detail", (str,), required=False, default=""),
                against=r.get("against", (str,), required=False))


def from_json(data: Any, where: str) -> Record:
    """The record in ``data`` (parsed JSON), refused naming ``where`` and the dotted key."""
    r = _Reader(data, where)
    fmt = r.get("format", (str,))
    if fmt != FORMAT:
        raise r.error(f"{fmt!r} is not {FORMAT!r}", "format",
                      fix="made by another toolkit version: import it with that one")
    machine = r.child("machine")
    tested = r.child("tested")
    counts = r.child("counts")
    record = Record(
        kind=r.string("kind"), subject=r.get("subject", (str,), required=False),
        stack=r.string("stack"), command=r.string("command"), created=r.string("created"),
        toolkit=r.string("toolkit"), machine=_machine(machine), tested=_tested(tested),
        planned=r.get("planned", (int,)), finished=r.get("finished", (bool,)),
        counts={k: counts.get(k, (int,)) for k in OUTCOMES},
        verdict=r.string("verdict"), cases=r.objects("cases", _case, required=True),
        not_run=r.strings("not_run"), notes=r.strings("notes"))
    for reader in (machine, tested, counts, r):
        reader.done()
    if record.verdict not in VERDICTS:
        raise r.error(f"{record.verdict!r} is not one of {', '.join(VERDICTS)}", "verdict")
    check(record, where=where)
    return record


def read(path: Path, *, shown: str | None = None) -> Record:
    """The record in ``path`` (a record.json); errors name ``shown`` (default: ``path``)."""
    where = shown or str(path)
    return from_json(_json_file(path, where), where)


def _json_file(path: Path, where: str) -> Any:
    """The parsed JSON of ``path``; a file that cannot be read or is not JSON is refused
    naming ``where``."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read it: {exc.strerror}", where=where) from exc
    except ValueError as exc:
        raise ConfigError(f"is not JSON: {exc}", where=where) from exc


# --------------------------------------------------------------------------- summary


def _counted(record: Record) -> str:
    """The outcomes, per variant where the run compared several (an A/B's baseline fails
    where the patched build passes: one sum of both would read as failures of the build)."""
    def line(c: Mapping[str, int]) -> str:
        return f"{c['pass']} pass, {c['fail']} fail, {c['skip']} skip, {c['error']} error"

    variants = list(dict.fromkeys(c.variant for c in record.cases))
    if len(variants) < 2:
        return line(record.counts)
    return "; ".join(
        f"{v}{' (baseline)' if v in BASELINE_VARIANTS else ''}: "
        + line(tally(c for c in record.cases if c.variant == v)) for v in variants)


def summary(record: Record) -> str:
    """The short markdown a person reads beside the record."""
    kind = KINDS[record.kind]
    title = f"{record.stack}: {record.kind}" + (f" ({record.subject})" if record.subject else "")
    lines = [f"# {title}", "", f"{kind.description[0].upper()}{kind.description[1:]}.", "",
             f"- Verdict: **{record.verdict}** ({_counted(record)}; {len(record.cases)} of "
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
    if record.tested.wheels:
        lines += ["", "| variant | wheel | sha256 |", "| --- | --- | --- |",
                  *(f"| {w.variant} | {w.file} | `{w.sha256[:16]}` |"
                    for w in record.tested.wheels)]
    if record.tested.patches:
        lines += ["", "| project | patch | patch-id |", "| --- | --- | --- |",
                  *(f"| {p.project} | {p.patch} | `{p.patch_id[:12]}` |"
                    for p in record.tested.patches)]
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
    if record.not_run:
        lines += ["", "Not run:", "", *(f"- {x}" for x in record.not_run)]
    if record.notes:
        lines += ["", "Notes:", "", *(f"- {x}" for x in record.notes)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- publishing


def write(record: Record, reports: Path) -> Path:
    """Publish ``record`` under ``reports`` and return its folder: record.json and
    summary.md, each replaced in one step (a plot beside them stays)."""
    check(record, where=f"{record.folder.as_posix()}/{RECORD_FILE}")
    folder = reports / record.folder
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in ((RECORD_FILE, dumps(record)), (SUMMARY_FILE, summary(record))):
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
        os.replace(tmp, folder / name)
    return folder


def find(directory: Path) -> list[Path]:
    """Every record.json under ``directory``, in a stable order."""
    return sorted(directory.rglob(RECORD_FILE))


def import_records(source: Path, reports: Path) -> list[Path]:
    """Validate every record under ``source`` and publish each into ``reports``.

    All are read first: one bad record publishes none (nothing half-imported).  Two
    records for the same folder are refused, as one would silently replace the other."""
    if not source.is_dir():
        raise ConfigError("is not a folder", where=str(source),
                          fix="name the folder the GPU run wrote its records into")
    paths = find(source)
    if not paths:
        raise ConfigError(f"holds no {RECORD_FILE}", where=str(source),
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
    for path in find(reports):
        shown = path.relative_to(reports.parent).as_posix()
        rec = read(path, shown=shown)
        expected = reports / rec.folder / RECORD_FILE
        if path != expected:
            raise ConfigError(f"is a record for {rec.folder.as_posix()}/ but lies elsewhere",
                              where=shown, fix="import it: nox -s record_import -- DIR")
        out.append((path.relative_to(reports), rec))
    return out
