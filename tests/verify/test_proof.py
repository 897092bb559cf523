"""The SM12x proof: ELF parsing, PDL calibration, the JIT gate probe, verdicts, rendering.

Everything that needs nvcc compiles a few-line kernel (under a second) and is skipped with a
reason where nvcc is missing. The end-to-end test runs the whole pipeline on a miniature
FlashInfer tree whose kernel loses its body on SM12x exactly like the real F3 guard does.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct
import sys
from pathlib import Path

import pytest

from sm120fork.cuda.cubin import (
    EMPTY_BODY_BYTES,
    Kernel,
    PdlOpcodes,
    Tools,
    arch_list_entry,
    calibrate_pdl_opcodes,
    find_tools,
    gencode_flag,
    is_empty_body,
    kernel_family,
    kernel_sizes,
    parse_elf_sections,
    parse_sass_opcodes,
    undefined_symbols,
)
from sm120fork.errors import VerifyError
from sm120fork.util import proc
from sm120fork.verify.proof.run import (
    ArchResult,
    GateResult,
    ProofReport,
    Status,
    UnitResult,
    VariantResult,
    lost_pdl,
    make_dependencies,
    prove,
    run_gate,
    verdict,
)
from sm120fork.verify.proof.stack import render_markdown

NVCC = shutil.which("nvcc")

TINY_CU = """\
extern "C" __global__ void small_k(float* x) { x[threadIdx.x] = 1.0f; }
extern "C" __global__ void big_k(float* x, int n) {
  for (int i = 0; i < n; ++i) x[i * 7 % 1024] = __sinf(x[i]) * __expf(x[(i + 3) % 512]);
}
"""


def compile_cubin(tmp_path: Path, source: str, arch: str = "sm_90a") -> Path:
    assert NVCC is not None
    cu = tmp_path / "k.cu"
    cu.write_text(source)
    cubin = tmp_path / f"k_{arch}.cubin"
    proc.run([NVCC, gencode_flag(arch), "-cubin", "-o", cubin, cu])
    return cubin


def skip_or_fail(reason: str) -> None:
    """Skip where a tool is missing, but on CI (CI=true) a missing tool is a failure."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}, and CI=true: CI must run this test")
    pytest.skip(reason)


def tools_or_skip(*, disassemble: bool = False) -> Tools:
    if NVCC is None:
        skip_or_fail("nvcc (CUDA toolkit) is not installed")
    tools = find_tools(sys.executable)
    if disassemble and not tools.can_disassemble:
        skip_or_fail("cuobjdump/nvdisasm not installed (dependency group proof)")
    return tools


# --------------------------------------------------------------------------- ELF


def synthetic_elf(sections: dict[str, bytes]) -> bytes:
    """A minimal ELF64 file: NULL, the given sections, then .shstrtab."""
    names = b"\0"
    offsets = {}
    for name in [*sections, ".shstrtab"]:
        offsets[name] = len(names)
        names += name.encode() + b"\0"
    body = b""
    placed = []
    data_start = 64
    for name, payload in [*sections.items(), (".shstrtab", names)]:
        placed.append((offsets[name], 1, data_start + len(body), len(payload)))
        body += payload
    shoff = data_start + len(body)
    shnum = len(placed) + 1
    header = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + b"\0" * 9, 2, 190, 1,
                         0, 0, shoff, 0, 64, 0, 0, 64, shnum, shnum - 1)
    table = b"\0" * 64 + b"".join(
        struct.pack("<IIQQQQIIQQ", n, t, 0, 0, off, size, 0, 0, 1, 0)
        for n, t, off, size in placed)
    return header + body + table


