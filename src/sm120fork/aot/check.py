"""The AOT module's checks: which prebuilt module the installed FlashInfer loads, and why
(a probe imports ``flashinfer.jit`` without the package ``__init__`` and asks each module's
``JitSpec``); and what machine code a module carries, judged by the SM12x proof's rules.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sm120fork.aot.compile import MODULE
from sm120fork.aot.wheel import ENTRY_POINT_NAME, MARKER_SUFFIX, AotManifest, own_digest
from sm120fork.cuda import cubin
from sm120fork.cuda.cubin import REFERENCE_ARCH, demangle, find_cuobjdump, probe
from sm120fork.errors import VerifyError
from sm120fork.util import proc, typed

#: ``module:function`` making the JitSpec of each module asked about by default.
DEFAULT_SPECS: tuple[str, ...] = ("flashinfer.jit.comm:gen_trtllm_comm_module",)

_LOOKUP_PROBE = r"""
import importlib.util
makers, mark = sys.argv[1:-1], sys.argv[-1]
spec = importlib.util.find_spec("flashinfer")
if spec is None or not spec.submodule_search_locations:
    print(mark + json.dumps({"error": "flashinfer is not installed"})); raise SystemExit(0)
root = Path(list(spec.submodule_search_locations)[0])
fake_flashinfer(root)
jit_env = importlib.import_module("flashinfer.jit.env")
core = importlib.import_module("flashinfer.jit.core")
if hasattr(jit_env, "prebuilt_provider_dirs"):  # ours: entry points flashinfer.prebuilt
    lookup = "prebuilt"
    providers = [[n, str(d)] for n, d in jit_env.prebuilt_provider_dirs()]
elif hasattr(jit_env, "FLASHINFER_AOT_PROVIDERS"):  # 0.7.x: providers of upstream's shim
    lookup = "jit-cache-providers"
    providers = [[p.provider_id, str(p.jit_cache_dir)] for p in jit_env.FLASHINFER_AOT_PROVIDERS]
else:
    lookup, providers = None, []
folders = [{"provider": n, "path": d} for n, d in providers]
folders.append({"provider": "FLASHINFER_AOT_DIR", "path": str(jit_env.FLASHINFER_AOT_DIR)})
for folder in folders:
    path = Path(folder["path"])
    folder["modules"] = sorted(p.name for p in path.iterdir()
                               if (p / (p.name + ".so")).is_file()) if path.is_dir() else []
modules = {}
for maker in makers:
    where, _, function = maker.partition(":")
    try:
        jit_spec = getattr(importlib.import_module(where), function)()
    except Exception as exc:
        modules[maker] = {"error": f"{type(exc).__name__}: {exc}"}
        continue
    if hasattr(jit_spec, "prebuilt_verdicts"):
        copies = [{"path": str(p), "load": bool(ok), "why": str(why)}
                  for p, ok, why in jit_spec.prebuilt_verdicts()]
    elif hasattr(jit_spec, "aot_artifacts"):
        copies = [{"path": str(a.path), "load": True,
                   "why": f"provider {a.provider_id} fits the target"}
                  for a in jit_spec.aot_artifacts]
    elif jit_spec.aot_path.exists():
        copies = [{"path": str(jit_spec.aot_path), "load": True,
                   "why": "upstream's lookup loads any file there"}]
    else:
        copies = []
    is_aot = jit_spec.is_aot
    marker = Path(str(jit_spec.aot_path) + ".sources")
    modules[jit_spec.name] = {
        "is_aot": is_aot, "loads_from": str(jit_spec.aot_path) if is_aot else None,
        "copies": copies, "marker": marker.read_text().strip() if marker.is_file() else None}
print(mark + json.dumps({
    "flashinfer": str(root), "flashinfer_version": importlib.import_module(
        "flashinfer.version").__version__, "lookup": lookup,
    "aot_dir": str(jit_env.FLASHINFER_AOT_DIR), "providers": providers,
    "provider_errors": dict(getattr(jit_env, "PREBUILT_PROVIDER_ERRORS", {})),
    "folders": folders, "modules": modules}))
