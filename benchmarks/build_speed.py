"""Build speed, side by side in one run: toolkit build vs plain ``python -m build``.

Measures, alternating per repetition so that machine noise hits both alike:
  plain  - ``python -m build --wheel`` of each unpatched sdist of the stack;
  cold   - ``python -m sm120fork build`` in a scratch workspace whose only warm state is
           the sdist download cache (fetch, git, patches, wheel, artifact check);
  warm   - the same command again with nothing changed (the no-op rebuild).
Reports medians and the cold/plain ratio (target <= 1.3) and warm time (target <= 2 s)
to reports/build/speed.{json,md}.

    python benchmarks/build_speed.py [--reps 3] [--stack NAME]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from sm120fork.fetch.sdist import download_sdist  # noqa: E402
from sm120fork.workspace import Workspace  # noqa: E402


def timed(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--stack")
    args = parser.parse_args()
    ws = Workspace(ROOT)
    stack = ws.stack(args.stack)
    sdists = [download_sdist(p, ws.sdist_cache) for p in stack.projects]
    rows: dict[str, list[float]] = {"plain": [], "cold": [], "warm": []}
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp_name:
            tmp = Path(tmp_name)
            plain = 0.0
            for sdist in sdists:
                plain += timed([sys.executable, "-m", "build", "--wheel", "--outdir",
                                str(tmp / "plain"), str(sdist)], tmp)
            scratch = tmp / "ws"
            scratch.mkdir()
            shutil.copytree(ROOT / "forks", scratch / "forks")
            shutil.copytree(ROOT / "patches", scratch / "patches")
            shutil.copytree(ws.sdist_cache, scratch / ".forks" / "cache" / "sdists")
            cmd = [sys.executable, "-m", "sm120fork", "-q", "--root", str(scratch), "build"]
            cold = timed(cmd, scratch)
            warm = timed(cmd, scratch)
        rows["plain"].append(plain)
        rows["cold"].append(cold)
        rows["warm"].append(warm)
        print(f"rep {rep + 1}: plain {plain:.1f}s cold {cold:.1f}s warm {warm:.2f}s", flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    result = {
        "stack": stack.name,
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "reps": args.reps,
        "seconds": rows,
        "median": med,
        "cold_over_plain": med["cold"] / med["plain"],
        "targets": {"cold_over_plain_max": 1.3, "warm_max_s": 2.0},
    }
    out = ROOT / "reports" / "build"
    out.mkdir(parents=True, exist_ok=True)
    (out / "speed.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        f"# Build speed: stack {stack.name}",
        "",
        f"{args.reps} repetitions, medians, on {result['machine']['cpus']} CPUs "
        f"({result['machine']['platform']}, Python {result['machine']['python']}); "
        "plain/cold/warm alternate within each repetition. Produced by "
        "`python benchmarks/build_speed.py`; raw numbers in speed.json. The plain builds run "
        "one after the other; the toolkit patches and builds the projects concurrently.",
        "",
        "| measure | median s | runs (s) |",
        "| --- | ---: | --- |",
    ]
    for k, label in (("plain", "plain `python -m build --wheel` of the unpatched sdists"),
                     ("cold", "cold `sm120fork build` (sdists cached)"),
                     ("warm", "warm no-op `sm120fork build`")):
        md.append(f"| {label} | {med[k]:.2f} | {', '.join(f'{x:.2f}' for x in rows[k])} |")
    md += ["", f"cold / plain = **{result['cold_over_plain']:.2f}x** (target <= 1.3x); "
           f"warm no-op = **{med['warm']:.2f} s** (target <= 2 s, whole process)."]
    (out / "speed.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
