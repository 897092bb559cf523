"""``python -m sm120fork gpu {test,bench,report}`` (or ``python -m sm120fork.gpu ...``).

Runs on a GPU machine with torch (and nvcc for FlashInfer's JIT) but no nox and no
package index: wheels are installed from local directories with ``pip --no-index``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sm120fork.cli.usage import Parser
from sm120fork.errors import ConfigError, ToolkitError, VerifyError
from sm120fork.gpu import cases as cases_mod
from sm120fork.gpu import launcher, report, sglang_layer
from sm120fork.gpu.safety import ALLOW_MULTICAST_FLAG, check_backend
from sm120fork.util import portable

log = logging.getLogger("sm120fork")

_T0 = time.monotonic()
DEFAULT_WORK_DIR = Path(os.environ.get("SM120FORK_GPU_WORK", "/tmp/sm120fork-gpu"))


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text}") from exc
    if not values or any(v < 2 for v in values):
        raise argparse.ArgumentTypeError("world sizes must be >= 2")
    return values


def _counts(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text}") from exc


HELP = "multi-rank correctness (A/B) and latency on this machine's GPUs"


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m sm120fork.gpu``: the same verbs as ``sm120fork gpu``."""
    parser = Parser(prog="python -m sm120fork.gpu", description=__doc__)
    add_args(parser)
    return parser


def add_args(parser: argparse.ArgumentParser) -> None:
    """Add the ``test``, ``bench`` and ``report`` verbs to ``parser``."""
    sub = parser.add_subparsers(dest="gpu_command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--wheel-dir", action="append", default=[], metavar="NAME=DIR",
                       help="a variant: a directory holding one flashinfer_python wheel (or "
                       "the wheel); repeat for A/B, e.g. patched=wheels/sglang-0.5.10 "
                       "unpatched=up/")
        p.add_argument("--prebuilt", action="append", default=[], metavar="NAME=DIR",
                       help="FlashInfer modules prebuilt for variant NAME (DIR holds "
                       "<module>/<module>.so); if they fail to load, the run JIT-compiles")
        p.add_argument("--also-build", action="append", default=[], choices=["norm"],
                       help="JIT-build more modules now (so a later bench finds them cached)")
        p.add_argument("--quick", action="store_true", help="the quick subset")
        p.add_argument("--out", type=Path, help="report directory (default "
                       "reports/gpu/<gpu>-<count>x)")
        p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR,
                       help="installs, JIT caches (kept between runs) and raw logs")
        p.add_argument("--backend", default="trtllm",
                       help='workspace backend for the unified API (only "trtllm" unless '
                       f"{ALLOW_MULTICAST_FLAG})")
        p.add_argument(ALLOW_MULTICAST_FLAG, dest="allow_multicast", action="store_true",
                       help="this machine is yours and supports CUDA multicast")
        p.add_argument("--startup-timeout", type=float, default=300.0)
        p.add_argument("--case-timeout", type=float, default=90.0,
                       help="watchdog: seconds without rank output before a case is ended")
        p.add_argument("--compile-timeout", type=float, default=1200.0)
        p.add_argument("--time-budget", type=float, metavar="SECONDS",
                       help="stop starting cases after this long; the rest are reported "
                       "as not run (for machines leased by the minute)")
        p.add_argument("--not-run", action="append", default=[],
                       help="a line for the report's 'Not run here' section")

    t = sub.add_parser("test", help="correctness matrix (A/B over variants)")
    common(t)
    t.add_argument("--world-sizes", type=_ints, default=[2, 4, 8])
    t.add_argument("--api", action="append", choices=cases_mod.APIS)
    t.add_argument("--pattern", action="append", choices=list(cases_mod.PATTERN_CODES))
    t.add_argument("--tokens", type=_counts, help="only these token counts, e.g. 1,16")
    t.add_argument("--max-cases", type=int)
    t.add_argument("--primary", help="the variant under test (default: patched, else first)")

    b = sub.add_parser("bench", help="latency of fused vs NCCL + RMSNorm")
    common(b)
    b.add_argument("--world-size", type=int, help="default: the GPU count, at least 2")

    s = sub.add_parser("sglang-layer", help="SGLang's fused-norm layer path, fused and "
                       "under injected workspace faults (ranks share the GPUs)")
    s.add_argument("--sglang-path", type=Path, required=True,
                   help="the directory holding the sglang package under test (python/)")
    s.add_argument("--site", type=Path, action="append", default=[],
                   help="extra import directories for the ranks (FlashInfer, SGLang's deps)")
    s.add_argument("--case", action="append", choices=sglang_layer.CPU_CASES,
                   help="default: every case this device can run")
    s.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    s.add_argument("--world-size", type=int, default=2)
    s.add_argument("--tokens", type=_counts)
    s.add_argument("--timeout", type=float, default=120.0,
                   help="per case once every rank has imported SGLang, seconds; the first "
                   "case's includes FlashInfer's JIT build of the comm module if not cached")
    s.add_argument("--first-timeout", type=float, help="the first case's limit")
    s.add_argument("--start-timeout", type=float, default=300.0,
                   help="imports and set-up of each case's ranks, seconds")
    s.add_argument("--gates-in-memory", action="store_true",
                   help="stock 0.5.23: accept SM12x in its gates in memory (G1/G3 stand-in)")
    s.add_argument("--title", default="SGLang fused-norm layer path")
    s.add_argument("--note", action="append", default=[])
    s.add_argument("--out", type=Path, required=True)

    r = sub.add_parser("report", help="re-render reports from their JSON")
    r.add_argument("--test", type=Path)
    r.add_argument("--bench", type=Path)
    r.add_argument("--out", type=Path, required=True)


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def _run_dir(work: Path, what: str) -> Path:
    path = work / "runs" / f"{what}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _nvidia_smi() -> dict[str, Any]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return {}
    rows = [line.split(", ") for line in out.strip().splitlines() if line]
    return {"driver": rows[0][1]} if rows and len(rows[0]) > 1 else {}


