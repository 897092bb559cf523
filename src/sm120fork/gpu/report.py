"""Render the JSON results of ``test`` and ``bench`` as markdown and a PNG plot.

Pure functions of the JSON documents (no torch, no GPU), so reports can be re-rendered
anywhere with ``python -m sm120fork.gpu report``; each document is read through its typed
reader (:mod:`.documents`) first.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path

from sm120fork.gpu.core.documents import (
    AbDoc,
    BenchDoc,
    BenchRecord,
    CaseResult,
    Environment,
    MadeFrom,
    Provenance,
    VariantInfo,
    parse_ab,
    parse_bench,
)
from sm120fork.manifest import Manifest
from sm120fork.util import portable
from sm120fork.util.markdown import markdown_table as _md_table

SHARED_LABEL = "shared GPU: timings not representative"
#: 61 layers x 2 all-reduces per forward (Kimi-K2.5 / DeepSeek-V3 shape), hidden 7168.
PROJECTION_LAYERS = 61
PROJECTION_ALLREDUCES = 2 * PROJECTION_LAYERS
PROJECTION_HIDDEN = 7168
PROJECTION_TOKENS = (1, 3, 8, 64)
FUSED = "fused_auto"
UNFUSED = "nccl_rmsnorm"
TARGETS = (("<= 16 tokens", 16, 3.0), ("128 tokens", 128, 1.5))


def gpu_slug(name: str, count: int) -> str:
    """``NVIDIA H200`` x1 -> ``h200-1x`` (the report directory name)."""
    slug = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.IGNORECASE).lower()
    slug = re.sub(r"[^a-z0-9]+", "-", slug).strip("-") or "gpu"
    return f"{slug}-{count}x"




def _env_lines(env: Environment) -> list[str]:
    keys = ("gpus", "gpu_count", "capability", "driver", "driver_cuda_api", "torch",
            "torch_cuda", "python", "flashinfer", "multicast_supported_attr", "nvcc")
    fields: Mapping[str, object] = env
    rows = [(k, json.dumps(fields[k]) if isinstance(fields[k], list) else fields[k])
            for k in keys if k in fields]
    return _md_table(("", ""), rows)


def _modules(info: VariantInfo) -> str:
    if not info.get("compiled", True):
        return f"build FAILED: {info.get('compile_failure')}"
    if info.get("prebuilt_modules"):
        return ("prebuilt from this wheel's sources: " + ", ".join(info["prebuilt_modules"]))
    if info.get("prebuilt_failure"):
        return "JIT-compiled here (prebuilt modules failed to load)"
    return "JIT-compiled here"


# ---- test / A-B ------------------------------------------------------------------------
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


def ab_rows(doc: AbDoc) -> tuple[list[str], dict[str, dict[str, CaseResult]]]:
    """Case keys in run order and {key: {variant: record}}."""
    order: list[str] = []
    table: dict[str, dict[str, CaseResult]] = defaultdict(dict)
    for variant, records in doc["results"].items():
        for rec in records:
            if rec["key"] not in table:
                order.append(rec["key"])
            table[rec["key"]][variant] = rec
    return order, table


def _short(rec: CaseResult | None) -> str:
    if rec is None:
        return "missing"
    status = str(rec["status"])
    if status == "fail":
        return f"FAIL ({rec.get('failure') or 'error'})"
    return status


def _worst_rel(rec: CaseResult | None) -> str:
    if not rec or not rec.get("checks"):
        return ""
    vals = [rel for c in rec["checks"] if (rel := c.get("rel_l2")) is not None]
    return f"{max(vals):.2e}" if vals else "NaN"


def _completion_lines(doc: AbDoc | BenchDoc, missing: int = 0) -> list[str]:
    """Whether every planned case ran (``missing``: the planned case runs that did not),
    and the module build's time (outside the budget)."""
    lines = []
    if doc.get("finished") is False:
        lines.append("**Not finished**: " + (f"{missing} planned case runs did not run "
                     "(time budget used up)" if missing else "the run ended early") + ".")
    if "module_seconds" in doc:
        budget = doc.get("time_budget")
        lines.append(f"Module build: {doc['module_seconds']:.0f} s"
                     + (f", outside the cases' time budget of {budget:.0f} s." if budget
                        else "."))
    return [*lines, ""] if lines else []


