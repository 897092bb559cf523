"""The SM12x proof: ELF parsing, PDL calibration, the JIT gate probe, verdicts, rendering.

Everything that needs nvcc compiles a few-line kernel (under a second) and is skipped with a
reason where nvcc is missing. The end-to-end test runs the whole pipeline on a miniature
FlashInfer tree whose kernel loses its body on SM12x exactly like the real F3 guard does.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import struct
import sys
from pathlib import Path

import pytest

from sm120fork import sm120proof as sp
from sm120fork.errors import VerifyError
from sm120fork.util import proc

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) is not installed")

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
    proc.run([NVCC, sp.gencode_flag(arch), "-cubin", "-o", cubin, cu])
    return cubin


def tools_or_skip(*, disassemble: bool = False) -> sp.Tools:
    if NVCC is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed")
    tools = sp.find_tools(sys.executable)
    if disassemble and not tools.can_disassemble:
        pytest.skip("cuobjdump/nvdisasm not installed (dependency group proof)")
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
    sections = sp.parse_elf_sections(data)
    assert [s.name for s in sections] == ["", ".text.kern_a", ".nv.info.kern_a",
                                          ".text.kern_b", ".shstrtab"]
    cubin = tmp_path / "x.cubin"
    cubin.write_bytes(data)
    assert sp.kernel_sizes(cubin) == {"kern_a": 384, "kern_b": 128}


@pytest.mark.parametrize("data", [b"", b"not an elf file at all" * 4,
                                  b"\x7fELF\x01\x01" + b"\0" * 80])
def test_elf_parser_rejects_non_elf64(data: bytes) -> None:
    with pytest.raises(VerifyError, match="ELF"):
        sp.parse_elf_sections(data, where="x.cubin")


def test_elf_parser_rejects_truncated_section_table() -> None:
    data = synthetic_elf({".text.k": b"\0" * 16})
    with pytest.raises(VerifyError, match="truncated"):
        sp.parse_elf_sections(data[:-10])


@pytest.mark.nvcc
@needs_nvcc
def test_kernel_sizes_of_a_real_cubin(tmp_path: Path) -> None:
    sizes = sp.kernel_sizes(compile_cubin(tmp_path, TINY_CU))
    assert set(sizes) == {"small_k", "big_k"}
    assert 0 < sizes["small_k"] < sizes["big_k"]
    assert all(size % 128 == 0 for size in sizes.values())  # SASS bodies are 128-byte aligned


@pytest.mark.nvcc
@needs_nvcc
def test_guarded_kernel_body_is_empty_on_sm120a(tmp_path: Path) -> None:
    guarded = TINY_CU.replace("for (int", "#if __CUDA_ARCH__ < 1200\n  for (int").replace(
        "512]);\n", "512]);\n#endif\n")
    ref = sp.kernel_sizes(compile_cubin(tmp_path, guarded, "sm_90a"))
    sm120 = sp.kernel_sizes(compile_cubin(tmp_path, guarded, "sm_120a"))
    assert not sp.is_empty_body(sm120["small_k"], ref["small_k"])
    assert sm120["big_k"] <= sp.EMPTY_BODY_BYTES < ref["big_k"]


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
    counts = sp.parse_sass_opcodes(SASS)
    assert counts["kern_a"] == {"LDC": 1, "ACQBULK": 1, "PREEXIT": 1, "EXIT": 1}
    assert counts["kern_b"] == {"LDG": 1, "EXIT": 1}


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_pdl_calibration_finds_griddepcontrol_opcodes(tmp_path: Path, arch: str) -> None:
    tools = tools_or_skip(disassemble=True)
    opcodes = sp.calibrate_pdl_opcodes(arch, tools, tmp_path)
    # Established with this calibration on CUDA 13.0 for sm_90a, sm_100a, sm_120a, sm_121a.
    assert opcodes == sp.PdlOpcodes(arch=arch, wait=("ACQBULK",), launch=("PREEXIT",))


# --------------------------------------------------------------------------- small helpers


@pytest.mark.parametrize(("arch", "entry", "gencode"), [
    ("sm_90a", "9.0a", "-gencode=arch=compute_90a,code=sm_90a"),
    ("sm_120a", "12.0a", "-gencode=arch=compute_120a,code=sm_120a"),
    ("sm_121a", "12.1a", "-gencode=arch=compute_121a,code=sm_121a"),
])
def test_arch_names(arch: str, entry: str, gencode: str) -> None:
    assert sp.arch_list_entry(arch) == entry
    assert sp.gencode_flag(arch) == gencode


def test_bad_arch_name_is_an_error() -> None:
    with pytest.raises(VerifyError, match="not an architecture"):
        sp.arch_list_entry("compute_120")


def test_kernel_family_strips_return_type_and_arguments() -> None:
    name = ("void flashinfer::trtllm_allreduce::oneShotAllReduceKernel<__nv_bfloat16, 8, "
            "true>(flashinfer::AllReduceParams<__nv_bfloat16>)")
    assert sp.kernel_family(name) == "flashinfer::trtllm_allreduce::oneShotAllReduceKernel"
    assert sp.kernel_family("plain_kernel") == "plain_kernel"


def test_make_dependencies_parses_continuations_and_escaped_spaces() -> None:
    text = "x.o : /a/x.cu \\\n    /usr/include/a\\ b.h \\\n    /c/d.cuh\n"
    assert sp._make_dependencies(text) == ["/a/x.cu", "/usr/include/a b.h", "/c/d.cuh"]


def test_lost_pdl_needs_known_counts_on_both_sides() -> None:
    ref = sp.Kernel(name="k", display="k", family="k", size=1, pdl_wait=1, pdl_launch=1)
    assert sp.lost_pdl(dataclasses.replace(ref, pdl_launch=0), ref)
    assert not sp.lost_pdl(ref, ref)
    assert not sp.lost_pdl(dataclasses.replace(ref, pdl_wait=None, pdl_launch=None), ref)
    assert not sp.lost_pdl(dataclasses.replace(ref, pdl_wait=0),
                           dataclasses.replace(ref, pdl_wait=0))


def test_empty_body_thresholds() -> None:
    assert sp.is_empty_body(256, 12_672)
    assert sp.is_empty_body(1_024, 12_672)  # under 10 %
    assert not sp.is_empty_body(12_000, 12_672)
    assert not sp.is_empty_body(256, 512)  # a small reference kernel stays small


# --------------------------------------------------------------------------- verdicts


def kernel(name: str, size: int, pdl: tuple[int, int] | None = (1, 1),
           family: str = "fam") -> sp.Kernel:
    wait, launch = pdl if pdl is not None else (None, None)
    return sp.Kernel(name=name, display=f"void {family}<{name}>()", family=family, size=size,
                     pdl_wait=wait, pdl_launch=launch)


def arch_result(arch: str, kernels: list[sp.Kernel], *, accepted: bool = True,
                compiled: bool = True, seconds: float = 10.0) -> sp.ArchResult:
    gate = sp.GateResult(arch=arch, arch_list=sp.arch_list_entry(arch), accepted=accepted,
                         error=None if accepted else "No supported CUDA architectures found "
                         "for major versions [9, 10].")
    unit = sp.UnitResult(source="csrc/x.cu", cubin=Path(f"/c/{arch}.cubin"), key=arch,
                         seconds=seconds, cached=False, kernels=tuple(kernels))
    return sp.ArchResult(arch=arch, gate=gate, compiled=compiled,
                         units=(unit,) if compiled else ())


REF = [kernel("a", 12_672), kernel("b", 4_096, pdl=(0, 0)), kernel("c", 256)]


def variant(name: str, sm120: sp.ArchResult) -> sp.VariantResult:
    return sp.VariantResult(name=name, tree=Path("/t"),
                            archs=(arch_result("sm_90a", REF), sm120))


def test_verdict_passes_full_kernels_with_pdl() -> None:
    good = [kernel("a", 12_544), kernel("b", 4_224, pdl=(0, 0)), kernel("c", 256)]
    v = sp.verdict(variant("full", arch_result("sm_120a", good)), "sm_120a")
    assert v.status is sp.Status.PASS, v.reasons
    assert (v.present, v.reference_kernels, v.empty) == (3, 3, ())
    assert v.pdl == v.pdl_reference == (2, 2)


def test_verdict_fails_on_empty_kernel_and_lost_pdl() -> None:
    f1_only = [kernel("a", 256, pdl=(0, 0)), kernel("b", 4_224, pdl=(0, 0)),
               kernel("c", 256)]
    v = sp.verdict(variant("F1 only", arch_result("sm_120a", f1_only)), "sm_120a")
    assert v.status is sp.Status.FAIL
    assert v.empty == ("a",)
    assert v.pdl_lost == ("a",)
    assert any("empty body" in r for r in v.reasons)


def test_verdict_fails_on_missing_kernel() -> None:
    v = sp.verdict(variant("x", arch_result("sm_120a", REF[:2])), "sm_120a")
    assert v.status is sp.Status.FAIL
    assert v.missing == ("c",)


def test_verdict_fails_when_gate_refuses_even_if_forced_compile_is_fine() -> None:
    v = sp.verdict(variant("unpatched", arch_result("sm_120a", REF, accepted=False)),
                   "sm_120a")
    assert v.status is sp.Status.FAIL
    assert "No supported CUDA architectures" in v.reasons[0]


def test_verdict_without_disassembler_is_not_checked_not_pass() -> None:
    no_pdl = [kernel(k.name, k.size, pdl=None) for k in REF]
    v = sp.verdict(variant("x", arch_result("sm_120a", no_pdl)), "sm_120a")
    assert v.status is sp.Status.NOT_CHECKED
    assert v.pdl is None


def test_verdict_of_the_reference_itself() -> None:
    assert sp.verdict(variant("x", arch_result("sm_120a", REF)), "sm_90a").status is (
        sp.Status.PASS)


# --------------------------------------------------------------------------- rendering


def three_variant_report() -> sp.ProofReport:
    empty = [kernel("a", 256, pdl=(0, 0)), kernel("b", 4_224, pdl=(0, 0)), kernel("c", 256)]
    full = [kernel("a", 12_544), kernel("b", 4_224, pdl=(0, 0)), kernel("c", 256)]
    variants = (
        variant("unpatched", arch_result("sm_120a", empty, accepted=False)),
        variant("F1 only", arch_result("sm_120a", empty, seconds=0.5)),
        variant("full series", arch_result("sm_120a", full)),
    )
    return sp.ProofReport(variants=variants, archs=("sm_90a", "sm_120a"),
                          reference_arch="sm_90a", nvcc_version="cuda_13.0",
                          pdl_opcodes=(sp.PdlOpcodes(arch="sm_120a", wait=("ACQBULK",),
                                                     launch=("PREEXIT",)),),
                          wall_seconds=1.0)


def test_markdown_lays_variants_side_by_side() -> None:
    md = three_variant_report().to_markdown()
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
    md = three_variant_report().to_markdown()
    assert "| variant | arch | x.cu |" in md
    assert "| F1 only | sm_120a | 0.5 |" in md
    assert "| unpatched | sm_90a | 10.0 |" in md


def test_markdown_family_tables_show_count_min_median_and_empties() -> None:
    md = three_variant_report().to_markdown()
    section = md.split("## Kernel families: F1 only", 1)[1].split("## Kernel families", 1)[0]
    assert "| family | sm_90a: n / min B / median B | sm_120a: n / min B / median B |" in section
    assert "| `fam` | 3 / 256 / 4096 | 3 / 256 / 256 (1 empty, 1 lost PDL) |" in section


def test_to_json_round_trips_with_verdicts() -> None:
    document = json.loads(three_variant_report().to_json())
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
"""


