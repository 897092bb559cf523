"""Which evidence still stands: each record of a stack and each patch's ``Verified-By``
claim, with the reason and the one command that re-makes it.

Evidence is keyed on what was tested, never on how it is described: a record is current
while its patch ids (``git patch-id --stable``), wheels and patched trees are today's; a
claim is judged against its own stack's record, or another stack's that ran this very
build (a copy builds byte-identical wheels).  Nothing is built or run here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from sm120fork.errors import ConfigError, SeriesError
from sm120fork.patch.series import Patch, display_name
from sm120fork.record import (
    BASELINE_VARIANTS,
    KINDS,
    RECORD_FILE,
    Record,
    published,
    read,
)
from sm120fork.resolved import ResolvedStack
from sm120fork.workspace import Workspace

FIELD = "Verified-By"
#: What each kind of evidence is, as the per-patch table calls it.
EVIDENCE_LABELS = {
    "proof": "compile proof",
    "sglang": "CPU behaviour check",
    "cpu": "CPU behaviour check",
    "gpu": "SM90 GPU run",
}


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One ``Verified-By: <kind>:<check>`` line of a patch.  A ``gpu`` check names a record
    of the patch's own stack by its kind and subject (``gpu-test:custom_lamport`` is
    ``reports/<stack>/gpu-test`` and its API custom_lamport)."""

    kind: str
    check: str

    @property
    def text(self) -> str:
        return f"{self.kind}:{self.check}"


def claims(patch: Patch) -> tuple[Claim, ...]:
    """The patch's ``Verified-By`` fields, parsed; a malformed one is an error."""
    out = []
    for name, value in patch.fields:
        if name.lower() != FIELD.lower():
            continue
        kind, sep, check = value.strip().partition(":")
        if not sep or kind not in EVIDENCE_LABELS or not check:
            raise SeriesError(f"bad {FIELD} {value!r}", where=str(patch.path),
                              fix=f"write '{FIELD}: <kind>:<check>' with kind one of "
                                  f"{', '.join(EVIDENCE_LABELS)}")
        if kind == "gpu" and check.partition("/")[0].partition(":")[0] not in KINDS:
            raise SeriesError(f"bad {FIELD} {value!r}: a gpu claim names a kind of record "
                              "of the patch's own stack, not a folder", where=str(patch.path),
                              fix=f"write '{FIELD}: gpu:<kind>[/<subject>][:<api>]' with kind "
                                  f"one of {', '.join(KINDS)}")
        out.append(Claim(kind=kind, check=check))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class Standing:
    """One record or claim: its state, why, and the command that re-makes it with what
    that command needs beyond a CPU machine."""

    #: ``reports/<stack>/<kind>[/<subject>]`` for a record; ``<patch>: <claim>`` for a claim.
    name: str
    kind: str
    #: current (of the stack as it is; a claim: backed by a passing record), stale (made
    #: before a change), missing (never made) or fail (made and not passed).
    state: str
    reasons: tuple[str, ...] = ()
    command: str = ""
    #: The record's verdict (pass / fail / unfinished), None when there is no record.
    verdict: str | None = None
    #: What ``command`` needs ("a GPU", "nvcc >= 12.9"; "": this CPU machine will do).
    needs: str = ""

    @property
    def current(self) -> bool:
        return self.state == "current"

    def message(self) -> str:
        why = "; ".join(self.reasons)
        return (f"{self.name}: {self.state}" + (f" ({why})" if why else "")
                + (f"; re-make: {self.command}" if not self.current and self.command else "")
                + (f" (needs {self.needs})" if not self.current and self.needs else ""))


def same_build(rec: Record, today: ResolvedStack) -> bool:
    """``rec`` ran exactly the wheels and patched trees the stack has built now."""
    built = today.wheels or {}
    ran = [w for w in rec.tested.wheels if w.variant not in BASELINE_VARIANTS]
    return bool(ran) and all(w.project in built and w.sha256 in built[w.project][0]
                             for w in ran) \
        and all(t.project in built and t.tree == built[t.project][1] for t in rec.tested.trees)


def twin_record(today: ResolvedStack, kind: str, subject: str | None
                ) -> tuple[str, Record] | None:
    """(folder, record) of a ``kind`` record of another stack that ran this stack's very
    build (:func:`same_build`); None when the stack is not built or none did."""
    if today.wheels is None:
        return None
    return next(((f"reports/{rel.parent.as_posix()}", rec)
                 for rel, rec in published(today.ws.reports_dir)
                 if rec.kind == kind and rec.subject == subject
                 and rec.stack != today.stack.name and same_build(rec, today)), None)