def _nvcc() -> str | None:
    exe = shutil.which("nvcc")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return out.strip().splitlines()[-1] if out.strip() else None


def _manifest(wheel_dirs: Sequence[str], primary: str) -> dict[str, Any] | None:
    """The toolkit manifest published beside the primary variant's wheel (if any)."""
    for spec in wheel_dirs:
        name, _, where = spec.partition("=")
        if name != primary:
            continue
        folder = Path(where) if Path(where).is_dir() else Path(where).parent
        path = folder / "manifest.json"
        if path.is_file():
            try:
                data: dict[str, Any] = json.loads(path.read_text())
                return data
            except json.JSONDecodeError:
                return {"error": f"{path} is not valid JSON"}
    return None


def _prepare(args: argparse.Namespace, what: str, modules: Sequence[str],
             ) -> tuple[Path, list[launcher.Variant], dict[str, dict[str, Any]]]:
    check_backend(args.backend, allow_multicast=args.allow_multicast,
                  host_environ=os.environ)
    specs = launcher.parse_variant_specs(args.wheel_dir)
    work: Path = args.work_dir
    run_dir = _run_dir(work, what)
    prebuilt = launcher.parse_variant_specs(args.prebuilt)
    unknown = sorted(set(prebuilt) - set(specs))
    if unknown:
        raise ConfigError(f"--prebuilt for unknown variants {unknown}", where="--prebuilt")
    variants = [launcher.install_variant(name, path, work, prebuilt.get(name))
                for name, path in (specs.items() if specs else [("installed", None)])]
    modules = [*modules, *(m for m in args.also_build if m not in modules)]
    log.info("building/loading FlashInfer modules %s for %s (cached under %s)", modules,
             [v.name for v in variants], work)
    started = time.monotonic()
    compiled = launcher.compile_variants(variants, run_dir, modules=modules,
                                         timeout=args.compile_timeout)
    retry = [i for i, v in enumerate(variants)
             if v.aot_modules and not compiled[v.name]["ok"]]
    if retry:
        for i in retry:
            log.warning("variant %s: prebuilt modules failed to load, JIT-compiling:\n%s",
                        variants[i].name, "\n".join(compiled[variants[i].name]["tail"]))
            variants[i] = variants[i].without_prebuilt()
        again = launcher.compile_variants([variants[i] for i in retry], run_dir,
                                          modules=modules, timeout=args.compile_timeout)
        for name, info in again.items():
            info["prebuilt_failure"] = compiled[name]["failure"]
            compiled[name] = info
    log.info("module step took %.0f s", time.monotonic() - started)
    for name, info in compiled.items():
        if not info["ok"]:
            log.error("variant %s: JIT build failed: %s\n%s", name, info["failure"],
                      "\n".join(info["tail"]))
    return run_dir, variants, compiled


