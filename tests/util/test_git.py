"""util/git.py: GitPython as the repository API, its git processes under the one runner.

Real git repositories in temporary folders (conftest: fixed identity and dates, no user
configuration, GIT_CEILING_DIRECTORIES above tmp_path)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

import git as gitpython
import pytest

from helpers_proc import ended, pids_written, sleeping_hook
from sm120fork.errors import CommandError
from sm120fork.util import proc
from sm120fork.util.git import FIXED_DATE, Git, GitError, Repo, RunnerGit


def _two_commits(tmp_path: Path) -> Git:
    repo = Git.init(tmp_path / "tree")
    (repo.path / "pkg").mkdir()
    (repo.path / "pkg" / "a.py").write_text("one\n")
    (repo.path / "README").write_text("readme\n")
    repo.commit_all("upstream")
    repo.tag("upstream")
    (repo.path / "pkg" / "a.py").write_text("two\n")
    repo.commit_all("change a\n\nwhy it changes")
    return repo


def test_the_repository_api_answers_from_real_commits(tmp_path: Path) -> None:
    repo = _two_commits(tmp_path)
    assert isinstance(repo.repo, Repo)
    assert isinstance(repo.repo.git, RunnerGit)
    assert Repo.GitCommandWrapperType is RunnerGit
    head = repo.head()
    assert len(head) == 40
    assert repo.commit("HEAD").hexsha == head
    assert repo.commit("upstream").hexsha == repo.commit("HEAD~1").hexsha
    assert repo.tree_hash() == repo.commit("HEAD").tree.hexsha
    assert [c.summary for c in repo.commits("upstream..HEAD")] == ["change a"]
    assert repo.show("upstream", "pkg/a.py") == "one\n"
    assert repo.show("HEAD", "pkg/a.py") == "two\n"
    assert repo.show("HEAD", "pkg/missing.py") is None
    assert repo.files("HEAD") == ["README", "pkg/a.py"]
    assert repo.files("HEAD", under="pkg") == ["pkg/a.py"]
    assert repo.files("HEAD", under="nowhere") == []
    assert repo.exists("HEAD", "pkg")
    assert not repo.exists("HEAD", "nowhere")
    with pytest.raises(CommandError, match="no commit 'no-such-tag'"):
        repo.commit("no-such-tag")
    # The toolkit's commits carry its fixed identity and date: reproducible ids.
    commit = repo.commit("HEAD")
    assert (commit.author.name, commit.committer.name) == ("sm120fork", "sm120fork")
    assert repo.commit_time() == int(
        __import__("datetime").datetime.fromisoformat(FIXED_DATE).timestamp())
    again = _two_commits(tmp_path / "again")
    assert again.head() == head
    assert not repo.is_dirty()
    (repo.path / "new.txt").write_text("x\n")
    assert repo.is_dirty()
    # GitPython's own helpers that catch its GitCommandError keep working.
    assert repo.repo.is_ancestor(repo.commit("upstream"), repo.commit("HEAD"))
    assert not repo.repo.is_ancestor(repo.commit("HEAD"), repo.commit("upstream"))


def test_a_failing_git_command_is_the_toolkits_error_with_stderr(tmp_path: Path,
                                                                 capfd: pytest.CaptureFixture[str]
                                                                 ) -> None:
    repo = _two_commits(tmp_path)
    capfd.readouterr()
    repo("status")  # a success shows nothing
    assert capfd.readouterr() == ("", "")
    with pytest.raises(GitError) as caught:
        repo.repo.git.checkout("no-such-branch")  # GitPython's own API, same error
    err = caught.value
    assert isinstance(err, CommandError)
    assert isinstance(err, gitpython.GitCommandError)
    assert err.exit_code == 11
    assert err.status == 1
    assert "pathspec 'no-such-branch' did not match" in err.stderr
    assert "did not match" in (err.detail or "")
    assert str(err) == f"{repo.path}: git checkout failed (exit 1)"
    assert capfd.readouterr() == ("", "")  # the output travels with the error only


def test_each_git_command_is_echoed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    repo = _two_commits(tmp_path)
    patch = tmp_path / "change.patch"
    patch.write_text(repo("format-patch", "--stdout", "upstream..HEAD", strip=False))
    repo("reset", "-q", "--hard", "upstream")
    with caplog.at_level(logging.DEBUG, logger="sm120fork"):
        repo.am([patch])
    assert f"+ git am --quiet --no-3way --keep-cr {patch}" in caplog.messages
    assert repo.show("HEAD", "pkg/a.py") == "two\n"


def test_a_patch_that_does_not_apply_stops_the_am_on_it(tmp_path: Path) -> None:
    repo = _two_commits(tmp_path)
    patch = tmp_path / "change.patch"
    patch.write_text(repo("format-patch", "--stdout", "upstream..HEAD", strip=False))
    with pytest.raises(GitError, match="git apply failed"):
        repo("apply", "--check", str(patch))  # HEAD already has it
    repo("reset", "-q", "--hard", "upstream")
    repo("apply", "--check", str(patch))
    (repo.path / "pkg" / "a.py").write_text("three\n")
    repo.commit_all("conflicting")
    with pytest.raises(GitError, match="git am failed"):
        repo.am([patch])
    assert repo.am_in_progress()
    repo("am", "--abort")
    assert not repo.am_in_progress()


def test_gitpythons_object_reads_run_under_the_runner_and_leave_nothing_running(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """GitPython reads objects through ``git cat-file``: here each read is one command of
    the runner (echoed), and nothing stays running behind a repository handle."""
    repo = _two_commits(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="sm120fork"):
        assert repo.show("HEAD", "pkg/a.py") == "two\n"
    assert "+ git cat-file --batch" in caplog.messages
    assert not [p for p in proc._helpers if p.poll() is None]
    with proc._children_lock:
        assert not [p for p in proc._children if p.poll() is None]


def test_sigterm_to_git_am_through_gitpython_stops_it_and_its_hook(tmp_path: Path) -> None:
    """A ``git am`` started through GitPython's own API (``repo.git.am``) is the runner's
    child: ending the children (the toolkit's Ctrl-C and SIGTERM handler) ends it and the
    hook it runs, and the caller gets the toolkit's error."""
    repo = _two_commits(tmp_path)
    patch = tmp_path / "change.patch"
    patch.write_text(repo("format-patch", "--stdout", "upstream..HEAD", strip=False))
    repo("reset", "-q", "--hard", "upstream")
    hook_pid = tmp_path / "hook.pid"
    sleeping_hook(Path(repo.repo.git_dir), hook_pid)
    errors: list[BaseException] = []

    def am() -> None:
        try:
            repo.repo.git.am(str(patch))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=am)
    thread.start()
    try:
        (pid,) = pids_written(hook_pid)
        with proc._children_lock:
            (child,) = [p for p in proc._children if p.poll() is None]
        assert list(child.args)[:2] == ["git", "am"]  # type: ignore[arg-type]
        os.killpg(child.pid, signal.SIGTERM)  # what end_children sends, to git's group
        thread.join(60)
        assert not thread.is_alive()
        (err,) = errors
        assert isinstance(err, GitError)
        assert err.status == -signal.SIGTERM
        assert ended(pid), "git am's hook still runs"
    finally:
        proc.allow_children()
