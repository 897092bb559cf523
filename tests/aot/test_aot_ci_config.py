"""cibuildwheel resolves aot/ to the builds and steps we mean; the workflows call nox."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sm120fork.aot import pipeline
from sm120fork.declare import load_stacks

REPO = Path(__file__).resolve().parents[2]
AOT = REPO / "aot"
WORKFLOWS = REPO / ".github" / "workflows"


def test_cibuildwheel_builds_one_cp312_manylinux_wheel_per_architecture() -> None:
    out = subprocess.run([sys.executable, "-m", "cibuildwheel", "--print-build-identifiers",
                          "--platform", "linux", str(AOT)], check=True, capture_output=True,
                         text=True).stdout.split()
    assert out == ["cp312-manylinux_x86_64", "cp312-manylinux_aarch64"]


@pytest.mark.parametrize("identifier", ["cp312-manylinux_x86_64", "cp312-manylinux_aarch64"])
def test_cibuildwheel_options_resolve_to_our_steps(identifier: str) -> None:
    plan = pipeline.resolve(AOT, identifier)
    assert plan.frontend == "build"
    assert plan.frontend_args == ("--no-isolation",)
    # The toolchain from the package index, then the stack's fork trees and wheels.
    assert "pip install {project} -r {package}/requirements-build.txt" in plan.before_build
    assert "python -m sm120fork --root {project} build" in plan.before_build
    for lib in ("libcudart.so.13", "libcuda.so.1", "libtvm_ffi.so"):
        assert f"--exclude {lib}" in plan.repair
    assert plan.repair.startswith("auditwheel repair")
    assert "flashinfer_python-*.whl" in plan.before_test
    assert plan.test_command == "python -m sm120fork aot-check --code {wheel}"


def test_manylinux_images_are_2_28_for_both_architectures() -> None:
    from cibuildwheel.options import CommandLineArguments, compute_options

    args = CommandLineArguments.defaults()
    args.platform = "linux"
    args.package_dir = AOT
    build = compute_options("linux", args, env={}).build_options("cp312-manylinux_x86_64")
    assert build.manylinux_images is not None
    for arch in ("x86_64", "aarch64"):
        assert "manylinux_2_28" in build.manylinux_images[arch]


def test_build_requirements_pin_the_cuda_toolchain_from_the_index() -> None:
    reqs = (AOT / "requirements-build.txt").read_text()
    for name in ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-cuda-runtime",
                 "nvidia-cuda-cccl", "nvidia-nvvm"):
        assert re.search(rf"^{name}==13\.0\.\d+$", reqs, re.M), name


def _sessions() -> set[str]:
    tree = ast.parse((REPO / "noxfile.py").read_text())
    return {f.name for f in tree.body if isinstance(f, ast.FunctionDef)
            and any(isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "session"
                    for d in f.decorator_list)}


def _runs(workflow: dict[str, object]) -> list[str]:
    jobs = workflow["jobs"]
    assert isinstance(jobs, dict)
    return [step["run"] for job in jobs.values() for step in job["steps"] if "run" in step]


def test_workflows_call_the_nox_sessions_a_user_runs() -> None:
    sessions = _sessions()
    called: dict[str, set[str]] = {}
    for path in sorted(WORKFLOWS.glob("*.yml")):
        workflow = yaml.safe_load(path.read_text())
        for run in _runs(workflow):
            used = re.findall(r"\bnox -s (\w+)", run)
            if not used:
                # Only installing nox or fetching an input is allowed besides a session.
                assert re.match(r"python3? -m pip (install nox|download )", run), (path, run)
            for name in used:
                assert name in sessions, (path.name, name)
                called.setdefault(path.stem, set()).add(name)
    assert called == {"ci": {"lint", "tests", "e2e", "verify_sm120"}, "build": {"build"},
                      "wheels": {"cibuildwheel"}, "gpu": {"build", "gpu_test", "bench"},
                      "release": {"build", "index"}, "watch": {"watch"}}


def test_workflow_triggers_and_runners() -> None:
    def load(name: str) -> dict[object, object]:
        data: dict[object, object] = yaml.safe_load((WORKFLOWS / name).read_text())
        return data

    def on(name: str) -> dict[str, object]:
        data = load(name)
        triggers = data.get("on", data.get(True))  # YAML 1.1 reads a bare `on` as True
        assert isinstance(triggers, dict)
        return triggers

    assert "pull_request" in on("ci.yml")
    assert set(on("wheels.yml")) == {"push", "workflow_dispatch"}
    assert on("wheels.yml")["push"] == {"tags": ["v*"]}
    assert set(on("gpu.yml")) == {"workflow_dispatch"}
    assert on("release.yml")["push"] == {"tags": ["v*"]}
    assert set(on("watch.yml")) == {"schedule", "workflow_dispatch"}  # weekly, and on demand
    gpu_jobs = load("gpu.yml")["jobs"]
    assert isinstance(gpu_jobs, dict)
    assert gpu_jobs["gpu"]["runs-on"][0] == "self-hosted"


def test_build_workflow_covers_every_declared_stack() -> None:
    workflow = yaml.safe_load((WORKFLOWS / "build.yml").read_text())
    matrix = workflow["jobs"]["build"]["strategy"]["matrix"]["stack"]
    # Every declared stack is built; a stack whose series exists is listed ahead of its
    # declaration landing (sglang-0.5.23), and nothing else.
    assert set(load_stacks(REPO / "forks")) <= set(matrix)
    assert all((REPO / "patches" / name).is_dir() for name in matrix), matrix


def test_the_release_publishes_the_index_of_every_stack_as_the_pages_site() -> None:
    """On a tag every stack is built, `nox -s index` writes the site for the Pages URL,
    and the folder uploaded is the one it writes (wheels/index/)."""
    jobs = yaml.safe_load((WORKFLOWS / "release.yml").read_text())["jobs"]
    steps = jobs["index"]["steps"]
    assert "nox -s build -- --all-stacks" in _runs({"jobs": {"index": jobs["index"]}})
    uses = {s["uses"].split("@")[0]: s for s in steps if "uses" in s}
    assert uses["actions/upload-pages-artifact"]["with"]["path"] == "wheels/index/"
    index = next(s for s in steps if "nox -s index" in s.get("run", ""))
    assert index["env"]["SITE_URL"] == "${{ steps.pages.outputs.base_url }}"
    assert jobs["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    assert [s["uses"].split("@")[0] for s in jobs["deploy"]["steps"]] == [
        "actions/deploy-pages"]


def test_the_build_and_test_steps_take_a_cpu_torch_only() -> None:
    """Issue 18.6: the compile needs torch only for its ABI flag; the CUDA build (~10 GB,
    twice) is never what the AOT steps install."""
    torch_cpu = (AOT / "requirements-torch-cpu.txt").read_text()
    assert re.search(r"^--extra-index-url https://download\.pytorch\.org/whl/cpu$", torch_cpu,
                     re.M)
    assert re.search(r"^torch==[\d.]+\+cpu$", torch_cpu, re.M)
    for name in ("requirements-build.txt", "requirements-test.txt"):
        assert not re.search(r"^torch\b", (AOT / name).read_text(), re.M), name
    for identifier in ("cp312-manylinux_x86_64", "cp312-manylinux_aarch64"):
        plan = pipeline.resolve(AOT, identifier)
        for steps in (plan.before_build, plan.before_test):
            first, _, rest = steps.partition("&&")
            assert "requirements-torch-cpu.txt" in first, steps
            assert "requirements-build.txt" in rest or "requirements-test.txt" in rest
    noxfile = (REPO / "noxfile.py").read_text()
    assert '"-r", "aot/requirements-torch-cpu.txt"' in noxfile.split("def build_aot")[1]


def test_the_workflow_says_the_aarch64_build_has_never_run() -> None:
    text = (WORKFLOWS / "wheels.yml").read_text()
    assert "aarch64" in text
    assert "NOT YET RUN" in text
    assert "never run" in text