def _environment(compiled: dict[str, dict[str, Any]], primary: str,
                 wheel_dirs: Sequence[str]) -> dict[str, Any]:
    env = dict(compiled.get(primary, {}).get("env", {}))
    env.update(_nvidia_smi())
    env["nvcc"] = _nvcc()
    manifest = _manifest(wheel_dirs, primary)
    if manifest is not None:
        env["wheels_manifest"] = manifest
    return env


def _out_dir(args: argparse.Namespace, env: dict[str, Any]) -> Path:
    if args.out:
        out: Path = args.out
        return out
    gpus = env.get("gpus") or ["unknown"]
    return Path("reports/gpu") / report.gpu_slug(gpus[0], int(env.get("gpu_count") or 0))


def _roles(args: argparse.Namespace, out: Path) -> portable.Roles:
    """This machine's paths by role, for reports that travel (issue 8: no machine path)."""
    return portable.machine_roles(Path.cwd(), {"gpu-work": args.work_dir, "out": out})


def _collect_logs(run_dir: Path, dest: Path, roles: portable.Roles) -> None:
    """One log file per variant and world size: every attempt's rank logs, concatenated."""
    dest.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[Path]] = {}
    for path in sorted(run_dir.glob("*.log")):
        stem = path.stem
        group = stem.split("-a")[0] if "-ws" in stem else stem.split("-rank")[0]
        groups.setdefault(group, []).append(path)
    for group, paths in groups.items():
        with (dest / f"{group}.log").open("w") as out:
            for path in paths:
                out.write(f"===== {path.name} =====\n")
                out.write(portable.portable_text(path.read_text(errors="replace"), roles))
                out.write("\n")


def _timeouts(args: argparse.Namespace) -> launcher.Timeouts:
    deadline = None if args.time_budget is None else _T0 + args.time_budget
    return launcher.Timeouts(startup=args.startup_timeout, case=args.case_timeout,
                             deadline=deadline)


