"""A stack's built FlashInfer wheel installed into a folder, upstream's files put back into
it, and the companion packages it checks, for the end-to-end tests of a built stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import git


def install_flashinfer(built: Path, stack: str, site: Path) -> str:
    """The stack's FlashInfer wheel (``wheels/<stack>/``) installed into ``site``; its version."""
    wheel = next((built / "wheels" / stack).glob("flashinfer_python-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", str(site), str(wheel)],
                   check=True)
    return wheel.name.split("-")[1]


def put_upstream_file(built: Path, stack: str, site: Path, path: str) -> None:
    """Replace the installed ``path`` (``flashinfer/...``) by unpatched upstream's."""
    work = built / ".forks" / "trees" / stack / "flashinfer"
    (site / path).write_text(git(work, "show", f"upstream:{path}") + "\n")


def cubin_stand_in(site: Path, version: str) -> Path:
    """flashinfer-cubin of ``version``: only what FlashInfer's version check reads; its
    cubin folder."""
    pkg = site / "flashinfer_cubin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        f'__version__ = "{version}"\n\ndef get_cubin_dir():\n'
        '    return __file__.rsplit("/", 1)[0] + "/cubins"\n')
    return pkg / "cubins"
