"""The ``tune`` run: doctor, bench per TP size, policy, install, record.

The box comes in through :class:`Box` (tested on CPU with fakes).  The policy holds only
the TP sizes whose bench finished (elsewhere SGLang keeps today's rule, and the run says
why); a run whose ranks shared a GPU installs its policy marked not for use.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sm120fork import __version__, record
from sm120fork.doctor.facts import Facts, parse_facts
from sm120fork.doctor.rules import judge
from sm120fork.errors import ToolkitError, UsageError
from sm120fork.gpu import methods, policy
from sm120fork.gpu.core import records
from sm120fork.gpu.core.documents import BenchRecord
from sm120fork.util.files import atomic_write_text

log = logging.getLogger("sm120fork")

#: the variant name the bench gives a stack's own build
VARIANT = "patched"


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorldBench:
    """One TP size's bench: its records (``gpu/methods.py`` statuses) and how it ended."""

    world: int
    records: list[BenchRecord]
    tokens: tuple[int, ...]
    hidden: tuple[int, ...]
    methods: tuple[str, ...]
    finished: bool
    shared: bool
    failure: str | None = None
    #: the FlashInfer version the bench's environment reported
    flashinfer: str | None = None
    #: the FlashInfer wheel benched: its file name and sha256
    wheel: tuple[str, str] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Box:
    """What the run asks of the machine."""

    #: the doctor's facts as collected (``doctor.probe.collect``; typed here, once)
    doctor: Callable[[], object]
    #: the bench at one TP size, with the seconds left of the budget (None: no budget)
    bench: Callable[[int, float | None], WorldBench]
    #: a yes/no question on the terminal; None: no terminal (the answer is no)
    ask: Callable[[str], bool] | None
    #: ends what the bench started (after Ctrl-C)
    stop: Callable[[], object] = lambda: None
    environ: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(os.environ))
    clock: Callable[[], float] = time.monotonic


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuneOptions:
    stack: str
    command: str
    #: where the record goes (``<reports>/<stack>/policy/``)
    reports: Path
    #: TP sizes to measure; None: every size the doctor says the box can run
    world_sizes: tuple[int, ...] | None = None
    #: replace an installed policy without asking
    yes: bool = False
    time_budget: float | None = None
    #: What the build benched was made from (its trees, each patch's id): the record is
    #: keyed on it, as a gpu-test's is; None: the record names the wheel alone (stale).
    tested: record.Tested | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tuned:
    """What the run did, for the caller to print."""

    measured: tuple[int, ...]
    #: TP size -> why it has no entry in the policy
    not_covered: Mapping[int, str]
    policy: dict[str, Any] | None
    #: where the policy was installed (None: not installed; ``kept`` says why)
    installed: Path | None
    kept: str | None
    record_dir: Path
    interrupted: bool = False

    @property
    def cut_short(self) -> bool:
        return self.interrupted or any(not why.startswith("doctor:")
                                       for why in self.not_covered.values())

    def lines(self) -> list[str]:
        out = [f"measured: {', '.join(f'TP{t}' for t in self.measured) or 'nothing'}"]
        out += [f"not in the policy: TP{tp}: {why} (SGLang keeps today's rule there)"
                for tp, why in sorted(self.not_covered.items())]
        if self.policy is not None:
            out += [f"policy: {line}" for line in policy.describe(self.policy)]
        if self.installed is not None:
            out.append(f"installed the policy at {self.installed}; SGLang reads it at its "
                       "next start (remove the file to go back to today's rule)")
            tps = " ".join(f"--tp {t}" for t in self.measured)
            out.append(f"what SGLang's own start-up code now decides: the doctor with {tps} "
                       "(in the environment SGLang serves from)")
        elif self.kept:
            out.append(self.kept)
        out.append(f"record to send us: {self.record_dir / record.RECORD_FILE}")
        return out


def doctor_sizes(facts: Facts, asked: Sequence[int] | None
                 ) -> tuple[list[int], dict[int, str], list[str]]:
    """(TP sizes to measure, sizes left out with the doctor's reason, the doctor's lines)."""
    report = judge(facts, tp=list(asked or ()))
    verdicts = report.sections.get("tp") or []
    lines = report.text_of("tp")
    if asked:
        return sorted(set(asked)), {}, lines
    sizes = [v["tp"] for v in verdicts if v["ok"]]
    refused = {v["tp"]: f"doctor: {v['why']}" for v in verdicts if not v["ok"]}
    if not sizes:
        gpus = len(facts["gpus"]["devices"])
        raise UsageError(f"the doctor found no TP size above 1 this box can run ({gpus} "
                         "GPU(s)" + (f"; {'; '.join(refused.values())}" if refused else "")
                         + ")", where="tune",
                         fix="pass --world-sizes 2 to measure with ranks sharing a GPU "
                         "(a check of the run, not of speed: the policy is installed "
                         "marked not for use)")
    return sizes, refused, lines


