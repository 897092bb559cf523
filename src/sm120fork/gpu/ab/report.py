"""Render an A/B run's ``test-ab.json`` as markdown (no torch, no GPU)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from pathlib import Path

from sm120fork.gpu.ab.results import AbRun, CaseResult
from sm120fork.gpu.core.cases import Case
from sm120fork.gpu.core.documents import VariantInfo
from sm120fork.gpu.core.report import built_manifest, completion_lines, env_lines, made_from
from sm120fork.util import portable
from sm120fork.util.markdown import markdown_table as _md_table


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
    if p == "skip" and b == "skip":
        return "skip"
    if p == "pass" and b == "pass":
        return "pass both"
    if p == "pass" and b != "pass":
        return "fixed"
    if p != "pass" and b == "pass":
        return "regressed"
    return "fail both" if p == "fail" else f"{p}/{b}"


def _short(rec: CaseResult | None) -> str:
    if rec is None:
        return "missing"
    if rec.status == "fail":
        return f"FAIL ({rec.failure or 'error'})"
    return rec.status


def _worst_rel(rec: CaseResult | None) -> str:
    if rec is None or not rec.checks:
        return ""
    vals = [c.rel_l2 for c in rec.checks if c.rel_l2 is not None]
    return f"{max(vals):.2e}" if vals else "NaN"


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
        self.cls = {k: classify({v: r.status for v, r in self.rows[k].items()},
                                self.primary, self.baseline) for k in self.order}

    def counts(self) -> dict[str, int]:
        """How many cases are in each A/B class (``not run``: some variant never ran it)."""
        return dict(sorted(Counter(
            "not run" if any(r.never_ran for r in self.rows[k].values()) else self.cls[k]
            for k in self.order).items()))

    def case(self, key: str) -> Case:
        return next(r.case for r in self.rows[key].values() if r.case is not None)

    def summary(self) -> list[str]:
        groups: dict[tuple[int, str], list[str]] = defaultdict(list)
        for key in self.order:
            groups[(self.case(key).world_size, self.case(key).api)].append(key)
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
            reason = ""
            for v in [*([self.baseline] if self.baseline else []), self.primary]:
                r = recs.get(v)
                if r and r.status == "fail":
                    reason = f"{v}: {r.reason}"[:300]
                    break
            body.append([f"`{k}`", *[_short(recs.get(v)) for v in self.variants],
                         _worst_rel(recs.get(self.primary)), reason])
        hdr = ["case", *self.variants, "worst rel L2 " + self.primary, "reason"]
        return [*lines, *_md_table(hdr, body), ""]

    def details(self) -> list[str]:
        lamport = [k for k in self.order if self.case(k).api == "custom_lamport"]
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
    lines = [f"# Fused all-reduce correctness: {doc.title}".rstrip(), ""]
    lines += [f"Created {doc.created} by `{doc.command}`.", ""]
    lines += completion_lines(doc.finished, doc.module_seconds, doc.time_budget,
                              sum(1 for recs in doc.results.values() for r in recs if r.not_run))
    if doc.shared:
        lines += ["**Ranks shared GPUs** (more ranks than GPUs): each rank is its own process "
                  "with its own CUDA context; handles went over a gloo group and buffers over "
                  "CUDA IPC. Correctness holds as on separate GPUs; timings do not.", ""]
    lines += ["## Environment", "", *env_lines(doc.environment), ""]
    lines += ["## Variants", ""]
    lines += _md_table(("variant", "wheel", "sha256", "FlashInfer", "modules"), [
        (name, info.get("wheel") or "(installed)", (info.get("sha256") or "")[:16],
         info.get("flashinfer", "?"), _modules(info))
        for name, info in doc.variants.items()])
    lines += ["", "## Method", "", _METHOD, "", "Tolerances (per output storage type):", ""]
    lines += _md_table(("kind", "bound"), doc.tolerances)
    lines += ["", "## Summary", "", *table.summary(), *table.details()]
    skips = Counter(str(r.reason) for rows in table.rows.values() for r in rows.values()
                    if r.status == "skip")
    lines += ["## Skipped", ""]
    lines += (_md_table(("reason", "case runs"), sorted(skips.items())) if skips
              else ["None."])
    lines += [""]
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
