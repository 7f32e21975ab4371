"""Survey R2E-Gym grading bundles (RepoHarness's `grading_bundles_r2e_v0.jsonl`): which can be rebuilt here as
R2E-Gym graded them, and for each other one the precise reason (`gyre benchmark r2e-bundles`).

A bundle (schema `rh2.private_grading_bundle.r2e.v1`, `Rogerffff/RepoHarness` at `4a969c3`,
`docs/agentic_RL/repo_harness_rh2_workstreams/s2_r2e/ingest/`) names an R2E-Gym instance by `repo`,
`base_commit` (the agent's start), `source_commit_hash` (the fix), its `run_tests_sh`, its expected map
(`expected_output_json`, with its sha256) and its hidden test files by path and sha256 only, no text. Its
`ingest_manifest_v0.json` lists RepoHarness's own revisions of the upstream material (`material_revisions`:
`kind`, `target`, `sha256_before` = upstream's original, `sha256_after` = the revision the bundle carries).

A bundle is recoverable when, in the repository's history (`--repos DIR`, layouts of `swe_build.find_repository`):
both commits are there; every hidden file's bytes are some blob of the history (found by sha256: `git_blobs`) and
none is RepoHarness's revision or addition; the expected map is upstream's (no `expected_*` revision; its text,
when the bundle file carries it, hashes to its sha256); `run_tests_sh` hashes to its sha256; and the Python
R2E-Gym's install script tries first for the repository (`install_utils/<repo>_install.sh`) is one a Debian
suite the mirror serves ships (the caller says which: `sandboxes.suite_base`, a room this one does not import). A revised file whose original is in the history is said
so: such a file does not stop the rebuild (the original is used; a file RepoHarness added is left out), but a
bundle whose expected map was revised is not recoverable as upstream graded it: upstream's map is known only by its
sha256, and regenerating it means running the fix commit in upstream's image, which is not here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from gyre.benchmarks.errors import BenchmarkFormatError
from gyre.benchmarks.git_blobs import BlobIndex, has_commit
from gyre.benchmarks.swe_build import find_repository

SCHEMA = "rh2.private_grading_bundle.r2e.v1"
R2E_REPOSITORIES = {
    "aiohttp": "aio-libs/aiohttp", "bokeh": "bokeh/bokeh", "coveragepy": "nedbat/coveragepy",
    "datalad": "datalad/datalad", "numpy": "numpy/numpy", "orange3": "biolab/orange3",
    "pandas": "pandas-dev/pandas", "pillow": "python-pillow/Pillow", "pyramid": "Pylons/pyramid",
    "scrapy": "scrapy/scrapy", "sympy": "sympy/sympy", "tornado": "tornadoweb/tornado",
}
"""R2E-Gym's repository keys -> GitHub (the `git clone` of `repo_analysis/base_dockerfiles/Dockerfile.<repo>`)."""
R2E_PYTHONS = {
    "aiohttp": ("3.9",), "coveragepy": ("3.7", "3.10"), "datalad": ("3.9", "3.7"), "numpy": ("3.7", "3.10"),
    "orange3": ("3.7", "3.8", "3.10"), "pillow": ("3.9",), "scrapy": ("3.9",),
}
"""The Pythons R2E-Gym's `install_utils/<repo>_install.sh` tries, in order (`uv venv --python X`; the image keeps
the first that installs). pandas picks per commit (`get_pandas_install_commands.py`): not listed."""


class BundleFile(BaseModel):
    model_config = ConfigDict(extra="ignore")
    path: str
    sha256: str


class GradingBundle(BaseModel):
    """One line of `grading_bundles_r2e_v0.jsonl` (the fields the survey reads)."""

    model_config = ConfigDict(extra="ignore")
    instance_id: str
    repo: str
    base_commit: str
    source_commit_hash: str
    hidden_test_files: list[BundleFile]
    expected_output_json_sha256: str
    expected_output_json: str | None = None
    material_revisions: list[str] = []
    run_tests_sh: str
    run_tests_sh_sha256: str
    schema_id: str = SCHEMA