def _portable(text: str) -> str:
    return records.no_box_paths(text)[:300]


#: a bench point's status -> its case's outcome (any other status: "error"), and what the
#: case says where the bench gave no reason
_OUTCOMES = {methods.TIMED: "pass", methods.FAILED_CHECK: "fail", methods.NOT_RUNNABLE: "skip"}
_UNSAID = {methods.FAILED_CHECK: "output check failed", methods.NOT_RUNNABLE: "not runnable"}


def _cases(bench: WorldBench) -> list[record.Case]:
    """One case per (method, tokens, hidden) the bench planned at this TP size."""
    cases: dict[str, record.Case] = {}
    whole: dict[str, str] = {}
    for rec in bench.records:
        method = str(rec.get("method"))
        if rec.get("kind") == "method" and rec.get("status") in (methods.NOT_RUNNABLE,
                                                                  methods.ERROR):
            whole[method] = _portable(("error: " if rec["status"] == methods.ERROR else "")
                                      + str(rec.get("reason") or "not runnable"))
        if rec.get("kind") != "point":
            continue
        key = f"tp{bench.world}/{method}/t{rec['tokens']}/h{rec['hidden']}"
        status = rec.get("status")
        if status == methods.TIMED:
            detail = f"{policy.latency(rec):.2f} us (slowest rank's median)"
        else:
            detail = _portable(str(rec.get("reason") or _UNSAID.get(str(status), status)))
        cases[key] = record.Case(id=key, variant=VARIANT, detail=detail,
                                 outcome=_OUTCOMES.get(str(status), "error"))
    for (method, why), t, h in itertools.product(whole.items(), bench.tokens, bench.hidden):
        key = f"tp{bench.world}/{method}/t{t}/h{h}"
        cases.setdefault(key, record.Case(id=key, variant=VARIANT, detail=why, outcome=(
            "error" if why.startswith("error: ") else "skip")))
    return list(cases.values())


def _machine(facts: Facts, shared: bool) -> record.Machine:
    devices = facts["gpus"]["devices"]
    names = tuple(d["name"] for d in devices)
    caps = sorted({d["capability"] for d in devices})
    torch = facts.get("torch") or {}
    made = facts.get("made_by")
    # the doctor's driver fact is the CUDA version the driver supports (cuDriverGetVersion),
    # not its release number: the record says so
    driver = facts["gpus"].get("driver")
    return record.Machine(
        description=f"{names[0] if names else 'no GPU'} x{len(names)}", gpus=names,
        capability=", ".join(caps) or None, driver=f"supports CUDA {driver}" if driver else None,
        cuda=torch.get("cuda"), torch=torch.get("version"),
        python=made.get("python") if made else None,
        cpus=os.cpu_count(), shared_gpu=shared)


def _install(text: str, target: Path, *, yes: bool,
             ask: Callable[[str], bool] | None) -> tuple[Path | None, str | None]:
    """Write the policy's ``text`` where SGLang reads it, asking before replacing another."""
    if target.is_file():
        if target.read_text(encoding="utf-8") == text:
            return target, None
        if not yes:
            question = (f"a policy is installed at {target}; replace it with this "
                        "measurement? [y/N] ")
            if ask is None or not ask(question):
                how = ("no terminal to ask on" if ask is None else "you said no")
                return None, (f"kept the policy already at {target} ({how}); this run's "
                              "policy is in the record's folder as policy.json: copy it "
                              "there, or run again with --yes")
    elif target.exists():
        return None, f"{target} exists and is not a file: nothing installed"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, text)
    return target, None


