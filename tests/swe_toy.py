"""A small SWE-bench instance written for gyre's tests (not from any benchmark): a repository with history and a row.

`toy_instance(dst)` makes `dst/repos/gyre-fixtures__toystats/` (three commits: an older one, the base, then the fix
on top, so the builder must leave the fix out of the agent's history) and `dst/rows.json`, one row in SWE-bench's
schema whose `patch` is that fix (two hunks in two functions, each needed by a FAIL_TO_PASS test) and whose
`test_patch` adds those tests and edits an existing one. Its PASS_TO_PASS holds the quirks the grader must key as
the repository's parser does: a parametrised id with a space (`test_words[a b]`: the parser keeps `test_words[a`),
an `xfail` test (XFAIL passes), a test class. `dst/specs.json` is its install specification (`--specs`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = "gyre-fixtures/toystats"
INSTANCE = "gyre-fixtures__toystats-1"
PYTHON = "3.11"

MODULE = """def mean(values):
    return {mean}


def words(text):
    \"\"\"The words of `text`, split at whitespace.

    Leading and trailing whitespace gives no empty word.
    \"\"\"
    return text.split()


def spread(values):
    return {spread}
"""
BASE = {
    "pyproject.toml": """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "toystats"
version = "1.0"
""",
    "toystats/__init__.py": MODULE.format(mean="sum(values) / (len(values) + 1)", spread="max(values) - min(values) + 1"),
    "tests/__init__.py": "",
    "tests/test_stats.py": """import pytest

from toystats import mean, spread, words


def test_mean_is_a_float():
    assert isinstance(mean([1, 2]), float)


@pytest.mark.parametrize("text", ["a b", "c"])
def test_words(text):
    assert words(text) == text.split()


@pytest.mark.xfail(reason="not supported")
def test_words_of_none():
    words(None)


class TestSpread:
    def test_is_a_number(self):
        assert isinstance(spread([1, 2]), int)
""",
}
OLDER = {"README.md": "toystats\n"}
FIX = {"toystats/__init__.py": MODULE.format(mean="sum(values) / len(values)", spread="max(values) - min(values)")}
TEST_PATCH_TESTS = """import pytest

from toystats import mean, spread, words


def test_mean_is_a_float():
    assert isinstance(mean([1, 2]), float)


def test_mean():
    assert mean([1, 2, 3]) == 2


def test_spread():
    assert spread([4, 1, 9]) == 8


@pytest.mark.parametrize("text", ["a b", "c"])
def test_words(text):
    assert words(text) == text.split()


@pytest.mark.xfail(reason="not supported")
def test_words_of_none():
    words(None)


class TestSpread:
    def test_is_a_number(self):
        assert isinstance(spread([1, 2]), int)
"""
F2P = ["tests/test_stats.py::test_mean", "tests/test_stats.py::test_spread"]
P2P = ["tests/test_stats.py::test_mean_is_a_float", "tests/test_stats.py::test_words[a",
       "tests/test_stats.py::test_words[c]", "tests/test_stats.py::test_words_of_none",
       "tests/test_stats.py::TestSpread::test_is_a_number"]


def _git_env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "fixture", "GIT_AUTHOR_EMAIL": "fixture@example.com",
            "GIT_COMMITTER_NAME": "fixture", "GIT_COMMITTER_EMAIL": "fixture@example.com",
            "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+00:00", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+00:00"}


def toy_instance(dst: Path, python: str = PYTHON) -> dict:
    """Write the repository, `rows.json` and `specs.json` under `dst`; returns the row."""
    repo = Path(dst) / "repos" / REPO.replace("/", "__")
    repo.mkdir(parents=True)
    env = _git_env(Path(dst))

    def git(*args: str, text_in: str | None = None) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                              env=env, input=text_in).stdout

    def commit(files: dict[str, str], message: str) -> str:
        for rel, text in files.items():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_text(text)
        git("add", "-A")
        git("commit", "-qm", message)
        return git("rev-parse", "HEAD").strip()

    git("init", "-q", "-b", "main")
    commit(OLDER, "older")
    base = commit(BASE, "base")
    git("tag", "-a", "v1.0", "-m", "release 1.0")
    (repo / "tests" / "test_stats.py").write_text(TEST_PATCH_TESTS)
    test_patch = git("diff")
    git("checkout", "-q", "--", ".")
    fixed = commit(FIX, "fix mean and spread")
    patch = git("diff", base, fixed)
    git("tag", "v1.1", fixed)
    row = {"repo": REPO, "instance_id": INSTANCE, "base_commit": base, "patch": patch, "test_patch": test_patch,
           "problem_statement": "mean() and spread() are off by one.", "hints_text": "",
           "created_at": "2024-01-01T00:00:00Z", "version": "1.0", "FAIL_TO_PASS": json.dumps(F2P),
           "PASS_TO_PASS": json.dumps(P2P), "environment_setup_commit": base}
    (Path(dst) / "rows.json").write_text(json.dumps([row], indent=1))
    (Path(dst) / "specs.json").write_text(json.dumps({REPO: {"1.0": {
        "python": python, "install": "python -m pip install -e .", "pip_packages": ["pytest"]}}}))
    return row
