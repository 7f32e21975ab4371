"""Score built R2E instances (`r2e_bundle_build`) in docker as R2E-Gym grades them: the gold patch (the fix
commit's non-test diff) and no patch, each in a fresh container of the instance's image, graded by gyre's R2E
evaluation in that container (`formats/in_container`: `bash run_tests.sh` from `/testbed` with the image's
`.venv`, R2E-Gym's rule). Expected: gold 1.0, none 0.0.

The image follows R2E-Gym's recipe for the repository (`repo_analysis/base_dockerfiles/Dockerfile.<repo>`: its
`apt-get install` line; `install_utils/<repo>_install.sh`: `uv venv --python X`, its pip packages, its install),
built here on the Debian suite whose `python3` is that Python (`suite_base`, the apt packages included in the
base: no build step reaches apt), pip through the package index. A repository without a recipe here, or whose
image cannot be built, is unscorable with that reason, never a 0. The install runs with uv, as upstream's does, the
distributions as of `PACKAGES_BEFORE`. Departures: Debian's CPython (upstream: uv's own on Ubuntu 22.04), PyQt5 left
out of Pillow's (only `ImageQt`'s tests import it).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gyre.benchmarks.r2e import load_r2e_report
from gyre.benchmarks.r2e_bundle_build import GOLD_DIR
from gyre.benchmarks.registry import task_spec
from gyre.evaluators import evaluate_query
from gyre.evaluators.formats.in_container import AGENT_DIRS, container_slots
from gyre.sandboxes.docker import DockerSandbox
from gyre.sandboxes.docker_build import PACKAGE_INDEX, task_image
from gyre.sandboxes.suite_base import suite_base, suite_for


@dataclass(frozen=True)
class R2ERecipe:
    python: str
    apt: tuple[str, ...]
    """Debian's names for the Dockerfile's `apt-get install` extras (Ubuntu's `libtiff5-dev` is `libtiff-dev`)."""
    install: str
    """The install script's commands, run in /testbed with the venv active (`uv pip` installs into it)."""


RECIPES = {
    "pillow": R2ERecipe("3.9", ("libjpeg-dev", "libwebp-dev", "libtiff-dev", "zlib1g-dev"),
                        "uv pip install setuptools pytest pytest-cov && uv pip install -e . --no-build-isolation"),
    "scrapy": R2ERecipe("3.9", ("libjpeg-dev", "libwebp-dev", "gcc", "g++", "gfortran", "libopenblas-dev",
                                "liblapack-dev", "pkg-config"),
                        "if [ -f requirements.txt ]; then uv pip install -r requirements.txt; fi && "
                        "uv pip install -e . && uv pip install pytest testfixtures pyftpdlib pexpect"),
}
PACKAGES_BEFORE = "2025-03-01"
"""Distributions as of this date (uv's `--exclude-newer`, build dependencies included): R2E-Gym's images were
built before its release (April 2025). Without it the newest setuptools the index serves (84.2.1 on 2026-12-06)
fails scrapy's 2022 `setup.py` at `import pkg_resources` in its isolated build."""
IMAGE = """FROM {base}
COPY testbed/ /testbed/
WORKDIR /testbed
ENV PIP_NO_CACHE_DIR=1 UV_NO_CACHE=1 UV_EXCLUDE_NEWER={before}
RUN python3 -m pip install --quiet uv && uv venv --quiet --python /usr/bin/python3 /testbed/.venv && \\
    export VIRTUAL_ENV=/testbed/.venv PATH=/testbed/.venv/bin:$PATH && {install}
"""
EXPECTED = {"gold": 1.0, "none": 0.0}


@dataclass
class ScoredInstance:
    instance_id: str
    scorable: bool = False
    reason: str = ""
    gold: float | None = None
    none: float | None = None
    match: bool = False
    image: str = ""
    details: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def run(tasks: Path, out: Path, *, instances: tuple[str, ...] = (), timeout_s: float = 600.0,
        index_url: str | None = None) -> dict:
    import docker

    client = docker.from_env()
    queries, problems = load_r2e_report(Path(tasks))
    results = [ScoredInstance(p.query_id or p.task, reason=f"malformed: {p.reason}") for p in problems]
    for query in queries:
        if instances and query.query_id not in instances:
            continue
        results.append(_instance(client, query, Path(tasks), Path(out) / query.query_id, timeout_s, index_url))
    scorable = [r for r in results if r.scorable]
    return {"tasks": str(tasks), "instances": len(results), "scorable": len(scorable), "expected": EXPECTED,
            "matched": sum(r.match for r in scorable),
            "unscorable": [{"instance_id": r.instance_id, "reason": r.reason} for r in results if not r.scorable],
            "results": [asdict(r) for r in results]}


def _instance(client, query, tasks: Path, out: Path, timeout_s: float, index_url: str | None) -> ScoredInstance:
    started = time.monotonic()
    result = ScoredInstance(query.query_id)
    repo = query.query_id.split("__", 1)[0]
    recipe = RECIPES.get(repo)
    if recipe is None or suite_for(recipe.python) is None:
        result.reason = f"no R2E image recipe for {repo} here" if recipe is None else \
            f"its Python {recipe.python} is served by no Debian suite here"
        return result
    try:
        tag = _image(client, query, recipe, timeout_s, index_url)
    except Exception as exc:  # deliberate: an image that cannot be had here is the instance's reason, said
        result.reason = f"no image: {type(exc).__name__}: {str(exc)[-600:]}"
        result.seconds = time.monotonic() - started
        return result
    result.image = tag
    gold = (tasks / GOLD_DIR / f"{query.query_id}.patch").read_text(encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    scores = {}
    for arm, patch in (("gold", gold), ("none", "")):
        scored = _score(query, tag, out, arm, patch, timeout_s)
        result.details[arm] = scored.detail[:1500]
        scores[arm] = scored
    result.seconds = time.monotonic() - started
    failed = [(arm, s) for arm, s in scores.items() if s.status.value == "error"]
    if failed:
        result.reason = f"evaluator failure on the {failed[0][0]} arm: {failed[0][1].detail[:600]}"
        return result
    result.scorable, result.gold, result.none = True, scores["gold"].score, scores["none"].score
    result.match = (result.gold, result.none) == (1.0, 0.0)
    return result


def _image(client, query, recipe: R2ERecipe, timeout_s: float, index_url: str | None) -> str:
    base, _ = suite_base(client, suite_for(recipe.python), extra=recipe.apt)
    with tempfile.TemporaryDirectory(prefix="gyre-r2e-image-") as tmp:
        context = Path(tmp)
        shutil.copytree(query.start_dir, context / "testbed", symlinks=True)
        (context / "Dockerfile").write_text(IMAGE.format(base=base, before=PACKAGES_BEFORE, install=recipe.install),
                                            encoding="utf-8")
        built = task_image(client, query.query_id, context, context / "Dockerfile", {}, max(timeout_s, 1800.0),
                           PACKAGE_INDEX, index_url)
    return built.tag


def _score(query, tag: str, out: Path, arm: str, patch: str, timeout_s: float):
    spec = task_spec(query)
    box = DockerSandbox.create(query, out / f"ws-{arm}", image=spec.image, workdir=spec.workdir,
                               eval_slots=container_slots(spec), agent_dirs=AGENT_DIRS,
                               base_images={spec.image: tag})
    try:
        if patch:
            done = subprocess.run(["git", "-C", str(box.workspace), "apply", "-"], input=patch, text=True,
                                  capture_output=True, timeout=120)
            if done.returncode != 0:
                raise RuntimeError(f"the gold patch does not apply: {done.stderr.strip()[-400:]}")
        box.end_agent()
        return evaluate_query(query, box.workspace, out / f"eval-{arm}", f"{query.query_id}-{arm}", timeout_s,
                              live=box, monitor="record")
    finally:
        box.close()
