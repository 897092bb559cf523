"""Install-and-import check of the patched cp312 sglang 0.5.23 wheel on the GPU machine's
Python 3.12, with the real torch and the real FlashInfer 0.7.2 (no capability stub).
Prints one JSON object; exit 1 if any import fails."""
import importlib, importlib.metadata as md, json, sys, traceback
from pathlib import Path

site = Path(sys.argv[1])
res = {"python": sys.version.split()[0], "sglang_version": md.version("sglang"), "imports": {}}
mods = ["sglang"]
mods += sorted(".".join(p.relative_to(site).with_suffix("").with_suffix("").parts)
               for p in (site / "sglang").rglob("*.cpython-312-x86_64-linux-gnu.so"))
layers = ["sglang.srt.layers.flashinfer_comm_fusion",
          "sglang.srt.layers.layer_boundary.residual.add_norm",
          "sglang.srt.arg_groups.overrides"]
ok = True
for name in mods + layers:
    if name == layers[0]:
        # sgl_kernel (built for torch 2.14.1) is not on this machine: an import stub, as
        # in the layer run; it is the only stub, and it comes after the Rust extensions.
        from sm120fork.gpu.sglang_rank import GPU_STUBS, _stub_packages
        _stub_packages(GPU_STUBS)
        res["stubbed_for_layer_imports"] = list(GPU_STUBS)
    try:
        m = importlib.import_module(name)
        f = Path(m.__file__).resolve()
        res["imports"][name] = {"ok": True, "file": str(f.relative_to(site.resolve()))}
    except BaseException as exc:  # noqa: BLE001 - recorded, and the run fails
        ok = False
        res["imports"][name] = {"ok": False, "error": "".join(
            traceback.format_exception_only(type(exc), exc)).strip()[-600:]}
fcf = site / "sglang/srt/layers/flashinfer_comm_fusion.py"
res["patched_text_present"] = (
    "FlashInfer allreduce fusion on SM12x GPUs supports single-node" in fcf.read_text())
import torch
res["torch"] = torch.__version__
res["gpu"] = torch.cuda.get_device_name(0)
res["capability"] = list(torch.cuda.get_device_capability(0))
print(json.dumps(res, indent=1))
sys.exit(0 if ok and res["patched_text_present"] else 1)
