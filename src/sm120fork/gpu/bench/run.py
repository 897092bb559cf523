"""``bench``: every all-reduce + RMSNorm method, checked then timed, per world size; its
reports and the all-reduce policy."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from sm120fork.errors import UsageError, VerifyError
from sm120fork.gpu import methods as methods_mod
from sm120fork.gpu import policy as policy_mod
from sm120fork.gpu.bench import report
from sm120fork.gpu.core import cases as cases_mod
from sm120fork.gpu.core import runs
from sm120fork.gpu.core.cases import RankSpec
from sm120fork.gpu.core.documents import BenchRecord, Environment
from sm120fork.gpu.core.records import now, policy_made
from sm120fork.gpu.core.runs import RunOptions
from sm120fork.gpu.core.variants import Timeouts, Variant, run_ranks
from sm120fork.util import wire
from sm120fork.util.proc import GroupOutcome
from sm120fork.util.typed import json_file

log = logging.getLogger("sm120fork")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchOptions(RunOptions):
    methods: tuple[str, ...] | None = None  # default: every registered method


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchRun:
    paths: list[Path]
    failure: str | None
    partial: bool = False  # the time budget was used up
    timed: int = 0
    module_seconds: float = 0.0
    allow_partial: bool = False
    policy: list[str] = dataclasses.field(default_factory=list)

    def headline(self) -> list[str]:
        return [f"{self.timed} bench points timed; module build {self.module_seconds:.0f} s"
                + ("; PARTIAL RUN: the time budget was used up" if self.partial else ""),
                *(f"policy: {line}" for line in self.policy)]

    def error(self) -> VerifyError | None:
        if self.partial and self.timed and self.allow_partial:
            return None
        if self.failure is not None:
            return VerifyError(f"bench ranks failed: {self.failure}")
        if not self.timed:
            return VerifyError("the bench timed nothing (every method was not runnable or "
                               "failed its check)", fix="see the bench report")
        return None


def group_envs(names: Iterable[str]) -> dict[tuple[tuple[str, str], ...], list[str]]:
    """Methods grouped by the environment their rank group needs (one group each)."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for name in names:
        groups.setdefault(tuple(sorted(methods_mod.METHODS[name].env.items())), []).append(name)
    return groups


def modules(names: Iterable[str]) -> list[str]:
    """The optional modules the module step builds for these methods."""
    return sorted({m for n in names if (m := methods_mod.METHODS[n].module)})


def select(names: Sequence[str] | None) -> list[str]:
    """The methods to run (None: all), in registry order; an unknown name is refused."""
    unknown = sorted(set(names or ()) - set(methods_mod.METHODS))
    if unknown:
        raise UsageError(f"unknown methods {unknown}", where="--method",
                         fix=f"one of {list(methods_mod.METHODS)}")
    return [name for name in methods_mod.METHODS if not names or name in names]


def run_bench(opts: BenchOptions) -> BenchRun:
    """Every method at every point, per world size, one report each; and the policy.  A
    method whose environment differs (NCCL reads its settings once) gets its own group."""
    opts = opts.with_stack(baseline=False)
    if len(opts.wheel_dirs) > 1:
        raise UsageError("bench measures one variant", where="--wheel-dir")
    chosen = select(opts.methods)
    prepared = runs.prepare(opts, "bench", ["comm", "norm", *modules(chosen)])
    compiled = prepared.compiled
    variant = prepared.variants[0]
    env = runs.run_environment(compiled, variant.name, opts.wheel_dirs)
    if not compiled[variant.name].ok:
        raise VerifyError(f"JIT build failed for {variant.name}",
                          detail="\n".join(compiled[variant.name].tail))
    gpu_count = int(env.get("gpu_count") or 1)
    worlds = list(opts.world_sizes or (max(2, gpu_count),))
    timeouts = opts.timeouts()  # the time budget counts from here
    out, roles = runs.run_out(opts, env)
    paths: list[Path] = []
    by_world: dict[int, list[BenchRecord]] = {}
    failures: list[str] = []
    partial = False
    for world in worlds:
        plan = cases_mod.bench_plan(world, quick=opts.quick, tokens=opts.tokens,
                                    hidden=opts.hidden)
        shared = world > gpu_count
        records, rank_env, outcomes = _run_world(opts, plan, prepared, chosen, timeouts,
                                                 shared=shared)
        failures += [f"world size {world}, {names}: {o.failure}" for names, o in outcomes
                     if not o.ok]
        partial = partial or any(o.kind == "budget" for _, o in outcomes)
        finished = all(o.ok for _, o in outcomes)
        doc = {
            "kind": "gpu-bench", "created": now(), "command": opts.command,
            "title": f"{(env.get('gpus') or ['?'])[0]} x{gpu_count}, world size {world}"
            + (f" ({report.SHARED_LABEL})" if shared else ""),
            "environment": {**rank_env, **env},
            "shared": shared, "label": report.SHARED_LABEL if shared else None,
            "world_size": world, "dtype": plan.dtype, "plan": dataclasses.asdict(plan),
            "methods": chosen, "module_failures": dict(compiled[variant.name].module_failures),
            "variant": variant.name, **variant.describe(), "records": records,
            "outcome": {"ok": finished, "failure": "; ".join(
                o.failure or "" for _, o in outcomes if not o.ok) or None,
                "kinds": [o.kind for _, o in outcomes],
                "log_tail": None if finished else [o.tails for _, o in outcomes]},
            "not_run": list(opts.not_run),
            "module_seconds": round(prepared.module_seconds, 1),
            "time_budget": opts.time_budget, "finished": finished,
        }
        paths += report.write_bench_report(doc, out if len(worlds) == 1 else out / f"ws{world}",
                                           roles)
        by_world[world] = records
    policy_path, policy = _write_policy(by_world, env, variant, out,
                                        shared=any(w > gpu_count for w in worlds),
                                        failed=bool(failures))
    paths.append(policy_path)
    runs.collect_logs(prepared.run_dir, out / "logs", roles)
    timed = sum(1 for recs in by_world.values() for r in recs
                if r.get("kind") == "point" and r.get("status") == methods_mod.TIMED)
    return BenchRun(paths=paths, failure="; ".join(failures) or None, partial=partial,
                    timed=timed, module_seconds=prepared.module_seconds,
                    allow_partial=opts.allow_partial, policy=policy)