class MaterialRevision(BaseModel):
    model_config = ConfigDict(extra="ignore")
    revision_id: str
    instance_id: str
    kind: str
    target: str
    sha256_before: str | None = None
    sha256_after: str | None = None


@dataclass
class FileFinding:
    path: str
    sha256: str
    blob: str | None = None
    """The git blob of the history holding these bytes, or None."""
    revision: str = ""
    """RepoHarness's revision of this file (`r2e-mr-...`: kind), if any."""
    original_sha256: str = ""
    original_blob: str | None = None


@dataclass
class BundleSurvey:
    instance_id: str
    repo: str
    repository: str = ""
    """Where its history was found, or empty."""
    python: str = ""
    recoverable: bool = False
    reasons: list[str] = field(default_factory=list)
    files: list[FileFinding] = field(default_factory=list)
    expected: str = ""
    """upstream | revised (r2e-mr-...) | text mismatch | absent from this copy"""


def load_bundles(path: Path) -> list[GradingBundle]:
    bundles = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            bundle = GradingBundle.model_validate_json(line)
        except ValidationError as exc:
            raise BenchmarkFormatError(Path(f"{path}:{number}"), "bundle", str(exc).splitlines()[0]) from None
        if bundle.schema_id != SCHEMA:
            raise BenchmarkFormatError(Path(f"{path}:{number}"), "schema_id", f"expected {SCHEMA}, got "
                                       f"{bundle.schema_id!r}")
        bundles.append(bundle)
    return bundles


def load_revisions(manifest: Path | None) -> dict[str, MaterialRevision]:
    """revision id -> revision, from `ingest_manifest_v0.json` (none without a manifest)."""
    if manifest is None:
        return {}
    data = json.loads(Path(manifest).read_text(encoding="utf-8"))
    return {r.revision_id: r for r in (MaterialRevision.model_validate(x) for x in data.get("material_revisions", []))}


def survey(bundles: list[GradingBundle], repos: Path, revisions: dict[str, MaterialRevision],
           unserved: Callable[[str], str | None], unreachable: dict[str, str] | None = None) -> list[BundleSurvey]:
    """Each bundle's verdict. `unserved(python)`: why that Python cannot be had here, None when it can;
    `unreachable` maps a repository key to why its history is not here (a fetch refused)."""
    indexes: dict[str, BlobIndex] = {}
    return [_survey_one(b, Path(repos), revisions, unserved, unreachable or {}, indexes) for b in bundles]


def summary(results: list[BundleSurvey]) -> dict:
    by_repo: dict[str, dict[str, int]] = {}
    for r in results:
        counts = by_repo.setdefault(r.repo, {"bundles": 0, "recoverable": 0})
        counts["bundles"] += 1
        counts["recoverable"] += r.recoverable
    return {"bundles": len(results), "recoverable": sum(r.recoverable for r in results),
            "recoverable_ids": [r.instance_id for r in results if r.recoverable], "by_repo": by_repo,
            "results": [asdict(r) for r in results]}


def upstream_files(result: BundleSurvey) -> list[tuple[str, str]]:
    """(path under r2e_tests/, git blob) of upstream's hidden files for a surveyed bundle: the original where
    RepoHarness replaced a text, none where it added a file."""
    files = []
    for f in result.files:
        if f.revision.endswith("hidden_test_file_add"):
            continue
        blob = f.original_blob if f.revision else f.blob
        if blob is None:
            raise ValueError(f"{result.instance_id}: {f.path} is not recoverable")
        files.append((f.path, blob))
    return files