def render_test_markdown(doc: AbDoc) -> str:
    primary: str = doc["primary"]
    baseline: str | None = doc.get("baseline")
    variants = list(doc["results"])
    order, table = ab_rows(doc)
    lines = [f"# Fused all-reduce correctness: {doc.get('title', '')}".rstrip(), ""]
    command = doc.get("command", "python -m sm120fork.gpu test")
    lines += [f"Created {doc.get('created', '?')} by `{command}`.", ""]
    lines += _completion_lines(doc, sum(1 for recs in doc["results"].values() for r in recs
                                        if r.get("not_run")))
    if doc.get("shared"):
        lines += ["**Ranks shared GPUs** (more ranks than GPUs): each rank is its own process "
                  "with its own CUDA context; handles went over a gloo group and buffers over "
                  "CUDA IPC. Correctness holds as on separate GPUs; timings do not.", ""]
    lines += ["## Environment", "", *_env_lines(doc.get("environment", {})), ""]
    lines += ["## Variants", ""]
    lines += _md_table(("variant", "wheel", "sha256", "FlashInfer", "modules"), [
        (name, info.get("wheel") or "(installed)", (info.get("sha256") or "")[:16],
         info.get("flashinfer", "?"), _modules(info))
        for name, info in doc.get("variants", {}).items()])
    lines += ["", "## Method", "",
              "Each rank regenerates every rank's input from the case seed; the reference is "
              "the fp32 sum of all inputs, fp32 residual add and fp32 RMSNorm (eps 1e-6). "
              "Outputs are NaN-filled before every call. Each case runs eagerly, then is "
              "captured in a CUDA graph and replayed twice (the legacy custom all-reduce's "
              "lamport path captures three calls with consecutive flags; its non-lamport "
              "path, whose barriers compare against a host-side flag, runs three eager "
              "calls instead). A crashed or hung case is ended "
              "by the watchdog and recorded as a failure with the ranks' last output.", "",
              "Tolerances (per output storage type):", ""]
    lines += _md_table(("kind", "bound"), doc.get("tolerances", []))
    lines += ["", "## Summary", ""]
    groups: dict[tuple[str, int], Counter[str]] = defaultdict(Counter)
    per_variant: dict[tuple[str, int, str], Counter[str]] = defaultdict(Counter)
    for key in order:
        recs = table[key]
        case = next(iter(recs.values()))["case"]
        g = (case["api"], case["world_size"])
        groups[g][classify({v: r["status"] for v, r in recs.items()}, primary, baseline)] += 1
        for v, r in recs.items():
            per_variant[(*g, v)][r["status"]] += 1
    header = ["api", "world size"] + [f"{v} pass/fail/skip" for v in variants]
    if baseline:
        header += ["fixed", "regressed", "pass both", "fail both"]
    rows = []
    for (api, ws), counts in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        row: list[object] = [api, ws]
        for v in variants:
            c = per_variant[(api, ws, v)]
            row.append(f"{c['pass']}/{c['fail']}/{c['skip']}")
        if baseline:
            row += [counts["fixed"], counts["regressed"], counts["pass both"],
                    counts["fail both"]]
        rows.append(row)
    lines += _md_table(header, rows)
    total = Counter(classify({v: r["status"] for v, r in table[k].items()}, primary, baseline)
                    for k in order)
    lines += ["", "Totals: " + ", ".join(f"{k}: {n}" for k, n in sorted(total.items())), ""]

    def detail(title: str, keys: list[str], note: str = "") -> None:
        nonlocal lines
        lines += [f"## {title}", ""]
        if note:
            lines += [note, ""]
        if not keys:
            lines += ["None.", ""]
            return
        hdr = ["case"] + [f"{v}" for v in variants] + ["worst rel L2 " + primary, "reason"]
        body = []
        for k in keys:
            recs = table[k]
            reason = ""
            for v in [*([baseline] if baseline else []), primary]:
                r = recs.get(v)
                if r and r["status"] == "fail":
                    reason = f"{v}: {r.get('reason', '')}"[:300]
                    break
            body.append([f"`{k}`", *[_short(recs.get(v)) for v in variants],
                         _worst_rel(recs.get(primary)), reason])
        lines += [*_md_table(hdr, body), ""]

    cls = {k: classify({v: r["status"] for v, r in table[k].items()}, primary, baseline)
           for k in order}
    lamport = [k for k in order if next(iter(table[k].values()))["case"]["api"]
               == "custom_lamport"]
    detail("Legacy custom all-reduce (lamport path at <= 16 tokens)", lamport,
           "trtllm_custom_all_reduce, RESIDUAL_RMS_NORM, ONESHOT. Tokens <= 16 take the "
           "lamport one-shot kernel; 17 and 64 are controls on the other path.")
    if baseline:
        detail(f"Cases the series fixes (fail in {baseline}, pass in {primary})",
               [k for k in order if cls[k] == "fixed"])
        detail(f"Regressions (pass in {baseline}, fail in {primary})",
               [k for k in order if cls[k] == "regressed"])
        detail("Failing in both", [k for k in order if cls[k] not in
                                   ("fixed", "regressed", "pass both", "skip")])
    else:
        detail("Failures", [k for k in order if cls[k] == "fail"])
    skips = Counter(str(r.get("reason")) for k in order for r in table[k].values()
                    if r["status"] == "skip")
    lines += ["## Skipped", ""]
    lines += (_md_table(("reason", "case runs"), sorted(skips.items())) if skips
              else ["None."])
    lines += [""]
    if doc.get("not_run"):
        lines += ["## Not run here", "", *[f"- {item}" for item in doc["not_run"]], ""]
    return "\n".join(lines)


