"""SGLang's own fused-norm layer path, rank against rank, on a GPU or (faked) on the CPU.

For each case a fresh group of rank processes (:mod:`sm120fork.gpu.sglang_rank`) imports
the SGLang tree under test, and this module judges what they report:

- ``fused``: the gate takes the fused path on every rank and the fused kernel's norm and
  residual match the float32 reference at every token count;
- a workspace-creation fault on every rank or on one rank only (before any collective,
  between two of FlashInfer's handle exchanges, after the last one) and a host-side
  error of the fused call: every rank falls back (S4: together; S3: the fallback
  all-reduces, so its output still matches), each logs exactly one warning, the gate
  stays off afterwards, and no rank hangs (a watchdog ends a case that outlives
  ``timeout`` and records it as hung);
- ``one-rank-fused-call-raises`` (rank 1) and ``rank-0-fused-call-raises``: the fused
  call raises on one rank only, so its peers wait inside the fused kernel for its data
  and no fallback can match them: as S4's and G6's headers say, that rank must end with
  one RuntimeError saying so within the agreement timeout (their
  ``_FUSED_CALL_AGREEMENT_TIMEOUT_S``, set by ``agreement_timeout_s``), and no peer may
  outlive it by more than ``PEER_GRACE_S`` (a peer still running then is stopped and
  recorded as such: on a GPU it spins in the kernel; the CPU stand-in's kernel is a gloo
  all-reduce, which fails once the raising rank has exited).  The rank-1 case is the one
  torch's gloo ``monitored_barrier`` does not bound: there its send to rank 0 waits with
  the group's own timeout (SGLang's TP CPU group: 120 min), not the barrier's.

Processes run with the multicast switches off (``NCCL_NVLS_ENABLE=0`` ...); the TP group
is a gloo group, so nothing here creates a multicast object or an NCCL communicator.
This module imports neither torch nor SGLang: the CPU checks and the tests use it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sm120fork.errors import ConfigError
from sm120fork.gpu.safety import rank_environment
from sm120fork.layouts import LAYOUTS, adapter
from sm120fork.util import proc as proc_mod

RANK_MODULE = "sm120fork.gpu.sglang_rank"
RESULT_MARKER = "SM120FORK-SGLANG-RANK "
READY_MARKER = "SM120FORK-SGLANG-READY"
RAISED_MARKER = "SM120FORK-SGLANG-RAISED "

#: The cases, in the order they run; "no-p2p" needs distinct devices and the POSIX-fd
#: exchange case a stand-in of FlashInfer 0.6.7's exchanger (CPU only here).
GPU_CASES = ("fused", "all-ranks-create-fails", "one-rank-create-fails",
             "one-rank-fails-midway", "one-rank-fails-late", "fused-call-raises")
#: Cases a run names with ``--case`` (on a GPU too): the fused call raising on one rank.
ALONE_CASES = ("one-rank-fused-call-raises", "rank-0-fused-call-raises")
CPU_CASES = (*GPU_CASES, "no-p2p", "one-rank-fails-in-fd-exchange", *ALONE_CASES)
#: case -> the rank whose fused call raises alone (the ranks' CASES say the same).
RAISES_ALONE = {"one-rank-fused-call-raises": 1, "rank-0-fused-call-raises": 0}
#: How long the harness lets the other ranks run on after one exited with an error.
PEER_GRACE_S = 2.0
#: What the raising rank may take beyond the agreement timeout (a loaded machine).
ALONE_SLACK_S = 5.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaseOutcome:
    """One case: what every rank reported, and the verdict."""

    case: str
    passed: bool
    hung: bool
    problems: list[str]
    ranks: list[dict[str, Any]]
    seconds: float
    tails: list[str]
    #: how each rank ended: ``rank``, ``exit`` (its status), ``stopped_by_harness`` (still
    #: running when the case ended), ``ended_after_ready_s`` (when it exited by itself,
    #: seconds after every rank was ready) and ``raised`` (its error line, or None)
    exits: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _parse(stdout: str, marker: str = RESULT_MARKER) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(marker):
            result: dict[str, Any] = json.loads(line.removeprefix(marker))
            return result
    return None


_VERSION = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?["']([^"']+)["']""", re.M)