"""


@dataclass(frozen=True, kw_only=True)
class PrebuiltCopy:
    """One prebuilt copy of a module, and whether FlashInfer takes it, and why."""

    path: str
    load: bool
    why: str


@dataclass(frozen=True, kw_only=True)
class ModuleLookup:
    """Where FlashInfer loads one module from (``loads_from`` None: it JIT-compiles it),
    or why it cannot make its JIT spec (``error``)."""

    loads_from: str | None = None
    copies: tuple[PrebuiltCopy, ...] = ()
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class PrebuiltFolder:
    provider: str
    path: str
    modules: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Found:
    """The lookup probe's answer (:func:`lookup`), read once: its one typed reader."""

    #: The installed FlashInfer's package folder, and its version.
    flashinfer: str
    flashinfer_version: str
    #: How it finds prebuilt modules: ``prebuilt``, ``jit-cache-providers`` or None.
    lookup: str | None
    #: (provider name, folder) of each provider it found, and why others failed.
    providers: tuple[tuple[str, str], ...]
    provider_errors: Mapping[str, str] = field(default_factory=dict)
    folders: tuple[PrebuiltFolder, ...]
    modules: Mapping[str, ModuleLookup]
    #: The answer as the probe printed it (``aot-check --json`` shows it whole).
    printed: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> Found:
        """VerifyError naming the key when ``data`` is not the probe's answer."""
        try:
            found = typed.read(cls, data, "", strict=False)
            for name, module in data["modules"].items():
                if "error" not in module and "loads_from" not in module:
                    raise typed.MalformedError("", f"modules.{name}.loads_from", "is missing")
        except typed.MalformedError as exc:
            raise VerifyError(f"the lookup probe's answer is not one: {exc.key}: {exc.what}",
                              fix="run aot-check of this toolkit's version") from None
        return replace(found, printed=data)


def lookup(env: Mapping[str, str] | None = None, arch_list: str = "9.0",
           specs: Sequence[str] = DEFAULT_SPECS) -> Found:
    """Where the installed FlashInfer would load each module from (no GPU needed); ``specs``
    name JitSpec makers (``module:function``, no arguments)."""
    full = {**os.environ, "FLASHINFER_CUDA_ARCH_LIST": arch_list,
            "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    cwd = Path(full.get("FLASHINFER_WORKSPACE_BASE") or os.getcwd())
    cwd.mkdir(parents=True, exist_ok=True)
    result = probe(sys.executable, _LOOKUP_PROBE, *specs, what="the lookup probe", env=full,
                   cwd=cwd)
    if isinstance(result, dict) and "error" in result:
        raise VerifyError(str(result["error"]),
                          fix="install the FlashInfer wheel beside the AOT wheel")
    return Found.from_json(result)


def describe(found: Found) -> list[str]:
    """One line per prebuilt folder and per module: what loads from where, and why."""
    lines = [f"prebuilt folder ({f.provider}): {f.path}: {', '.join(f.modules) or 'no modules'}"
             for f in found.folders]
    for name, module in found.modules.items():
        if module.error:
            lines.append(f"{name}: cannot make its JIT spec: {module.error}")
            continue
        where = module.loads_from or "nowhere prebuilt: JIT-compiled"
        lines.append(f"{name}: loads from {where}")
        for copy in module.copies:
            verdict = "taken" if copy.path == module.loads_from else (
                "acceptable, not first" if copy.load else "refused")
            lines.append(f"  {copy.path}: {verdict} ({copy.why})")
    return lines


def check_installed(manifest: AotManifest, found: Found) -> list[str]:
    """Problems (empty when FlashInfer will load our module) from :func:`lookup`'s answer."""
    problems: list[str] = []
    entry = manifest.modules.get(MODULE)
    if entry is None:
        return [f"the wheel has no {MODULE} module"]
    if found.flashinfer_version != manifest.flashinfer.version:
        problems.append(f"installed FlashInfer is {found.flashinfer_version}, the wheel was "
                        f"built for {manifest.flashinfer.version}")
    wanted = manifest.lookup.name
    if found.lookup != wanted:
        has = ("has no lookup for prebuilt-module packages" if found.lookup is None else
               f"finds prebuilt-module packages by {found.lookup}, the wheel is for {wanted}")
        problems.append(f"the installed FlashInfer {has}: it never looks in the AOT wheel; "
                        "install the FlashInfer wheel it pins")
        return problems
    ours = next((path for name, path in found.providers if name == ENTRY_POINT_NAME), None)
    if ours is None:
        errors = dict(found.provider_errors)
        through = manifest.lookup.through
        hint = (f": FlashInfer asks upstream's {through} shim for providers; install "
                f"{through}=={manifest.version} (FlashInfer's index, e.g. "
                f"`flashinfer install-jit-cache-wheel --mode minimal`)" if through else
                ": is the AOT wheel installed?")
        problems.append(f"FlashInfer sees no prebuilt folder of the AOT wheel (entry point "
                        f"{manifest.lookup.group}: "
                        "sm120fork)" + (f": {errors}" if errors else hint))
        return problems
    module = found.modules.get(MODULE, ModuleLookup())
    if module.error:
        return [*problems, f"FlashInfer cannot make {MODULE}'s JIT spec: {module.error}"]
    loads_from = module.loads_from
    own = Path(ours) / MODULE / f"{MODULE}.so"
    if loads_from is None or Path(loads_from).resolve() != own.resolve():
        why = "; ".join(f"{c.path}: {c.why}" for c in module.copies)
        problems.append(f"FlashInfer loads {MODULE} from {loads_from or 'nowhere (JIT)'}, not "
                        f"from the AOT wheel's {own}" + (f" ({why})" if why else ""))
    elif hashlib.sha256(own.read_bytes()).hexdigest() != entry.sha256:
        problems.append(f"{own} does not match the manifest's sha256")
    # What our FlashInfer checks before it loads the module (README-prebuilt.md).
    data = Path(found.flashinfer) / "data"
    shipped = own_digest(data / "csrc", data / "include")
    marker = own.with_name(own.name + MARKER_SUFFIX)
    recorded = marker.read_text().strip() if marker.is_file() else None
    if recorded != shipped:
        problems.append(f"the module's sources marker {recorded} is not the digest of the "
                        f"installed FlashInfer's sources ({shipped}): it would be refused")
    return problems


_ELF_LINE = re.compile(r"^ELF file\s+\d+:\s+(\S+\.cubin)\s*$")
_CUBIN_TARGET = re.compile(r"\.(sm_\d+[a-z]?)\.cubin$")


@dataclass(frozen=True, kw_only=True)
class TargetCode:
    """One embedded cubin: its target and each kernel's SASS size."""

    target: str
    cubin: str
    kernels: dict[str, int]
    families: dict[str, str]


@dataclass(frozen=True, kw_only=True)
class TargetCheck:
    target: str
    reference_kernels: int
    present: int
    missing: tuple[str, ...]
    empty: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.reference_kernels > 0 and not self.missing and not self.empty


def embedded_code(so: Path) -> list[TargetCode]:
    """Every ELF cubin inside ``so`` (via ``cuobjdump -xelf all``), measured."""
    tool = find_cuobjdump()
    listing = proc.run([tool, "--list-elf", so], quiet=True).stdout
    names = [m.group(1) for line in listing.splitlines() if (m := _ELF_LINE.match(line.strip()))]
    if not names:
        raise VerifyError("no embedded cubins", where=str(so),
                          fix="the module was built without -gencode targets")
    # One cubin per translation unit and target: a target's kernels are their union.
    kernels: dict[str, dict[str, int]] = {}
    cubins: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="sm120fork-aot-elf-") as tmp:
        proc.run([tool, "-xelf", "all", so.resolve()], cwd=Path(tmp), quiet=True)
        for name in names:
            match = _CUBIN_TARGET.search(name)
            target = match.group(1) if match else name
            kernels.setdefault(target, {}).update(cubin.kernel_sizes(Path(tmp) / name))
            cubins.setdefault(target, []).append(name)
    demangled = demangle(sorted({k for sizes in kernels.values() for k in sizes}))
    return [TargetCode(target=target, cubin=", ".join(cubins[target]), kernels=sizes,
                       families={k: cubin.kernel_family(demangled[k]) for k in sizes})
            for target, sizes in kernels.items()]