def test_elf_parser_reads_section_names_and_sizes(tmp_path: Path) -> None:
    data = synthetic_elf({".text.kern_a": b"\0" * 384, ".nv.info.kern_a": b"\0" * 8,
                          ".text.kern_b": b"\0" * 128})
    sections = parse_elf_sections(data)
    assert [s.name for s in sections] == ["", ".text.kern_a", ".nv.info.kern_a",
                                          ".text.kern_b", ".shstrtab"]
    cubin = tmp_path / "x.cubin"
    cubin.write_bytes(data)
    assert kernel_sizes(cubin) == {"kern_a": 384, "kern_b": 128}


@pytest.mark.parametrize("data", [b"", b"not an elf file at all" * 4,
                                  b"\x7fELF\x01\x01" + b"\0" * 80])
def test_elf_parser_rejects_non_elf64(data: bytes) -> None:
    with pytest.raises(VerifyError, match="ELF"):
        parse_elf_sections(data, where="x.cubin")


def test_elf_parser_rejects_truncated_section_table() -> None:
    data = synthetic_elf({".text.k": b"\0" * 16})
    with pytest.raises(VerifyError, match="truncated"):
        parse_elf_sections(data[:-10])


@pytest.mark.nvcc
def test_kernel_sizes_of_a_real_cubin(tmp_path: Path) -> None:
    tools_or_skip()
    sizes = kernel_sizes(compile_cubin(tmp_path, TINY_CU))
    assert set(sizes) == {"small_k", "big_k"}
    assert 0 < sizes["small_k"] < sizes["big_k"]
    assert all(size % 128 == 0 for size in sizes.values())  # SASS bodies are 128-byte aligned


@pytest.mark.nvcc
def test_guarded_kernel_body_is_empty_on_sm120a(tmp_path: Path) -> None:
    tools_or_skip()
    guarded = TINY_CU.replace("for (int", "#if __CUDA_ARCH__ < 1200\n  for (int").replace(
        "512]);\n", "512]);\n#endif\n")
    ref = kernel_sizes(compile_cubin(tmp_path, guarded, "sm_90a"))
    sm120 = kernel_sizes(compile_cubin(tmp_path, guarded, "sm_120a"))
    assert not is_empty_body(sm120["small_k"], ref["small_k"])
    assert sm120["big_k"] <= EMPTY_BODY_BYTES < ref["big_k"]


# --------------------------------------------------------------------------- SASS / PDL

SASS = """\
\tcode for sm_90a
\t\tFunction : kern_a
        /*0000*/                   LDC R1, c[0x0][0x28] ;           /* 0x00000a00ff017b82 */
        /*0010*/                   ACQBULK ;                        /* 0x0000000000007b1d */
        /*0020*/              @!P0 PREEXIT ;                        /* 0x000000000000782d */
        /*0030*/                   EXIT ;                           /* 0x000000000000794d */
\t\tFunction : kern_b
        /*0000*/                   LDG.E R0, desc[UR4][R2.64] ;
        /*0010*/                   EXIT ;
"""


def test_parse_sass_counts_base_opcodes_per_function() -> None:
    counts = parse_sass_opcodes(SASS)
    assert counts["kern_a"] == {"LDC": 1, "ACQBULK": 1, "PREEXIT": 1, "EXIT": 1}
    assert counts["kern_b"] == {"LDG": 1, "EXIT": 1}


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_pdl_calibration_finds_griddepcontrol_opcodes(tmp_path: Path, arch: str) -> None:
    tools = tools_or_skip(disassemble=True)
    opcodes = calibrate_pdl_opcodes(arch, tools, tmp_path)
    # Established with this calibration on CUDA 13.0 for sm_90a, sm_100a, sm_120a, sm_121a.
    assert opcodes == PdlOpcodes(arch=arch, wait=("ACQBULK",), launch=("PREEXIT",))


# --------------------------------------------------------------------------- small helpers


