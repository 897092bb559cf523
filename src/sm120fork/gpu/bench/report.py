"""Render a bench's ``bench.json`` as markdown and a PNG plot (no torch, no GPU)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from sm120fork.gpu.core.documents import BenchDoc, BenchRecord, parse_bench
from sm120fork.gpu.core.report import built_manifest, completion_lines, env_lines, made_from
from sm120fork.util import portable
from sm120fork.util.portable import markdown_table as _md_table

SHARED_LABEL = "shared GPU: timings not representative"
#: 61 layers x 2 all-reduces per forward (Kimi-K2.5 / DeepSeek-V3 shape), hidden 7168.
PROJECTION_LAYERS = 61
PROJECTION_ALLREDUCES = 2 * PROJECTION_LAYERS
PROJECTION_HIDDEN = 7168
PROJECTION_TOKENS = (1, 3, 8, 64)
FUSED = "fused_auto"
UNFUSED = "nccl_rmsnorm"
TARGETS = (("<= 16 tokens", 16, 3.0), ("128 tokens", 128, 1.5))


def bench_points(doc: BenchDoc, stat: str = "median") -> dict[int, dict[str, dict[int, float]]]:
    """{hidden: {method: {tokens: us}}}: the slowest rank's median (or ``stat="p90"``)."""
    out: dict[int, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for rec in doc.get("records", []):
        own = rec.get("median_us") if stat == "median" else None
        if rec.get("kind") != "point" or (stat == "median" and own is None):
            continue
        ranks = (rec.get("rank_medians_us") if stat == "median" else rec.get("rank_p90_us"))
        value = max((v for v in ranks or [] if v is not None), default=own)
        if value is not None:
            out[int(rec["hidden"])][rec["method"]][int(rec["tokens"])] = float(value)
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
        if status != "timed" and rec.get("reason") and len(reasons[name]) < 3:
            where = f" (t={rec['tokens']} h={rec['hidden']})" if rec["kind"] == "point" else ""
            reasons[name].append(f"{status}{where}: {rec['reason']}")
    rows = []
    for name in [m for m in METHODS if m in per] + sorted(set(per) - set(METHODS)):
        counts = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in sorted(per[name].items()))
        label = METHODS[name].label if name in METHODS else name
        text = "; ".join([counts or "no points", *reasons[name]])
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
        worst = min((unfused[t] / fused[t] for t in toks), default=None)
        out.append((f"fused >= {need}x NCCL+RMSNorm at {label}", "no data" if worst is None
                    else f"{'MET' if worst >= need else 'MISSED'}: worst {worst:.2f}x"))
    floor = op_floor(doc)
    small = [fused[t] for t in fused if t <= 16]
    ratio = min(small) / floor if floor and small else None
    out.append(("fused within 2x of the floor", "no data" if ratio is None else
                f"{'MET' if ratio <= 2 else 'MISSED'}: best {ratio:.2f}x of {floor:.1f} us"))
    return out


def op_floor(doc: BenchDoc) -> float | None:
    """One kernel in a graph plus one flag handoff to a peer: no fused op beats it."""
    fl = floors(doc)
    parts = [fl[k] for k in ("empty_graph", "flag_handoff") if k in fl]
    return sum(parts) if parts else None