def layout_of(sglang_path: Path, root: Path | None = None) -> str:
    """The upstream layout the stacks (``forks/*.toml``) name for the SGLang release under
    ``sglang_path`` (its ``sglang/version.py`` or ``_version.py``, local label ignored)."""
    from packaging.version import InvalidVersion, Version

    from sm120fork.workspace import Workspace

    found = ""
    for name in ("_version.py", "version.py"):
        path = sglang_path / "sglang" / name
        match = _VERSION.search(path.read_text(encoding="utf-8")) if path.is_file() else None
        if match:
            found = match.group(1)
            break
    try:
        version = Version(found).public
    except InvalidVersion:
        raise ConfigError(f"no SGLang version found under {sglang_path}",
                          fix="pass --layout (one of: " + ", ".join(LAYOUTS) + ")") from None
    ws = Workspace.find(root)
    layouts = {p.layout for s in ws.stacks().values() for p in s.projects
               if p.normalized_name == "sglang" and p.layout
               and Version(p.version).public == version}
    if len(layouts) != 1:
        raise ConfigError(f"no one stack in {ws.forks_dir.name}/ pins SGLang {version} with a "
                          f"layout ({', '.join(sorted(layouts)) or 'none'})",
                          fix="pass --layout (one of: " + ", ".join(LAYOUTS) + ")")
    return layouts.pop()


def warning_says(layout: str) -> str:
    """What the one fallback warning must say, in the layout's words (its adapter's)."""
    return str(adapter(layout, "rank").WARNING_SAYS)


def raised_alone_says(layout: str) -> str:
    """What the error of a rank whose fused call raised alone must say (its adapter's)."""
    return str(adapter(layout, "rank").RAISED_ALONE_SAYS)


def alone_problems(case: str, exits: Sequence[Mapping[str, Any]], *, layout: str,
                   ) -> list[str]:
    """What is wrong with how the ranks ended in a case whose fused call raised on one
    rank only (``RAISES_ALONE``): that rank ends with one RuntimeError in the layout's
    words within its agreement timeout (plus ``ALONE_SLACK_S``); every peer ends too, by
    its own error or stopped by the harness after the raising rank's exit; no rank
    finishes the case as if nothing happened.  A hang is the harness's own problem."""
    alone = RAISES_ALONE[case]
    says = raised_alone_says(layout)
    problems: list[str] = []
    for ended in exits:
        who = f"rank {ended['rank']}"
        raised: Mapping[str, Any] | None = ended.get("raised")
        if ended["exit"] == 0 and raised is None:
            problems.append(f"{who}: finished the case although the fused call raised on "
                            f"rank {alone} only")
            continue
        if ended["rank"] != alone:
            continue
        if raised is None:
            problems.append(f"{who}: its fused call raised alone, but it ended without "
                            f"an error (exit {ended['exit']}, stopped by the harness: "
                            f"{ended['stopped_by_harness']})")
            continue
        error = str(raised["error"])
        if not error.startswith("RuntimeError: ") or says not in error:
            problems.append(f"{who}: expected one RuntimeError saying {says!r}, got "
                            f"{error[:300]!r}")
        bound, took = raised.get("agreement_timeout_s"), raised.get("after_fused_call_error_s")
        if bound is None:
            problems.append(f"{who}: the tree under test has no agreement timeout "
                            "(_FUSED_CALL_AGREEMENT_TIMEOUT_S in its fusion module)")
        elif took is None or float(took) > float(bound) + ALONE_SLACK_S:
            problems.append(f"{who}: its error came {took} s after the fused call raised, "
                            f"beyond its {bound:g} s agreement timeout")
    return problems


