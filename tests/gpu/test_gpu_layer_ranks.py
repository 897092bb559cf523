"""The layer harness's ranks under the one supervisor, speaking the one wire format: fake
ranks (an interpreter wrapper that runs a script instead of ``-m sm120fork.gpu.layer.rank``)
that report, speak another wire version, hang, and outlive a SIGTERM to the harness."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

from helpers_proc import HANGING_CHILD, module_python, sigterm_ends_every_child
from sm120fork.gpu.layer import run as layer_run
from sm120fork.layouts import CaseOutcome


def _run(tmp_path: Path, rank_code: str, **kwargs: object) -> CaseOutcome:
    return layer_run.run_case("fused", sglang_path=tmp_path, device="cpu",
                                 python=module_python(tmp_path, rank_code), layout="layer_boundary",
                                 **kwargs)  # type: ignore[arg-type]


REPORTING = """\
    import json, sys
    from sm120fork.util.wire import say
    request = json.loads(sys.argv[1])
    say("READY")
    print("@@sm120fork/%s RESULT {}" % ("0" if request["rank"] == 1 else "1"), flush=True)
    """


def test_a_rank_on_another_wire_version_is_named_with_its_line(tmp_path: Path) -> None:
    outcome = _run(tmp_path, REPORTING, timeout=60, start_timeout=60)
    assert not outcome.passed
    assert outcome.problems[0].startswith("wire: rank 1: wire format version '0'")
    assert "'@@sm120fork/0 RESULT {}'" in outcome.problems[0]


def test_the_start_bound_ends_ranks_that_never_get_ready(tmp_path: Path) -> None:
    started = time.monotonic()
    outcome = _run(tmp_path, "import time; time.sleep(600)\n", timeout=60, start_timeout=1.5)
    assert outcome.hung
    assert outcome.problems[0] == "hung: not finished 2 s, before every rank was ready"
    assert all(e.stopped_by_harness for e in outcome.exits)
    assert time.monotonic() - started < 30


def test_the_case_bound_ends_ready_ranks_that_hang(tmp_path: Path) -> None:
    outcome = _run(tmp_path, """\
        import time
        from sm120fork.util.wire import say
        say("READY")
        time.sleep(600)
        """, timeout=1.0, start_timeout=60)
    assert outcome.hung
    assert outcome.problems[0] == "hung: not finished 1 s after every rank was ready"


def test_sigterm_to_the_harness_ends_every_rank_with_its_process_group(tmp_path: Path) -> None:
    python = module_python(tmp_path, HANGING_CHILD)
    parent = textwrap.dedent(f"""\
        from pathlib import Path
        from sm120fork.gpu.layer import run as layer_run
        layer_run.run_case("fused", sglang_path=Path({str(tmp_path)!r}), device="cpu",
                              python={str(python)!r}, layout="layer_boundary")
        """)
    sigterm_ends_every_child(parent, tmp_path / "marks", children=2)
