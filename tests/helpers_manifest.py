"""A ``manifest.json`` as a build publishes it, with only the fields a test cares about given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def entry(project: str, **fields: Any) -> dict[str, Any]:
    """One wheel's entry: ``fields`` over the values of a plausible build."""
    return {"project": project, "distribution": project, "upstream_version": "1",
            "version": "1", "upstream_commit": None, "upstream_commit_verified": False,
            "source": {"kind": "sdist", "digest": "0" * 64}, "series": f"{project}/series",
            "series_digest": "0" * 64, "patches": [], "wheel": f"{project}-1-py3-none-any.whl",
            "sha256": "0" * 64, "toolkit_version": "0", **fields}


def write_manifest(folder: Path, stack: str, *entries: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "manifest.json"
    path.write_text(json.dumps({"toolkit_version": "0", "stack": stack,
                                "wheels": list(entries)}))
    return path