def fake_tree(base: Path, *, majors: list[int], limit: int) -> Path:
    """A tree laid out like FlashInfer's: flashinfer/jit/comm.py, csrc/, include/."""
    tree = base
    (tree / "flashinfer" / "jit").mkdir(parents=True)
    (tree / "csrc").mkdir()
    (tree / "include").mkdir()
    (tree / "flashinfer" / "jit" / "comm.py").write_text(
        FAKE_COMM.format(majors=majors).replace("{NVCC}", NVCC or "nvcc"))
    (tree / "csrc" / "tiny.cu").write_text(FAKE_KERNEL.replace("{limit}", str(limit)))
    (tree / "include" / "pdl.cuh").write_text("#define PDL_ONE 1.0f\n")
    return tree


def probe_tools() -> sp.Tools:
    return sp.Tools(python=Path(sys.executable), nvcc=Path(NVCC or "nvcc"),
                    nvcc_version="test", cuobjdump=None, nvdisasm=None, cxxfilt=None)


def test_gate_probe_records_refusal_verbatim(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "unpatched", majors=[9, 10], limit=1200)
    gate = sp.run_gate(tree, "sm_120a", probe_tools())
    assert not gate.accepted
    assert gate.error == "No supported CUDA architectures found for major versions [9, 10]."
    assert gate.arch_list == "12.0a"