@pytest.mark.parametrize(("arch", "entry", "gencode"), [
    ("sm_90a", "9.0a", "-gencode=arch=compute_90a,code=sm_90a"),
    ("sm_120a", "12.0a", "-gencode=arch=compute_120a,code=sm_120a"),
    ("sm_121a", "12.1a", "-gencode=arch=compute_121a,code=sm_121a"),
    # what every 12.x GPU gets: its own capability, which FlashInfer normalises to 120f
    ("sm_120f", "12.0", "-gencode=arch=compute_120f,code=sm_120f"),
])
def test_arch_names(arch: str, entry: str, gencode: str) -> None:
    assert arch_list_entry(arch) == entry
    assert gencode_flag(arch) == gencode


def test_bad_arch_name_is_an_error() -> None:
    with pytest.raises(VerifyError, match="not an architecture"):
        arch_list_entry("compute_120")


def test_kernel_family_strips_return_type_and_arguments() -> None:
    name = ("void flashinfer::trtllm_allreduce::oneShotAllReduceKernel<__nv_bfloat16, 8, "
            "true>(flashinfer::AllReduceParams<__nv_bfloat16>)")
    assert kernel_family(name) == "flashinfer::trtllm_allreduce::oneShotAllReduceKernel"
    assert kernel_family("plain_kernel") == "plain_kernel"


def test_make_dependencies_parses_continuations_and_escaped_spaces() -> None:
    text = "x.o : /a/x.cu \\\n    /usr/include/a\\ b.h \\\n    /c/d.cuh\n"
    assert make_dependencies(text) == ["/a/x.cu", "/usr/include/a b.h", "/c/d.cuh"]


def test_lost_pdl_needs_known_counts_on_both_sides() -> None:
    ref = Kernel(name="k", display="k", family="k", size=1, pdl_wait=1, pdl_launch=1)
    assert lost_pdl(dataclasses.replace(ref, pdl_launch=0), ref)
    assert not lost_pdl(ref, ref)
    assert not lost_pdl(dataclasses.replace(ref, pdl_wait=None, pdl_launch=None), ref)
    assert not lost_pdl(dataclasses.replace(ref, pdl_wait=0),
                           dataclasses.replace(ref, pdl_wait=0))


def test_empty_body_thresholds() -> None:
    assert is_empty_body(256, 12_672)
    assert is_empty_body(1_024, 12_672)  # under 10 %
    assert not is_empty_body(12_000, 12_672)
    assert not is_empty_body(256, 512)  # a small reference kernel stays small


# --------------------------------------------------------------------------- verdicts


def kernel(name: str, size: int, pdl: tuple[int, int] | None = (1, 1),
           family: str = "fam") -> Kernel:
    wait, launch = pdl if pdl is not None else (None, None)
    return Kernel(name=name, display=f"void {family}<{name}>()", family=family, size=size,
                     pdl_wait=wait, pdl_launch=launch)


def arch_result(arch: str, kernels: list[Kernel], *, accepted: bool = True,
                compiled: bool = True, seconds: float = 10.0) -> ArchResult:
    gate = GateResult(arch=arch, arch_list=arch_list_entry(arch), accepted=accepted,
                         error=None if accepted else "No supported CUDA architectures found "
                         "for major versions [9, 10].")
    unit = UnitResult(source="csrc/x.cu", cubin=Path(f"/c/{arch}.cubin"), key=arch,
                         seconds=seconds, cached=False, kernels=tuple(kernels))
    return ArchResult(arch=arch, gate=gate, compiled=compiled,
                         units=(unit,) if compiled else ())


REF = [kernel("a", 12_672), kernel("b", 4_096, pdl=(0, 0)), kernel("c", 256)]


def variant(name: str, sm120: ArchResult) -> VariantResult:
    return VariantResult(name=name, tree=Path("/t"),
                            archs=(arch_result("sm_90a", REF), sm120))


def test_verdict_passes_full_kernels_with_pdl() -> None:
    good = [kernel("a", 12_544), kernel("b", 4_224, pdl=(0, 0)), kernel("c", 256)]
    v = verdict(variant("full", arch_result("sm_120a", good)), "sm_120a")
    assert v.status is Status.PASS, v.reasons
    assert (v.present, v.reference_kernels, v.empty) == (3, 3, ())
    assert v.pdl == v.pdl_reference == (2, 2)


