"""A layout's probe runs under the one runner and speaks the one wire format: fake probes
(an interpreter wrapper that runs a script instead of ``-m <probe module>``) that report,
speak another wire version, hang, and outlive a SIGTERM to the parent."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from helpers_proc import HANGING_CHILD, module_python, sigterm_ends_every_child
from sm120fork.errors import VerifyError
from sm120fork.layouts import results


def _probe(tmp_path: Path, code: str, timeout: float = 60) -> list[results.Observation]:
    return results.run_probe("sm120fork.layouts.x.probe", {"suite": "s"}, tree=tmp_path,
                             env={}, python=module_python(tmp_path, code), timeout=timeout,
                             what="the x probe", fix="install it")


def test_the_probes_result_is_its_wire_message(tmp_path: Path) -> None:
    code = """\
        import json, sys
        from sm120fork.harness.fake_gpu import emit
        print("noise")
        emit([{"name": "n", "observed": json.loads(sys.argv[1]), "detail": ""}])
        """
    assert _probe(tmp_path, code) == [
        results.Observation(name="n", observed={"suite": "s"}, detail="")]


def test_an_observation_without_its_name_is_named_as_such(tmp_path: Path) -> None:
    """Read once, typed, where the message arrives (a check read it by string keys and
    ended in a KeyError, an internal error)."""
    code = """\
        from sm120fork.harness.fake_gpu import emit
        emit([{"name": "n", "observed": 1, "detail": ""}, {"observed": 2, "detail": ""}])
        """
    with pytest.raises(VerifyError, match=r"a probe observation is not \{name, observed, "
                       r"detail\}") as caught:
        _probe(tmp_path, code)
    assert caught.value.where == "the x probe: RESULT[1]"


def test_a_probe_on_another_wire_version_is_named_with_its_line(tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match="the x probe spoke another wire format") as caught:
        _probe(tmp_path, "print('@@sm120fork/7 RESULT []')\n")
    assert "'@@sm120fork/7 RESULT []'" in str(caught.value)


def test_a_probe_that_says_nothing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match="printed no result"):
        _probe(tmp_path, "print('SM120FORK-PROBE-RESULT []')\n")


def test_a_hanging_probe_is_ended_at_its_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(VerifyError, match="the x probe failed") as caught:
        _probe(tmp_path, "import time; time.sleep(600)\n", timeout=1.0)
    assert isinstance(caught.value.__cause__, Exception)
    assert "timed out after 1.0s" in str(caught.value.__cause__)
    assert time.monotonic() - started < 30


def test_sigterm_to_the_parent_ends_the_probe_with_its_process_group(tmp_path: Path) -> None:
    python = module_python(tmp_path, HANGING_CHILD)
    parent = textwrap.dedent(f"""\
        from pathlib import Path
        from sm120fork.layouts import results
        results.run_probe("m", {{}}, tree=Path({str(tmp_path)!r}), env={{}},
                          python={str(python)!r}, timeout=600, what="p", fix="f")
        """)
    sigterm_ends_every_child(parent, tmp_path / "marks", children=1)


def _failing_probe(tmp_path: Path, module_text: str) -> VerifyError:
    """A probe that imports ``sglang.gate`` of a tree (``python/sglang/gate.py``)."""
    tree = tmp_path / "tree"
    (tree / "python" / "sglang").mkdir(parents=True)
    (tree / "python" / "sglang" / "__init__.py").write_text("")
    (tree / "python" / "sglang" / "gate.py").write_text(module_text)
    code = f"""\
        import sys
        sys.path.insert(0, {str(tree / "python")!r})
        import sglang.gate
        """
    with pytest.raises(VerifyError) as caught:
        results.run_probe("sm120fork.layouts.x.probe", {}, tree=tree, env={},
                          python=module_python(tmp_path, code), timeout=60,
                          what="the x probe", fix="install the probe's requirements")
    return caught.value


def test_an_error_in_the_tree_is_named_by_file_and_line_not_by_requirements(
        tmp_path: Path) -> None:
    """A merged patch used a name its release lacks; the probe's NameError was answered
    with "install the probe's requirements and its overlay" (issue 41)."""
    err = _failing_probe(tmp_path, "import os\n\nLIMIT = DEFAULT * 2\n")
    assert err.what == ("the x probe met an error in the tree under test: NameError: name "
                        "'DEFAULT' is not defined")
    assert err.where == "python/sglang/gate.py:3"
    assert "requirements" not in (err.fix or "")
    assert "mend the patch that changes python/sglang/gate.py" in (err.fix or "")


def test_a_module_the_tree_should_hold_is_an_error_of_the_tree(tmp_path: Path) -> None:
    err = _failing_probe(tmp_path, "from sglang.srt import moved_away\n")
    assert err.what.endswith("ModuleNotFoundError: No module named 'sglang.srt'")
    assert err.where == "python/sglang/gate.py:1"


def test_only_a_missing_requirement_asks_to_install_the_requirements(tmp_path: Path) -> None:
    err = _failing_probe(tmp_path, "import transformers_not_installed_here\n")
    assert err.what == ("the x probe could not run: this Python lacks "
                        "'transformers_not_installed_here'")
    assert err.fix == "install the probe's requirements"