def expected_problems(case: str, ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    """What is wrong with the ranks' reports for ``case`` (empty: the case passed)."""
    problems: list[str] = []
    for obs in ranks:
        who = f"rank {obs['rank']}"
        says = warning_says(str(obs["layout"]))
        wrong = [s["tokens"] for s in obs["steps"] if not s["correct"]]
        if wrong:
            problems.append(f"{who}: output differs from the reference at tokens {wrong}")
        paths = {s["path"] for s in obs["steps"]}
        warnings = obs["warnings"]
        if case == "fused":
            if paths != {"fused"}:
                problems.append(f"{who}: expected the fused path throughout, got {sorted(paths)}")
            if warnings:
                problems.append(f"{who}: unexpected warnings {warnings}")
            continue
        if "fused" in paths:
            problems.append(f"{who}: took the fused path although fusion failed")
        if len(warnings) != 1:
            problems.append(f"{who}: expected exactly one warning, got {len(warnings)}")
        elif "\n" in warnings[0] or says not in warnings[0]:
            problems.append(f"{who}: the warning is not one line saying {says!r}: "
                            f"{warnings[0][:300]!r}")
        if obs["gate_after"] or not obs["unavailable"]:
            problems.append(f"{who}: fusion is still on after the failure")
        alive = obs.get("fake_buffers_alive")
        if case == "fused-call-raises":
            # CUDA graphs captured before the failing call still hold the workspace's
            # pointers and replay the fused kernel: it must stay allocated (issue 19).
            if alive == 0:
                problems.append(f"{who}: the workspace was freed after the fused call "
                                "failed, while captured CUDA graphs may still use it")
        elif alive:
            problems.append(f"{who}: {alive} workspace buffers not freed")
    if case != "fused" and ranks and len({s["path"] for o in ranks for s in o["steps"][:1]}) > 1:
        problems.append("the ranks took different paths on the first call")
    return problems


def run_case(case: str, *, sglang_path: Path, python: str | os.PathLike[str] = sys.executable,
             device: str = "cuda", world_size: int = 2, tokens: Sequence[int] | None = None,
             hidden: int | None = None, timeout: float = 120.0, start_timeout: float = 300.0,
             extra_path: Sequence[Path] = (), env: Mapping[str, str] | None = None,
             gates_in_memory: bool = False, layout: str,
             load_plugins: bool = False, agreement_timeout_s: float | None = None,
             collective_timeout_s: float | None = None) -> CaseOutcome:
    """Run ``case`` on ``world_size`` fresh rank processes; judge their reports.

    ``start_timeout`` bounds the imports and set-up (until every rank says it is ready);
    ``timeout`` bounds the case itself from then on: a rank still running after it hangs.
    Once a rank exits with an error the others get ``PEER_GRACE_S``, then are stopped.
    ``agreement_timeout_s`` sets the tree's fused-call agreement timeout (None: its own);
    ``collective_timeout_s`` the ranks' gloo groups' timeout (None: twice ``timeout``).
    """
    package_root = Path(__file__).resolve().parents[2]
    pythonpath = [str(sglang_path), *map(str, extra_path), str(package_root)]
    port = _free_port()
    started = time.monotonic()
    procs: list[tuple[subprocess.Popen[bytes], Any, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sm120fork-sglang-layer-") as tmp, \
            proc_mod.ProcessGroup() as group:
        for rank in range(world_size):
            request: dict[str, Any] = {
                "rank": rank, "world_size": world_size, "case": case, "device": device,
                "init_method": f"tcp://127.0.0.1:{port}",
                "collective_timeout_s": collective_timeout_s or timeout * 2,
                "gates_in_memory": gates_in_memory,
                "layout": layout,
                "load_plugins": load_plugins,
                "fused_call_agreement_timeout_s": agreement_timeout_s,
            }
            if tokens is not None:
                request["tokens"] = list(tokens)
            if hidden is not None:
                request["hidden"] = hidden
            rank_env = rank_environment({**os.environ, **(env or {})})
            rank_env["PYTHONPATH"] = os.pathsep.join(pythonpath)
            rank_env["PYTHONUNBUFFERED"] = "1"
            out = open(Path(tmp) / f"rank{rank}.out", "w+b")
            err = open(Path(tmp) / f"rank{rank}.err", "w+b")
            proc = group.start([python, "-m", RANK_MODULE, json.dumps(request)],
                               env=rank_env, stdout=out, stderr=err)
            procs.append((proc, out, err))
        hung = False
        deadline = started + start_timeout
        ready = False
        ready_at = started
        ended_at: dict[int, float] = {}

        def note_ended() -> None:
            for r, (p, _, _) in enumerate(procs):
                if r not in ended_at and p.poll() is not None:
                    ended_at[r] = time.monotonic()

        while any(p.poll() is None for p, _, _ in procs):
            note_ended()
            if not ready and all(READY_MARKER in (Path(tmp) / f"rank{r}.out").read_text(
                    errors="replace") for r in range(world_size)):
                ready = True
                ready_at = time.monotonic()
                deadline = ready_at + timeout
            if time.monotonic() > deadline:
                hung = True
                break
            if any(p.returncode not in (None, 0) for p, _, _ in procs):
                # let the peers finish or fail, then stop them
                grace = time.monotonic() + PEER_GRACE_S
                while time.monotonic() < grace and any(p.poll() is None for p, _, _ in procs):
                    note_ended()
                    time.sleep(0.1)
                break
            time.sleep(0.1)
        note_ended()
        group.kill()
        reports, tails, problems, exits = [], [], [], []
        for rank, (proc, out, err) in enumerate(procs):
            out.seek(0)
            err.seek(0)
            stdout = out.read().decode("utf-8", "replace")
            stderr = err.read().decode("utf-8", "replace")
            out.close()
            err.close()
            report = _parse(stdout)
            raised = _parse(stdout, RAISED_MARKER)
            useful = [line for line in stderr.splitlines() if "registered at" not in line]
            tails.append(f"rank {rank} (exit {proc.returncode}): "
                         + "\n".join(useful[-20:]))
            exits.append({
                "rank": rank, "exit": proc.returncode, "stopped_by_harness": rank not in ended_at,
                "ended_after_ready_s": round(ended_at[rank] - ready_at, 1)
                if rank in ended_at else None,
                "raised": raised})
            if report is None and case not in RAISES_ALONE:
                said = f": {str(raised['error'])[:300]}" if raised else ""
                problems.append(f"rank {rank}: {'hung' if hung else 'exited'} without a "
                                f"result (exit {proc.returncode}){said}")
            elif report is not None:
                reports.append(report)
    if hung:
        limit = f"{timeout:.0f} s after every rank was ready" if ready else (
            f"{start_timeout:.0f} s, before every rank was ready")
        problems.insert(0, f"hung: not finished {limit}")
    if case in RAISES_ALONE:
        problems += alone_problems(case, exits, layout=layout)
    elif len(reports) == world_size:
        problems += expected_problems(case, reports)
    return CaseOutcome(case=case, passed=not problems, hung=hung, problems=problems,
                       ranks=reports, seconds=round(time.monotonic() - started, 1),
                       tails=[] if not problems else tails, exits=exits)


def run_cases(cases: Sequence[str], **kwargs: Any) -> list[CaseOutcome]:
    """Each case in its own fresh group of ranks, one after the other."""
    return [run_case(case, **kwargs) for case in cases]


def render(outcomes: Sequence[CaseOutcome], *, title: str, notes: Sequence[str]) -> str:
    """A Markdown report: one row per case and rank, then the notes and any failures."""
    lines = [f"# {title}", ""]
    lines += [f"- {note}" for note in notes]
    lines += ["", "| case | verdict | rank | injected | paths | max rel. error (norm / "
              "residual) | warnings | fusion after | s |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for outcome in outcomes:
        verdict = "PASS" if outcome.passed else ("HUNG" if outcome.hung else "FAIL")
        if not outcome.ranks and outcome.exits:  # a case that ends in errors
            for ended in outcome.exits:
                raised = ended.get("raised") or {}
                how = ("stopped by the harness" if ended["stopped_by_harness"] else
                       f"exit {ended['exit']} at {ended['ended_after_ready_s']} s")
                took = raised.get("after_fused_call_error_s")
                error = str(raised.get("error", "-")).replace("|", "/")
                lines.append(f"| {outcome.case} | {verdict} | {ended['rank']} | "
                             f"{'fused-call-raises' if took is not None else '-'} | "
                             f"ended: {how}"
                             f"{f', {took} s after its fused call raised' if took else ''}"
                             f" | - | {error[:160]} | - | {outcome.seconds} |")
        elif not outcome.ranks:
            lines.append(f"| {outcome.case} | {verdict} | - | - | - | - | - | - | "
                         f"{outcome.seconds} |")
        for obs in outcome.ranks:
            steps = obs["steps"]
            paths = "/".join(sorted({s["path"] for s in steps}))
            err_n = max(s["norm_error"] for s in steps)
            err_r = max(s["residual_error"] for s in steps)
            lines.append(
                f"| {outcome.case} | {verdict} | {obs['rank']} | {obs['injected'] or '-'} | "
                f"{paths} | {err_n:.2e} / {err_r:.2e} | {len(obs['warnings'])} | "
                f"{'on' if obs['gate_after'] else 'off'} | {outcome.seconds} |")
    plugin: list[str] = next((obs["plugin"] for o in outcomes for obs in o.ranks
                              if obs.get("plugin")), [])
    if plugin:
        lines += ["", "## What the plugin logged (first rank that ran it)", ""]
        lines += [f"- `{line}`" for line in plugin]
    warned = [(o.case, obs["rank"], obs["warnings"][0]) for o in outcomes for obs in o.ranks
              if obs["warnings"]]
    if warned:
        lines += ["", "## The warning each rank logged", ""]
        lines += [f"- {case}, rank {rank}: `{text}`" for case, rank, text in warned]
    failed = [o for o in outcomes if not o.passed]
    if failed:
        lines += ["", "## Problems", ""]
        for outcome in failed:
            lines += [f"- {outcome.case}: {p}" for p in outcome.problems]
            lines += ["", "```", *outcome.tails, "```"]
    return "\n".join(lines) + "\n"


def to_json(outcomes: Sequence[CaseOutcome]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(o) for o in outcomes]