def test_verdict_fails_on_empty_kernel_and_lost_pdl() -> None:
    f1_only = [kernel("a", 256, pdl=(0, 0)), kernel("b", 4_224, pdl=(0, 0)),
               kernel("c", 256)]
    v = verdict(variant("F1 only", arch_result("sm_120a", f1_only)), "sm_120a")
    assert v.status is Status.FAIL
    assert v.empty == ("a",)
    assert v.pdl_lost == ("a",)
    assert any("empty body" in r for r in v.reasons)


def test_verdict_fails_on_missing_kernel() -> None:
    v = verdict(variant("x", arch_result("sm_120a", REF[:2])), "sm_120a")
    assert v.status is Status.FAIL
    assert v.missing == ("c",)


def test_verdict_fails_when_gate_refuses_even_if_forced_compile_is_fine() -> None:
    v = verdict(variant("unpatched", arch_result("sm_120a", REF, accepted=False)),
                   "sm_120a")
    assert v.status is Status.FAIL
    assert "No supported CUDA architectures" in v.reasons[0]


def test_verdict_without_disassembler_is_not_checked_not_pass() -> None:
    no_pdl = [kernel(k.name, k.size, pdl=None) for k in REF]
    v = verdict(variant("x", arch_result("sm_120a", no_pdl)), "sm_120a")
    assert v.status is Status.NOT_CHECKED
    assert v.pdl is None


def test_verdict_of_the_reference_itself() -> None:
    assert verdict(variant("x", arch_result("sm_120a", REF)), "sm_90a").status is (
        Status.PASS)


# --------------------------------------------------------------------------- rendering


def three_variant_report() -> ProofReport:
    empty = [kernel("a", 256, pdl=(0, 0)), kernel("b", 4_224, pdl=(0, 0)), kernel("c", 256)]
    full = [kernel("a", 12_544), kernel("b", 4_224, pdl=(0, 0)), kernel("c", 256)]
    variants = (
        variant("unpatched", arch_result("sm_120a", empty, accepted=False)),
        variant("F1 only", arch_result("sm_120a", empty, seconds=0.5)),
        variant("full series", arch_result("sm_120a", full)),
    )
    return ProofReport(variants=variants, archs=("sm_90a", "sm_120a"),
                          reference_arch="sm_90a", nvcc_version="cuda_13.0",
                          pdl_opcodes=(PdlOpcodes(arch="sm_120a", wait=("ACQBULK",),
                                                     launch=("PREEXIT",)),),
                          wall_seconds=1.0)


def test_markdown_lays_variants_side_by_side() -> None:
    md = render_markdown(three_variant_report())
    lines = md.splitlines()
    assert "| arch | check | unpatched | F1 only | full series |" in lines
    verdict_row = next(line for line in lines if line.startswith("| sm_120a | verdict |"))
    assert verdict_row == "| sm_120a | verdict | **FAIL** | **FAIL** | **PASS** |"
    empty_row = next(line for line in lines if line.startswith("| sm_120a | empty kernels |"))
    assert empty_row == "| sm_120a | empty kernels | 1 | 1 | 0 |"
    gate_row = next(line for line in lines if line.startswith("| sm_120a | JIT gate |"))
    assert "refused: `No supported CUDA architectures found" in gate_row
    assert "| accepted | accepted |" in gate_row
    pdl_row = next(line for line in lines if line.startswith("| sm_120a | PDL |"))
    assert "1 / 1 vs 2 / 2 (ACQBULK / PREEXIT); 1 kernels lost PDL" in pdl_row
    assert "2 / 2 vs 2 / 2" in pdl_row


def test_markdown_lists_compile_seconds_per_unit() -> None:
    md = render_markdown(three_variant_report())
    assert "| variant | arch | x.cu |" in md
    assert "| F1 only | sm_120a | 0.5 |" in md
    assert "| unpatched | sm_90a | 10.0 |" in md


