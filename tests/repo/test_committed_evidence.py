"""The committed evidence of each stack stands for the stack as it is now.

CI does not re-run the evidence (the default stack's compile proof is about 20 minutes of
nvcc on two cores; the GPU runs need GPUs).  What it checks, in seconds and without
building: every committed record reads under the format's rules; each stack with patches
has its verify-sm120 and gpu-test records, passed, and made from its patches' changes as
they are now (``git patch-id --stable``: a reworded Description stales nothing); and
every patch's ``Verified-By`` claim is backed by a current record of its own stack.  A
change to a patch's code without new evidence fails here, naming per stale item the one
command that re-makes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120fork.patch.series import load_series
from sm120fork.record import published
from sm120fork.standing import Today, claim_standings, claims, stack_evidence
from sm120fork.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]
WS = Workspace(REPO)
#: Every stack whose series hold a patch: each has evidence of its own.
PATCHED = sorted(s.name for s in WS.stacks().values()
                 if any(load_series(WS.series_dir(p)).patches for p in s.projects))


def test_every_patch_of_every_stack_claims_its_evidence() -> None:
    """Each patch names what backs it (``Verified-By``, patches/README.md): a new patch
    without a claim fails here, naming it."""
    unclaimed = {f"{project.series}/{patch.name}" for stack in WS.stacks().values()
                 for project in stack.projects
                 for patch in load_series(WS.series_dir(project)).patches if not claims(patch)}
    assert not unclaimed, f"no Verified-By line (patches/README.md): {sorted(unclaimed)}"


def test_every_committed_record_reads_and_lies_in_its_folder() -> None:
    records = published(WS.reports_dir)
    assert {rec.stack for _, rec in records} >= set(PATCHED)


def test_every_stack_with_patches_is_checked() -> None:
    assert {"sglang-0.5.10", "sglang-0.5.23"} <= set(PATCHED)


@pytest.mark.parametrize("name", PATCHED)
def test_the_committed_records_are_of_the_stack_as_it_is_and_passed(name: str) -> None:
    stack = WS.stack(name)
    # The local wheels (a developer's build) are not what CI has: judge the patches.
    today = Today.of(WS, stack, wheels_dir=REPO / ".no-such-wheels")
    standings = {s.kind: s for s in stack_evidence(WS, stack, today=today)
                 if s.kind in ("verify-sm120", "gpu-test", "sglang-layer")}
    stale = [s.message() for s in standings.values() if not s.current]
    assert not stale, "\n".join(stale)
    assert {k: s.verdict for k, s in standings.items()} == dict.fromkeys(standings, "pass")


@pytest.mark.parametrize("name", PATCHED)
def test_every_claim_is_backed_by_a_current_record_of_its_stack(name: str) -> None:
    stack = WS.stack(name)
    today = Today.of(WS, stack, wheels_dir=REPO / ".no-such-wheels")
    stale = [s.message() for s in claim_standings(WS, stack, today) if not s.current]
    assert not stale, "\n".join(stale)


def test_no_upstream_package_or_patch_copy_is_committed() -> None:
    """An upstream PR's package (patches, body, a reproducer run with this checkout's
    harness) is made on demand by upstream_pr from patches/; what stays committed of it is
    its record under reports/<stack>/upstream-pr/<pr>/ (issue 32)."""
    copies = sorted(p.relative_to(REPO).as_posix() for p in WS.reports_dir.rglob("*")
                    if p.is_file() and (p.suffix == ".patch"
                                        or p.relative_to(WS.reports_dir).parts[0] == "upstream"))
    assert not copies, f"not evidence but copies (upstream_pr makes them): {copies}"
