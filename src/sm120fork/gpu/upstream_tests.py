"""An upstream PR's own GPU tests (FlashInfer's ``tests/comm``) against the stack's patched
FlashInfer and upstream's, one ``upstream-pr`` record each; the kit carries them as
``upstream-tests/<pr>/``."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sm120fork import __version__, record
from sm120fork.errors import CommandError, ConfigError
from sm120fork.gpu.core import records, runs
from sm120fork.gpu.core.documents import Environment
from sm120fork.gpu.core.variants import Variant, compile_variants, install_variant
from sm120fork.util import proc, typed

PR_FILE = "pr.json"
BASELINE = "unpatched"
_OUTCOMES = {"failure": "fail", "error": "error", "skipped": "skip"}
#: pytest -v's line of a finished case (what a run cut short leaves).
_LIVE_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR)\b")
_LIVE = {"PASSED": "pass", "FAILED": "fail", "ERROR": "error"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrTests:
    """``pr.json``: one PR's GPU tests as the kit carries them."""

    pr: str
    stack: str
    project: str
    files: tuple[str, ...]
    patches: tuple[record.TestedPatch, ...]
    notes: tuple[str, ...] = ()


def bundles(folder: Path, names: Sequence[str] = ()) -> list[tuple[Path, PrTests]]:
    """(folder, pr.json) of each PR the kit carries (``names``: only those)."""
    carried = [(path.parent, typed.read(PrTests, typed.json_file(path), path))
               for path in sorted(folder.glob(f"*/{PR_FILE}"))]
    found = [(where, pr) for where, pr in carried if not names or pr.pr in names]
    missing = sorted(set(names) - {d.pr for _, d in found})
    if missing or not found:
        have = sorted(where.name for where, _ in carried)
        raise ConfigError(f"no upstream tests of PR {', '.join(missing) or '(any)'} here "
                          f"(carried: {', '.join(have) or 'none'})", where=str(folder),
                          fix="make the kit with --harness upstream_tests --upstream-pr NAME")
    return found


def junit_cases(path: Path) -> list[tuple[str, str, str]]:
    """(id, outcome, detail) of each test case in pytest's junit XML."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, detail = "pass", f"{float(case.get('time') or 0):.0f} s"
        for child in case:
            if child.tag in _OUTCOMES:
                outcome = _OUTCOMES[child.tag]
                text = child.get("message") or child.text or child.tag
                detail = records.no_box_paths(" ".join(text.split()))[:200] or child.tag
                break
        cases.append((test_id, outcome, detail))
    return cases


def against(patched: str, baseline: str | None) -> str | None:
    """How a case of the patched build compares with upstream's (None: not comparable)."""
    if baseline is None or "skip" in (patched, baseline):
        return None
    ok, ok_before = patched == "pass", baseline == "pass"
    return {(True, True): "pass-both", (True, False): "fixed",
            (False, True): "regressed", (False, False): "fail-both"}[(ok, ok_before)]


def _pytest(variant: Variant, folder: Path, args: Sequence[str], timeout: float,
            on_line: Callable[[str], None] | None = None) -> subprocess.CompletedProcess[str]:
    return proc.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                    cwd=folder, env=variant.env(os.environ), check=False, timeout=timeout,
                    on_line=on_line)


def collect(variant: Variant, folder: Path, files: Sequence[str], pytest_args: Sequence[str],
            timeout: float) -> list[str]:
    """The test ids pytest collects with ``variant`` (what the run plans)."""
    done = _pytest(variant, folder, ["--collect-only", "-q", *files, *pytest_args], timeout)
    ids = [line.strip() for line in done.stdout.splitlines() if "::" in line]
    if not ids:
        raise ConfigError(f"pytest collected no test of {', '.join(files)}", where=str(folder),
                          fix="see pytest's message above", )
    return ids


