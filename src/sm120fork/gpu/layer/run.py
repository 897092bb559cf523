"""``sglang-layer``: SGLang's fused-norm layer path, rank against rank: each case in fresh
rank processes (:mod:`.rank`), judged here, its report and its record, as far as the run got.
No torch or SGLang here.

Cases whose fused call raises on one rank only must end that rank with one RuntimeError
within the agreement timeout, peers within ``PEER_GRACE_S`` (S4's and G6's headers).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sm120fork import __version__, record
from sm120fork.errors import ConfigError
from sm120fork.gpu import policy
from sm120fork.gpu.core import records
from sm120fork.gpu.core.documents import LayerMachine, MadeFrom, Provenance
from sm120fork.gpu.core.records import now
from sm120fork.gpu.core.safety import rank_environment
from sm120fork.gpu.core.variants import source_root
from sm120fork.gpu.decision import Process, decide
from sm120fork.gpu.layer.rank import (
    CASES,
    CPU_ONLY_CASES,
    DEFAULT_TOKENS,
    POLICY_CASES,
    RAISED,
    READY,
    RESULT,
    RankRequest,
)
from sm120fork.gpu.methods import UNFUSED
from sm120fork.layouts import LAYOUTS, CaseOutcome, Ended, Observation, Raised, adapter
from sm120fork.util import proc, typed

log = logging.getLogger("sm120fork")
RANK_MODULE = "sm120fork.gpu.layer.rank"

CPU_CASES = tuple(CASES)
RAISES_ALONE = {case: where for case, (fault, where) in CASES.items()
                if fault == "fused-call-raises" and isinstance(where, int)}
PEER_GRACE_S = 2.0
#: What the raising rank may take beyond the agreement timeout (a loaded machine).
ALONE_SLACK_S = 5.0
Policy = dict[str, Any]


_VERSION = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?["']([^"']+)["']""", re.M)


def layout_of(sglang_path: Path, root: Path | None = None) -> str:
    """The layout the stacks name for the SGLang release under ``sglang_path``."""
    from packaging.version import InvalidVersion, Version

    from sm120fork.workspace import Workspace

    fix = "pass --layout (one of: " + ", ".join(LAYOUTS) + ")"
    files = [sglang_path / "sglang" / name for name in ("_version.py", "version.py")]
    found = [m.group(1) for f in files if f.is_file()
             and (m := _VERSION.search(f.read_text(encoding="utf-8")))]
    try:
        version = Version((found or [""])[0]).public
    except InvalidVersion:
        raise ConfigError(f"no SGLang version found under {sglang_path}", fix=fix) from None
    ws = Workspace.find(root)
    layouts = {p.layout for s in ws.stacks().values() for p in s.projects
               if p.normalized_name == "sglang" and p.layout
               and Version(p.version).public == version}
    if len(layouts) != 1:
        raise ConfigError(f"no one stack in {ws.forks_dir.name}/ pins SGLang {version} with a "
                          f"layout ({', '.join(sorted(layouts)) or 'none'})", fix=fix)
    return layouts.pop()


def alone_problems(case: str, exits: Sequence[Ended], *, layout: str) -> list[str]:
    """What is wrong with how the ranks ended where the fused call raised on one rank."""
    alone = RAISES_ALONE[case]
    says = str(adapter(layout).RAISED_ALONE_SAYS)
    problems: list[str] = []
    for ended in exits:
        who, raised = f"rank {ended.rank}", ended.raised
        if ended.exit == 0 and raised is None:
            problems.append(f"{who}: finished the case although the fused call raised on "
                            f"rank {alone} only")
            continue
        if ended.rank != alone:
            continue
        if raised is None:
            problems.append(f"{who}: its fused call raised alone, but it ended without "
                            f"an error (exit {ended.exit}, stopped by the harness: "
                            f"{ended.stopped_by_harness})")
            continue
        if not raised.error.startswith("RuntimeError: ") or says not in raised.error:
            problems.append(f"{who}: expected one RuntimeError saying {says!r}, got "
                            f"{raised.error[:300]!r}")
        bound, took = raised.agreement_timeout_s, raised.after_fused_call_error_s
        if bound is None:
            problems.append(f"{who}: the tree under test has no agreement timeout "
                            "(_FUSED_CALL_AGREEMENT_TIMEOUT_S in its fusion module)")
        elif took is None or took > bound + ALONE_SLACK_S:
            problems.append(f"{who}: its error came {took} s after the fused call raised, "
                            f"beyond its {bound:g} s agreement timeout")
    return problems