def check_module(code: Sequence[TargetCode]) -> list[TargetCheck]:
    """The proof's per-kernel rule: present, and not an empty body against sm_90a."""
    reference = next((c for c in code if c.target == REFERENCE_ARCH), None)
    if reference is None:
        raise VerifyError(f"no {REFERENCE_ARCH} code to compare against",
                          fix=f"build the module for {REFERENCE_ARCH} too")
    ref = reference.kernels
    checks = []
    for other in (c for c in code if c is not reference):
        missing, empty = cubin.missing_and_empty(ref, other.kernels)
        checks.append(TargetCheck(target=other.target, reference_kernels=len(ref),
                                  present=len(ref) - len(missing), missing=missing, empty=empty))
    return checks


def family_rows(code: Sequence[TargetCode]) -> list[list[str]]:
    """Per kernel family and target: ``count / min B / median B``."""
    return cubin.family_rows([[(c.families[name], size, ()) for name, size in c.kernels.items()]
                              for c in code])


def summary(code: Sequence[TargetCode], checks: Sequence[TargetCheck]) -> dict[str, object]:
    return {
        "targets": [{"target": c.target, "cubin": c.cubin, "kernels": len(c.kernels),
                     "sass_bytes": sum(c.kernels.values())} for c in code],
        "checks": [{"target": k.target, "ok": k.ok, "reference_kernels": k.reference_kernels,
                    "present": k.present, "missing": len(k.missing), "empty": len(k.empty),
                    "first_empty": list(k.empty[:5])} for k in checks],
    }
