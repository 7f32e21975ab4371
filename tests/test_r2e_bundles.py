"""The R2E grading-bundle survey (`benchmarks.r2e_bundles`, `gyre benchmark r2e-bundles`) on a tiny real git
history and bundle rows in RepoHarness's schema (`rh2.private_grading_bundle.r2e.v1`)."""

import hashlib
import json
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from gyre.benchmarks.git_blobs import BlobIndex
from gyre.benchmarks.r2e_bundles import load_bundles, load_revisions, summary, survey, upstream_files
from gyre.cli.main import app

RUN_TESTS = "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' .venv/bin/python -W ignore -m pytest -rA r2e_tests"
TEST_AT_FIX = "from toylib import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
REVISED_TEST = TEST_AT_FIX + "\n\ndef test_more():\n    assert add(2, 2) == 4\n"
EXPECTED = json.dumps({"test_add": "PASSED"}, indent=4)


def served(python: str) -> str | None:
    return None if python == "3.9" else f"Python {python} is not served here"


def sha(data: str | bytes) -> str:
    return "sha256:" + hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo)}
                          ).stdout.strip()


def toy_history(repos: Path) -> tuple[str, str]:
    """repos/scrapy+scrapy/repo (a fetched snapshot's layout): a base commit with a bug, the fix commit with its
    test. Returns (base, fix)."""
    repo = repos / "scrapy+scrapy" / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "toylib.py").write_text("def add(a, b):\n    return a - b\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "toylib.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_toylib.py").write_text(TEST_AT_FIX)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "fix")
    return base, git(repo, "rev-parse", "HEAD")


def bundle(repo: str, base: str, fix: str, files: dict[str, str], *, expected: str | None = EXPECTED,
           revisions: tuple[str, ...] = ()) -> dict:
    row = {"base_commit": base, "expected_output_json_sha256": sha(EXPECTED),
           "hidden_test_files": [{"path": p, "sha256": sha(text)} for p, text in files.items()],
           "hidden_tests_tree_sha256": "sha256:" + "0" * 64, "instance_id": f"{repo}__{fix}",
           "material_revisions": list(revisions), "normalization_version": "prime_decolor_v1",
           "parser_id": "r2e_prime_pytest_v1", "repo": repo, "repo_key_lower": repo, "run_tests_sh": RUN_TESTS,
           "run_tests_sh_sha256": sha(RUN_TESTS), "schema_id": "rh2.private_grading_bundle.r2e.v1",
           "source_commit_hash": fix}
    if expected is not None:
        row["expected_output_json"] = expected
    return row


def write_inputs(tmp_path: Path) -> tuple[Path, Path, Path, str, str]:
    repos = tmp_path / "repos"
    base, fix = toy_history(repos)
    other = "f" * 40
    rows = [
        bundle("scrapy", base, fix, {"__init__.py": "", "test_1.py": TEST_AT_FIX}),
        bundle("scrapy", base, other, {"__init__.py": "", "test_1.py": "not in the history\n"}),
        bundle("scrapy", base, "e" * 40, {"__init__.py": "", "test_1.py": TEST_AT_FIX}, revisions=("r2e-mr-001",)),
        bundle("scrapy", base, "d" * 40, {"__init__.py": "", "test_1.py": REVISED_TEST, "conftest.py": "x = 1\n"},
               revisions=("r2e-mr-002", "r2e-mr-003")),
        bundle("pandas", base, fix, {"test_1.py": TEST_AT_FIX}),
        bundle("scrapy", base, "c" * 40, {"test_1.py": TEST_AT_FIX}, expected=EXPECTED.replace("PASSED", "FAILED")),
    ]
    bundles = tmp_path / "grading_bundles_r2e_v0.jsonl"
    bundles.write_text("".join(json.dumps(r) + "\n" for r in rows))
    revision = {"decision_ref": "-", "sha256_after": sha("{}"), "sha256_before": sha(EXPECTED)}
    manifest = tmp_path / "ingest_manifest_v0.json"
    manifest.write_text(json.dumps({"material_revisions": [
        {**revision, "instance_id": rows[2]["instance_id"], "kind": "expected_text_replace", "revision_id": "r2e-mr-001",
         "target": "expected_output_json"},
        {"decision_ref": "-", "instance_id": rows[3]["instance_id"], "kind": "hidden_test_text_replace",
         "revision_id": "r2e-mr-002", "sha256_after": sha(REVISED_TEST), "sha256_before": sha(TEST_AT_FIX),
         "target": "test_1.py"},
        {"decision_ref": "-", "instance_id": rows[3]["instance_id"], "kind": "hidden_test_file_add",
         "revision_id": "r2e-mr-003", "sha256_after": sha("x = 1\n"), "sha256_before": None, "target": "conftest.py"},
    ]}))
    return bundles, manifest, repos, base, fix


def test_blob_index_finds_a_file_by_its_bytes(tmp_path):
    _, fix = toy_history(tmp_path)
    index = BlobIndex.of(tmp_path / "scrapy+scrapy" / "repo")
    blob = index.find(sha(TEST_AT_FIX))
    assert blob is not None and index.read(blob).decode() == TEST_AT_FIX
    assert index.find(sha("nowhere\n")) is None


def test_survey_says_which_bundles_are_recoverable_and_why_not(tmp_path):
    bundles, manifest, repos, _, fix = write_inputs(tmp_path)
    results = survey(load_bundles(bundles), repos, load_revisions(manifest), served,
                     {"pandas": "fetch refused: snapshot too large"})
    by_id = {r.instance_id: r for r in results}
    good = by_id[f"scrapy__{fix}"]
    assert good.recoverable and good.reasons == [] and good.expected == "upstream" and good.python == "3.9"
    assert all(f.blob for f in good.files)

    lost = by_id["scrapy__" + "f" * 40]
    assert not lost.recoverable
    assert any("test_1.py" in r and "not recoverable" in r for r in lost.reasons)
    assert any("commits not in scrapy/scrapy's history" in r for r in lost.reasons)

    revised = by_id["scrapy__" + "e" * 40]
    assert not revised.recoverable and revised.expected == "revised (r2e-mr-001)"
    assert any("expected_output_json revised by RepoHarness (r2e-mr-001" in r for r in revised.reasons)

    replaced = by_id["scrapy__" + "d" * 40]  # only its test text was revised, and the original is in the history
    assert [r for r in replaced.reasons if "hidden test" in r] == []
    files = dict(upstream_files(replaced))
    assert "conftest.py" not in files  # RepoHarness's addition is left out
    assert BlobIndex.of(repos / "scrapy+scrapy" / "repo").read(files["test_1.py"]).decode() == TEST_AT_FIX

    pandas = by_id[f"pandas__{fix}"]
    assert pandas.reasons[0] == "repository history not here: fetch refused: snapshot too large"
    assert "no R2E-Gym install recipe for pandas here: its image's Python is not known" in pandas.reasons

    mismatch = by_id["scrapy__" + "c" * 40]
    assert mismatch.expected == "text mismatch" and not mismatch.recoverable
    assert summary(results)["recoverable"] == 1


def test_cli_writes_the_results_file(tmp_path):
    bundles, manifest, repos, _, fix = write_inputs(tmp_path)
    out = tmp_path / "results" / "survey.json"
    done = CliRunner().invoke(app, ["benchmark", "r2e-bundles", str(bundles), "--repos", str(repos), "--manifest",
                                    str(manifest), "--unreachable", "pandas=too large", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert "1 of 6 bundles recoverable here" in done.output
    report = json.loads(out.read_text())
    assert report["recoverable_ids"] == [f"scrapy__{fix}"]
    assert report["by_repo"]["pandas"] == {"bundles": 1, "recoverable": 0}


def test_cli_refuses_a_bundle_of_another_schema(tmp_path):
    bundles, _, repos, _, _ = write_inputs(tmp_path)
    row = json.loads(bundles.read_text().splitlines()[0]) | {"schema_id": "something.else"}
    bundles.write_text(json.dumps(row) + "\n")
    done = CliRunner().invoke(app, ["benchmark", "r2e-bundles", str(bundles), "--repos", str(repos)])
    assert done.exit_code == 2 and "schema_id" in done.output


def test_build_writes_r2e_task_directories_gyre_loads(tmp_path):
    from gyre.benchmarks.r2e import load_r2e
    from gyre.benchmarks.r2e_bundle_build import GOLD_DIR, build_tasks, is_test_path

    bundles, manifest, repos, base, fix = write_inputs(tmp_path)
    rows = load_bundles(bundles)
    surveyed = survey(rows, repos, load_revisions(manifest), served)
    out = tmp_path / "tasks"
    built = build_tasks(rows, surveyed, out)
    assert built == [f"scrapy__{fix}"]
    (query,) = [q for q in load_r2e(out) if q.query_id == f"scrapy__{fix}"]
    assert (Path(query.start_dir) / "toylib.py").read_text() == "def add(a, b):\n    return a - b\n"  # the base
    hidden = Path(query.hidden_tests_dir)
    assert (hidden / "r2e_tests" / "test_1.py").read_text() == TEST_AT_FIX
    assert (hidden / "r2e_tests" / "__init__.py").read_bytes() == b""
    assert (hidden / "run_tests.sh").read_text() == RUN_TESTS
    gold = (out / GOLD_DIR / f"{query.query_id}.patch").read_text()
    assert "toylib.py" in gold and "tests/test_toylib.py" not in gold
    subprocess.run(["git", "-C", str(query.start_dir), "apply", "-"], input=gold, text=True, check=True)
    assert (Path(query.start_dir) / "toylib.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert is_test_path("Tests/test_image.py") and is_test_path("src/conftest.py") and not is_test_path("src/PIL/Image.py")


def test_a_base_whose_blob_the_snapshot_lacks_starts_from_its_tree_without_that_file(tmp_path):
    from gyre.benchmarks.r2e_bundle_build import start_commit

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "code.py").write_text("x = 1\n")
    (repo / "big.ttf").write_bytes(b"\0" * 100)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    assert start_commit(repo, base) == (base, [])
    blob = git(repo, "rev-parse", "HEAD:big.ttf")
    (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()  # what a snapshot without large files looks like
    start, missing = start_commit(repo, base)
    assert missing == ["big.ttf"] and start != base
    assert git(repo, "ls-tree", "-r", "--name-only", start) == "code.py"
    assert git(repo, "log", "--format=%P", "-1", start) == ""  # no parent: no history that needs the lost blob


def test_an_instance_without_an_image_recipe_is_unscorable_with_that_reason(tmp_path):
    from types import SimpleNamespace

    from gyre.benches.fidelity_r2e_score import RECIPES, _instance
    from gyre.sandboxes.suite_base import suite_for

    query = SimpleNamespace(query_id="numpy__" + "a" * 40)
    result = _instance(None, query, tmp_path, tmp_path / "out", 60.0, None)  # no engine is asked
    assert (result.scorable, result.gold, result.none) == (False, None, None)
    assert result.reason == "no R2E image recipe for numpy here"
    assert all(suite_for(recipe.python) for recipe in RECIPES.values())
