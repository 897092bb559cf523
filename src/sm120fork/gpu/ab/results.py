"""What crosses the A/B's processes: a case's :class:`CaseResult` and the run's
``test-ab.json`` (:class:`AbRun`), serialized once at the edge and read back by
``util.typed.read``; and ``test-ab.json`` rendered as markdown."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sm120fork.errors import ConfigError
from sm120fork.gpu.core.cases import Case
from sm120fork.gpu.core.documents import Environment, MadeFrom, VariantInfo
from sm120fork.gpu.core.report import built_manifest, completion_lines, env_lines, made_from
from sm120fork.util import portable, typed
from sm120fork.util.portable import markdown_table as _md_table


@dataclasses.dataclass(frozen=True, kw_only=True)
class Check:
    output: str
    stage: str
    ok: bool
    kind: str = ""
    rel_l2: float | None = None
    max_abs: float | None = None
    nonfinite: int = 0
    reason: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaseResult:
    """One case's result: one rank's (``rank`` set), or every rank's merged (``case`` set)."""

    key: str
    status: str
    case: Case | None = None
    rank: int | None = None
    failure: str | None = None
    reason: str | None = None
    checks: tuple[Check, ...] = ()
    note: str | None = None
    traceback: str | None = None
    #: left out by the time budget: a skip that says so, never a pass
    not_run: bool = False
    failing_ranks: tuple[int, ...] = ()
    reported_ranks: tuple[int, ...] = ()
    log_tail: Mapping[str, tuple[str, ...]] | None = None

    @property
    def worst(self) -> float | None:
        """The largest relative L2 error of its checks (None: no check measured one)."""
        return max((c.rel_l2 for c in self.checks if c.rel_l2 is not None), default=None)

    @property
    def never_ran(self) -> bool:
        return self.not_run or self.failure == "build"

    @classmethod
    def failed(cls, case: Case, failure: str, reason: str, **more: Any) -> CaseResult:
        return cls(key=case.key, case=case, status="fail", failure=failure, reason=reason,
                   **more)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AbRun:
    """``test-ab.json``: each variant's case results and what the report says of the run."""

    kind: str = "gpu-test"
    created: str = "?"
    command: str = "python -m sm120fork.gpu test"
    title: str = ""
    environment: Environment = dataclasses.field(default_factory=Environment)
    shared: bool = False
    quick: bool = False
    world_sizes: tuple[int, ...] = ()
    primary: str
    baseline: str | None = None
    variants: Mapping[str, VariantInfo] = dataclasses.field(default_factory=dict)
    tolerances: tuple[tuple[str, str], ...] = ()
    not_run: tuple[str, ...] = ()
    results: Mapping[str, tuple[CaseResult, ...]]
    module_seconds: float | None = None
    time_budget: float | None = None
    finished: bool | None = None
    stack: str | None = None
    made_from: tuple[MadeFrom, ...] | None = None

    @classmethod
    def read(cls, data: object, where: str) -> AbRun:
        run = typed.read(cls, data, where, strict=False)
        if run.primary not in run.results:
            raise ConfigError(f"names no results of the primary variant {run.primary!r}",
                              where=f"{where}: results",
                              fix=f"known: {', '.join(run.results) or 'none'}")
        return run


def _modules(info: VariantInfo) -> str:
    if not info.get("compiled", True):
        return f"build FAILED: {info.get('compile_failure')}"
    if info.get("prebuilt_modules"):
        return ("prebuilt from this wheel's sources: " + ", ".join(info["prebuilt_modules"]))
    if info.get("prebuilt_failure"):
        return "JIT-compiled here (prebuilt modules failed to load)"
    return "JIT-compiled here"


def classify(statuses: dict[str, str], primary: str, baseline: str | None) -> str:
    """A/B class of one case: fixed, regressed, pass, fail, skip, or the primary's status."""
    p = statuses.get(primary, "missing")
    if baseline is None:
        return p
    b = statuses.get(baseline, "missing")
    if p == b == "skip":
        return "skip"
    ab = {(True, True): "pass both", (True, False): "fixed", (False, True): "regressed"}
    return ab.get((p == "pass", b == "pass")) or ("fail both" if p == "fail" else f"{p}/{b}")


_METHOD = (
    "Each rank regenerates every rank's input from the case seed; the reference is the fp32 "
    "sum of all inputs, fp32 residual add and fp32 RMSNorm (eps 1e-6). Outputs are NaN-filled "
    "before every call. Each case runs eagerly, then is captured in a CUDA graph and replayed "
    "twice (the legacy custom all-reduce's lamport path captures three calls with consecutive "
    "flags; its non-lamport path, whose barriers compare against a host-side flag, runs three "
    "eager calls instead). A crashed or hung case is ended by the watchdog and recorded as a "
    "failure with the ranks' last output.")


