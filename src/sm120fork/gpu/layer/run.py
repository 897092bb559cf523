"""``sglang-layer``: every case of the layer harness in fresh rank groups, its report and
its record, as far as the run got."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sm120fork import __version__, record
from sm120fork.errors import ConfigError
from sm120fork.gpu.core import records
from sm120fork.gpu.core.documents import LayerMachine, MadeFrom, Provenance
from sm120fork.gpu.core.records import now
from sm120fork.gpu.layer import cases
from sm120fork.gpu.layer.cases import CaseOutcome
from sm120fork.gpu.layer.rank import POLICY_CASES
from sm120fork.util import proc

log = logging.getLogger("sm120fork")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerRoute:
    """A second install route of the stack: stock SGLang with the plugin beside it."""

    variant: str
    sglang_path: Path
    site: tuple[Path, ...] = ()
    made_from: tuple[MadeFrom, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerOptions:
    command: str
    sglang_path: Path
    out: Path
    layout: str
    site: tuple[Path, ...] = ()
    cases: tuple[str, ...] | None = None
    device: str = "cuda"
    world_size: int = 2
    tokens: tuple[int, ...] | None = None
    timeout: float = 120.0
    first_timeout: float | None = None
    start_timeout: float = 300.0
    gates_in_memory: bool = False
    load_plugins: bool = False
    title: str = "SGLang fused-norm layer path"
    notes: tuple[str, ...] = ()
    made: Provenance | None = None
    tested: record.Tested | None = None
    machine: LayerMachine = dataclasses.field(default_factory=LayerMachine)
    record_command: str | None = None
    agreement_timeout: float | None = None
    group_timeout: float | None = None
    variant: str = "patched"
    routes: tuple[LayerRoute, ...] = ()
    #: seconds after which no further case starts; the record then stays unfinished
    time_budget: float | None = None
    jobs: int = 1
    prebuild: bool = False


LAYER_NOTES = (
    "ranks are processes sharing the GPUs: correctness only, timings mean nothing",
    "SGLang's capability query answers 12.0 to callers in sglang.* only (its SM12x gates "
    "and policy run); FlashInfer builds and runs for the real GPU",
    "TP group: gloo over the rank processes (NCCL refuses two ranks on one GPU) as the "
    "stand-in for NCCL; sgl_kernel is an import stub, so the unfused norm is SGLang's "
    "forward_native",
    "policy-graph: a step whose route is SGLang's NCCL dispatch is checked eagerly (its gloo "
    "stand-in cannot be recorded into a CUDA graph); the fused and pcie_ipc steps are "
    "captured and replayed on new inputs",
)
#: A case's most, for the time budget (about 30 s on the H200 box).
CASE_ESTIMATE_S = 60.0
PREBUILD = {
    "trtllm comm": "from flashinfer.comm.trtllm_ar import get_trtllm_comm_module as g; g()",
    "pcie_ipc": "from flashinfer.comm.pcie_ipc_ar import get_pcie_ipc_comm_module as g; g()",
}


def planned_cases(opts: LayerOptions) -> list[tuple[str, str]]:
    """(variant, case) planned, routes interleaved so a cut-short run covers each alike."""
    if opts.cases:
        chosen = list(opts.cases)
    elif opts.device == "cuda":
        chosen = list(cases.GPU_PLAN.get(opts.layout, cases.GPU_CASES))
    else:
        chosen = [c for c in cases.CPU_CASES if opts.layout == "layer_boundary"
                  or c not in POLICY_CASES]
    return [(variant, case) for case in chosen
            for variant in [opts.variant, *(r.variant for r in opts.routes)]]


def _prebuild(opts: LayerOptions) -> None:
    from sm120fork.gpu.core.safety import rank_environment

    env = rank_environment(os.environ, {  # multicast off, as in every rank
        "PYTHONPATH": os.pathsep.join([*map(str, opts.site), str(opts.sglang_path)])})
    started = time.monotonic()
    log.info("building FlashInfer's %s modules once (JIT; a few minutes the first time)",
             " and ".join(PREBUILD))
    with proc.ProcessGroup() as group:
        running = {name: group.start([sys.executable, "-c", code], env=env)
                   for name, code in PREBUILD.items()}
        for name, child in running.items():
            code = child.wait()
            log.info("module %s: %s after %.0f s", name, "built" if code == 0 else
                     f"FAILED (exit {code}; its cases will say why)",
                     time.monotonic() - started)


def run_sglang_layer(opts: LayerOptions) -> list[CaseOutcome]:
    from concurrent.futures import ThreadPoolExecutor

    started = time.monotonic()
    planned = planned_cases(opts)
    if opts.prebuild and opts.device == "cuda":
        _prebuild(opts)
    routes = {opts.variant: LayerRoute(variant=opts.variant, sglang_path=opts.sglang_path,
                                       site=opts.site),
              **{r.variant: r for r in opts.routes}}
    done: dict[int, CaseOutcome] = {}
    not_run: list[str] = []

    def one(index: int) -> None:
        variant, case = planned[index]
        if opts.time_budget is not None and (
                time.monotonic() - started + CASE_ESTIMATE_S > opts.time_budget):
            not_run.append(f"{variant} {case}: not started, the time budget "
                           f"({opts.time_budget:.0f} s) ran out")
            log.info("[%d/%d] %s %s: not started (time budget)", index + 1, len(planned),
                     variant, case)
            return
        route = routes[variant]
        timeout = opts.first_timeout if index == 0 and opts.first_timeout else opts.timeout
        plugin = route is not routes[opts.variant]
        log.info("[%d/%d] %s %s: starting at %.0f s", index + 1, len(planned), variant,
                 case, time.monotonic() - started)
        outcome = cases.run_case(
            case, sglang_path=route.sglang_path, device=opts.device,
            world_size=opts.world_size, tokens=list(opts.tokens) if opts.tokens else None,
            timeout=timeout, start_timeout=opts.start_timeout, extra_path=list(route.site),
            gates_in_memory=opts.gates_in_memory and not plugin, layout=opts.layout,
            load_plugins=opts.load_plugins or plugin,
            agreement_timeout_s=opts.agreement_timeout,
            collective_timeout_s=opts.group_timeout, variant=variant)
        log.info("[%d/%d] %s %s: %s in %.0f s %s", index + 1, len(planned), variant, case,
                 "PASS" if outcome.passed else "FAIL", outcome.seconds,
                 "; ".join(outcome.problems))
        done[index] = outcome
        _publish(opts, [done[i] for i in sorted(done)], planned, not_run,
                 finished=len(done) == len(planned))

    with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
        list(pool.map(one, range(len(planned))))
    outcomes = [done[i] for i in sorted(done)]
    _publish(opts, outcomes, planned, not_run, finished=len(done) == len(planned))
    if len(done) < len(planned):
        log.info("cut short: %d of %d planned cases ran (%s); not run: %s", len(done),
                 len(planned), ", ".join(f"{o.variant} {o.case}" for o in outcomes) or "none",
                 "; ".join(not_run))
    return outcomes


def _publish(opts: LayerOptions, outcomes: Sequence[CaseOutcome],
             planned: Sequence[tuple[str, str]], not_run: Sequence[str], *,
             finished: bool) -> None:
    opts.out.mkdir(parents=True, exist_ok=True)
    notes = [f"command: `{opts.command}`",
             f"{'finished' if finished else 'in progress'} {now()}", *opts.notes]
    (opts.out / "report.md").write_text(
        cases.render(outcomes, title=opts.title, notes=notes), encoding="utf-8")
    shown = [c if v == opts.variant else f"{v} {c}" for v, c in planned]
    (opts.out / "report.json").write_text(
        json.dumps({"kind": "sglang-layer", "notes": notes, "planned": shown,
                    "finished": finished, "layout": opts.layout, **(opts.made or {}),
                    "cases": [dataclasses.asdict(o) for o in outcomes]}, indent=1),
        encoding="utf-8")
    made_from = [*(opts.made["made_from"] if opts.made else ()),
                 *(m for r in opts.routes for m in r.made_from)]
    try:
        rec = layer_record(
            made={"stack": opts.made["stack"] if opts.made else None, "made_from": made_from},
            tested=opts.tested,
            command=opts.record_command or opts.command, created=now(),
            machine=opts.machine, planned=planned, outcomes=outcomes,
            notes=(*opts.notes, *(LAYER_NOTES if opts.device == "cuda" else ())),
            not_run=tuple(not_run))
    except ConfigError as exc:  # the run goes on; its record would break the format
        log.error("no record: %s", exc)
        return
    if rec is not None:
        records.write(rec, opts.out)


def layer_record(*, made: Provenance, tested: record.Tested | None,
                 command: str, created: str, machine: LayerMachine,
                 planned: Sequence[tuple[str, str]],
                 outcomes: Sequence[CaseOutcome],
                 notes: Sequence[str] = (), not_run: Sequence[str] = (),
                 ) -> record.Record | None:
    """The record of a run of a stack's build (None without one)."""
    stack = made["stack"]
    if not stack:
        return None
    gpus = tuple(str(g) for g in machine.get("gpus") or ())
    return record.make(
        kind="sglang-layer", stack=stack, command=command, created=created,
        toolkit=__version__,
        machine=record.Machine(
            description=f"{gpus[0]} x{len(gpus)}" if gpus else "CPU ranks (no GPU)",
            gpus=gpus, torch=machine.get("torch"), cuda=machine.get("cuda"),
            cpus=os.cpu_count()),
        tested=records.tested_block([record.TestedWheel(variant=m.get("variant", "patched"),
                                           project=str(m["project"]),
                                           file=str(m["wheel"]),
                                           sha256=str(m["wheel_sha256"]))
                        for m in made["made_from"]], tested),
        planned=len(planned),
        cases=tuple(record.Case(
            id=o.case, variant=o.variant,
            outcome="pass" if o.passed else "fail",
            detail=" ".join("; ".join(o.problems).split())[:200] or f"{o.seconds:.0f} s")
            for o in outcomes),
        not_run=tuple(not_run), notes=tuple(notes))