def test_markdown_family_tables_show_count_min_median_and_empties() -> None:
    md = render_markdown(three_variant_report())
    section = md.split("## Kernel families: F1 only", 1)[1].split("## Kernel families", 1)[0]
    assert "| family | sm_90a: n / min B / median B | sm_120a: n / min B / median B |" in section
    assert "| `fam` | 3 / 256 / 4096 | 3 / 256 / 256 (1 empty, 1 lost PDL) |" in section


def test_to_json_round_trips_with_verdicts() -> None:
    document = three_variant_report().document()
    statuses = {(v["variant"], v["arch"]): v["status"] for v in document["verdicts"]}
    assert statuses[("full series", "sm_120a")] == "pass"
    assert statuses[("unpatched", "sm_120a")] == "fail"
    assert document["report"]["variants"][0]["archs"][1]["gate"]["accepted"] is False


# --------------------------------------------------------------------------- the JIT gate probe

FAKE_COMM = '''\
import os
from pathlib import Path

SUPPORTED = {majors}
CSRC = Path(__file__).resolve().parents[1] / "data" / "csrc"


class Spec:
    def __init__(self, flags):
        self.sources = [CSRC / "tiny.cu"]
        self.extra_cuda_cflags = flags

    def get_compile_commands(self):
        include = Path(__file__).resolve().parents[1] / "data" / "include"
        return [{{"command": f"{{NVCC}} -c {{s}} -isystem {{include}} "
                 + " ".join(self.extra_cuda_cflags) + " -o /nowhere/x.o", "file": str(s)}}
                for s in self.sources]


def gen_trtllm_comm_module():
    entry = os.environ["FLASHINFER_CUDA_ARCH_LIST"]
    major, minor = entry.split(".")
    if int(major) not in SUPPORTED:
        raise RuntimeError(
            f"No supported CUDA architectures found for major versions {{SUPPORTED}}.")
    if not minor[-1].isalpha():
        minor += "f" if major == "12" else "a"  # as FlashInfer's compilation context does
    number = major + minor
    return Spec(["-O3", f"-gencode=arch=compute_{{number}},code=sm_{{number}}"])
'''

FAKE_KERNEL = """\
#include "pdl.cuh"
extern "C" __global__ void lamport_k(float* x, int n) {
#if (__CUDA_ARCH__ >= 900) && (__CUDA_ARCH__ < {limit})
  asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int i = 0; i < n; ++i) x[i * 7 % 1024] = __sinf(x[i]) * __expf(x[(i + 3) % 512]);
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
extern "C" __global__ void plain_k(float* x) { x[threadIdx.x] = PDL_ONE; }
{launcher}
"""
#: Host code of the fixture's launcher: with F5, it asks the device for the cluster size.
QUERYING_LAUNCHER = """int cluster_size_for(int block) {
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(block);
  int answer = 0;
  if (cudaOccupancyMaxPotentialClusterSize(&answer, (void const*)lamport_k, &config) !=
      cudaSuccess) { (void)cudaGetLastError(); return 1; }
  return answer > 1 ? answer : 1;
}
"""
ASSUMING_LAUNCHER = "int cluster_size_for(int) { return 8; }\n"


def fake_tree(base: Path, *, majors: list[int], limit: int, query: bool = False) -> Path:
    """A tree laid out like FlashInfer's: flashinfer/jit/comm.py, csrc/, include/."""
    tree = base
    (tree / "flashinfer" / "jit").mkdir(parents=True)
    (tree / "csrc").mkdir()
    (tree / "include").mkdir()
    (tree / "flashinfer" / "jit" / "comm.py").write_text(
        FAKE_COMM.format(majors=majors).replace("{NVCC}", NVCC or "nvcc"))
    (tree / "csrc" / "tiny.cu").write_text(FAKE_KERNEL.replace("{limit}", str(limit)).replace(
        "{launcher}", QUERYING_LAUNCHER if query else ASSUMING_LAUNCHER))
    (tree / "include" / "pdl.cuh").write_text("#define PDL_ONE 1.0f\n")
    return tree