class AbTable:
    """An A/B run's case keys in run order, {key: {variant: record}} and each case's class."""

    def __init__(self, doc: AbRun) -> None:
        self.primary, self.baseline = doc.primary, doc.baseline
        self.variants = list(doc.results)
        self.rows: dict[str, dict[str, CaseResult]] = defaultdict(dict)
        for variant, records in doc.results.items():
            for rec in records:
                self.rows[rec.key][variant] = rec
        self.order = list(self.rows)
        self.cases = {r.key: r.case for recs in doc.results.values() for r in recs if r.case}
        self.cls = {k: classify({v: r.status for v, r in self.rows[k].items()},
                                self.primary, self.baseline) for k in self.order}

    def counts(self) -> dict[str, int]:
        """How many cases are in each A/B class (``not run``: some variant never ran it)."""
        return dict(sorted(Counter(
            "not run" if any(r.never_ran for r in self.rows[k].values()) else self.cls[k]
            for k in self.order).items()))

    def summary(self) -> list[str]:
        groups: dict[tuple[int, str], list[str]] = defaultdict(list)
        for key in self.order:
            groups[(self.cases[key].world_size, self.cases[key].api)].append(key)
        header = ["api", "world size"] + [f"{v} pass/fail/skip" for v in self.variants]
        ab = ("fixed", "regressed", "pass both", "fail both") if self.baseline else ()
        rows = []
        for (ws, api), keys in sorted(groups.items()):
            counts = [Counter(self.rows[k][v].status for k in keys if v in self.rows[k])
                      for v in self.variants]
            classes = Counter(self.cls[k] for k in keys)
            rows.append([api, ws, *(f"{n['pass']}/{n['fail']}/{n['skip']}" for n in counts),
                         *(classes[c] for c in ab)])
        total = Counter(self.cls.values())
        return [*_md_table([*header, *ab], rows), "",
                "Totals: " + ", ".join(f"{k}: {n}" for k, n in sorted(total.items())), ""]

    def detail(self, title: str, keys: list[str], note: str = "") -> list[str]:
        lines = [f"## {title}", "", *([note, ""] if note else [])]
        if not keys:
            return [*lines, "None.", ""]
        body = []
        for k in keys:
            recs = self.rows[k]
            first_fail = (v for v in (self.baseline, self.primary)
                          if v and (r := recs.get(v)) and r.status == "fail")
            reason = next((f"{v}: {recs[v].reason}"[:300] for v in first_fail), "")
            mine = recs.get(self.primary)
            worst = ("" if mine is None or not mine.checks
                     else "NaN" if mine.worst is None else f"{mine.worst:.2e}")
            shorts = [("missing" if (r := recs.get(v)) is None else
                       f"FAIL ({r.failure or 'error'})" if r.status == "fail" else r.status)
                      for v in self.variants]
            body.append([f"`{k}`", *shorts, worst, reason])
        hdr = ["case", *self.variants, "worst rel L2 " + self.primary, "reason"]
        return [*lines, *_md_table(hdr, body), ""]

    def details(self) -> list[str]:
        lamport = [k for k in self.order if self.cases[k].api == "custom_lamport"]
        lines = self.detail(
            "Legacy custom all-reduce (lamport path at <= 16 tokens)", lamport,
            "trtllm_custom_all_reduce, RESIDUAL_RMS_NORM, ONESHOT. Tokens <= 16 take the "
            "lamport one-shot kernel; 17 and 64 are controls on the other path.")
        if not self.baseline:
            return lines + self.detail("Failures", self.of("fail"))
        return (lines + self.detail(f"Cases the series fixes (fail in {self.baseline}, pass "
                                    f"in {self.primary})", self.of("fixed"))
                + self.detail(f"Regressions (pass in {self.baseline}, fail in "
                              f"{self.primary})", self.of("regressed"))
                + self.detail("Failing in both", [
                    k for k in self.order
                    if self.cls[k] not in ("fixed", "regressed", "pass both", "skip")]))

    def of(self, cls: str) -> list[str]:
        return [k for k in self.order if self.cls[k] == cls]


def render_test_markdown(doc: AbRun) -> str:
    table = AbTable(doc)
    skips = Counter(str(r.reason) for rows in table.rows.values() for r in rows.values()
                    if r.status == "skip")
    lines = [f"# Fused all-reduce correctness: {doc.title}".rstrip(), "",
             f"Created {doc.created} by `{doc.command}`.", "",
             *completion_lines(doc.finished, doc.module_seconds, doc.time_budget,
                               sum(r.not_run for recs in doc.results.values() for r in recs))]
    if doc.shared:
        lines += ["**Ranks shared GPUs** (more ranks than GPUs): each rank is its own process "
                  "with its own CUDA context; handles went over a gloo group and buffers over "
                  "CUDA IPC. Correctness holds as on separate GPUs; timings do not.", ""]
    lines += ["## Environment", "", *env_lines(doc.environment), "", "## Variants", "",
              *_md_table(("variant", "wheel", "sha256", "FlashInfer", "modules"), [
                  (name, info.get("wheel") or "(installed)", (info.get("sha256") or "")[:16],
                   info.get("flashinfer", "?"), _modules(info))
                  for name, info in doc.variants.items()]),
              "", "## Method", "", _METHOD, "", "Tolerances (per output storage type):", "",
              *_md_table(("kind", "bound"), doc.tolerances),
              "", "## Summary", "", *table.summary(), *table.details(), "## Skipped", "",
              *(_md_table(("reason", "case runs"), sorted(skips.items())) if skips
                else ["None."]), ""]
    if doc.not_run:
        lines += ["## Not run here", "", *[f"- {item}" for item in doc.not_run], ""]
    return "\n".join(lines)


def write_test_report(doc: AbRun, out_dir: Path,
                      roles: portable.Roles | None = None) -> list[Path]:
    """``test-ab.json`` (``doc`` with what it was made from, less this machine's paths) and
    its markdown."""
    if doc.made_from is None:
        made = made_from(built_manifest(doc.environment), doc.variants.get(doc.primary, {}))
        doc = dataclasses.replace(doc, stack=made["stack"], made_from=tuple(made["made_from"]))
    text = json.dumps(portable.portable(dataclasses.asdict(doc), roles or []), indent=1,
                      sort_keys=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    j, m = out_dir / "test-ab.json", out_dir / "test-ab.md"
    j.write_text(text + "\n")
    m.write_text(render_test_markdown(AbRun.read(json.loads(text), str(j))))
    return [j, m]