def run_variant(variant: Variant, folder: Path, files: Sequence[str],
                pytest_args: Sequence[str], out: Path, timeout: float
                ) -> dict[str, tuple[str, str]]:
    """{case id: (outcome, detail)} of the tests run with ``variant`` (its log in ``out``)."""
    junit = out / f"{variant.name}.xml"
    junit.unlink(missing_ok=True)
    lines: list[str] = []
    try:
        _pytest(variant, folder, ["-v", "-rA", f"--junitxml={junit}", *files, *pytest_args],
                timeout, on_line=lines.append)
    except CommandError as exc:  # cut short: pytest wrote no junit, its live lines count
        lines.append(str(exc))
    (out / f"{variant.name}.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if junit.is_file():
        return {test_id: (outcome, detail) for test_id, outcome, detail in junit_cases(junit)}
    return {_case_key(m.group(1)): (_LIVE[m.group(2)], "the run was cut short after it")
            for m in map(_LIVE_LINE.match, lines) if m}


def _case_key(collected_id: str) -> str:
    """``tests/comm/test_x.py::test_y[a-b]`` -> junit's ``tests.comm.test_x::test_y[a-b]``."""
    path, _, name = collected_id.partition("::")
    module = path.removesuffix(".py").replace("/", ".")
    return f"{module}::{name.replace('::', '.')}" if "::" in name else f"{module}::{name}"


def pr_record(pr: PrTests, planned: Sequence[str],
              results: Mapping[str, Mapping[str, tuple[str, str]]], variants: Sequence[Variant],
              machine: record.Machine, command: str, notes: Sequence[str]) -> record.Record:
    """The ``upstream-pr`` record of PR ``pr``'s GPU tests: a case per test and variant."""
    cases = []
    for test_id in planned:
        key = _case_key(test_id)
        before = results.get(BASELINE, {}).get(key)
        for v in variants:
            got = results.get(v.name, {}).get(key)
            if got is None:
                continue  # never ran: the record is unfinished
            cases.append(record.Case(
                id=test_id, variant=v.name, outcome=got[0], detail=got[1],
                against=against(got[0], before[0] if before else None)
                if v.name != BASELINE else None))
    return record.make(
        kind="upstream-pr", subject=pr.pr, stack=pr.stack, command=command,
        created=records.now(),
        toolkit=__version__, machine=machine,
        tested=record.Tested(
            wheels=tuple(record.TestedWheel(variant=v.name, project=pr.project,
                                            file=v.wheel.name, sha256=v.sha256)
                         for v in variants if v.wheel is not None and v.sha256),
            patches=pr.patches),
        planned=len(planned) * len(variants), cases=tuple(cases),
        notes=(*pr.notes, *notes))


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tests", type=Path, required=True, metavar="DIR",
                   help="the PRs' tests as the kit carries them (DIR/<pr>/pr.json)")
    p.add_argument("--pr", action="append", default=[], metavar="NAME",
                   help="only this PR (default: every PR in --tests)")
    runs.variant_args(p)
    p.add_argument("--out", type=Path, required=True,
                   help="each PR's record.json and logs, under OUT/<pr>/ (nox -s "
                        "record_import -- OUT publishes them)")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="do not build the comm module first (a machine without a GPU: the "
                        "tests then skip, and the record says so)")
    p.add_argument("--compile-timeout", type=float, default=1200.0)
    p.add_argument("--timeout", type=float, default=1500.0,
                   help="per variant and PR: pytest's whole run, seconds")
    p.add_argument("pytest_args", nargs="*", metavar="PYTEST_ARG",
                   help="after --: pytest's own options, e.g. -k 'world_size'")


def run(args: argparse.Namespace, argv: Sequence[str], host: object = None) -> int:
    """Run each PR's tests with each variant; write one record per PR; 0 when all pass."""
    specs = runs.parse_variant_specs(args.wheel_dir)
    if "patched" not in specs:
        raise ConfigError("no patched variant", where="--wheel-dir",
                          fix="--wheel-dir patched=<the stack's FlashInfer wheel>")
    prebuilt = runs.parse_variant_specs(args.prebuilt)
    variants = [install_variant(n, specs[n], args.work_dir, prebuilt.get(n))
                for n in sorted(specs, key=lambda n: n != "patched")]
    run_dir = args.out / ".logs"
    run_dir.mkdir(parents=True, exist_ok=True)
    env: Environment
    notes: list[str] = []
    if args.compile:
        built = compile_variants(variants, run_dir, modules=["comm"],
                                 timeout=args.compile_timeout)
        env = built["patched"].env
        notes += [records.no_box_paths(f"the comm module of {n} did not build ({b.failure}): "
                                       "its tests JIT-build it")
                  for n, b in built.items() if not b.ok]
    else:
        from sm120fork.gpu.core.worker import environment

        env = environment()
        notes.append("run with --no-compile")
    machine = records.machine_of(env, shared=None)
    if env.get("gpu_count") == 1:
        notes.append("one GPU: the ranks of each test shared it (correctness only)")
    command = records.recorded_command("upstream-tests", argv)
    worst = 0
    for folder, pr in bundles(args.tests, args.pr):
        out = args.out / pr.pr
        out.mkdir(parents=True, exist_ok=True)
        planned = collect(variants[0], folder, pr.files, args.pytest_args,
                          args.compile_timeout)
        results = {v.name: run_variant(v, folder, pr.files, args.pytest_args, out,
                                       args.timeout) for v in variants}
        rec = pr_record(pr, planned, results, variants, machine, command, notes)
        records.write(rec, out)
        counted = ", ".join(f"{n} {k}" for k, n in rec.counts.items() if n)
        print(f"{pr.pr}: {rec.verdict} ({counted}); record: {out / record.RECORD_FILE}",
              flush=True)
        worst = max(worst, 0 if rec.verdict == "pass" else 1)
    return worst
