"""The evaluation environment sealed before the workspace's commands (`environments/seal.py`)."""

from __future__ import annotations

import os

import pytest

from gyre.evaluators.environments.seal import EnvSeal
from gyre.evaluators.formats.nl2repo import evaluate
from gyre.records import EvalStatus
from gyre.sandboxes.local.isolation import probe_bwrap
from tests.test_evaluator_nl2repo import _calc_query, _workspace

SITE = "lib/python3.11/site-packages"


def _env(tmp_path):
    root = tmp_path / "env"
    (root / SITE / "pytest").mkdir(parents=True)
    (root / SITE / "pytest" / "__init__.py").write_text("# the tools' pytest\n")
    (root / SITE / "_gyre_tools.pth").write_text("/gyre-tools/site\n")
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return root


def _install(root, name: str, files: dict[str, str]) -> None:
    """What pip does: the files, and a dist-info whose RECORD lists them and itself."""
    info = f"{name}-1.0.dist-info"
    (root / SITE / info).mkdir()
    for rel, text in files.items():
        (root / SITE / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / SITE / rel).write_text(text)
    (root / SITE / info / "METADATA").write_text(f"Name: {name}\n")
    record = [f"{rel},sha256=x,1" for rel in files] + [f"{info}/METADATA,,", f"{info}/RECORD,,"]
    (root / SITE / info / "RECORD").write_text("\n".join(record) + "\n")


def test_what_pip_installs_is_the_installers(tmp_path):
    root = _env(tmp_path)
    seal = EnvSeal.take(root)
    _install(root, "calc", {
        "__editable__.calc-1.0.pth": "import __editable___calc_1_0_finder; __editable___calc_1_0_finder.install()\n",
        "__editable___calc_1_0_finder.py": "def install():\n    pass\n",
        "../../../bin/calc": "#!/bin/sh\n",
    })
    (root / SITE / "easy-install.pth").write_text("/work/repo\n")  # a legacy develop install: paths only
    assert seal.broken() == []


@pytest.mark.parametrize("plant, evidence", [
    ({"zz.pth": "import os; os.environ['X'] = '1'\n"}, "site runs its line"),
    ({"sitecustomize.py": "print('hi')\n"}, "runs in every Python process"),
    ({"pytest/__init__.py": "# patched\n"}, "pytest/__init__.py was changed"),
    ({"pytest/__pycache__/__init__.cpython-311.pyc": "forged"}, "was written in the evaluation's environment"),
])
def test_what_a_setup_command_plants_is_tampering(tmp_path, plant, evidence):
    root = _env(tmp_path)
    seal = EnvSeal.take(root)
    for rel, text in plant.items():
        path = root / SITE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            os.utime(path, ns=(0, 0))  # its mtime put back cannot hide the rewrite: ctime moved
        path.write_text(text)
    found = seal.broken()
    assert len(found) == 1 and evidence in found[0], found


def test_a_startup_file_of_a_locally_built_distribution_is_tampering(tmp_path):
    root = _env(tmp_path)
    seal = EnvSeal.take(root)
    _install(root, "evil", {"evil.pth": "import evil_boot\n", "evil_boot.py": "pass\n",
                            "evil-1.0.dist-info/direct_url.json": '{"url": "file:///work/repo"}'})
    (found,) = seal.broken()
    assert "evil.pth" in found and "import evil_boot" in found


def test_a_startup_file_of_a_wheel_from_the_index_is_the_installers(tmp_path):
    """more-itertools' test dependencies bring coverage, whose wheel ships `a1_coverage.pth`."""
    root = _env(tmp_path)
    seal = EnvSeal.take(root)
    _install(root, "coverage", {"a1_coverage.pth": "import sys; exec('import os')\n", "coverage/__init__.py": ""})
    assert seal.broken() == []


def test_a_removal_is_the_installers_only_with_its_record(tmp_path):
    root = _env(tmp_path)
    _install(root, "old", {"old/__init__.py": ""})
    seal = EnvSeal.take(root)
    for path in sorted((root / SITE).glob("old*/*")):
        path.unlink()
    assert seal.broken() == []
    (root / SITE / "_gyre_tools.pth").unlink()
    assert seal.broken() == [f"{SITE}/_gyre_tools.pth was removed from the evaluation's environment"]


@pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing or unusable")
def test_a_setup_command_that_plants_a_pth_in_the_environment_is_tampering(tmp_path):
    """NL2RepoBench runs the workspace's own script before the tests: the `.pth` it writes into the evaluation's
    environment would run in the test process before gyre's plugin."""
    query = _calc_query(tmp_path, commands=["python plant.py", "python -m pytest -q tests"])
    plant = ("import sysconfig\nopen(sysconfig.get_path('purelib') + '/aaa.pth', 'w').write("
             "'import os; os.environ.setdefault(\"FORGED\", \"1\")\\n')\n")
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return a + b\n", "plant.py": plant})
    score = evaluate(query, workspace, tmp_path / "eval", "planted", timeout_s=60)
    assert score.status is EvalStatus.tampering, score
    assert any("aaa.pth" in e for e in score.evidence), score.evidence