def cmd_test(args: argparse.Namespace, argv: Sequence[str]) -> int:
    run_dir, variants, compiled = _prepare(args, "test", ["comm"])
    names = [v.name for v in variants]
    primary = args.primary or ("patched" if "patched" in names else names[0])
    if primary not in names:
        raise ConfigError(f"--primary {primary} is not a variant", fix=f"one of {names}")
    others = [n for n in names if n != primary]
    baseline = "unpatched" if "unpatched" in others else (others[0] if others else None)
    matrix = (cases_mod.quick_matrix if args.quick else cases_mod.full_matrix)(
        args.world_sizes)
    matrix = cases_mod.select(matrix, apis=args.api, patterns=args.pattern,
                              tokens=args.tokens, max_cases=args.max_cases)
    timeouts = _timeouts(args)
    results: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    # Variants alternate per batch, so a time budget leaves a complete A/B of what ran.
    for batch in cases_mod.phases(matrix):
        ws = batch[0].world_size
        for variant in variants:
            info = compiled[variant.name]
            if not info["ok"]:
                results[variant.name] += [
                    {"key": c.key, "case": c.to_dict(), "status": "fail", "failure": "build",
                     "reason": f"JIT build failed: {info['failure']}", "log_tail": info["tail"]}
                    for c in batch]
                continue
            log.info("variant %s, world size %d: %d cases (%s)", variant.name, ws, len(batch),
                     batch[0].api)
            started = time.monotonic()
            results[variant.name] += launcher.run_cases(
                batch, variant, run_dir, backend=args.backend,
                allow_multicast=args.allow_multicast, timeouts=timeouts, progress=log.info)
            log.info("variant %s, world size %d took %.0f s", variant.name, ws,
                     time.monotonic() - started)
    env = _environment(compiled, primary, args.wheel_dir)
    shared = any(ws > int(env.get("gpu_count") or 1) for ws in args.world_sizes)
    from sm120fork.gpu.reference import tolerance_table

    doc = {
        "kind": "gpu-test", "created": _now(), "command": shlex.join(
            ["python", "-m", "sm120fork.gpu", *argv]),
        "title": f"{(env.get('gpus') or ['?'])[0]} x{env.get('gpu_count', '?')}",
        "environment": env, "shared": shared, "quick": args.quick,
        "world_sizes": args.world_sizes, "primary": primary, "baseline": baseline,
        "variants": {v.name: {**v.describe(), "flashinfer": compiled[v.name]["env"].get(
            "flashinfer"), "compiled": compiled[v.name]["ok"],
            "compile_failure": compiled[v.name]["failure"],
            "prebuilt_failure": compiled[v.name].get("prebuilt_failure")}
            for v in variants},
        "tolerances": tolerance_table(), "results": results, "not_run": args.not_run,
    }
    out = _out_dir(args, env)
    roles = _roles(args, out)
    paths = report.write_test_report(doc, out, roles)
    _collect_logs(run_dir, out / "logs", roles)
    failed = [r["key"] for r in results[primary] if r["status"] == "fail"]
    order, table = report.ab_rows(doc)
    classes = [report.classify({v: r["status"] for v, r in table[k].items()}, primary,
                               baseline) for k in order]
    summary = {c: classes.count(c) for c in sorted(set(classes))}
    print(f"wrote {', '.join(map(str, paths))} and {out / 'logs'}")
    print(f"{primary}: {len(failed)} failing of {len(results[primary])}; A/B: {summary}")
    if failed:
        print(VerifyError(f"{len(failed)} cases fail with {primary}",
                          fix=f"see {paths[1]}").message, file=sys.stderr)
        return VerifyError.exit_code
    return 0