# ---- bench -----------------------------------------------------------------------------
def bench_points(doc: BenchDoc) -> dict[int, dict[str, dict[int, float]]]:
    """{hidden: {method: {tokens: median_us}}} of the measured points."""
    out: dict[int, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for rec in doc.get("records", []):
        if rec.get("kind") == "point" and (median := rec.get("median_us")) is not None:
            # the slowest rank bounds a collective: use the max of the ranks' medians
            medians = [m for m in rec.get("rank_medians_us") or [] if m is not None]
            value = max(medians) if medians else median
            out[int(rec["hidden"])][rec["method"]][int(rec["tokens"])] = float(value)
    return out


def bench_p90(doc: BenchDoc) -> dict[int, dict[str, dict[int, float]]]:
    """{hidden: {method: {tokens: p90_us}}}: the slowest rank's p90."""
    out: dict[int, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for rec in doc.get("records", []):
        p90s = [v for v in rec.get("rank_p90_us") or [] if v is not None]
        if rec.get("kind") == "point" and p90s:
            out[int(rec["hidden"])][rec["method"]][int(rec["tokens"])] = float(max(p90s))
    return out


def method_rows(doc: BenchDoc) -> list[tuple[str, str, str]]:
    """(method, what it is, what happened to it): timed, failed its check, not runnable."""
    from sm120fork.gpu.methods import METHODS

    per: dict[str, Counter[str]] = defaultdict(Counter)
    reasons: dict[str, list[str]] = defaultdict(list)
    for rec in doc.get("records", []):
        if rec.get("kind") not in ("method", "point") or "status" not in rec:
            continue
        name, status = rec["method"], rec["status"]
        if rec["kind"] == "method" and status in ("runnable", "starting"):
            per[name]
            continue
        per[name][status] += 1
        if status != "timed" and rec.get("reason"):
            where = (f" (t={rec['tokens']} h={rec['hidden']})" if rec["kind"] == "point"
                     else "")
            if len(reasons[name]) < 3:
                reasons[name].append(f"{status}{where}: {rec['reason']}")
    rows = []
    for name in [m for m in METHODS if m in per] + sorted(set(per) - set(METHODS)):
        counts = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in sorted(per[name].items()))
        label = METHODS[name].label if name in METHODS else name
        text = counts or "no points"
        if reasons[name]:
            text += "; " + "; ".join(reasons[name])
        rows.append((name, label, text.replace("|", "/")))
    return rows


def floors(doc: BenchDoc) -> dict[str, float]:
    return {r["method"]: float(median) for r in doc.get("records", [])
            if r.get("kind") == "floor" and (median := r.get("median_us")) is not None}


def projection(points: dict[int, dict[str, dict[int, float]]]) -> list[dict[str, float | None]]:
    """Per decode step comm time: 122 all-reduces at hidden 7168, fused vs unfused."""
    rows = []
    by_method = points.get(PROJECTION_HIDDEN, {})
    for tokens in PROJECTION_TOKENS:
        fused = by_method.get(FUSED, {}).get(tokens)
        unfused = by_method.get(UNFUSED, {}).get(tokens)
        rows.append({
            "tokens": tokens,
            "fused_ms": None if fused is None else fused * PROJECTION_ALLREDUCES / 1000,
            "unfused_ms": None if unfused is None else unfused * PROJECTION_ALLREDUCES / 1000,
            "speedup": None if not (fused and unfused) else unfused / fused,
        })
    return rows


def target_checks(doc: BenchDoc) -> list[tuple[str, str]]:
    """The issue's targets, each with a verdict or the reason none can be given."""
    if doc.get("shared"):
        return [(t, f"not evaluated ({SHARED_LABEL})") for t in
                ("fused >= 3x NCCL+RMSNorm at <= 16 tokens", "fused >= 1.5x at 128 tokens",
                 "fused within 2x of the floor")]
    pts = bench_points(doc).get(PROJECTION_HIDDEN, {})
    fused, unfused = pts.get(FUSED, {}), pts.get(UNFUSED, {})
    out = []
    for label, max_tokens, need in TARGETS:
        toks = [t for t in fused if t in unfused and (t <= max_tokens if max_tokens == 16
                                                     else t == max_tokens)]
        if not toks:
            out.append((f"fused >= {need}x NCCL+RMSNorm at {label}", "no data"))
            continue
        worst = min(unfused[t] / fused[t] for t in toks)
        out.append((f"fused >= {need}x NCCL+RMSNorm at {label}",
                    f"{'MET' if worst >= need else 'MISSED'}: worst {worst:.2f}x"))
    floor = op_floor(doc)
    small = [fused[t] for t in fused if t <= 16]
    if floor and small:
        ratio = min(small) / floor
        out.append(("fused within 2x of the floor",
                    f"{'MET' if ratio <= 2 else 'MISSED'}: best {ratio:.2f}x of {floor:.1f} us"))
    else:
        out.append(("fused within 2x of the floor", "no data"))
    return out


def op_floor(doc: BenchDoc) -> float | None:
    """No fused all-reduce op can beat launching one kernel in a graph plus one one-way
    flag handoff to a peer GPU; either alone when only one was measured."""
    fl = floors(doc)
    parts = [fl[k] for k in ("empty_graph", "flag_handoff") if k in fl]
    return sum(parts) if parts else None


def render_bench_markdown(doc: BenchDoc) -> str:
    pts = bench_points(doc)
    lines = [f"# Fused all-reduce throughput: {doc.get('title', '')}".rstrip(), ""]
    command = doc.get("command", "python -m sm120fork.gpu bench")
    lines += [f"Created {doc.get('created', '?')} by `{command}`.", ""]
    lines += _completion_lines(doc)
    if doc.get("shared"):
        lines += [f"**{SHARED_LABEL}.** {doc.get('world_size')} ranks time-slice "
                  f"{doc.get('environment', {}).get('gpu_count', '?')} GPU(s); every number "
                  "below measures the time-slicing, not the kernels.", ""]
    lines += ["## Environment", "", *_env_lines(doc.get("environment", {})), ""]
    meta = next((r for r in doc.get("records", []) if r.get("kind") == "meta"),
                BenchRecord())
    sha256 = doc.get("sha256")
    lines += [f"Variant: {doc.get('variant')} ({doc.get('wheel') or 'installed'}"
              f"{', sha256 ' + sha256[:16] if sha256 else ''}); "
              + (f"fused calls through `{meta['fused_api']}`; " if meta.get("fused_api") else "")
              + "world size "
              f"{doc.get('world_size')}; per-op latency = median over "
              f"{meta.get('replays', '?')} CUDA-graph replays of "
              f"{meta.get('rotate', '?')} rotating buffer sets x "
              f"{meta.get('calls_per_buffer', '?')} calls, max over ranks.", ""]
    meta_skipped = meta.get("skipped")
    skipped = dict(meta_skipped) if isinstance(meta_skipped, dict) else {}
    for r in doc.get("records", []):
        if r.get("kind") == "floor" and (why := r.get("skipped")):
            skipped[f"floor {r['method']}"] = str(why)
        if r.get("kind") == "point" and (error := r.get("error")):
            skipped[f"{r['method']} t={r['tokens']} h={r['hidden']}"] = error
    if skipped:
        lines += ["Skipped or failed:", ""]
        lines += [f"- {k}: {v}" for k, v in sorted(skipped.items())] + [""]
    fl = floors(doc)
    lines += ["## Floor", ""]
    lines += _md_table(("floor", "us"), [
        ("empty op: a 1-element kernel per op, same graph shape as the methods",
         _fmt(fl.get("empty_graph"))),
        ("one-way flag handoff between two ranks", _fmt(fl.get("flag_handoff"))),
        ("floor of a fused op (the two together; the 2x target's reference)",
         _fmt(op_floor(doc)))])
    lines += [""]
    rows = method_rows(doc)
    if rows:
        lines += ["## Methods", "",
                  "Each method's output (residual sum and normed output) is checked against "
                  "the fp32 reference, eagerly and in a CUDA-graph replay, on the same inputs, "
                  "before it is timed; a method that fails its check is never timed.", ""]
        lines += _md_table(("method", "what", "points"), rows)
        lines += [""]
    p90 = bench_p90(doc)
    for hidden in sorted(pts, reverse=True):
        methods = sorted(pts[hidden])
        tokens = sorted({t for m in methods for t in pts[hidden][m]})
        lines += [f"## Latency per op, hidden {hidden}, {doc.get('dtype', 'bf16')} "
                  "(us, slowest rank's median (p90))", ""]
        lines += _md_table(["tokens", *methods],
                           [[t, *[_fmt(pts[hidden][m].get(t)) + (
                               f" ({_fmt(p90[hidden][m][t])})" if t in p90[hidden][m] else "")
                               for m in methods]] for t in tokens])
        lines += [""]
    lines += [f"## Model projection ({PROJECTION_LAYERS} layers x 2 = "
              f"{PROJECTION_ALLREDUCES} all-reduces per forward, hidden {PROJECTION_HIDDEN})",
              ""]
    lines += _md_table(("tokens", f"fused ({FUSED}) ms/step", f"unfused ({UNFUSED}) ms/step",
                        "speedup"),
                       [(r["tokens"], _fmt(r["fused_ms"], 3), _fmt(r["unfused_ms"], 3),
                         _fmt(r["speedup"], 2)) for r in projection(pts)])
    lines += ["", "## Targets (multi-GPU NVLink H200)", ""]
    lines += _md_table(("target", "result"), target_checks(doc))
    lines += [""]
    if doc.get("not_run"):
        lines += ["## Not run here", "", *[f"- {item}" for item in doc["not_run"]], ""]
    return "\n".join(lines)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def render_bench_plot(doc: BenchDoc, path: Path) -> None:
    """Latency vs tokens, one line per method, floors drawn; one panel per hidden size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = bench_points(doc)
    hiddens = sorted(pts, reverse=True) or [PROJECTION_HIDDEN]
    fig, axes = plt.subplots(1, len(hiddens), figsize=(6.5 * len(hiddens), 4.5),
                             squeeze=False)
    fl = floors(doc)
    for ax, hidden in zip(axes[0], hiddens, strict=True):
        for method in sorted(pts.get(hidden, {})):
            series = sorted(pts[hidden][method].items())
            ax.plot([t for t, _ in series], [v for _, v in series], marker="o", label=method)
        for name, style in (("flag_handoff", "--"), ("empty_graph", ":")):
            if name in fl:
                ax.axhline(fl[name], linestyle=style, color="gray",
                           label=f"floor: {name} {fl[name]:.1f} us")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("latency per op (us)")
        title = f"hidden {hidden}, ws {doc.get('world_size')}"
        if doc.get("shared"):
            title += f"\n{SHARED_LABEL}"
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(doc.get("title", "fused all-reduce"))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def made_from(manifest: Manifest | None, tested: VariantInfo | BenchDoc | None
              ) -> Provenance:
    """``stack`` and ``made_from`` of a GPU report: the toolkit build of the tested wheel.

    The same shape as verify.json's, so that upstream_pr can refuse evidence of another
    stack, series or wheel.  ``tested`` is the primary variant (its wheel's name, sha256
    and RECORD digest).  A manifest wheel of the same name but other bytes (a published
    wheel too large to carry, zipped again from its checked tree) is recorded with the
    tested sha256 and RECORD digest, for upstream_pr to check against the published wheel.
    An empty ``made_from`` means the wheel is no toolkit build.
    """
    sha256 = tested.get("sha256") if tested else None
    name = tested.get("wheel") if tested else None
    rows: list[MadeFrom] = []
    for w in manifest.wheels if manifest else ():
        same_bytes = bool(sha256) and w.sha256 == sha256
        if not same_bytes and not (name and w.wheel == name):
            continue
        row: MadeFrom = {"project": w.project, "series": w.series,
                         "series_digest": w.series_digest, "wheel": w.wheel,
                         "wheel_sha256": w.sha256}
        if not same_bytes:
            row["tested_sha256"] = sha256
            row["record_sha256"] = tested.get("record_sha256") if tested else None
        rows.append(row)
    return {"stack": manifest.stack if manifest else None, "made_from": rows}


def built_manifest(env: Environment) -> Manifest | None:
    """The build manifest a run recorded in its environment (``wheels_manifest``), typed;
    None when the wheels were no stack's build (or the run could not read its manifest)."""
    data = env.get("wheels_manifest")
    if not data or "error" in data:
        return None
    try:
        return Manifest.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _provenance(doc: AbDoc | BenchDoc, tested: VariantInfo | BenchDoc | None
                ) -> Provenance | None:
    if "stack" in doc and "made_from" in doc:
        return None
    return made_from(built_manifest(doc.get("environment", {})), tested)


def write_test_report(doc: object, out_dir: Path,
                      roles: portable.Roles | None = None, *,
                      where: str = "test-ab.json") -> list[Path]:
    """test-ab.json/.md; ``roles`` rewrites this machine's paths (see util/portable)."""
    ab = parse_ab(doc, where)
    primary = ab.get("variants", {}).get(ab["primary"], {})
    ab = parse_ab(portable.portable({**ab, **(_provenance(ab, primary) or {})}, roles or []),
                  where)
    out_dir.mkdir(parents=True, exist_ok=True)
    j, m = out_dir / "test-ab.json", out_dir / "test-ab.md"
    j.write_text(json.dumps(ab, indent=1, sort_keys=True) + "\n")
    m.write_text(render_test_markdown(ab))
    return [j, m]


def write_bench_report(doc: object, out_dir: Path,
                       roles: portable.Roles | None = None, *,
                       where: str = "bench.json") -> list[Path]:
    bench = parse_bench(doc, where)
    out_dir.mkdir(parents=True, exist_ok=True)
    j, m, p = out_dir / "bench.json", out_dir / "bench.md", out_dir / "bench.png"
    bench = parse_bench(portable.portable({**bench, **(_provenance(bench, bench) or {}),
                                           "projection": projection(bench_points(bench)),
                                           "targets": target_checks(bench)}, roles or []),
                        where)
    j.write_text(json.dumps(bench, indent=1, sort_keys=True) + "\n")
    m.write_text(render_bench_markdown(bench))
    render_bench_plot(bench, p)
    return [j, m, p]
