"""The suite's own scheduling (tests/conftest.py, `SHARED_GROUPS`): every test file that starts containers on the
engine (a test or fixture taking `docker_image`) runs in the `host-processes` group, one file after another on one
worker. A file left out ran beside the group under `make test` and its containers met the group's checks that
nothing labelled gyre is left (and its load met their evaluations): CI failed on it once."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import SHARED_GROUPS

TESTS = Path(__file__).resolve().parent


def _takes_docker_image(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and any(arg.arg == "docker_image" for arg in node.args.args) for node in ast.walk(tree))


def test_every_file_that_starts_containers_runs_in_the_host_processes_group():
    users = {path.stem for path in TESTS.glob("test_*.py") if _takes_docker_image(path)}
    assert len(users) >= 10  # the check reads the files it should
    assert sorted(users - set(SHARED_GROUPS["host-processes"])) == []