def test_gate_probe_maps_data_links_to_the_source_tree(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "patched", majors=[9, 10, 12], limit=1300)
    gate = sp.run_gate(tree, "sm_121a", probe_tools())
    assert gate.accepted
    assert gate.sources == ("csrc/tiny.cu",)
    assert gate.compile_flags == ("-isystem", str(tree.resolve() / "include"), "-O3",
                                  "-gencode=arch=compute_121a,code=sm_121a")


def test_gate_probe_reports_a_broken_tree(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "t", majors=[9], limit=1200)
    (tree / "flashinfer" / "jit" / "comm.py").write_text("import no_such_module_here\n")
    with pytest.raises(VerifyError, match=r"cannot import flashinfer\.jit\.comm"):
        sp.run_gate(tree, "sm_90a", probe_tools())


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
    report = sp.prove(trees, archs=archs, cache_dir=cache, force_compile=["sm_120a"])
    status = {(v.variant, v.arch): v for v in report.verdicts()}
    assert status[("full series", "sm_120a")].status in {sp.Status.PASS,
                                                         sp.Status.NOT_CHECKED}
    f1 = status[("F1 only", "sm_120a")]
    assert f1.status is sp.Status.FAIL
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

    again = sp.prove(trees, archs=archs, cache_dir=cache, force_compile=["sm_120a"])
    assert all(unit.cached for v in again.variants for a in v.archs for unit in a.units)
    assert [v.status for v in again.verdicts()] == [v.status for v in report.verdicts()]
    md = again.to_markdown()
    assert "| sm_120a | verdict | **FAIL** | **FAIL** |" in md