def _write_policy(by_world: dict[int, list[BenchRecord]], env: Environment, variant: Variant,
                  out: Path, *, shared: bool, failed: bool) -> tuple[Path, list[str]]:
    """The policy the measured points give, written (not for use from a shared GPU or a
    failed run), and its description."""
    manifest = env.get("wheels_manifest") or {}
    made = policy_made(
        gpu=(env.get("gpus") or ["?"])[0], gpu_count=int(env.get("gpu_count") or 1),
        shared=shared, stack=s if isinstance(s := manifest.get("stack"), str) else None,
        flashinfer=env.get("flashinfer"),
        wheel_sha256=variant.sha256, hidden=(int(r["hidden"]) for recs in by_world.values()
                                             for r in recs if r.get("kind") == "point"),
        note=(report.SHARED_LABEL + ": made on a shared GPU, not for use")
        if shared else ("partial run: not for use" if failed else None))
    policy = policy_mod.derive(by_world, made=made, for_use=not shared and not failed)
    return policy_mod.write(policy, out), policy_mod.describe(policy)


def _run_world(opts: BenchOptions, plan: cases_mod.BenchPlan, prepared: runs.Prepared,
               chosen: Sequence[str], timeouts: Timeouts, *, shared: bool,
               ) -> tuple[list[BenchRecord], Environment, list[tuple[list[str], GroupOutcome]]]:
    """One world size's groups of ranks, one per environment; after a crash, the methods
    after the one that was running, in a new group: (records, the ranks' environment, each
    group's methods and outcome)."""
    variant, world = prepared.variants[0], plan.world_size
    records: list[BenchRecord] = []
    rank_env: Environment = {}
    outcomes: list[tuple[list[str], GroupOutcome]] = []
    for index, (group_env, group) in enumerate(group_envs(chosen).items()):
        if group_env and shared:
            records += [{"kind": "method", "method": name, "status": methods_mod.NOT_RUNNABLE,
                         "reason": cases_mod.NCCL_SHARED} for name in group]
            continue
        names, attempt = group, 0
        while names:
            started = time.monotonic()
            got, got_env, outcome = run_group(
                dataclasses.replace(plan, floors=index == 0 and attempt == 0), variant,
                prepared.run_dir, methods=names, tag=f"bench-ws{world}-g{index}-a{attempt}",
                extra_env=dict(group_env),
                module_failures=prepared.compiled[variant.name].module_failures,
                backend=opts.backend, allow_multicast=opts.allow_multicast, timeouts=timeouts)
            log.info("bench, world size %d, %s: %.0f s", world, names,
                     time.monotonic() - started)
            records += got
            rank_env = rank_env or got_env
            outcomes.append((names, outcome))
            begun = [r["method"] for r in got  # the last is the one running when it died
                     if r.get("kind") == "method" and r.get("status") == methods_mod.STARTING]
            if outcome.ok or outcome.kind == "budget" or not begun:
                break
            records.append({"kind": "method", "method": begun[-1],
                            "status": methods_mod.ERROR,
                            "reason": f"the ranks died while it ran "
                            f"({outcome.kind}: {outcome.failure}); the methods "
                            "after it ran in a new group"})
            names, attempt = names[names.index(begun[-1]) + 1:], attempt + 1
    return records, rank_env, outcomes


def run_group(plan: cases_mod.BenchPlan, variant: Variant, run_dir: Path, *,
              methods: Sequence[str], tag: str = "bench",
              extra_env: Mapping[str, str] | None = None,
              module_failures: Mapping[str, str] | None = None,
              timeouts: Timeouts, backend: str = "trtllm", allow_multicast: bool = False,
              worker: Sequence[str] = (sys.executable, "-m", "sm120fork.gpu.bench.timing"),
              ) -> tuple[list[BenchRecord], Environment, GroupOutcome]:
    """Run one bench group of ``methods``: (bench records, environment, outcome)."""
    records: list[BenchRecord] = []
    env_info: Environment = {}

    def on_message(rank: int, message: wire.Message) -> None:
        if message.tag == "BENCH" and rank == 0:
            records.append(message.data)
        elif message.tag == "ENV":
            env_info.update(message.data)

    outcome = run_ranks(worker, lambda store: RankSpec(
        mode="bench", world_size=plan.world_size, store=str(store), backend=backend,
        allow_multicast=allow_multicast, max_tokens=max(plan.tokens),
        max_hidden=max(plan.hidden), custom_max_tokens=max(plan.tokens), bench=plan,
        methods=tuple(methods), module_failures=dict(module_failures or {})),
        plan.world_size, variant, run_dir / f"{tag}-{variant.name}", timeouts, on_message,
        extra_env)
    return records, env_info, outcome


def rerender(bench: Path, out: Path) -> list[Path]:
    return report.write_bench_report(json_file(bench), out, where=str(bench))
