from __future__ import annotations

from pathlib import Path

import pytest

from sm120fork.declare import load_stack, load_stacks, select_stack
from sm120fork.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
GOOD = (REPO / "forks" / "sglang-0.5.10.toml").read_text()


def write(tmp_path: Path, text: str, name: str = "sglang-0.5.10") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_shipped_default_stack_is_valid() -> None:
    stacks = load_stacks(REPO / "forks")
    stack = select_stack(stacks, None)
    assert stack.default
    fi = stack.project("flashinfer")
    assert fi.local_version == "0.6.7.post3+sm120.1"
    assert fi.git_pin.commit == "f499b1f0c618ed6583865bc4b97812fb8e3f2ef1"
    sg = stack.project("sglang")
    assert sg.package_root == "python"
    assert sg.requires == ("flashinfer",)
    assert sg.package_path("python/sglang/srt/x.py") == "sglang/srt/x.py"
    assert sg.package_path("docs/x.md") is None
    assert not sg.git_pin.commit_verified


def test_typo_names_file_key_and_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace('local_label = "sm120.1"\npackage_root = "."',
                                        'local_lable = "sm120.1"\npackage_root = "."'))
    with pytest.raises(ConfigError) as err:
        load_stack(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "projects.flashinfer.local_lable" in msg
    assert "did you mean 'local_label'" in msg


@pytest.mark.parametrize(("old", "new", "expected"), [
    ('commit = "f499b1f0c618ed6583865bc4b97812fb8e3f2ef1"', 'commit = "f499b1f"',
     "projects.flashinfer.git.commit: 'f499b1f' is not a full 40-hex"),
    ('sha256 = "defad8', 'sha256 = "XYZ',
     "projects.flashinfer.sdist.sha256"),
    ('version = "0.6.7.post3"', 'version = "0.6.7.post3+sm120"', "must not carry a local"),
    ('version = "0.6.7.post3"', 'version = "banana"', "not a valid PEP 440 version"),
    ('source = "sdist"\n\n[projects.flashinfer.git]',
     'source = "sdsit"\n\n[projects.flashinfer.git]', "did you mean 'sdist'"),
    ('name = "sglang-0.5.10"', 'name = "other"', "differs from the file name"),
    ('series_record = "flashinfer/jit/series_sources.py"', 'series_record = "../x.py"',
     "projects.flashinfer.series_record: must be a relative path inside the package root"),
    ('requires = ["flashinfer"]', 'requires = ["flashinfr"]', "did you mean 'flashinfer'"),
    ('tag = "v0.6.7.post3"\n', '', "projects.flashinfer.git.tag: missing required key"),
    # a typo in a nested table is named as such, not as the required key it hides
    ('commit = "f499b1f0c618ed6583865bc4b97812fb8e3f2ef1"',
     'comit = "f499b1f0c618ed6583865bc4b97812fb8e3f2ef1"',
     "projects.flashinfer.git.comit: unknown key (did you mean 'commit'?)"),
    # the pinned file must be the declared version and distribution, checked at load
    ('version = "0.6.7.post3"', 'version = "0.6.7.post2"',
     "projects.flashinfer.sdist.filename: 'flashinfer_python-0.6.7.post3.tar.gz' is version "
     "0.6.7.post3, the project declares version = '0.6.7.post2'"),
    ('distribution = "flashinfer-python"', 'distribution = "flashinfer-cubin"',
     "is a file of flashinfer-python, not of flashinfer-cubin"),
])
def test_bad_declarations(tmp_path: Path, old: str, new: str, expected: str) -> None:
    assert old in GOOD
    with pytest.raises(ConfigError, match=None) as err:
        load_stack(write(tmp_path, GOOD.replace(old, new, 1)))
    assert expected in str(err.value)
    assert err.value.exit_code == 2


def test_invalid_toml_names_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_stack(write(tmp_path, GOOD + "\n[broken"))


def test_exactly_one_default(tmp_path: Path) -> None:
    write(tmp_path, GOOD)
    other = GOOD.replace('name = "sglang-0.5.10"', 'name = "second"')
    write(tmp_path, other, "second")
    with pytest.raises(ConfigError, match="exactly one stack"):
        load_stacks(tmp_path)
    write(tmp_path, other.replace("default = true", "default = false"), "second")
    stacks = load_stacks(tmp_path)
    assert select_stack(stacks, "second").name == "second"
    with pytest.raises(ConfigError, match="did you mean 'second'"):
        select_stack(stacks, "secnd")


def test_unknown_project(tmp_path: Path) -> None:
    stack = load_stack(write(tmp_path, GOOD))
    with pytest.raises(ConfigError, match="did you mean 'sglang'"):
        stack.project("sglng")
