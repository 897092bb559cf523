"""G7's added module is the toolkit's own policy reader and decision, byte for byte.

SGLang cannot import the toolkit, so the fork-only patch G7 adds one module made by
``sm120fork.plugin.bundle`` from the toolkit's files; these tests fail when the patch's
copy drifts from them, and check that the bundle, imported alone, decides as the toolkit.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from sm120fork.gpu import decision, policy
from sm120fork.plugin import bundle

ROOT = Path(__file__).resolve().parents[2]
SERIES = ROOT / "patches" / "sglang-0.5.23" / "sglang"


def added_file(patch: Path, path: str) -> str | None:
    """The text a ``git format-patch`` file adds as the new file ``path`` (None: it adds
    no such file)."""
    lines = patch.read_text(encoding="utf-8").splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines)
                  if line == f"diff --git a/{path} b/{path}\n"), None)
    if start is None:
        return None
    hunk = next(i for i in range(start, len(lines)) if lines[i].startswith("@@ "))
    out: list[str] = []
    for line in lines[hunk + 1:]:
        if line.startswith("diff --git ") or line == "-- \n":
            break
        if line.startswith("\\"):  # "\ No newline at end of file"
            out[-1] = out[-1].rstrip("\n")
            continue
        out.append(line[1:])
    return "".join(out)


def g7() -> Path:
    (patch,) = SERIES.glob("0007-G7-*.patch")
    return patch


def test_g7_adds_the_bundle_unchanged() -> None:
    carried = added_file(g7(), "python/" + bundle.SGLANG_PATH)
    assert carried is not None, f"{g7().name} adds no python/{bundle.SGLANG_PATH}"
    assert carried == bundle.module_source(), (
        f"{g7().name}'s {bundle.SGLANG_PATH} differs from the toolkit's files: re-make it "
        "with python -m sm120fork.plugin.bundle into the fork tree, then "
        "nox -s refresh -- sglang-0.5.23 sglang")


def _bundled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    source = tmp_path / "sm120fork_allreduce.py"
    source.write_text(bundle.module_source(), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("bundled_sm120fork_allreduce", source)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_the_bundle_alone_decides_as_the_toolkit(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    module = _bundled(tmp_path, monkeypatch)
    imported = {(n.module or "") if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(ast.parse(bundle.module_source()))
                if isinstance(n, ast.Import | ast.ImportFrom)
                for a in n.names}
    assert not {m for m in imported if m.startswith(("sm120fork", "."))}, imported
    doc = {"format": policy.FORMAT, "version": 2, "for_use": True,
           "made": {"created": "2026-12-03", "gpu": "NVIDIA H200", "gpu_count": 1},
           "tp": {"2": {"ranges": [
               {"min_tokens": 1, "max_tokens": 8, "method": "fused_auto",
                "fallback": ["nccl_rmsnorm"]},
               {"min_tokens": 9, "max_tokens": 64, "method": "pcie_ipc_rmsnorm",
                "fallback": ["nccl_rmsnorm"]}]}}}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    monkeypatch.setenv(policy.ENV_VAR, str(path))
    gpu = {"name": "NVIDIA H200"}
    cuda = types.SimpleNamespace(get_device_capability=lambda: (9, 0),
                                 get_device_name=lambda: gpu["name"])
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    module.sglang_forget()
    lines: list[str] = []
    got = module.sglang_decision(2, sm12x=False, announce=lines.append)
    present = module.importable(module.needed_names())
    want = decision.decide(policy.validate(doc, str(path)),
                           decision.Process(world_size=2, gpu_major=9, present=present),
                           source=f"policy {path}, measured 2026-12-03 on NVIDIA H200 x1")
    assert dataclasses.asdict(got) == dataclasses.asdict(want)
    assert lines == [want.line, *want.fallbacks]
    # measured on another GPU model: not followed off SM12x, and the line says why
    gpu["name"] = "NVIDIA H100"
    module.sglang_forget()
    assert module.sglang_decision(2, sm12x=False) is None
    assert "was measured on NVIDIA H200, not on this NVIDIA H100" in \
        module.sglang_not_followed(2)


def _sglang_calls() -> set[str]:
    """The names SGLang's patched code takes from the added module (``policy.NAME``)."""
    patch = g7().read_text(encoding="utf-8")
    return set(re.findall(r"\bpolicy\.(\w+)\(", patch.split(
        f"diff --git a/python/{bundle.SGLANG_PATH}")[0]))


def test_the_bundle_holds_only_what_sglang_calls() -> None:
    """Every top-level name of the bundle is reached from SGLang's call sites (or is
    ``sglang_forget``, a probe's way to re-read the file), and it stays small."""
    assert _sglang_calls() == set(bundle.ENTRY) - {"sglang_forget"}
    tree = ast.parse(bundle.module_source())
    defined: dict[str, ast.stmt] = {}
    for node in tree.body:
        names = ([node.name] if isinstance(node, ast.FunctionDef | ast.ClassDef)
                 else [a.asname or a.name.partition(".")[0] for a in node.names]
                 if isinstance(node, ast.Import | ast.ImportFrom)
                 else [t.id for t in ast.walk(node) if isinstance(t, ast.Name)
                       and isinstance(t.ctx, ast.Store)])
        defined.update(dict.fromkeys(names, node))
    defined.pop("annotations")
    reached: set[str] = set()
    todo = [*_sglang_calls(), "sglang_forget"]
    while todo:
        name = todo.pop()
        if name in defined and name not in reached:
            reached.add(name)
            todo += [n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name)]
    assert set(defined) - reached == set()
    for unwanted in ("derive", "drive", "view", "describe", "BuildError", "main"):
        assert unwanted not in defined
    assert len(bundle.module_source().splitlines()) <= 400