def _survey_one(bundle: GradingBundle, repos: Path, revisions: dict[str, MaterialRevision],
                unserved: Callable[[str], str | None], unreachable: dict[str, str],
                indexes: dict[str, BlobIndex]) -> BundleSurvey:
    result = BundleSurvey(bundle.instance_id, bundle.repo)
    mine = [revisions[r] for r in bundle.material_revisions if r in revisions]
    unknown = [r for r in bundle.material_revisions if r not in revisions]
    if unknown:
        result.reasons.append(f"material revisions {unknown} are not in the manifest: what they changed is unknown")
    if _sha256(bundle.run_tests_sh) != _hex(bundle.run_tests_sh_sha256):
        result.reasons.append("run_tests_sh does not hash to run_tests_sh_sha256")
    result.expected = _expected_state(bundle, mine, result.reasons)
    _environment(bundle.repo, result, unserved)
    github = R2E_REPOSITORIES.get(bundle.repo)
    where = find_repository(repos, github) if github else None
    if where is None:
        why = unreachable.get(bundle.repo, f"no git repository {github or bundle.repo} under {repos}")
        result.reasons.insert(0, f"repository history not here: {why}")
        return result
    result.repository = str(where)
    missing = [c for c in (bundle.base_commit, bundle.source_commit_hash) if not has_commit(where, c)]
    if missing:
        result.reasons.append(f"commits not in {github}'s history: {', '.join(missing)}")
    index = indexes.get(bundle.repo) or indexes.setdefault(bundle.repo, BlobIndex.of(where))
    by_target = {r.target: r for r in mine if r.kind.startswith("hidden_test")}
    for hidden in bundle.hidden_test_files:
        finding = FileFinding(hidden.path, _hex(hidden.sha256), index.find(hidden.sha256))
        revision = by_target.get(hidden.path)
        if revision is not None:
            finding.revision = f"{revision.revision_id}: {revision.kind}"
            if revision.sha256_before:
                finding.original_sha256 = _hex(revision.sha256_before)
                finding.original_blob = index.find(revision.sha256_before)
            if not _original_usable(revision, finding):
                result.reasons.append(_revised_file_reason(hidden.path, revision, finding))
        elif finding.blob is None:
            result.reasons.append(f"hidden test file {hidden.path} ({finding.sha256[:12]}) is no blob of "
                                  f"{github}'s history: its text is not recoverable")
        result.files.append(finding)
    result.recoverable = not result.reasons
    return result


def _expected_state(bundle: GradingBundle, mine: list[MaterialRevision], reasons: list[str]) -> str:
    revised = [r for r in mine if r.target == "expected_output_json"]
    if revised:
        r = revised[0]
        reasons.append(f"expected_output_json revised by RepoHarness ({r.revision_id}: {r.kind}); upstream's map is "
                       f"known only by its sha256 {_hex(r.sha256_before or '')[:12]} and the revision's text is not "
                       "upstream's: regenerating it needs the fix commit run in upstream's image")
        return f"revised ({r.revision_id})"
    if bundle.expected_output_json is None:
        reasons.append("expected_output_json's text is absent from this copy of the bundles")
        return "absent from this copy"
    if _sha256(bundle.expected_output_json) != _hex(bundle.expected_output_json_sha256):
        reasons.append("expected_output_json does not hash to expected_output_json_sha256")
        return "text mismatch"
    return "upstream"


def _original_usable(revision: MaterialRevision, finding: FileFinding) -> bool:
    """Upstream's own file is at hand: RepoHarness added the file (upstream had none: it is left out) or replaced
    a text whose original is a blob of the history (the original is used)."""
    return revision.kind == "hidden_test_file_add" or finding.original_blob is not None


def _revised_file_reason(path: str, revision: MaterialRevision, finding: FileFinding) -> str:
    if revision.kind == "hidden_test_file_add":
        return f"hidden test file {path} was added by RepoHarness ({revision.revision_id}): upstream had none"
    original = ("its original is in the history (blob " + finding.original_blob[:12] + ")" if finding.original_blob
                else "its original is in no blob of the history")
    return f"hidden test file {path} revised by RepoHarness ({revision.revision_id}: {revision.kind}); {original}"


def _environment(repo: str, result: BundleSurvey, unserved: Callable[[str], str | None]) -> None:
    pythons = R2E_PYTHONS.get(repo)
    if not pythons:
        result.reasons.append(f"no R2E-Gym install recipe for {repo} here: its image's Python is not known")
        return
    result.python = pythons[0]
    why = unserved(pythons[0])
    if why is not None:
        tried = f" (then {', '.join(pythons[1:])})" if len(pythons) > 1 else ""
        result.reasons.append(f"environment: R2E-Gym's {repo}_install.sh tries Python {pythons[0]} first{tried}; {why}")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:").lower()