#: The policy cases' (first and last token of a range, method): four boundaries among the
#: methods an H200 runs; above 128 tokens SGLang's own dispatch.
POLICY_RANGES = ((1, 8, "fused_auto"), (9, 32, "pcie_ipc_rmsnorm"), (33, 64, "nccl_rmsnorm"),
                 (65, 128, "fused_auto"))
POLICY_GPU_MAJOR = 12
#: pcie_ipc runs bf16 only.
POLICY_DTYPE = "bf16"


def policy_document(world_size: int) -> Policy:
    entries = [{"min_tokens": low, "max_tokens": last, "method": method,
                "fallback": [] if method == UNFUSED else [UNFUSED]}
               for low, last, method in POLICY_RANGES]
    doc = {"format": policy.FORMAT, "version": policy.VERSION, "for_use": True,
           "made": {"created": "by the layer harness", "gpu": "any", "gpu_count": world_size,
                    "shared_gpu": False, "dtype": POLICY_DTYPE,
                    "note": "written by sm120fork's layer harness: methods switch at token "
                            "boundaries to check correctness, not measured"},
           "tp": {str(world_size): {"ranges": entries, "measured_tokens": [],
                                    "excluded": {}, "not_measured": {}}}}
    return policy.validate(doc, "the layer harness's policy")


def policy_tokens(doc: Policy, world_size: int) -> list[int]:
    """Token counts on both sides of every boundary of the policy at this TP size."""
    counts = {int(rng[end]) for rng in doc["tp"][str(world_size)]["ranges"]
              for end in ("min_tokens", "max_tokens")}
    return sorted(counts | {max(counts) + 1} if counts else counts)


def expected_routes(doc: Policy, world_size: int, tokens: Sequence[int], *,
                    capturing: bool) -> dict[int, str]:
    """tokens -> the route :func:`sm120fork.gpu.decision.decide` names for this process."""
    decision = decide(doc, Process(world_size=world_size, dtype=POLICY_DTYPE,
                                   gpu_major=POLICY_GPU_MAJOR, capturing=capturing))
    return {t: decision.route_for(t) for t in tokens}


def policy_problems(case: str, ranks: Sequence[Observation], doc: Policy, world_size: int,
                    ) -> list[str]:
    planned = policy_tokens(doc, world_size)
    want = expected_routes(doc, world_size, planned, capturing=case == "policy-graph")
    problems: list[str] = []
    for obs in ranks:
        who, steps = f"rank {obs.rank}", obs.steps
        if [s.tokens for s in steps] != planned:
            problems.append(f"{who}: ran tokens {[s.tokens for s in steps]}, planned "
                            f"{planned}")
        for step in steps:
            if step.route != want.get(step.tokens):
                problems.append(f"{who}: at {step.tokens} tokens the route {step.route!r} "
                                f"ran, the policy's decision is {want.get(step.tokens)!r}")
            if not step.skipped and not step.correct:
                problems.append(f"{who}: output differs from the reference at {step.tokens} "
                                f"tokens ({step.route})")
        if steps and all(s.skipped for s in steps):
            problems.append(f"{who}: every step was skipped: nothing was checked")
    return problems


