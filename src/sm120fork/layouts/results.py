"""What every layout's checks share: the result, running a probe, and the GPU layer
case's runner (passed in, :data:`LayerRunner`: this sits below gpu/)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from sm120fork.errors import CommandError, VerifyError
from sm120fork.layouts import CaseOutcome
from sm120fork.util import proc, typed, wire

#: A traceback's frame, its last line (the exception), and a module that is not there.
_FRAME = re.compile(r'^  File "([^"]+)", line (\d+)', re.MULTILINE)
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*$", re.MULTILINE)
_MISSING = re.compile(r"ModuleNotFoundError: No module named '(([^'.]+)[^']*)'")

#: The probe's one message: its observations (``harness.fake_gpu.emit``).
RESULT = "RESULT"
REQUIREMENTS = "pip install --group sglang-probe  # in the checkout, pip >= 25.1"


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    name: str
    capability: str
    expected: str
    observed: str
    passed: bool
    detail: str


def compact(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def setting_in(scenario: str, variable: str) -> str | None:
    """The value a case's name gives ``variable`` (``... VAR=1``), None when it gives none."""
    _, sep, value = scenario.partition(f"{variable}=")
    return value.split()[0] if sep else None


def number_in(scenario: str, key: str) -> int:
    """The number a case's name gives ``key`` (``auto tp2 nodes1`` -> 2 for ``tp``)."""
    return int(scenario.partition(f" {key}")[2].split(maxsplit=1)[0])


K = TypeVar("K")
T = TypeVar("T")


def sglang_trees(*roots: Path | None) -> None:
    for root in roots:
        if root is not None and not (root / "python" / "sglang").is_dir():
            raise VerifyError("no python/sglang package directory", where=str(root),
                              fix="pass the repository root of an SGLang tree")


def gather(jobs: Mapping[K, Callable[[], T]], workers: int | None = None) -> dict[K, T]:
    """Run ``jobs`` in threads (``workers``: one a CPU); Ctrl-C ends the running children
    and cancels the rest."""
    with ThreadPoolExecutor(max_workers=workers or min(len(jobs), os.cpu_count() or 1)) as pool:
        futures = {key: pool.submit(job) for key, job in jobs.items()}
        try:
            with proc.ending_children():
                return {key: future.result() for key, future in futures.items()}
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


@dataclass(frozen=True, kw_only=True)
class Observation:
    name: str
    observed: object
    detail: str = ""


def judged(obs: Observation, expected: object, capability: str, prefix: str, *,
           note: str = "", require_in_detail: str = "") -> CheckResult:
    """``obs`` against ``expected`` as compact JSON (and its detail holding
    ``require_in_detail``)."""
    observed = compact(obs.observed)
    return CheckResult(name=f"{prefix} {obs.name}", capability=capability,
                       expected=compact(expected), observed=observed,
                       passed=compact(expected) == observed and require_in_detail in obs.detail,
                       detail=" ".join(part for part in (obs.detail, note) if part))


#: ``run(case, sglang_path=..., layout=..., python=..., device="cpu", tokens=...,
#: timeout=..., start_timeout=...)``: :func:`sm120fork.gpu.layer.run.run_case`.
LayerRunner = Callable[..., CaseOutcome]


def probe_failure(what: str, tree: Path, fix: str, output: str) -> VerifyError:
    """Why a probe failed, by its traceback: a module missing from both tree and Python,
    else an error raised in the tree (its ``file:line``), else its output says."""
    raised = _RAISED.findall(output)
    missing = _MISSING.match(raised[-1]) if raised else None
    inside = [(f, n) for f, n in _FRAME.findall(output)
              if Path(f).resolve().is_relative_to(tree.resolve())]
    if missing and not any((root / missing.group(2)).exists() or
                           (root / f"{missing.group(2)}.py").exists()
                           for root in (tree, tree / "python")):
        return VerifyError(f"{what} could not run: this Python lacks {missing.group(2)!r}",
                           where=str(tree), fix=fix, detail=output)
    if missing and not inside:  # the probe's own import: the tree is not what it expects
        return VerifyError(f"{what} failed: the tree under test has no module "
                           f"{missing.group(1)!r}", where=str(tree), detail=output,
                           fix="check that it is a tree of the release the stack's layout "
                               "names")
    if raised and inside:
        file, line = inside[-1]
        rel = Path(file).resolve().relative_to(tree.resolve()).as_posix()
        return VerifyError(f"{what} met an error in the tree under test: {raised[-1]}",
                           where=f"{rel}:{line}", detail=output,
                           fix=f"mend the patch that changes {rel} (in {tree}), then run "
                               "it again")
    return VerifyError(f"{what} failed", where=str(tree), detail=output,
                       fix="its output (below) says why")


def run_probe(module: str, request: Mapping[str, object], *, tree: Path,
              env: Mapping[str, str], python: str | os.PathLike[str], timeout: float,
              what: str, fix: str, path: Sequence[str | Path] = ()) -> list[Observation]:
    """``python -m module request`` in ``tree``, with ``path`` and this package importable."""
    package_root = Path(__file__).resolve().parents[2]
    env = {**env, "PYTHONPATH": os.pathsep.join(map(str, [*path, package_root]))}
    try:
        with proc.sigterm_unwinds():
            completed = proc.run([python, "-m", module, json.dumps(request)],
                                 cwd=tree, env=env, timeout=timeout)
        results = wire.last(completed.stdout, RESULT)
    except wire.WireError as exc:
        raise VerifyError(f"{what} spoke another wire format: {exc.what}", where=str(tree),
                          fix=exc.fix) from exc
    except CommandError as exc:
        raise probe_failure(what, tree, fix, exc.detail or "") from exc
    if not isinstance(results, list):
        raise VerifyError(f"{what} printed no result", where=str(tree),
                          detail="\n".join(completed.stderr.splitlines()[-40:]))
    observations = []
    for i, item in enumerate(results):
        try:
            observations.append(typed.read(Observation, item, "", strict=False))
        except typed.MalformedError as exc:
            raise VerifyError(f"a probe observation is not {{name, observed, detail}}: "
                              f"{exc.key} {exc.what}", where=f"{what}: RESULT[{i}]",
                              fix="run the probe of this toolkit's version") from exc
    return observations
