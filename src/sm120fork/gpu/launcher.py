"""Start rank processes, watch them, and turn crashes and hangs into recorded failures.

Each batch of cases runs in a fresh group of rank processes.  A watchdog ends the group
when a rank exits with an error or when no rank prints anything for ``idle_timeout``
seconds; the case that was in progress is recorded as a failure with every rank's last
output lines, and the remaining cases continue in a new group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sm120fork.errors import ConfigError
from sm120fork.gpu import protocol
from sm120fork.gpu.cases import CUSTOM_API, Case
from sm120fork.gpu.safety import rank_environment
from sm120fork.util.files import sha256_file

log = logging.getLogger("sm120fork")

TAIL_LINES = 25


@dataclasses.dataclass
class GroupOutcome:
    """How a group of processes ended."""

    ok: bool
    failure: str | None = None
    kind: str | None = None  # "crash", "hang" or "fatal"
    returncodes: list[int | None] = dataclasses.field(default_factory=list)
    tails: list[list[str]] = dataclasses.field(default_factory=list)


class _Follower:
    """Reads a growing log file line by line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = ""
        self.tail: list[str] = []

    def poll(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        text = self.partial + chunk.decode("utf-8", "replace")
        lines = text.split("\n")
        self.partial = lines.pop()
        self.tail = (self.tail + lines)[-TAIL_LINES:]
        return lines

    def final_tail(self) -> list[str]:
        return (self.tail + ([self.partial] if self.partial else []))[-TAIL_LINES:]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """End a process we started and everything in its session (it is the group leader)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_group(commands: Sequence[Sequence[str]], *, envs: Sequence[Mapping[str, str]],
              log_paths: Sequence[Path], idle_timeout: float, first_timeout: float,
              on_line: Callable[[int, str], None] | None = None, fail_fast: bool = True,
              poll_interval: float = 0.1, deadline: float | None = None) -> GroupOutcome:
    """Run ``commands`` concurrently under a watchdog.

    ``first_timeout`` bounds the time to the first output line of any process,
    ``idle_timeout`` the time between lines after that.  With ``fail_fast``, the first
    process that exits non-zero (or a ``@@FATAL`` line) ends the whole group.  Past
    ``deadline`` (a ``time.monotonic()`` value) the group is ended as "budget".
    """
    procs: list[subprocess.Popen[bytes]] = []
    followers = [_Follower(p) for p in log_paths]
    for cmd, env, path in zip(commands, envs, log_paths, strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            procs.append(subprocess.Popen(
                list(cmd), stdout=out, stderr=subprocess.STDOUT, env=dict(env),
                start_new_session=True))
    seen_output = False
    last = time.monotonic()
    outcome = GroupOutcome(ok=False)
    fatal: str | None = None
    try:
        while True:
            for idx, follower in enumerate(followers):
                for line in follower.poll():
                    seen_output = True
                    last = time.monotonic()
                    parsed = protocol.parse(line)
                    if parsed and parsed[0] == "FATAL":
                        fatal = fatal or f"rank {idx}: {parsed[1]}"
                    if on_line:
                        on_line(idx, line)
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if fatal and fail_fast:
                outcome.failure, outcome.kind = fatal, "fatal"
                break
            if failed and fail_fast:
                i, c = failed[0]
                outcome.failure = f"rank {i} exited with code {c}" + (
                    f" (signal {-c})" if c is not None and c < 0 else "")
                outcome.kind = "crash"
                break
            if all(c is not None for c in codes):
                outcome.ok = not failed
                if failed:
                    outcome.failure = "; ".join(f"process {i} exited with code {c}"
                                                for i, c in failed)
                    outcome.kind = "crash"
                break
            if deadline is not None and time.monotonic() > deadline:
                outcome.failure, outcome.kind = "time budget exhausted", "budget"
                break
            limit = idle_timeout if seen_output else first_timeout
            if time.monotonic() - last > limit:
                stuck = [i for i, c in enumerate(codes) if c is None]
                outcome.failure = (f"watchdog: no output for {limit:.0f} s; ranks still running: "
                                   f"{stuck}")
                outcome.kind = "hang"
                break
            time.sleep(poll_interval)
    finally:
        for proc in procs:
            _kill(proc)
        for idx, follower in enumerate(followers):
            for line in follower.poll():
                if on_line:
                    on_line(idx, line)
    outcome.returncodes = [p.returncode for p in procs]
    outcome.tails = [f.final_tail() for f in followers]
    return outcome


# ---- variants ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class Variant:
    """One FlashInfer build under test, with its own import path and JIT cache."""

    name: str
    wheel: Path | None
    sha256: str | None
    site: Path | None
    jit_base: Path
    aot_modules: tuple[str, ...] = ()

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        paths = [str(self.site)] if self.site else []
        paths.append(str(source_root()))
        if base.get("PYTHONPATH"):
            paths.append(base["PYTHONPATH"])
        return rank_environment(base, {
            "PYTHONPATH": os.pathsep.join(paths),
            "FLASHINFER_WORKSPACE_BASE": str(self.jit_base),
        })

    def describe(self) -> dict[str, Any]:
        return {"wheel": self.wheel.name if self.wheel else None, "sha256": self.sha256,
                "site": str(self.site) if self.site else None,
                "prebuilt_modules": list(self.aot_modules)}

    def aot_dir(self) -> Path | None:
        """Where FlashInfer looks for prebuilt modules (when no flashinfer-jit-cache)."""
        return self.site / "flashinfer" / "data" / "aot" if self.site else None

    def without_prebuilt(self) -> Variant:
        """Remove the prebuilt modules so that FlashInfer JIT-compiles them instead."""
        aot = self.aot_dir()
        for module in self.aot_modules:
            if aot is not None and (aot / module).exists():
                shutil.rmtree(aot / module)
        return dataclasses.replace(self, aot_modules=())


def source_root() -> Path:
    """The directory that holds the ``sm120fork`` package (goes on the ranks' PYTHONPATH)."""
    return Path(__file__).resolve().parents[2]


def parse_variant_specs(specs: Sequence[str]) -> dict[str, Path]:
    """``NAME=DIR_OR_WHEEL`` options -> {name: path}, names unique."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"bad variant {spec!r}", where="--wheel-dir",
                              fix="write NAME=DIR, e.g. patched=wheels/sglang-0.5.10")
        if name in out:
            raise ConfigError(f"variant {name!r} given twice", where="--wheel-dir")
        out[name] = Path(path)
    return out


def find_flashinfer_wheel(path: Path) -> Path:
    if path.is_file():
        return path
    wheels = sorted(path.glob("flashinfer_python-*.whl"))
    if len(wheels) != 1:
        raise ConfigError(
            f"expected exactly one flashinfer_python-*.whl, found {len(wheels)}",
            where=str(path), fix="point --wheel-dir at a directory with one FlashInfer wheel")
    return wheels[0]


def install_variant(name: str, source: Path | None, work_dir: Path,
                    prebuilt: Path | None = None) -> Variant:
    """Install the variant's wheel into its own target directory (no index, no deps).

    ``prebuilt``: a directory of ``<module>/<module>.so`` built elsewhere from the same
    wheel (e.g. on a CPU machine with the same nvcc); they go where FlashInfer looks for
    AOT modules, which saves the minutes of JIT compilation per variant on the GPU box.
    """
    base = work_dir / name
    jit = base / "jit"
    jit.mkdir(parents=True, exist_ok=True)
    if source is None:
        return Variant(name=name, wheel=None, sha256=None, site=None, jit_base=jit)
    wheel = find_flashinfer_wheel(source)
    digest = sha256_file(wheel)
    site = base / "site"
    marker = base / "installed.sha256"
    if not (marker.exists() and marker.read_text().strip() == digest and site.is_dir()):
        if site.exists():
            shutil.rmtree(site)
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
               "--no-compile", "--target", str(site), str(wheel)]
        log.info("+ %s", " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            from sm120fork.errors import CommandError

            raise CommandError(f"installing {wheel.name} for variant {name} failed",
                               detail=(proc.stdout + proc.stderr)[-4000:])
        marker.write_text(digest + "\n")
    variant = Variant(name=name, wheel=wheel, sha256=digest, site=site, jit_base=jit)
    aot = variant.aot_dir()
    assert aot is not None
    modules: list[str] = []
    if prebuilt is not None:
        for so in sorted(prebuilt.glob("*/*.so")):
            if so.stem != so.parent.name:
                continue
            (aot / so.stem).mkdir(parents=True, exist_ok=True)
            shutil.copy2(so, aot / so.stem / so.name)
            # the sources digest a patched FlashInfer checks before it loads a prebuilt
            # module (patches/sglang-0.5.10/flashinfer/README-prebuilt.md)
            marker = so.with_name(so.name + ".sources")
            if marker.is_file():
                shutil.copy2(marker, aot / so.stem / marker.name)
            modules.append(so.stem)
        if not modules:
            raise ConfigError("no <module>/<module>.so files", where=str(prebuilt),
                              fix="point --prebuilt at a FlashInfer cached_ops directory")
    return dataclasses.replace(variant, aot_modules=tuple(modules))


# ---- compile ---------------------------------------------------------------------------
def compile_variants(variants: Sequence[Variant], run_dir: Path, *, modules: Sequence[str],
                     timeout: float) -> dict[str, dict[str, Any]]:
    """JIT-build each variant's modules once, all variants in parallel.

    Returns per variant: {"ok", "env" (the probe's environment), "failure", "tail"}.
    """
    spec = run_dir / "compile-spec.json"
    spec.write_text(json.dumps({"mode": "compile", "modules": list(modules)}))
    envs: dict[int, dict[str, Any]] = {}

    def on_line(idx: int, line: str) -> None:
        parsed = protocol.parse(line)
        if parsed and parsed[0] == "ENV":
            envs[idx] = parsed[1]

    outcome = run_group(
        [[sys.executable, "-m", "sm120fork.gpu.worker", str(spec)] for _ in variants],
        envs=[v.env(os.environ) for v in variants],
        log_paths=[run_dir / f"compile-{v.name}.log" for v in variants],
        idle_timeout=timeout, first_timeout=timeout, on_line=on_line, fail_fast=False)
    result = {}
    for idx, v in enumerate(variants):
        rc = outcome.returncodes[idx]
        ok = rc == 0
        last = next((line for line in reversed(outcome.tails[idx]) if line.strip()), "")
        failure = None if ok else (f"exit code {rc}: {last}" if rc is not None
                                   else outcome.failure)
        result[v.name] = {"ok": ok, "env": envs.get(idx, {}), "failure": failure,
                          "tail": outcome.tails[idx]}
    return result


# ---- correctness batches ---------------------------------------------------------------
def _merge(case: Case, records: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One record per case from every rank's record (a case passes only if all ranks do)."""
    statuses = {r["status"] for r in records.values()}
    merged: dict[str, Any] = {"key": case.key, "case": case.to_dict()}
    if statuses == {"skip"}:
        merged.update(status="skip", reason=next(iter(records.values())).get("reason"))
        return merged
    failing = sorted(r for r, rec in records.items() if rec["status"] != "pass")
    checks: dict[tuple[str, str], dict[str, Any]] = {}
    for rec in records.values():
        for check in rec.get("checks", []):
            k = (check["output"], check["stage"])
            old = checks.get(k)
            if old is None or (old["ok"] and not check["ok"]) or (
                    old["ok"] == check["ok"] and (check.get("rel_l2") or 0) >
                    (old.get("rel_l2") or 0)):
                checks[k] = check
    merged["checks"] = list(checks.values())
    if not failing:
        merged["status"] = "pass"
        return merged
    first = records[failing[0]]
    merged.update(status="fail", failure=first.get("failure") or "wrong result",
                  failing_ranks=failing)
    reasons = [c["reason"] for c in checks.values() if not c["ok"]]
    merged["reason"] = first.get("reason") or ("; ".join(f"{c['output']} ({c['stage']}): "
                                                        f"{c['reason']}"
                                                        for c in checks.values()
                                                        if not c["ok"])[:1500])
    if not merged["reason"] and reasons:
        merged["reason"] = reasons[0]
    if first.get("traceback"):
        merged["traceback"] = first["traceback"]
    return merged


def _not_run(case: Case) -> dict[str, Any]:
    return {"key": case.key, "case": case.to_dict(), "status": "skip",
            "reason": "not run: the run's time budget (--time-budget) was used up"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timeouts:
    startup: float = 300.0  # to the first line: interpreter, torch, FlashInfer load, gloo
    case: float = 90.0  # between lines once running (a case prints START and RESULT)
    deadline: float | None = None  # time.monotonic() after which no case starts
    #: circuit breaker: after this many hangs (crashes) in a row of one API, the rest of
    #: that API's cases in the batch are reported as not attempted
    max_hang_streak: int = 4
    max_crash_streak: int = 12


def _run_ranks(worker: Sequence[str], spec_path: Path, world: int, variant: Variant,
               log_stem: Path, timeouts: Timeouts, on_line: Callable[[int, str], None]
               ) -> GroupOutcome:
    """One worker process per rank on ``spec_path``, logging to ``<log_stem>-rank<r>.log``."""
    return run_group(
        [[*worker, str(spec_path), str(r)] for r in range(world)],
        envs=[variant.env(os.environ)] * world,
        log_paths=[log_stem.with_name(f"{log_stem.name}-rank{r}.log") for r in range(world)],
        idle_timeout=timeouts.case, first_timeout=timeouts.startup, on_line=on_line,
        deadline=timeouts.deadline)


def run_cases(cases: Sequence[Case], variant: Variant, run_dir: Path, *,
              backend: str = "trtllm", allow_multicast: bool = False,
              timeouts: Timeouts = Timeouts(),
              worker: Sequence[str] = (sys.executable, "-m", "sm120fork.gpu.worker"),
              progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run ``cases`` (one world size) for ``variant``; crashes and hangs become failures."""
    if not cases:
        return []
    world = cases[0].world_size
    if any(c.world_size != world for c in cases):
        raise ConfigError("run_cases takes cases of one world size")
    pending = list(cases)
    label = "custom" if all(c.api == CUSTOM_API for c in cases) else "fusion"
    results: dict[str, dict[str, Any]] = {}
    attempt = 0
    startup_failures = 0
    streaks: dict[str, dict[str, int]] = {}
    env_info: dict[str, Any] = {}
    while pending:
        if timeouts.deadline is not None and time.monotonic() > timeouts.deadline:
            for case in pending:
                results[case.key] = _not_run(case)
            break
        attempt += 1
        tag = f"{variant.name}-ws{world}-{label}-a{attempt}"
        spec_path = run_dir / f"spec-{tag}.json"
        store = run_dir / f"store-{tag}"
        if store.exists():
            store.unlink()
        custom = [c for c in pending if c.api == CUSTOM_API]
        spec_path.write_text(json.dumps({
            "mode": "test", "world_size": world, "store": str(store),
            "backend": backend, "allow_multicast": allow_multicast,
            "max_tokens": max(c.tokens for c in pending),
            "max_hidden": max(c.hidden for c in pending),
            "custom_max_tokens": max((c.tokens for c in custom), default=1),
            "cases": [c.to_dict() for c in pending]}))
        per_rank: dict[str, dict[int, dict[str, Any]]] = {}
        started: list[str] = []

        def on_line(rank: int, line: str, per_rank: dict[str, dict[int, dict[str, Any]]]
                    = per_rank, started: list[str] = started) -> None:
            parsed = protocol.parse(line)
            if not parsed:
                return
            tag_, payload = parsed
            if tag_ == "START":
                started.append(payload)
            elif tag_ == "RESULT":
                per_rank.setdefault(payload["key"], {})[rank] = payload
            elif tag_ == "ENV":
                env_info.update(payload)

        outcome = _run_ranks(worker, spec_path, world, variant, run_dir / tag, timeouts,
                             on_line)
        remaining = []
        for case in pending:
            recs = per_rank.get(case.key, {})
            if len(recs) == world:
                results[case.key] = _merge(case, recs)
            else:
                remaining.append(case)
        if progress:
            progress(f"{tag}: {len(pending) - len(remaining)} cases done, "
                     f"{len(remaining)} left" + (f"; {outcome.failure}" if outcome.failure
                                                 else ""))
        if not remaining:
            break
        tails = {f"rank{r}": t for r, t in enumerate(outcome.tails)}
        if outcome.kind == "budget":
            for case in remaining:
                results[case.key] = _not_run(case)
            break
        if outcome.ok or outcome.kind == "fatal":
            why = outcome.failure or "ranks exited without reporting these cases"
            for case in remaining:
                results[case.key] = {"key": case.key, "case": case.to_dict(), "status": "fail",
                                     "failure": outcome.kind or "error",
                                     "reason": f"not run: {why}", "log_tail": tails}
            break
        in_progress = [c for c in remaining if c.key in set(started)]
        if not in_progress:
            # Nothing was running when the group ended: a crash between cases (after a
            # case that reported, e.g. a CUDA error that poisoned the context) or a
            # start-up failure.  Retry; two start-up failures in a row with no progress
            # mean the ranks cannot start.
            progressed = len(remaining) < len(pending)
            startup_failures = 0 if progressed else startup_failures + 1
            if startup_failures >= 2:
                for case in remaining:
                    results[case.key] = {
                        "key": case.key, "case": case.to_dict(), "status": "fail",
                        "failure": outcome.kind or "error",
                        "reason": f"not run: ranks failed twice before a case: "
                                  f"{outcome.failure}", "log_tail": tails}
                break
            pending = remaining
            continue
        startup_failures = 0
        for case in pending:
            if case.key in results and results[case.key].get("failure") not in ("crash", "hang"):
                streaks.pop(case.api, None)
        culprit = in_progress[0]
        partial = per_rank.get(culprit.key, {})
        reason = outcome.failure or "ranks ended"
        detail = [rec.get("reason") for rec in partial.values() if rec.get("reason")]
        results[culprit.key] = {
            "key": culprit.key, "case": culprit.to_dict(), "status": "fail",
            "failure": outcome.kind or "crash",
            "reason": reason + (f"; {detail[0]}" if detail else ""),
            "reported_ranks": sorted(partial), "log_tail": tails}
        pending = [c for c in remaining if c is not culprit]
        kind = outcome.kind or "crash"
        streak = streaks.setdefault(culprit.api, {"crash": 0, "hang": 0})
        streak[kind if kind in streak else "crash"] += 1
        if (streak["hang"] >= timeouts.max_hang_streak
                or streak["crash"] >= timeouts.max_crash_streak):
            why = (f"not attempted: {streak['hang']} hangs / {streak['crash']} crashes in a row "
                   f"for {culprit.api} (circuit breaker)")
            for case in [c for c in pending if c.api == culprit.api]:
                results[case.key] = {"key": case.key, "case": case.to_dict(),
                                     "status": "fail", "failure": "not attempted",
                                     "reason": why}
            pending = [c for c in pending if c.api != culprit.api]
    ordered = [results[c.key] for c in cases if c.key in results]
    if env_info and ordered:
        ordered[0].setdefault("env", env_info)
    return ordered


def run_bench(plan_dict: dict[str, Any], variant: Variant, run_dir: Path, *,
              backend: str = "trtllm", allow_multicast: bool = False,
              timeouts: Timeouts = Timeouts(),
              worker: Sequence[str] = (sys.executable, "-m", "sm120fork.gpu.worker"),
              ) -> tuple[list[dict[str, Any]], dict[str, Any], GroupOutcome]:
    """Run one bench group; returns (bench records, environment, outcome)."""
    world = int(plan_dict["world_size"])
    spec_path = run_dir / f"spec-bench-{variant.name}.json"
    store = run_dir / f"store-bench-{variant.name}"
    if store.exists():
        store.unlink()
    spec_path.write_text(json.dumps({
        "mode": "bench", "world_size": world, "store": str(store), "backend": backend,
        "allow_multicast": allow_multicast, "max_tokens": max(plan_dict["tokens"]),
        "max_hidden": max(plan_dict["hidden"]), "bench": plan_dict}))
    records: list[dict[str, Any]] = []
    env_info: dict[str, Any] = {}

    def on_line(rank: int, line: str) -> None:
        parsed = protocol.parse(line)
        if not parsed:
            return
        if parsed[0] == "BENCH" and (rank == 0 or parsed[1].get("kind") != "point"):
            if rank == 0:
                records.append(parsed[1])
        elif parsed[0] == "ENV":
            env_info.update(parsed[1])

    outcome = _run_ranks(worker, spec_path, world, variant,
                         run_dir / f"bench-{variant.name}", timeouts, on_line)
    return records, env_info, outcome
