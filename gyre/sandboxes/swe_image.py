"""A SWE-bench instance's image: its Python's base, its repository version's environment, its install at base_commit.

SWE-bench builds three images per instance (`swebench/harness/docker_build.py`, `dockerfiles/python.py`,
`test_spec/python.py`): a base (conda), an environment image per repository and version (`conda create
python=<X> <packages>`, the requirements file, `pip install <pip_packages>`), and the instance image (the
repository cloned at `base_commit` into `/testbed`, `pre_install`, then the install command). `instance_image`
makes the same three here, each cached on the engine:

- the base of the Debian suite whose `python3` is the specification's Python (`suite_base`: bullseye 3.9,
  bookworm 3.11, trixie 3.13), built offline with mmdebstrap; a Python none of them ships is `NoPythonHere`,
  which the caller turns into "unscorable here, with this reason", never a 0;
- the environment: `FROM` that base, its requirement lines and pip packages resolved as of the task's
  `packages_before` date (uv's `--exclude-newer`, through the index: upstream's images were built in 2024, and a
  package released since can break a 2020 repository: NumPy 2 removed `np.Inf`, which pvlib 0.8 imports), what
  that installed frozen into a constraints file every later `pip install` honours (`PIP_CONSTRAINT`), compiled to
  bytecode as pip and conda leave it (else every import compiles the library's source, which gyre's runtime monitor
  reads as code compiled under a trusted file's name); pip (below 25, as SWE-bench's conda environments of 2024 had it: pip 25.3 drops
  the `setup.py develop` fallback that astroid 2.13's `pip install -e .` needs, its build backend pinned to
  setuptools 62 without PEP 660), setuptools and wheel upgraded (Debian bullseye's setuptools 52 cannot install
  in editable mode by PEP 660, which the eval script's install needs without build isolation), the requirement lines (a requirements file, or the conda
  packages the specification names: pip installs them here), then the extra pip packages; a task image built by
  `docker_build.task_image`, so it is cached by its Dockerfile's digest (every instance of one repository version
  with the same requirements shares it) and its steps reach the package index through gyre's proxy when the
  run's `build_network` is `package-index` (else they have no network and fail, naming the step);
- the instance: `FROM` the environment, the repository at `base_commit` (the task's `start/`, its `.git` too:
  setuptools-scm reads versions from it) copied to `/testbed`, `pre_install` and the install command run there
  as root; cached by the digest of that build context.

Everything is installed into the image's system Python, no virtualenv: the evaluation runs as another user on a
read-only root, and its own `pip install -e .` (upstream's eval script runs the install command again) then goes
to that user's site, which a virtualenv would hide. The agent's workspace is seeded from the image's `/testbed`
(`docker_build.seed_workspace`), so what the install built there (egg-info, compiled extensions) is in it.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gyre.sandboxes.base import SandboxStartError
from gyre.sandboxes.docker_build import BuiltImage, task_image
from gyre.sandboxes.suite_base import no_suite_reason, suite_base, suite_for

REQUIREMENTS = "requirements.txt"
CONSTRAINTS = "/etc/gyre-swe-constraints.txt"
"""In an environment image: `pip freeze` of what it installed, named by `PIP_CONSTRAINT` in its environment, so the
install command (and the eval script's) never upgrades them."""
ENVIRONMENT_DOCKERFILE = """FROM {base}
COPY {requirements} /tmp/gyre-requirements.txt
RUN python3 -m pip install --no-cache-dir --quiet --upgrade 'pip<25' setuptools wheel uv{install_requirements}{install_packages} && \\
    python3 -m pip freeze --all --exclude pip --exclude setuptools --exclude wheel --exclude uv > {constraints} && \\
    rm /tmp/gyre-requirements.txt
ENV PIP_CONSTRAINT={constraints}
"""
INSTANCE_DOCKERFILE = """FROM {environment}
COPY testbed/ {workdir}/
WORKDIR {workdir}
RUN {commands}
"""


class NoPythonHere(SandboxStartError):
    """The instance's Python is served by no Debian suite the mirror has: unscorable here, the message says why."""


@dataclass(frozen=True)
class EnvironmentRecipe:
    """What a SWE-bench instance's images are made of (its `SweSpec`, handed down by the evaluators' room)."""

    task: str
    """The instance id (labels, messages)."""
    environment_key: str
    """`owner/name version`: what the environment image is for."""
    python: str
    requirements: tuple[str, ...]
    pip_packages: tuple[str, ...]
    pre_install: tuple[str, ...]
    install: str
    repository: Path
    packages_before: str | None = None
    """Install only distributions uploaded before this date (uv's `--exclude-newer`); None: the newest."""
    """The repository at base_commit (the task's `start/`)."""
    workdir: str = "/testbed"


def instance_image(client, recipe: EnvironmentRecipe, timeout_s: float, network: str = "none",
                   index_url: str | None = None) -> BuiltImage:
    """The instance image of `recipe` (built or found), its note naming the three layers; `NoPythonHere` when no
    suite ships its Python."""
    suite = suite_for(recipe.python)
    if suite is None:
        raise NoPythonHere(f"{recipe.task}: {no_suite_reason(recipe.python)}")
    base, base_cached = suite_base(client, suite)
    environment = environment_image(client, recipe, base, timeout_s, network, index_url)
    with tempfile.TemporaryDirectory(prefix="gyre-swe-instance-") as tmp:
        context = Path(tmp)
        shutil.copytree(recipe.repository, context / "testbed", symlinks=True)
        commands = " && \\\n    ".join([*recipe.pre_install, recipe.install])
        (context / "Dockerfile").write_text(INSTANCE_DOCKERFILE.format(
            environment=environment.tag, workdir=recipe.workdir, commands=commands), encoding="utf-8")
        built = task_image(client, recipe.task, context, context / "Dockerfile", {}, timeout_s, network, index_url)
    note = (f"{built.tag}: {recipe.task} at base_commit installed ({recipe.install}) on {environment.tag} "
            f"({recipe.environment_key}'s environment{', built' if not environment.cached else ''}) on {base} "
            f"(Python {recipe.python}, Debian {suite}{', built' if not base_cached else ''})")
    return BuiltImage(built.tag, note, built.cached and environment.cached and base_cached)


def environment_image(client, recipe: EnvironmentRecipe, base: str, timeout_s: float, network: str,
                      index_url: str | None) -> BuiltImage:
    """The repository version's environment on `base` (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="gyre-swe-environment-") as tmp:
        context = Path(tmp)
        (context / REQUIREMENTS).write_text("".join(f"{line}\n" for line in recipe.requirements), encoding="utf-8")
        (context / REQUIREMENTS).chmod(0o644)
        uv = ("uv pip install --system --no-cache --quiet --compile-bytecode --exclude-newer "
              f"{shlex.quote(recipe.packages_before)}") \
            if recipe.packages_before else "python3 -m pip install --no-cache-dir --quiet"
        text = ENVIRONMENT_DOCKERFILE.format(
            base=base, requirements=REQUIREMENTS, constraints=CONSTRAINTS,
            install_requirements=f" && \\\n    {uv} -r /tmp/gyre-requirements.txt" if recipe.requirements else "",
            install_packages=f" && \\\n    {uv} " + " ".join(shlex.quote(p) for p in recipe.pip_packages)
            if recipe.pip_packages else "")
        (context / "Dockerfile").write_text(text, encoding="utf-8")
        (context / "Dockerfile").chmod(0o644)
        return task_image(client, f"{recipe.environment_key} environment", context, context / "Dockerfile", {},
                          timeout_s, network, index_url)
