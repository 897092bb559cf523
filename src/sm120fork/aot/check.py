"""Does an installed AOT wheel do its job?  FlashInfer's own lookup must land on it.

Run in an environment where the AOT wheel and its FlashInfer are installed (the test step
of cibuildwheel, ``nox -s build_aot``, the GPU machine).  A probe imports the installed
``flashinfer.jit.env`` / ``flashinfer.jit.comm`` the way FlashInfer does at run time (the
package ``__init__`` is skipped, so no GPU is needed) and asks the module's ``JitSpec``
where it would load from; that must be our wheel's file, byte for byte as the manifest says.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sm120fork.aot import provenance
from sm120fork.aot.compile import MODULE
from sm120fork.errors import VerifyError
from sm120fork.util import proc

_MARK = "@@sm120fork-aot-check@@"
_LOOKUP_PROBE = r"""
import importlib, importlib.util, json, os, sys, types
from pathlib import Path
mark = sys.argv[1]
spec = importlib.util.find_spec("flashinfer")
if spec is None or not spec.submodule_search_locations:
    print(mark + json.dumps({"error": "flashinfer is not installed"})); raise SystemExit(0)
root = Path(list(spec.submodule_search_locations)[0])
for name in ("flashinfer", "flashinfer.jit"):
    module = types.ModuleType(name)
    module.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
    sys.modules[name] = module
jit_env = importlib.import_module("flashinfer.jit.env")
comm = importlib.import_module("flashinfer.jit.comm")
import flashinfer_jit_cache
jit_spec = comm.gen_trtllm_comm_module()
marker = Path(str(jit_spec.aot_path) + ".sources")
print(mark + json.dumps({
    "marker": marker.read_text().strip() if marker.is_file() else None,
    "flashinfer": str(root), "flashinfer_version": importlib.import_module(
        "flashinfer.version").__version__,
    "aot_dir": str(jit_env.FLASHINFER_AOT_DIR), "aot_path": str(jit_spec.aot_path),
    "is_aot": jit_spec.is_aot, "jit_cache_version": flashinfer_jit_cache.__version__,
    "jit_cache_built_by": getattr(flashinfer_jit_cache, "BUILT_BY", None),
    "jit_cache_dir": flashinfer_jit_cache.get_jit_cache_dir()}))
"""


def lookup(python: Path | None = None, env: Mapping[str, str] | None = None,
           arch_list: str = "9.0") -> dict[str, Any]:
    """Where the installed FlashInfer would load ``trtllm_comm`` from (no GPU needed)."""
    full = {"FLASHINFER_CUDA_ARCH_LIST": arch_list, "PYTHONDONTWRITEBYTECODE": "1",
            **(env or {})}
    interpreter = python or Path(sys.executable)
    out = proc.run([interpreter, "-c", _LOOKUP_PROBE, _MARK], env=full, quiet=True,
                   cwd=Path(full.get("FLASHINFER_WORKSPACE_BASE") or os.getcwd()))
    payload = next((line.removeprefix(_MARK) for line in out.stdout.splitlines()
                    if line.startswith(_MARK)), None)
    if payload is None:
        raise VerifyError("the lookup probe printed no result",
                          detail=(out.stdout + out.stderr)[-2000:])
    result: dict[str, Any] = json.loads(payload)
    if "error" in result:
        raise VerifyError(result["error"], fix="install the FlashInfer wheel beside the AOT wheel")
    return result


def check_installed(manifest: Mapping[str, Any], found: Mapping[str, Any]) -> list[str]:
    """Problems (empty when FlashInfer will load our module) from :func:`lookup`'s answer."""
    problems: list[str] = []
    entry = manifest["modules"].get(MODULE)
    if entry is None:
        return [f"the wheel has no {MODULE} module"]
    if found["jit_cache_built_by"] != manifest["built_by"]:
        problems.append(f"flashinfer_jit_cache {found['jit_cache_version']} is not ours "
                        f"(built by {found['jit_cache_built_by']!r})")
    if found["jit_cache_version"] != manifest["version"]:
        problems.append(f"installed flashinfer_jit_cache is {found['jit_cache_version']}, the "
                        f"wheel is {manifest['version']}")
    if found["flashinfer_version"] != manifest["flashinfer"]["version"]:
        problems.append(f"installed FlashInfer is {found['flashinfer_version']}, the wheel was "
                        f"built for {manifest['flashinfer']['version']}")
    if Path(found["aot_dir"]).resolve() != Path(found["jit_cache_dir"]).resolve():
        problems.append(f"FlashInfer looks for prebuilt modules in {found['aot_dir']}, not in "
                        f"the wheel's {found['jit_cache_dir']}")
    if not found["is_aot"]:
        problems.append(f"FlashInfer finds no prebuilt {MODULE} at {found['aot_path']}: it "
                        "would JIT-compile")
    else:
        digest = hashlib.sha256(Path(found["aot_path"]).read_bytes()).hexdigest()
        if digest != entry["sha256"]:
            problems.append(f"{found['aot_path']} does not match the manifest's sha256")
    # What our FlashInfer checks before it loads the module (README-prebuilt.md).
    data = Path(found["flashinfer"]) / "data"
    shipped = provenance.own_digest(data / "csrc", data / "include")
    if found["marker"] != shipped:
        problems.append(f"the module's sources marker {found['marker']} is not the digest of "
                        f"the installed FlashInfer's sources ({shipped}): it would be refused")
    return problems