def expected_problems(case: str, ranks: Sequence[Observation]) -> list[str]:
    problems: list[str] = []
    for obs in ranks:
        who, warnings = f"rank {obs.rank}", obs.warnings
        says = str(adapter(obs.layout).WARNING_SAYS)
        wrong = [s.tokens for s in obs.steps if not s.correct]
        if wrong:
            problems.append(f"{who}: output differs from the reference at tokens {wrong}")
        paths = {s.path for s in obs.steps}
        if case == "fused":
            if paths != {"fused"}:
                problems.append(f"{who}: expected the fused path throughout, got {sorted(paths)}")
            if warnings:
                problems.append(f"{who}: unexpected warnings {list(warnings)}")
            continue
        if "fused" in paths:
            problems.append(f"{who}: took the fused path although fusion failed")
        if len(warnings) != 1:
            problems.append(f"{who}: expected exactly one warning, got {len(warnings)}")
        elif "\n" in warnings[0] or says not in warnings[0]:
            problems.append(f"{who}: the warning is not one line saying {says!r}: "
                            f"{warnings[0][:300]!r}")
        if obs.gate_after or not obs.unavailable:
            problems.append(f"{who}: fusion is still on after the failure")
        alive = obs.fake_buffers_alive
        if case == "fused-call-raises":
            # CUDA graphs captured before the failing call still hold the workspace's
            # pointers and replay the fused kernel: it must stay allocated (issue 19).
            if alive == 0:
                problems.append(f"{who}: the workspace was freed after the fused call "
                                "failed, while captured CUDA graphs may still use it")
        elif alive:
            problems.append(f"{who}: {alive} workspace buffers not freed")
    if case != "fused" and ranks and len({s.path for o in ranks for s in o.steps[:1]}) > 1:
        problems.append("the ranks took different paths on the first call")
    return problems


def run_case(case: str, *, sglang_path: Path, python: str | os.PathLike[str] = sys.executable,
             device: str = "cuda", world_size: int = 2, tokens: Sequence[int] | None = None,
             timeout: float = 120.0, start_timeout: float = 300.0,
             extra_path: Sequence[Path] = (), gates_in_memory: bool = False, layout: str,
             load_plugins: bool = False, agreement_timeout_s: float | None = None,
             collective_timeout_s: float | None = None,
             exchange_timeout_s: float | None = None,
             variant: str = "patched") -> CaseOutcome:
    """Run ``case`` on fresh rank processes and judge their reports: ``start_timeout``
    bounds the set-up until every rank is ready, ``timeout`` the case from then on."""
    started = time.monotonic()
    doc = policy_document(world_size) if case in POLICY_CASES else None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as free:
        free.bind(("127.0.0.1", 0))
        port = int(free.getsockname()[1])
    request = RankRequest(
        rank=0, world_size=world_size, case=case, device=device, layout=layout,
        init_method=f"tcp://127.0.0.1:{port}",
        collective_timeout_s=collective_timeout_s or timeout * 2,
        gates_in_memory=gates_in_memory, load_plugins=load_plugins,
        fused_call_agreement_timeout_s=agreement_timeout_s,
        handle_exchange_timeout_s=exchange_timeout_s,
        tokens=tuple(policy_tokens(doc, world_size) if doc else tokens or DEFAULT_TOKENS))
    rank_env = rank_environment(os.environ, {"PYTHONPATH": os.pathsep.join(
        [str(sglang_path), *map(str, extra_path), str(source_root())])})
    with tempfile.TemporaryDirectory(prefix="sm120fork-sglang-layer-") as tmp:
        if doc is not None:  # every rank reads it where SGLang looks
            request = dataclasses.replace(request, policy_path=str(policy.write(doc, Path(tmp))))
        children = [proc.Child(
            argv=[os.fspath(python), "-m", RANK_MODULE,
                  json.dumps(dataclasses.asdict(dataclasses.replace(request, rank=rank)))],
            env=rank_env, name=f"rank {rank}", log=Path(tmp) / f"rank{rank}.out",
            stderr=Path(tmp) / f"rank{rank}.err") for rank in range(world_size)]
        group = proc.run_group(
            children, ready=READY,
            timeouts=proc.Timeouts(startup=start_timeout, run=timeout, grace=PEER_GRACE_S))
        ranks, exits, tails, problems = _collect(group, Path(tmp), started, case)
    hung = group.kind == "hang"
    if hung:
        limit = (f"{timeout:.0f} s after every rank was ready" if group.ready_at is not None
                 else f"{start_timeout:.0f} s, before every rank was ready")
        problems.insert(0, f"hung: not finished {limit}")
    if case in RAISES_ALONE:
        problems += alone_problems(case, exits, layout=layout)
    elif len(ranks) == world_size:
        problems += (expected_problems(case, ranks) if doc is None
                     else policy_problems(case, ranks, doc, world_size))
    return CaseOutcome(case=case, passed=not problems, hung=hung, problems=problems,
                       ranks=ranks, seconds=round(time.monotonic() - started, 1),
                       tails=[] if not problems else tails, exits=exits, variant=variant)