def record_problems(rec: Record, today: ResolvedStack) -> list[str]:
    """Why ``rec`` is not of the stack as it is today (empty: it is current)."""
    stack = today.stack
    if rec.stack != stack.name and not same_build(rec, today):
        return [f"it ran on stack {rec.stack}, not {stack.name}"]
    if rec.kind == "upstream-pr":
        return _pr_problems(rec, today)
    problems: list[str] = [
        f"the plugin wheel it ran (sha256 {w.sha256[:12]}) is not the one built now "
        f"({Path(today.manifest).parent.as_posix()}/plugin: "
        f"{', '.join(sorted(s[:12] for s in today.plugin))})"
        for w in rec.tested.wheels
        if w.variant == "plugin" and today.plugin is not None and w.sha256 not in today.plugin]
    keys = {p.key for p in stack.projects}
    for project in rec.tested.projects:
        if project not in keys:
            problems.append(f"it tested project {project!r}, which stack {stack.name} "
                            "no longer has")
            continue
        problems += _patch_problems(project, rec, today)
        pinned = stack.project(project).version
        shas, tree = (today.wheels or {}).get(project, (frozenset(), None))
        for w in rec.tested.wheels:
            if w.project != project or w.variant in BASELINE_VARIANTS:
                continue
            # the wheel file name's version, without its local label
            version = w.file.partition("-")[2].partition("-")[0].partition("+")[0]
            if version not in (pinned, ""):
                problems.append(f"it ran {w.file}, but {project} is pinned at {pinned} now")
            elif shas and w.sha256 not in shas:
                problems.append(f"the {project} wheel it ran (sha256 {w.sha256[:12]}) is not "
                                f"the one built now ({today.manifest}: "
                                f"{', '.join(sorted(s[:12] for s in shas))})")
        problems += [f"it tested another patched {project} tree ({t.tree[:12]}, built now "
                     f"{tree[:12]})" for t in rec.tested.trees
                     if t.project == project and tree and t.tree != tree]
    return problems


def _patch_problems(project: str, rec: Record, today: ResolvedStack) -> list[str]:
    """Which patch's change differs between the record and today's series."""
    tested = rec.tested.patches_of(project)
    now = today.series[project].patches
    ids = [p.patch_id for p in now]
    if [p.patch_id for p in tested] == ids:
        return []
    before = {p.patch_id for p in tested}
    after = set(ids)
    changed = [display_name(p.name) for p in now if p.patch_id not in before]
    gone = [display_name(p.patch) for p in tested if p.patch_id not in after]
    if not changed and not gone:
        return [f"the {project} series is in another order than it tested"]
    return [f"{project} patch(es) {what}: {', '.join(names)}" for what, names in (
        ("changed or added since", changed), ("it tested are gone or changed", gone)) if names]


def _pr_problems(rec: Record, today: ResolvedStack) -> list[str]:
    """An upstream PR's record tested some patches of a series (and upstream-form tests
    beside it) on upstream's tree, not the stack's build: it is current while each of them
    has the change it tested."""
    problems: list[str] = []
    for tested in rec.tested.patches:
        pool = [*(today.series[tested.project].patches if tested.project in today.series
                  else ()),
                *(today.upstream_tests[tested.project].patches
                  if tested.project in today.upstream_tests else ())]
        now = next((p for p in pool if p.name == tested.patch), None)
        if now is None:
            problems.append(f"{tested.project} patch {display_name(tested.patch)} is gone")
        elif now.patch_id != tested.patch_id:
            problems.append(f"{tested.project} patch {display_name(tested.patch)} changed "
                            f"since (patch-id {tested.patch_id[:12]}, now {now.patch_id[:12]})")
    return problems


def needs(kind: str, today: ResolvedStack) -> str:
    """What re-making a ``kind`` record of the stack needs beyond a CPU machine: verify-sm120
    needs nvcc only for a stack whose patches claim a compile proof."""
    if kind == "verify-sm120" and not any(c.kind == "proof" for *_, c in _claims(today)):
        return ""
    return KINDS[kind].needs if kind in KINDS else ""


def judge(rec: Record, today: ResolvedStack, name: str) -> Standing:
    problems = record_problems(rec, today)
    passed = "current" if rec.verdict == "pass" else "fail"
    return Standing(name=name, kind=rec.kind, state="stale" if problems else passed,
                    reasons=tuple(problems), command=rec.remake, verdict=rec.verdict,
                    needs=needs(rec.kind, today))


def stack_records(ws: Workspace, stack: str) -> list[tuple[Path, Record]]:
    """(folder relative to the checkout, record) of each record of ``stack``."""
    folder = ws.reports_dir / stack
    if not folder.is_dir():
        return []
    return [(Path("reports") / rel.parent, rec) for rel, rec in published(ws.reports_dir)
            if rec.stack == stack]


def stack_evidence(today: ResolvedStack) -> list[Standing]:
    """Each record of the stack, judged; a kind with no record is named as missing."""
    stack = today.stack
    found = [judge(rec, today, rel.as_posix())
             for rel, rec in stack_records(today.ws, stack.name)]
    have = {s.kind for s in found}
    for kind in ("gpu-test", "verify-sm120"):
        twin = twin_record(today, kind, None) if kind == "gpu-test" else None
        if kind not in have and twin:
            found.append(replace(judge(twin[1], today, twin[0]),
                                 reasons=(f"ran this stack's very build as {twin[1].stack}",)))
        elif kind not in have:
            found.append(Standing(name=f"reports/{stack.name}/{kind}", kind=kind,
                                  state="missing", reasons=("never made",),
                                  command=KINDS[kind].command(stack.name),
                                  needs=needs(kind, today)))
    return found