def probe_tools() -> Tools:
    return Tools(python=Path(sys.executable), nvcc=Path(NVCC or "nvcc"),
                    nvcc_version="test", cuobjdump=None, nvdisasm=None)


def test_gate_probe_records_refusal_verbatim(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "unpatched", majors=[9, 10], limit=1200)
    gate = run_gate(tree, "sm_120a", probe_tools())
    assert not gate.accepted
    assert gate.error == "No supported CUDA architectures found for major versions [9, 10]."
    assert gate.arch_list == "12.0a"


def test_gate_probe_maps_data_links_to_the_source_tree(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "patched", majors=[9, 10, 12], limit=1300)
    gate = run_gate(tree, "sm_121a", probe_tools())
    assert gate.accepted
    assert gate.sources == ("csrc/tiny.cu",)
    assert gate.compile_flags == ("-isystem", str(tree.resolve() / "include"), "-O3",
                                  "-gencode=arch=compute_121a,code=sm_121a")


def test_gate_probe_reports_a_broken_tree(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "t", majors=[9], limit=1200)
    (tree / "flashinfer" / "jit" / "comm.py").write_text("import no_such_module_here\n")
    with pytest.raises(VerifyError, match=r"cannot import flashinfer\.jit\.comm"):
        run_gate(tree, "sm_90a", probe_tools())


# --------------------------------------------------------------------------- end to end


@pytest.mark.nvcc
@pytest.mark.slow
def test_prove_end_to_end_with_cache(tmp_path: Path) -> None:
    tools_or_skip()
    trees = {
        "unpatched": fake_tree(tmp_path / "unpatched", majors=[9, 10], limit=1200),
        "F1 only": fake_tree(tmp_path / "f1", majors=[9, 10, 12], limit=1200),
        "full series": fake_tree(tmp_path / "full", majors=[9, 10, 12], limit=1300),
    }
    cache = tmp_path / "cache"
    archs = ("sm_90a", "sm_120a")
    report = prove(trees, archs=archs, cache_dir=cache, force_compile=["sm_120a"])
    status = {(v.variant, v.arch): v for v in report.verdicts()}
    assert status[("full series", "sm_120a")].status in {Status.PASS,
                                                         Status.NOT_CHECKED}
    f1 = status[("F1 only", "sm_120a")]
    assert f1.status is Status.FAIL
    assert f1.empty == ("lamport_k",)
    unpatched = report.variants[0].arch("sm_120a")
    assert unpatched is not None
    assert unpatched.forced
    assert not unpatched.gate.accepted
    # F1 only compiles the same C++ as unpatched: every one of its cubins came from the cache.
    f1_result = report.variants[1]
    assert all(unit.cached for a in f1_result.archs for unit in a.units)
    assert not any(unit.cached for a in report.variants[2].archs for unit in a.units)
    if report.pdl_opcodes:
        assert status[("full series", "sm_120a")].pdl == (1, 1)
        assert f1.pdl == (0, 0)
        assert f1.pdl_lost == ("lamport_k",)

    again = prove(trees, archs=archs, cache_dir=cache, force_compile=["sm_120a"])
    assert all(unit.cached for v in again.variants for a in v.archs for unit in a.units)
    assert [v.status for v in again.verdicts()] == [v.status for v in report.verdicts()]
    md = render_markdown(again)
    assert "| sm_120a | verdict | **FAIL** | **FAIL** |" in md