def _collect(group: proc.GroupOutcome, logs: Path, started: float, case: str,
             ) -> tuple[list[Observation], list[Ended], list[str], list[str]]:
    ready_at = group.ready_at if group.ready_at is not None else started
    ranks, exits, tails, problems = [], [], [], []
    if group.kind == "protocol":
        problems.append(f"wire: {group.failure}")
    for rank, end in enumerate(group.children):
        stderr = (logs / f"rank{rank}.err").read_text("utf-8", errors="replace")
        useful = [line for line in stderr.splitlines() if "registered at" not in line]
        tails.append(f"rank {rank} (exit {end.returncode}): " + "\n".join(useful[-20:]))
        report = raised = None
        try:
            if (data := end.last(RESULT)) is not None:
                report = typed.read(Observation, data, f"rank {rank}: {RESULT}")
            if (data := end.last(RAISED)) is not None:
                raised = typed.read(Raised, data, f"rank {rank}: {RAISED}")
        except typed.MalformedError as exc:
            problems.append(f"wire: {exc}")
        exits.append(Ended(rank=rank, exit=end.returncode, stopped_by_harness=end.stopped,
                           ended_after_ready_s=None if end.ended_at is None
                           else round(end.ended_at - ready_at, 1), raised=raised))
        if report is not None:
            ranks.append(report)
        elif case not in RAISES_ALONE:
            said = f": {raised.error[:300]}" if raised is not None else ""
            problems.append(f"rank {rank}: {'hung' if group.kind == 'hang' else 'exited'} "
                            f"without a result (exit {end.returncode}){said}")
    return ranks, exits, tails, problems


def _rows(outcome: CaseOutcome) -> list[str]:
    verdict = "PASS" if outcome.passed else ("HUNG" if outcome.hung else "FAIL")
    rows = []
    for obs in outcome.ranks:
        paths = "/".join(sorted({s.route or s.path for s in obs.steps}))
        checked = [s for s in obs.steps if not s.skipped]
        err_n = max((s.norm_error for s in checked), default=float("nan"))
        err_r = max((s.residual_error for s in checked), default=float("nan"))
        rows.append(f"| {outcome.case} | {verdict} | {obs.rank} | {obs.injected or '-'} | "
                    f"{paths} | {err_n:.2e} / {err_r:.2e} | {len(obs.warnings)} | "
                    f"{'on' if obs.gate_after else 'off'} | {outcome.seconds} |")
    for ended in outcome.exits if not outcome.ranks else ():  # a case that ends in errors
        raised = ended.raised or Raised(rank=ended.rank, error="-")
        how = ("stopped by the harness" if ended.stopped_by_harness else
               f"exit {ended.exit} at {ended.ended_after_ready_s} s")
        took = raised.after_fused_call_error_s
        rows.append(f"| {outcome.case} | {verdict} | {ended.rank} | "
                    f"{'fused-call-raises' if took is not None else '-'} | ended: {how}"
                    f"{f', {took} s after its fused call raised' if took else ''} | - | "
                    f"{raised.error.replace('|', '/')[:160]} | - | {outcome.seconds} |")
    return rows or [f"| {outcome.case} | {verdict} | - | - | - | - | - | - | "
                    f"{outcome.seconds} |"]


