"""Issue 17 item 7: the GPU CLI only parses and prints; the GPU code is split by job."""

from __future__ import annotations

import ast
from pathlib import Path

GPU = Path(__file__).resolve().parents[2] / "src" / "sm120fork" / "gpu"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_the_cli_neither_runs_ranks_nor_writes_reports() -> None:
    """Orchestration (installs, module builds, rank groups, reports) lives in gpu/runs.py."""
    imported = _imports(GPU / "cli.py")
    for job in ("subprocess", "shutil", "json", "sm120fork.gpu.launcher",
                "sm120fork.gpu.variants", "sm120fork.gpu.supervise", "sm120fork.gpu.report",
                "sm120fork.gpu.policy"):
        assert job not in imported, job
    assert "sm120fork.gpu.runs" in imported


def test_one_job_per_module() -> None:
    """The watchdog, the variants, the batches, and each rank-side job are apart."""
    jobs = {
        "supervise.py": "def run_group(", "variants.py": "def install_variant(",
        "launcher.py": "def run_cases(", "rank.py": "class Rank:",
        "correctness.py": "def run_case(", "timing.py": "def _time_graph(",
        "probe.py": "def run_compile(", "worker.py": "def main(",
    }
    for module, defines in jobs.items():
        text = (GPU / module).read_text()
        assert defines in text, (module, defines)
        others = [d for m, d in jobs.items() if m != module and d != defines]
        assert not [d for d in others if d in text], module
    assert len((GPU / "worker.py").read_text().splitlines()) < 80