@pytest.mark.nvcc
def test_host_object_lists_the_runtime_calls_of_its_launcher(tmp_path: Path) -> None:
    tools_or_skip()
    assert NVCC is not None
    objects = {}
    for name, launcher in (("query", QUERYING_LAUNCHER), ("assume", ASSUMING_LAUNCHER)):
        cu = tmp_path / f"{name}.cu"
        cu.write_text(FAKE_KERNEL.replace("{limit}", "1300").replace('#include "pdl.cuh"',
                      "#define PDL_ONE 1.0f").replace("{launcher}", launcher))
        obj = tmp_path / f"{name}.o"
        proc.run([NVCC, gencode_flag("sm_90a"), "-c", "-o", obj, cu])
        objects[name] = undefined_symbols(obj.read_bytes(), where=str(obj))
    assert "cudaOccupancyMaxPotentialClusterSize" in objects["query"]
    assert "cudaOccupancyMaxPotentialClusterSize" not in objects["assume"]


def _check_all(report: ProofReport, root: Path) -> dict[str, tuple[str, bool]]:
    from sm120fork.verify.proof.patches import PROOF_CHECKS, Context

    ctx = Context(root=root, proof=report, gate_variant="F1 only")
    return {name: fn(ctx) for name, fn in PROOF_CHECKS.items()}


@pytest.mark.nvcc
@pytest.mark.slow
def test_patch_checks_tell_each_fix_apart_on_fixture_trees(tmp_path: Path) -> None:
    """jit-gate, kernel-bodies and cluster-query each look at their own evidence: a tree
    with bodies but no cluster query passes the first two and fails the third."""
    tools_or_skip()
    unpatched = fake_tree(tmp_path / "unpatched", majors=[9, 10], limit=1200)
    f1 = fake_tree(tmp_path / "f1", majors=[9, 10, 12], limit=1200)
    no_query = fake_tree(tmp_path / "no-query", majors=[9, 10, 12], limit=1300)
    full = fake_tree(tmp_path / "full", majors=[9, 10, 12], limit=1300, query=True)
    options: dict[str, object] = {
        "archs": ("sm_90a", "sm_120f", "sm_120a"), "cache_dir": tmp_path / "cache",
        "compile_archs": {"unpatched": ("sm_90a", "sm_120f"), "F1 only": ("sm_90a", "sm_120f")},
        "force_compile": ["sm_120f"], "host_archs": ["sm_120f"]}

    def checks(full_tree: Path) -> dict[str, tuple[str, bool]]:
        trees = {"unpatched": unpatched, "F1 only": f1, "full series": full_tree}
        return _check_all(prove(trees, **options), tmp_path)  # type: ignore[arg-type]

    good = checks(full)
    assert all(ok for _, ok in good.values()), good
    assert "1/1 translation units with the full series, 0/1 unpatched" in good["cluster-query"][0]
    assert "sm_120f (12.0): unpatched refuses, full series accepts" in good["jit-gate"][0]
    assert "F1 only: 1 empty" in good["kernel-bodies"][0]
    without_query = checks(no_query)
    assert without_query["jit-gate"][1]
    assert without_query["kernel-bodies"][1]
    assert not without_query["cluster-query"][1]
    nothing = checks(unpatched)
    assert not any(ok for _, ok in nothing.values()), nothing


def test_an_unplanned_build_whose_gate_accepts_is_not_checked() -> None:
    ref = arch_result("sm_90a", REF)
    skipped = ArchResult(arch="sm_120a", gate=GateResult(arch="sm_120a", arch_list="12.0a",
                                                         accepted=True),
                         compiled=False, planned=False)
    v = verdict(VariantResult(name="F1 only", tree=Path("t"), archs=(ref, skipped)), "sm_120a")
    assert v.status is Status.NOT_CHECKED


def test_missing_tools_fail_on_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    from sm120fork.cuda.cubin import require_tools_in_ci

    tools = Tools(python=Path(sys.executable), nvcc=Path("nvcc"), nvcc_version="x",
                  cuobjdump=None, nvdisasm=None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(VerifyError, match="CI=true"):
        require_tools_in_ci(tools)
    monkeypatch.setenv("CI", "false")
    require_tools_in_ci(tools)
