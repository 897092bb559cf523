"""Per-target compile times of the AOT module from nvcc's --time tables (reports/aot/compile/).

Prints a markdown table: for each build and translation unit, the seconds of the device
passes (preprocess, cicc, ptxas) per target and of the host passes, as nvcc recorded them.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from sm120fork.aot.compile import parse_nvcc_times


def main(folder: Path) -> int:
    for csv in sorted(folder.glob("*-nvcc-time.csv")):
        phases = parse_nvcc_times(csv.read_text())
        targets = sorted({p.target for p in phases if p.target},
                         key=lambda t: (len(t), t))
        table: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for p in phases:
            table[p.source][p.target or "host"] += p.seconds
        print(f"\n{csv.name.removesuffix('-nvcc-time.csv')}:\n")
        print("| translation unit | " + " | ".join([*targets, "host"]) + " |")
        print("|---" * (len(targets) + 2) + "|")
        for source in sorted(table):
            cells = [f"{table[source].get(t, 0):.0f}" for t in [*targets, "host"]]
            print(f"| {source} | " + " | ".join(cells) + " |")
        total = [sum(table[s].get(t, 0) for s in table) for t in [*targets, "host"]]
        print("| all three (sum) | " + " | ".join(f"{v:.0f}" for v in total) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "reports/aot/compile")))
