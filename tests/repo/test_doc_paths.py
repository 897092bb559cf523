"""Every path the user docs name exists (issue 42): README.md, CONTRIBUTING.md and docs/.

Two kinds: markdown links (relative to the page) and backticked repository paths (a code
span of one word whose first part is a top-level entry of the repository, relative to
its root).  A path with a placeholder or a pattern (``reports/<stack>/verify-sm120/``,
``wheels/<stack>/*.whl``) is checked up to it; a path git ignores (a build's output, such
as ``wheels/sglang-0.5.10/constraints.txt``) is made, not committed, and not checked.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
#: where a path stops being literal: a placeholder, a pattern, an ellipsis, a version range
TEMPLATE = re.compile(r"<|\*|\.\.\.|\{|\$")


def pages(root: Path) -> list[Path]:
    return [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").glob("*.md"))]


def _ignored(root: Path, rel: str) -> bool:
    done = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", "--no-index", rel],
                          check=False)
    return done.returncode == 0


def _literal(rel: str) -> str:
    """``rel`` up to its first placeholder or pattern, cut back to a whole folder."""
    match = TEMPLATE.search(rel)
    return rel if match is None else rel[:match.start()].rpartition("/")[0] + "/"


def missing_paths(root: Path) -> list[str]:
    """``page: path`` for each path a page names that is not there."""
    top = {p.name for p in root.iterdir() if p.name != ".git"}
    found = []
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        named = [(page.parent, t.partition("#")[0]) for t in LINK.findall(text)
                 if not re.match(r"[a-z]+:", t)]
        named += [(root, c.partition("::")[0].rstrip(".,;:")) for c in CODE.findall(text)
                  if "/" in c and c.split("/")[0] in top]
        for base, target in named:
            rel = _literal(target)
            if rel == "/" or (base / rel).exists():
                continue
            path = (base / rel).resolve().relative_to(root.resolve()).as_posix()
            if not _ignored(root, path + "/" * rel.endswith("/")):
                found.append(f"{page.relative_to(root).as_posix()}: {target}")
    return found


def test_every_path_the_docs_name_exists() -> None:
    assert missing_paths(REPO) == []


def test_a_missing_path_is_named_and_a_build_output_is_not(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/wheels/*/\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "reports" / "s").mkdir(parents=True)
    (tmp_path / "wheels").mkdir()
    (tmp_path / "CONTRIBUTING.md").write_text("")
    (tmp_path / "docs" / "a.md").write_text(
        "[ok](../reports/s/) [anchor](#x) [web](https://example.org/x)\n"
        "`reports/<stack>/verify-sm120/`, `wheels/s/*.whl`, `wheels/s/constraints.txt`\n")
    (tmp_path / "README.md").write_text(
        "[gone](docs/b.md#top) and `reports/sm120/<stack>/` and `reports/s/x.json`.\n")
    assert missing_paths(tmp_path) == ["README.md: docs/b.md", "README.md: reports/sm120/<stack>/",
                                       "README.md: reports/s/x.json"]
