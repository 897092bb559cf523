"""Architectures, and the JIT gate: what the tree's own FlashInfer JIT says for one of them."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shlex
import tempfile
from pathlib import Path

from sm120fork.cuda.arch import arch_list_entry, gencode_flag
from sm120fork.cuda.tools import PROBE_MARK, Tools
from sm120fork.errors import VerifyError
from sm120fork.util import proc

log = logging.getLogger("sm120fork")

#: The editable-install links build_backend.py makes under flashinfer/data (an sdist or a
#: git checkout has none; the JIT's paths point through them).
_DATA_LINKS: tuple[tuple[str, str], ...] = (
    ("cutlass", "3rdparty/cutlass"),
    ("spdlog", "3rdparty/spdlog"),
    ("csrc", "csrc"),
    ("include", "include"),
)

# Stubbing the two package modules runs flashinfer/jit/comm.py and what it imports, but not
# flashinfer/__init__.py, which would pull in every kernel wrapper and its dependencies.
_GATE_PROBE = r"""
import importlib, json, sys, types
from pathlib import Path

tree = Path(sys.argv[1]).resolve()
mark = sys.argv[2]
for name in ("flashinfer", "flashinfer.jit"):
    module = types.ModuleType(name)
    module.__path__ = [str(tree.joinpath(*name.split(".")))]
    sys.modules[name] = module
try:
    comm = importlib.import_module("flashinfer.jit.comm")
except Exception as exc:
    print(mark + json.dumps({"import_error": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
try:
    spec = comm.gen_trtllm_comm_module()
except Exception as exc:
    result = {"accepted": False, "error": str(exc)}
else:
    result = {
        "accepted": True,
        "nvcc_flags": list(spec.extra_cuda_cflags or []),
        "commands": [c["command"] for c in spec.get_compile_commands()],
    }
print(mark + json.dumps(result))
"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateResult:
    """What ``gen_trtllm_comm_module()`` said for one FLASHINFER_CUDA_ARCH_LIST value."""

    arch: str
    arch_list: str
    accepted: bool
    error: str | None = None
    sources: tuple[str, ...] = ()
    nvcc_flags: tuple[str, ...] = ()
    compile_flags: tuple[str, ...] = ()


def _map_data_links(text: str, tree: Path) -> str:
    for link, target in _DATA_LINKS:
        prefix = tree / "flashinfer" / "data" / link
        if not prefix.exists():
            text = re.sub(re.escape(str(prefix)) + r"(?=/|\s|$)", str(tree / target), text)
    return text


def run_gate(tree: Path, arch: str, tools: Tools) -> GateResult:
    """Ask the tree's own JIT for the trtllm comm module, targeting ``arch`` only."""
    tree = tree.resolve()
    entry = arch_list_entry(arch)
    with tempfile.TemporaryDirectory(prefix="sm120fork-proof-jit-") as workspace:
        env = {"PYTHONPATH": str(tree), "FLASHINFER_CUDA_ARCH_LIST": entry,
               "FLASHINFER_WORKSPACE_BASE": workspace, "PYTHONDONTWRITEBYTECODE": "1"}
        log.info("+ FLASHINFER_CUDA_ARCH_LIST=%s PYTHONPATH=%s %s -c <gen_trtllm_comm_module "
                 "probe>", entry, tree, tools.python)
        out = proc.run([tools.python, "-c", _GATE_PROBE, tree, PROBE_MARK], env=env,
                       cwd=Path(workspace), quiet=True).stdout
    payload = next((line.removeprefix(PROBE_MARK) for line in out.splitlines()
                    if line.startswith(PROBE_MARK)), None)
    if payload is None:
        raise VerifyError("the JIT gate probe printed no result", where=str(tree), fix=out[-2000:])
    result = json.loads(payload)
    if not isinstance(result, dict):
        raise VerifyError("the JIT gate probe printed no result object", where=str(tree),
                          fix=out[-2000:])
    if "import_error" in result:
        raise VerifyError(
            f"cannot import flashinfer.jit.comm: {result['import_error']}", where=str(tree),
            fix=f"pip install --group proof (pyproject.toml) into {tools.python}")
    if not result["accepted"]:
        log.info("JIT gate %s refused %s: %s", tree.name, entry, result["error"])
        return GateResult(arch=arch, arch_list=entry, accepted=False, error=result["error"])
    sources: list[str] = []
    flag_sets: set[tuple[str, ...]] = set()
    for command in result["commands"]:
        argv = shlex.split(_map_data_links(command, tree))
        if len(argv) < 5 or argv[1] != "-c" or argv[-2] != "-o":
            raise VerifyError(f"unexpected JIT compile command: {command}", where=str(tree))
        sources.append(Path(argv[2]).relative_to(tree).as_posix())
        flag_sets.add(tuple(argv[3:-2]))
    if len(flag_sets) != 1:
        raise VerifyError("the JIT compiles its sources with different flags", where=str(tree))
    flags = flag_sets.pop()
    if gencode_flag(arch) not in flags:
        raise VerifyError(f"the JIT's flags do not target {arch}: {shlex.join(flags)}",
                          where=str(tree))
    return GateResult(arch=arch, arch_list=entry, accepted=True, sources=tuple(sources),
                      nvcc_flags=tuple(result["nvcc_flags"]), compile_flags=flags)


def retarget(flags: tuple[str, ...], source_arch: str, arch: str) -> tuple[str, ...]:
    return tuple(gencode_flag(arch) if f == gencode_flag(source_arch) else f for f in flags)