def render(outcomes: Sequence[CaseOutcome], *, title: str, notes: Sequence[str]) -> str:
    lines = [f"# {title}", "", *(f"- {note}" for note in notes), "",
             "| case | verdict | rank | injected | paths | max rel. error (norm / "
             "residual) | warnings | fusion after | s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    labelled = [o if o.variant == "patched" else
                dataclasses.replace(o, case=f"{o.case} ({o.variant})") for o in outcomes]
    for outcome in labelled:
        lines += _rows(outcome)
    plugin = next((obs.plugin for o in outcomes for obs in o.ranks if obs.plugin), ())
    if plugin:
        lines += ["", "## What the plugin logged (first rank that ran it)", ""]
        lines += [f"- `{line}`" for line in plugin]
    warned = [(o.case, obs.rank, obs.warnings[0]) for o in outcomes for obs in o.ranks
              if obs.warnings]
    if warned:
        lines += ["", "## The warning each rank logged", ""]
        lines += [f"- {case}, rank {rank}: `{text}`" for case, rank, text in warned]
    failed = [o for o in labelled if not o.passed]
    if failed:
        lines += ["", "## Problems", ""]
        for outcome in failed:
            lines += [f"- {outcome.case}: {p}" for p in outcome.problems]
            lines += ["", "```", *outcome.tails, "```"]
    return "\n".join(lines) + "\n"


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
    load_plugins: bool = False
    title: str = "SGLang fused-norm layer path"
    notes: tuple[str, ...] = ()
    made: Provenance | None = None
    tested: record.Tested | None = None
    machine: LayerMachine = dataclasses.field(default_factory=LayerMachine)
    record_command: str | None = None
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
    """(variant, case) planned, routes interleaved so a cut-short run covers each alike:
    the policy cases on layout layer_boundary only."""
    chosen = opts.cases or [c for c in CASES if (opts.device == "cpu" or c not in CPU_ONLY_CASES)
                            and (opts.layout == "layer_boundary" or c not in POLICY_CASES)]
    return [(variant, case) for case in chosen
            for variant in ["patched", *(r.variant for r in opts.routes)]]


def run_sglang_layer(opts: LayerOptions) -> list[CaseOutcome]:
    from concurrent.futures import ThreadPoolExecutor

    started = time.monotonic()
    planned = planned_cases(opts)
    if opts.prebuild and opts.device == "cuda":
        env = rank_environment(os.environ, {  # multicast off, as in every rank
            "PYTHONPATH": os.pathsep.join([*map(str, opts.site), str(opts.sglang_path)])})
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
    routes = {r.variant: r for r in opts.routes}
    routes["patched"] = LayerRoute(variant="patched", sglang_path=opts.sglang_path, site=opts.site)
    done: dict[int, CaseOutcome] = {}
    not_run: list[str] = []

    def one(index: int) -> None:
        variant, case = planned[index]
        step = f"[{index + 1}/{len(planned)}] {variant} {case}"
        if opts.time_budget is not None and (
                time.monotonic() - started + CASE_ESTIMATE_S > opts.time_budget):
            not_run.append(f"{variant} {case}: not started, the time budget "
                           f"({opts.time_budget:.0f} s) ran out")
            log.info("%s: not started (time budget)", step)
            return
        route = routes[variant]
        log.info("%s: starting at %.0f s", step, time.monotonic() - started)
        outcome = run_case(
            case, sglang_path=route.sglang_path, device=opts.device,
            world_size=opts.world_size, tokens=opts.tokens, timeout=opts.timeout,
            extra_path=route.site, layout=opts.layout,
            load_plugins=opts.load_plugins or variant != "patched",
            variant=variant)
        log.info("%s: %s in %.0f s %s", step, "PASS" if outcome.passed else "FAIL",
                 outcome.seconds, "; ".join(outcome.problems))
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
        render(outcomes, title=opts.title, notes=notes), encoding="utf-8")
    shown = [c if v == "patched" else f"{v} {c}" for v, c in planned]
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
