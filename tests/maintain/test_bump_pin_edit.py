"""The declaration edit a bump writes at its end (``maintain.pin.declaration_with_pin``).

Found on a fresh clone (issue 31's trial): a new stack from sglang-0.5.10 (an ``sdist``
source stamped through ``SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG``) bumped to 0.5.20,
which SGLang publishes as wheels only, resolved every conflict and then stopped at its
last step: the written pins kept the ``version_stamp`` table a wheel source refuses, and
``--abort`` was the only way out.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sm120fork.declare import WheelPin, load_stack
from sm120fork.maintain.pin import declaration_with_pin
from sm120fork.maintain.state import BumpState, NewPin

_SDIST_STACK = textwrap.dedent("""\
    [stack]
    name = "sg"
    default = false

    [projects.sglang]
    distribution = "sglang"
    version = "0.5.10.post1"
    local_label = "sm120.1"
    package_root = "python"
    series = "patches/sg/sglang"
    source = "sdist"

    [projects.sglang.git]
    url = "https://github.com/sgl-project/sglang.git"
    tag = "v0.5.10.post1"
    commit = "94f03a39dbd39edfc2b118b5357bbbadaaa9ad28"

    [projects.sglang.sdist]
    filename = "sglang-0.5.10.post1.tar.gz"
    sha256 = "{sha}"

    [projects.sglang.version_stamp]
    env = "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG"
    """).format(sha="0" * 64)


def test_an_sdist_source_moved_to_a_wheels_only_release_loses_its_version_stamp(
        tmp_path: Path) -> None:
    path = tmp_path / "forks" / "sg.toml"
    path.parent.mkdir()
    path.write_text(_SDIST_STACK, encoding="utf-8")
    (tmp_path / "patches" / "sg" / "sglang").mkdir(parents=True)
    project = load_stack(path, strict=False).project("sglang")
    wheel = "sglang-0.5.20-cp312-cp312-manylinux_2_34_x86_64.whl"
    state = BumpState(
        stack="sg", project="sglang", old_version="0.5.10.post1", new_version="0.5.20",
        new_pin=NewPin(source="wheel", wheels=(WheelPin(filename=wheel, sha256="1" * 64),)),
        created_stack=False, declaration=str(path), series_dir="", results=[])

    text = declaration_with_pin(path.read_text(encoding="utf-8"), project, state,
                                str(path))

    assert "version_stamp" not in text
    path.write_text(text, encoding="utf-8")
    moved = load_stack(path, strict=False).project("sglang")
    assert (moved.source, moved.version) == ("wheel", "0.5.20")
    assert [w.filename for w in moved.wheels] == [wheel]


def test_the_pins_a_bump_writes_keep_one_blank_line_between_tables(tmp_path: Path) -> None:
    """The trial's new stack read ``[[projects.flashinfer.wheels]]`` glued to
    ``[projects.sglang]``, and two blank lines where the sdist tables had been."""
    path = tmp_path / "forks" / "sg.toml"
    path.parent.mkdir()
    fi = textwrap.dedent("""\

        [projects.flashinfer]
        distribution = "flashinfer-python"
        version = "0.6.7.post3"
        local_label = "sm120.1"
        package_root = "."
        series = "patches/sg/flashinfer"
        source = "wheel"

        [[projects.flashinfer.wheels]]
        filename = "flashinfer_python-0.6.7.post3-py3-none-any.whl"
        sha256 = "{sha}"
        """).format(sha="2" * 64)
    text = _SDIST_STACK.replace("\n[projects.sglang]\n", fi + "\n[projects.sglang]\n")
    text = text.replace('series = "patches/sg/sglang"\n',
                        'series = "patches/sg/sglang"\nrequires = ["flashinfer"]\n')
    path.write_text(text, encoding="utf-8")
    for key in ("sglang", "flashinfer"):
        (tmp_path / "patches" / "sg" / key).mkdir(parents=True)
    project = load_stack(path, strict=False).project("sglang")
    wheel = "sglang-0.5.20-cp312-cp312-manylinux_2_34_x86_64.whl"
    fi_wheel = WheelPin(filename="flashinfer_python-0.6.18-py3-none-any.whl",
                        sha256="3" * 64)
    state = BumpState(
        stack="sg", project="sglang", old_version="0.5.10.post1", new_version="0.5.20",
        new_pin=NewPin(source="wheel", wheels=(WheelPin(filename=wheel, sha256="1" * 64),),
                       companions={"flashinfer": NewPin(source="wheel", version="0.6.18",
                                                        wheels=(fi_wheel,))}),
        created_stack=False, declaration=str(path), series_dir="", results=[])

    out = declaration_with_pin(text, project, state, str(path))

    assert "\n\n\n" not in out
    assert out.endswith('"\n')
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("[") and i:
            assert lines[i - 1] == "", (line, lines[i - 1])
    path.write_text(out, encoding="utf-8")
    assert load_stack(path, strict=False).project("flashinfer").version == "0.6.18"


def test_a_bump_state_keeps_its_classifications_typed_across_a_save(tmp_path: Path) -> None:
    """``state.json`` holds each patch's classification; read back it is a Classification
    again (it was a dict every reader re-parsed), and a row that is not one is no state."""
    import json

    from sm120fork.maintain.state import Classification
    from sm120fork.workspace import Workspace

    (tmp_path / "forks").mkdir()
    ws = Workspace(root=tmp_path)
    row = Classification(patch="0001-a.patch", subject="F1 a", verdict="applies",
                         evidence=("applies cleanly",), applied_upstream="")
    state = BumpState(stack="sg", project="sglang", old_version="1", new_version="2",
                      new_pin=NewPin(source="sdist"), created_stack=False, declaration="",
                      series_dir="",
                      results=[row], preview=[row])
    state.save(ws)
    path = BumpState.directory(ws, "sg", "sglang") / "state.json"
    assert json.loads(path.read_text())["results"] == [
        {"patch": "0001-a.patch", "subject": "F1 a", "verdict": "applies",
         "evidence": ["applies cleanly"], "applied_upstream": ""}]
    loaded = BumpState.load(ws, "sg", "sglang")
    assert loaded is not None
    assert loaded.results == [row]
    assert loaded.preview == [row]
    data = json.loads(path.read_text())
    data["results"][0]["verdict"] = 3
    path.write_text(json.dumps(data))
    assert BumpState.load(ws, "sg", "sglang") is None


def test_a_bump_state_keeps_its_new_pin_typed_and_refuses_an_older_one(
        tmp_path: Path) -> None:
    """The new pin is declare's own pin types in ``state.json`` and back (it was a dict
    mirroring them); a state an older toolkit wrote (no format, no ``wheels`` for the
    declared ones, ``{}`` for no sdist) is refused, naming the file and what to do, and a
    pin that is no pin is no state."""
    import json

    from sm120fork.declare import GitPin, SdistPin
    from sm120fork.errors import MaintenanceError
    from sm120fork.workspace import Workspace

    (tmp_path / "forks").mkdir()
    ws = Workspace(root=tmp_path)
    pin = NewPin(source="sdist", git=GitPin(url="u", tag="v2", commit="a" * 40,
                                            commit_verified=False, note="n"),
                 sdist=SdistPin(filename="lib-2.tar.gz", sha256="1" * 64),
                 upstream_requires=("fi==2",), layout="layer_boundary",
                 companions={"fi": NewPin(source="wheel", version="2", wheels=(
                     WheelPin(filename="fi-2-py3-none-any.whl", sha256="2" * 64),))})
    state = BumpState(stack="sg", project="lib", old_version="1", new_version="2",
                      new_pin=pin, created_stack=False, declaration="", series_dir="",
                      results=[])
    state.save(ws)
    loaded = BumpState.load(ws, "sg", "lib")
    assert loaded is not None
    assert loaded.new_pin == pin
    path = BumpState.directory(ws, "sg", "lib") / "state.json"
    data = json.loads(path.read_text())
    data["new_pin"] = {"source": "git", "git": ["u"]}
    path.write_text(json.dumps(data))
    assert BumpState.load(ws, "sg", "lib") is None
    older = {k: v for k, v in data.items() if k not in ("format", "step")}
    older.update(phase="classify", new_pin={
        "source": "git", "git": {"url": "u", "tag": "", "commit": "b" * 40,
                                 "commit_verified": True, "note": ""}, "sdist": {}})
    path.write_text(json.dumps(older))
    with pytest.raises(MaintenanceError, match="started by an older toolkit") as err:
        BumpState.load(ws, "sg", "lib")
    assert err.value.where == str(path)
    assert "finish or undo it with the toolkit that started it" in (err.value.fix or "")
