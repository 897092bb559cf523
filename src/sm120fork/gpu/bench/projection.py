"""A PROJECTION (not a measurement) of the bench's methods on a PCIe SM12x box, from the
public figures of the facts file (``SM120-FACTS.md``): (low, high) microseconds per
all-reduce + add + RMSNorm.  One-shot: launch floor + one sync + ``(w-1) B / bw``;
two-shot: two syncs + ``2 (w-1)/w B / bw``; NCCL: its published small-message latency +
the ring's transfer + the norm; pcie_ipc: its TP8 figures interpolated in size (else the
two-shot model) + the norm.  A real ``bench`` run on the box replaces it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Sequence
from pathlib import Path

from sm120fork.util.portable import markdown_table

Range = tuple[float, float]
LABEL = ("PROJECTION from public figures (SM120-FACTS.md), not a measurement: no SM12x "
         "box was available")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fabric:
    """What the projection assumes of a box (all from the facts file)."""

    name: str
    bw_gbps: Range  # per-rank P2P bandwidth, GB/s
    sync_us: dict[int, Range]  # one cross-rank synchronisation at world size w
    floor_us: Range = (1.1, 2.0)  # one kernel in a graph (1.1 us measured on H200)
    norm_us: Range = (2.0, 3.0)  # a separate fused_add_rmsnorm launch
    nccl_small_us: dict[int, Range] = dataclasses.field(default_factory=dict)
    pcie_ipc_tp8: Sequence[tuple[int, float]] = ()  # (bytes, us), published
    collapse_write_gbps: float = 2.6


RTX_PRO_6000_8X = Fabric(
    name="8x RTX PRO 6000 Blackwell, PCIe Gen5 x16, no NVLink, two NUMA nodes",
    bw_gbps=(39.0, 56.0),  # measured P2P: 53-56 same NUMA, 39-51 cross
    # a 128 B remote read takes 2-4 us (4 GPUs), 6-7 us (8 GPUs); a one-shot's flags
    # are writes (~0.4 us) plus the spin: "2-4 us sync" at TP8 in the facts
    sync_us={2: (0.8, 2.0), 4: (2.0, 4.0), 8: (2.0, 7.0)},
    # 4x on PCIe switches 13-16 us; 8x 24-26 us (switches or a tuned graph); the
    # cross-NUMA 8x box: 205 us at 12 KiB
    nccl_small_us={2: (10.0, 39.0), 4: (13.0, 16.0), 8: (24.0, 205.0)},
    pcie_ipc_tp8=((12 << 10, 5.3), (96 << 10, 15.3), (384 << 10, 34.6)),
)


def _interp(points: Sequence[tuple[int, float]], size: int) -> float:
    """Piecewise-linear in bytes; the first value below the first point (a floor)."""
    pts = sorted(points)
    if size <= pts[0][0]:
        return pts[0][1]
    (x0, y0), (x1, y1) = next((pair for pair in itertools.pairwise(pts) if size <= pair[1][0]),
                              pts[-2:])  # past the last point: the last segment, extended
    return y0 + (y1 - y0) * (size - x0) / (x1 - x0)


def _us(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * 1e3)  # GB/s = 1e3 bytes per us


def project(world: int, tokens: int, hidden: int, fabric: Fabric = RTX_PRO_6000_8X,
            ) -> dict[str, Range]:
    """(low, high) microseconds per method for one all-reduce + add + RMSNorm."""
    size = tokens * hidden * 2
    one = (world - 1) * size
    two = 2 * (world - 1) / world * size

    def end(i: int) -> dict[str, float]:
        """The low (0) or the high (1) end: the low one at the higher bandwidth."""
        bw, sync = fabric.bw_gbps[1 - i], fabric.sync_us[world][i]
        floor, norm = fabric.floor_us[i], fabric.norm_us[i]
        two_shot = floor + 2 * sync + _us(two, bw)
        return {
            "fused_oneshot": floor + sync + _us(one, bw),
            "fused_twoshot": two_shot,
            "fused_oneshot_write_collapse": floor + sync + _us(one, fabric.collapse_write_gbps),
            "nccl_rmsnorm": fabric.nccl_small_us[world][i] + _us(two, bw) + norm,
            "pcie_ipc_rmsnorm": (_interp(fabric.pcie_ipc_tp8, size) if world == 8
                                 and fabric.pcie_ipc_tp8 else two_shot) + norm,
        }

    low, high = end(0), end(1)
    # FlashInfer's two-shot asserts token_num > world_size
    return {m: (low[m], high[m]) for m in low if m != "fused_twoshot" or tokens > world}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    """One (world, tokens) point: each method's range, and the likely winner."""

    world_size: int
    tokens: int
    hidden: int
    bytes: int
    us: dict[str, list[float]]
    likely_fastest: str
    #: the methods whose range reaches into the winner's: the projection cannot tell
    ranges_overlap_with: list[str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Projection:
    kind: str
    label: str
    fabric: Fabric
    hidden: int
    rows: list[Row]


def table(hidden: int = 7168, fabric: Fabric = RTX_PRO_6000_8X) -> Projection:
    """The projection document: every (world, tokens) point, and the likely winner."""
    rows = []
    for w, t in itertools.product((2, 4, 8), (1, 3, 8, 16, 64, 128, 512)):
        est = project(w, t, hidden, fabric)
        honest = {m: r for m, r in est.items() if not m.endswith("write_collapse")}
        mid = {m: (lo + hi) / 2 for m, (lo, hi) in honest.items()}
        winner = min(mid, key=mid.__getitem__)
        overlap = [m for m, (lo, _hi) in honest.items()
                   if m != winner and lo <= honest[winner][1]]
        rows.append(Row(world_size=w, tokens=t, hidden=hidden, bytes=t * hidden * 2,
                        us={m: [round(lo, 1), round(hi, 1)] for m, (lo, hi) in est.items()},
                        likely_fastest=winner, ranges_overlap_with=sorted(overlap)))
    return Projection(kind="gpu-projection", label=LABEL, fabric=fabric, hidden=hidden,
                      rows=rows)


def render(doc: Projection) -> str:
    lines = [f"# Projection: {doc.fabric.name}", "", f"**{doc.label}.**", "",
             "Per all-reduce + residual add + RMSNorm, bf16, hidden "
             f"{doc.hidden}, in microseconds as (low-high) ranges. The model and its "
             "inputs: `src/sm120fork/gpu/bench/projection.py` (every input is a figure of the "
             "facts file). 'likely fastest' compares range midpoints; where another "
             "method's range overlaps the winner's, the projection cannot tell them apart "
             "and only a `bench` run on the box can. The write-collapse column is the "
             "one-shot on a fabric whose peer writes collapse to 2.6 GB/s (seen on one "
             "root-complex box); it is not used to pick the winner.", ""]
    methods = ["fused_oneshot", "fused_twoshot", "pcie_ipc_rmsnorm", "nccl_rmsnorm",
               "fused_oneshot_write_collapse"]
    for w in sorted({r.world_size for r in doc.rows}):
        rows = [[r.tokens, f"{r.bytes / 1024:.0f}",
                 *(f"{r.us[m][0]:.1f}-{r.us[m][1]:.1f}" if m in r.us
                   else "n/a (tokens <= ranks)" for m in methods),
                 r.likely_fastest, ", ".join(r.ranges_overlap_with) or "-"]
                for r in doc.rows if r.world_size == w]
        header = ["tokens", "KiB", *methods, "likely fastest", "overlaps"]
        lines += [f"## TP{w}", "", *markdown_table(header, rows), ""]
    step = [r for r in doc.rows if r.world_size == 8 and r.tokens == 3]
    if step:
        lines += ["## One EAGLE-3 verify step of Kimi-K2.5 at TP8 (3 tokens, 122 all-reduces)",
                  ""]
        for m in [m for m in methods[:4] if m in step[0].us]:
            lo, hi = step[0].us[m]
            lines.append(f"- {m}: {lo * 122 / 1000:.2f}-{hi * 122 / 1000:.2f} ms")
        lines += ["", "(The facts file's measured step on such a box: ~25 ms of ~30 ms in "
                  "NCCL all-reduces.)", ""]
    return "\n".join(lines)


def write(doc: Projection, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    j, m = out / "projection.json", out / "projection.md"
    j.write_text(json.dumps(dataclasses.asdict(doc), indent=1, sort_keys=True) + "\n",
                 encoding="utf-8")
    m.write_text(render(doc), encoding="utf-8")
    return [j, m]