def render_bench_markdown(doc: BenchDoc) -> str:
    pts = bench_points(doc)
    lines = [f"# Fused all-reduce throughput: {doc.get('title', '')}".rstrip(), "",
             f"Created {doc.get('created', '?')} by "
             f"`{doc.get('command', 'python -m sm120fork.gpu bench')}`.", "",
             *completion_lines(doc.get("finished"), doc.get("module_seconds"),
                               doc.get("time_budget"))]
    if doc.get("shared"):
        lines += [f"**{SHARED_LABEL}.** {doc.get('world_size')} ranks time-slice "
                  f"{doc.get('environment', {}).get('gpu_count', '?')} GPU(s); every number "
                  "below measures the time-slicing, not the kernels.", ""]
    lines += ["## Environment", "", *env_lines(doc.get("environment", {})), ""]
    meta = next((r for r in doc.get("records", []) if r.get("kind") == "meta"),
                BenchRecord())
    sha256 = doc.get("sha256")
    lines += [f"Variant: {doc.get('variant')} ({doc.get('wheel') or 'installed'}"
              f"{', sha256 ' + sha256[:16] if sha256 else ''}); world size "
              f"{doc.get('world_size')}; per-op latency = median over "
              f"{meta.get('replays', '?')} CUDA-graph replays of "
              f"{meta.get('rotate', '?')} rotating buffer sets x "
              f"{meta.get('calls_per_buffer', '?')} calls, max over ranks.", ""]
    skipped = sorted(f"- floor {r['method']}: {why}" for r in doc.get("records", [])
                     if r.get("kind") == "floor" and (why := r.get("skipped")))
    if skipped:
        lines += ["Skipped or failed:", "", *skipped, ""]
    fl = floors(doc)
    lines += ["## Floor", "", *_md_table(("floor", "us"), [
        ("empty op: a 1-element kernel per op, same graph shape as the methods",
         _fmt(fl.get("empty_graph"))),
        ("one-way flag handoff between two ranks", _fmt(fl.get("flag_handoff"))),
        ("floor of a fused op (the two together; the 2x target's reference)",
         _fmt(op_floor(doc)))]), ""]
    rows = method_rows(doc)
    if rows:
        lines += ["## Methods", "",
                  "Each method's output (residual sum and normed output) is checked against "
                  "the fp32 reference, eagerly and in a CUDA-graph replay, on the same inputs, "
                  "before it is timed; a method that fails its check is never timed.", "",
                  *_md_table(("method", "what", "points"), rows), ""]
    p90 = bench_points(doc, "p90")
    for hidden in sorted(pts, reverse=True):
        methods = sorted(pts[hidden])
        tokens = sorted({t for m in methods for t in pts[hidden][m]})
        lines += [f"## Latency per op, hidden {hidden}, {doc.get('dtype', 'bf16')} "
                  "(us, slowest rank's median (p90))", "",
                  *_md_table(["tokens", *methods],
                             [[t, *[_fmt(pts[hidden][m].get(t)) + (
                                 f" ({_fmt(p90[hidden][m][t])})" if t in p90[hidden][m]
                                 else "") for m in methods]] for t in tokens]), ""]
    lines += [f"## Model projection ({PROJECTION_LAYERS} layers x 2 = "
              f"{PROJECTION_ALLREDUCES} all-reduces per forward, hidden {PROJECTION_HIDDEN})",
              ""]
    lines += _md_table(("tokens", f"fused ({FUSED}) ms/step", f"unfused ({UNFUSED}) ms/step",
                        "speedup"),
                       [(r["tokens"], _fmt(r["fused_ms"], 3), _fmt(r["unfused_ms"], 3),
                         _fmt(r["speedup"], 2)) for r in projection(pts)])
    lines += ["", "## Targets (multi-GPU NVLink H200)", "",
              *_md_table(("target", "result"), target_checks(doc)), ""]
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
        ax.set(yscale="log", xlabel="tokens", ylabel="latency per op (us)",
               title=f"hidden {hidden}, ws {doc.get('world_size')}"
               + (f"\n{SHARED_LABEL}" if doc.get("shared") else ""))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(doc.get("title", "fused all-reduce"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_bench_report(doc: object, out_dir: Path,
                       roles: portable.Roles | None = None, *,
                       where: str = "bench.json") -> list[Path]:
    bench = parse_bench(doc, where)
    out_dir.mkdir(parents=True, exist_ok=True)
    j, m, p = out_dir / "bench.json", out_dir / "bench.md", out_dir / "bench.png"
    made = made_from(built_manifest(bench.get("environment", {})), bench)
    bench = parse_bench(portable.portable({**bench, **made,
                                           "projection": projection(bench_points(bench)),
                                           "targets": target_checks(bench)}, roles or []),
                        where)
    j.write_text(json.dumps(bench, indent=1, sort_keys=True) + "\n")
    m.write_text(render_bench_markdown(bench))
    render_bench_plot(bench, p)
    return [j, m, p]