def cmd_bench(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if len(args.wheel_dir) > 1:
        raise ConfigError("bench measures one variant", where="--wheel-dir")
    run_dir, variants, compiled = _prepare(args, "bench", ["comm", "norm"])
    variant = variants[0]
    env = _environment(compiled, variant.name, args.wheel_dir)
    if not compiled[variant.name]["ok"]:
        raise VerifyError(f"JIT build failed for {variant.name}",
                          detail="\n".join(compiled[variant.name]["tail"]))
    gpu_count = int(env.get("gpu_count") or 1)
    world = args.world_size or max(2, gpu_count)
    plan = cases_mod.bench_plan(world, quick=args.quick)
    timeouts = _timeouts(args)
    started = time.monotonic()
    records, rank_env, outcome = launcher.run_bench(
        plan.to_dict(), variant, run_dir, backend=args.backend,
        allow_multicast=args.allow_multicast, timeouts=timeouts)
    log.info("bench took %.0f s", time.monotonic() - started)
    shared = world > gpu_count
    doc = {
        "kind": "gpu-bench", "created": _now(),
        "command": shlex.join(["python", "-m", "sm120fork.gpu", *argv]),
        "title": f"{(env.get('gpus') or ['?'])[0]} x{gpu_count}, world size {world}"
        + (f" ({report.SHARED_LABEL})" if shared else ""),
        "environment": {**env, **{k: v for k, v in rank_env.items() if k not in env}},
        "shared": shared, "label": report.SHARED_LABEL if shared else None,
        "world_size": world, "dtype": plan.dtype, "plan": plan.to_dict(),
        "variant": variant.name, **variant.describe(), "records": records,
        "outcome": {"ok": outcome.ok, "failure": outcome.failure, "kind": outcome.kind,
                    "log_tail": None if outcome.ok else outcome.tails},
        "not_run": args.not_run,
    }
    out = _out_dir(args, env)
    roles = _roles(args, out)
    paths = report.write_bench_report(doc, out, roles)
    _collect_logs(run_dir, out / "logs", roles)
    print(f"wrote {', '.join(map(str, paths))}")
    if not outcome.ok:
        print(VerifyError(f"bench ranks failed: {outcome.failure}").message, file=sys.stderr)
        return VerifyError.exit_code
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    written: list[Path] = []
    if args.test:
        written += report.write_test_report(json.loads(args.test.read_text()), args.out)
    if args.bench:
        written += report.write_bench_report(json.loads(args.bench.read_text()), args.out)
    if not written:
        raise ConfigError("nothing to render", fix="pass --test and/or --bench")
    print(f"wrote {', '.join(map(str, written))}")
    return 0


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM (e.g. from ``timeout``) unwinds like Ctrl-C, so rank groups get killed."""
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_sglang_layer(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Every case in fresh rank groups; report.md + report.json under ``--out``."""
    cases = args.case or list(sglang_layer.GPU_CASES if args.device == "cuda"
                              else sglang_layer.CPU_CASES)
    outcomes = []
    for index, case in enumerate(cases):
        timeout = args.first_timeout if index == 0 and args.first_timeout else args.timeout
        outcome = sglang_layer.run_case(
            case, sglang_path=args.sglang_path, device=args.device,
            world_size=args.world_size, tokens=args.tokens, timeout=timeout,
            start_timeout=args.start_timeout, extra_path=args.site,
            gates_in_memory=args.gates_in_memory)
        log.info("%s: %s in %.0f s %s", case, "PASS" if outcome.passed else "FAIL",
                 outcome.seconds, "; ".join(outcome.problems))
        outcomes.append(outcome)
        _write_sglang_layer_report(args, argv, outcomes, done=index + 1 == len(cases))
    return 0 if all(o.passed for o in outcomes) else 1


def _write_sglang_layer_report(args: argparse.Namespace, argv: Sequence[str],
                               outcomes: Sequence[sglang_layer.CaseOutcome], *,
                               done: bool) -> None:
    """Rewritten after every case, so a run cut short still leaves what it finished."""
    args.out.mkdir(parents=True, exist_ok=True)
    notes = [f"command: `python -m sm120fork.gpu {shlex.join(argv)}`",
             f"{'finished' if done else 'in progress'} {_now()}", *args.note]
    (args.out / "report.md").write_text(
        sglang_layer.render(outcomes, title=args.title, notes=notes), encoding="utf-8")
    (args.out / "report.json").write_text(
        json.dumps({"notes": notes, "cases": sglang_layer.to_json(outcomes)}, indent=1),
        encoding="utf-8")


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the parsed GPU verb; ``argv`` (from the verb on) is recorded in the reports."""
    global _T0  # noqa: PLW0603 - the time budget counts from the start of this command
    _T0 = time.monotonic()
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        if args.gpu_command == "test":
            return cmd_test(args, argv)
        if args.gpu_command == "bench":
            return cmd_bench(args, argv)
        if args.gpu_command == "sglang-layer":
            return cmd_sglang_layer(args, argv)
        return cmd_report(args)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sm120fork.gpu``: needs neither rich nor a checkout's forks/."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        args = build_parser().parse_args(argv)
        return run(args, argv)
    except ToolkitError as err:
        print(f"error: {err.message}", file=sys.stderr)
        if err.detail:
            print(err.detail, file=sys.stderr)
        return err.exit_code