def claim_record_path(claim_kind: str, check: str, stack: str) -> tuple[str, str]:
    """(record folder relative to the checkout, what of it the claim looks at) for a claim
    of a patch of ``stack``: ``gpu:<kind>[/<subject>][:<api>]`` names the stack's record
    of that kind, the other kinds are checked by verify-sm120, whose record backs them."""
    if claim_kind == "gpu":
        where, _, api = check.partition(":")
        return f"reports/{stack}/{where.strip('/')}", api
    return f"reports/{stack}/verify-sm120", check


def judge_claim(project: str, patch: Patch, claim: Claim, today: ResolvedStack) -> Standing:
    """A patch's claim: current only when the stack's record that backs it exists, lists
    the patch's change as it is today and passed (verify-sm120: the patch's own case too)."""
    ws, stack = today.ws, today.stack
    folder, _ = claim_record_path(claim.kind, claim.check, stack.name)
    name = f"{stack.project(project).series}/{display_name(patch.name)}: {claim.text}"
    kind, *subject = Path(folder).parts[2:4]
    shown = f"{folder}/{RECORD_FILE}"

    def standing(state: str, why: str = "", verdict: str | None = None) -> Standing:
        return Standing(name=name, kind=kind, state=state, reasons=(why,) if why else (),
                        command=KINDS[kind].command(stack.name, *subject), verdict=verdict,
                        needs=needs(kind, today))

    path = ws.root / shown
    twin = None if path.is_file() or claim.kind != "gpu" else twin_record(
        today, kind, subject[0] if subject else None)
    if twin is not None:
        folder, rec = twin
    elif not path.is_file():
        return standing("missing", f"{shown} was never made")
    else:
        try:
            rec = read(path, shown=shown)
        except ConfigError as exc:
            return standing("stale", str(exc))
    if (rec.stack != stack.name and twin is None) or rec.kind != kind:
        return standing("stale", f"{shown} is a {rec.kind} record of stack {rec.stack}, "
                                 f"not stack {stack.name}'s {kind}")
    # The patch as the record tested it, found by its change: a renamed or renumbered
    # patch (a bump that dropped one before it) is the same patch.
    tested = next((p.patch for p in rec.tested.patches_of(project)
                   if p.patch_id == patch.patch_id), None)
    if tested is None:
        return standing("stale", f"{folder} was made before this patch's change (patch-id "
                                 f"{patch.patch_id[:12]} not in it)", rec.verdict)
    if rec.verdict != "pass":
        return standing("fail", f"{folder}: {rec.verdict}", rec.verdict)
    if kind == "verify-sm120":
        own = next((c.outcome for c in rec.cases if c.id == f"{project}/{tested}"),
                   "not in it")
        if own != "pass":
            return standing("fail", f"{folder}: this patch's case: {own}", rec.verdict)
    return standing("current", f"{folder} ran this stack's very build" if twin else "",
                    rec.verdict)


def _claims(today: ResolvedStack) -> Iterator[tuple[str, Patch, Claim]]:
    """(project, patch, claim) of each claim of each patch of the stack."""
    return ((key, patch, c) for key, series in today.series.items()
            for patch in series.patches for c in claims(patch))


def claim_standings(today: ResolvedStack) -> list[Standing]:
    """Each claim of each patch of the stack, judged (nothing is run)."""
    return [judge_claim(key, patch, c, today) for key, patch, c in _claims(today)]


def unbacked_claims(today: ResolvedStack) -> list[Standing]:
    """Each claim of ``stack`` that no current record backs: its own standing, or its
    record's where the claim holds but the record is not of the stack as it is now (it
    passed, but ran another pin or wheel): what ``bump`` and ``watch`` say to re-make."""
    records = {s.name: s for s in stack_evidence(today)}
    out = []
    for key, patch, c in _claims(today):
        standing = judge_claim(key, patch, c, today)
        record = records.get(claim_record_path(c.kind, c.check, today.name)[0])
        if not standing.current:
            out.append(standing)
        elif record is not None and not record.current:
            out.append(replace(record, name=standing.name))
    return out


def to_remake(today: ResolvedStack) -> list[str]:
    """One line per command that makes a record the stack's claims need and no passing
    one backs (:func:`unbacked_claims`): the command, what it needs, and each such claim."""
    by: dict[str, list[str]] = {}
    for s in unbacked_claims(today):
        head, _, claim = s.name.partition(": ")
        by.setdefault(f"`{s.command}`" + (f" (needs {s.needs})" if s.needs else ""),
                      []).append(f"{head.rsplit('/', 1)[-1]}: {claim} ({s.state})")
    return [f"{command}: {'; '.join(names)}" for command, names in by.items()]