def tune(opts: TuneOptions, box: Box) -> Tuned:
    """Doctor, bench per TP size, derive, install, record (see the module's docstring)."""
    started = box.clock()
    log.info("tune: the doctor looks at this box")
    facts = parse_facts(box.doctor(), "the doctor's facts")
    sizes, not_covered, doctor_lines = doctor_sizes(facts, opts.world_sizes)
    log.info("tune: measuring TP %s; the doctor: %s", ", ".join(map(str, sizes)),
             "; ".join(doctor_lines) or "-")
    benches: dict[int, WorldBench] = {}
    interrupted = False
    for i, tp in enumerate(sizes):
        left = None if opts.time_budget is None else \
            opts.time_budget - (box.clock() - started)
        stop = None  # (why this size has no entry, why the sizes after it have none)
        if left is not None and left <= 0:
            stop = ("not reached: the time budget was used up",) * 2
        else:
            log.info("tune: TP%d (%d of %d): bench", tp, i + 1, len(sizes))
            try:
                result = benches[tp] = box.bench(tp, left)
            except ToolkitError as exc:  # e.g. the module build failed: the next would too
                stop = (f"the bench failed: {exc.message}",
                        "not reached: the bench failed before it")
            except KeyboardInterrupt:
                box.stop()
                interrupted = True
                stop = ("interrupted while it ran", "not reached: interrupted")
        if stop is not None:
            not_covered.update({rest: stop[0] if rest == tp else stop[1] for rest in sizes[i:]})
            break
        if not result.finished:
            not_covered[tp] = f"the bench did not finish: {result.failure or 'cut short'}"
        elif not any(r.get("kind") == "point" and r.get("status") == methods.TIMED
                     for r in result.records):
            not_covered[tp] = "the bench timed nothing (no method ran here)"
        log.info("tune: TP%d done (%.0f s so far)", tp, box.clock() - started)
    measured = tuple(tp for tp in sizes if tp in benches and tp not in not_covered)
    shared = any(benches[tp].shared for tp in measured)
    doc = None
    if measured:
        first, devices = benches[measured[0]], facts["gpus"]["devices"]
        made = records.policy_made(
            gpu=devices[0]["name"] if devices else "?", gpu_count=len(devices), shared=shared,
            stack=opts.stack, flashinfer=first.flashinfer,
            wheel_sha256=first.wheel[1] if first.wheel else None,
            hidden=(h for tp in measured for h in benches[tp].hidden),
            note="ranks shared a GPU: made to check the run, not for use" if shared else None)
        doc = policy.derive({tp: benches[tp].records for tp in measured}, made=made,
                            for_use=not shared)
    target = policy.locate(box.environ)
    installed, kept = (None, "nothing measured: no policy installed") if doc is None else \
        _install(json.dumps(doc, indent=1, sort_keys=True) + "\n", target,  # as policy.write
                 yes=opts.yes, ask=box.ask)
    folder = _record(opts, facts, benches, sizes, not_covered,
                     None if doc is None else policy.describe(doc), shared=shared,
                     doctor_lines=doctor_lines, installed=installed is not None)
    if doc is not None:
        policy.write(doc, folder)
    return Tuned(measured=measured, not_covered=dict(sorted(not_covered.items())),
                 policy=doc, installed=installed, kept=kept, record_dir=folder,
                 interrupted=interrupted)


def _record(opts: TuneOptions, facts: Facts, benches: Mapping[int, WorldBench],
            sizes: Sequence[int], not_covered: Mapping[int, str],
            described: Sequence[str] | None, *, shared: bool, doctor_lines: Sequence[str],
            installed: bool) -> Path:
    # per TP size: a case per (method, tokens, hidden), and one that the bench finished
    # (absent when it did not: the record is then unfinished, never a pass)
    cases = [c for tp in sizes if tp in benches for c in _cases(benches[tp])]
    cases += [record.Case(id=f"tp{tp}/finished", variant=VARIANT, outcome="pass",
                          detail="the bench ran every method at every point")
              for tp in sizes if tp in benches and benches[tp].finished]
    per_size = [len(b.methods) * len(b.tokens) * len(b.hidden) + 1 for b in benches.values()]
    # sizes the bench never reached were planned too: as many cases as the first size's
    planned = sum(per_size) + (per_size[0] if per_size else 1) * sum(
        1 for tp in sizes if tp not in benches)
    wheels = tuple(dict.fromkeys(
        record.TestedWheel(variant=VARIANT, project="flashinfer", file=b.wheel[0],
                           sha256=b.wheel[1]) for b in benches.values() if b.wheel))
    notes = [f"doctor: {line}" for line in doctor_lines]
    if described is not None:
        notes += [f"policy: {line}" for line in described]
        notes.append("installed where SGLang reads it" if installed else
                     "not installed (see the run's output)")
    if shared:
        notes.append("ranks shared a GPU: timings mean nothing; the policy is not for use")
    rec = record.make(
        kind="policy", stack=opts.stack, command=_portable(opts.command), created=records.now(),
        toolkit=__version__, machine=_machine(facts, shared),
        tested=records.tested_block(wheels, opts.tested), planned=planned, cases=cases,
        not_run=tuple(_portable(f"TP{tp}: {why}") for tp, why in sorted(not_covered.items())),
        notes=tuple(_portable(n) for n in notes))
    return record.write(rec, opts.reports)

