"""What the reports of ``test`` and ``bench`` share (pure functions of the documents)."""

from __future__ import annotations

import json
import re

from sm120fork.errors import ConfigError
from sm120fork.gpu.core.documents import BenchDoc, Environment, MadeFrom, Provenance, VariantInfo
from sm120fork.manifest import Manifest
from sm120fork.util.portable import markdown_table as _md_table


def gpu_slug(name: str, count: int) -> str:
    """``NVIDIA H200`` x1 -> ``h200-1x`` (the report directory name)."""
    slug = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.IGNORECASE).lower()
    slug = re.sub(r"[^a-z0-9]+", "-", slug).strip("-") or "gpu"
    return f"{slug}-{count}x"


def env_lines(env: Environment) -> list[str]:
    keys = ("gpus", "gpu_count", "capability", "driver", "driver_cuda_api", "torch",
            "torch_cuda", "python", "flashinfer", "multicast_supported_attr", "nvcc")
    rows = [(k, json.dumps(v) if isinstance(v := env.get(k), list) else v)
            for k in keys if k in env]
    return _md_table(("", ""), rows)


def completion_lines(finished: bool | None, module_seconds: float | None,
                     budget: float | None, missing: int = 0) -> list[str]:
    """Whether every planned case ran (``missing``: those that did not), and the build time."""
    lines = []
    if finished is False:
        lines.append("**Not finished**: " + (f"{missing} planned case runs did not run "
                     "(time budget used up)" if missing else "the run ended early") + ".")
    if module_seconds is not None:
        lines.append(f"Module build: {module_seconds:.0f} s"
                     + (f", outside the cases' time budget of {budget:.0f} s." if budget
                        else "."))
    return [*lines, ""] if lines else []


def made_from(manifest: Manifest | None, tested: VariantInfo | BenchDoc | None
              ) -> Provenance:
    """``stack`` and ``made_from`` of a GPU report (verify.json's shape): the toolkit build
    of the tested wheel; a same-named wheel of other bytes keeps the tested digests."""
    sha256 = tested.get("sha256") if tested else None
    name = tested.get("wheel") if tested else None
    rows: list[MadeFrom] = []
    for w in manifest.wheels if manifest else ():
        same_bytes = bool(sha256) and w.sha256 == sha256
        if not same_bytes and not (name and w.wheel == name):
            continue
        row: MadeFrom = {"project": w.project, "series": w.series,
                         "series_digest": w.series_digest, "wheel": w.wheel,
                         "wheel_sha256": w.sha256}
        if not same_bytes:
            row["tested_sha256"] = sha256
            row["record_sha256"] = tested.get("record_sha256") if tested else None
        rows.append(row)
    return {"stack": manifest.stack if manifest else None, "made_from": rows}


def built_manifest(env: Environment) -> Manifest | None:
    """The build manifest the run recorded (None: the wheels are no stack's build)."""
    data = env.get("wheels_manifest")
    if not data or "error" in data:
        return None
    try:
        return Manifest.from_json(data)
    except ConfigError:
        return None
