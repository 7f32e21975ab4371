"""What a SWE-bench instance's images are made of, read from its spec: the bridge from `benchmarks` to `sandboxes`.

The builder resolved the instance's install specification into its `SweSpec` (`gyre.benchmarks.swe_bench`);
`gyre.sandboxes.swe_image` builds the three images from an `EnvironmentRecipe`, a plain record, since the
sandboxes' room does not import the benchmarks'. The docker sandbox of an execution
(`nl2repo_image.docker_placement`) and its evaluation's fresh container (`swe_bench`) both ask here, so both find
the same cached image.
"""

from __future__ import annotations

from pathlib import Path

from gyre.benchmarks.spec import TaskSpec
from gyre.benchmarks.swe_bench import WORKDIR
from gyre.records import Query
from gyre.sandboxes.swe_image import EnvironmentRecipe


def recipe(query: Query, spec: TaskSpec) -> EnvironmentRecipe:
    """The images of `query`, a SWE-bench instance (`spec.swe` set)."""
    swe = spec.swe
    return EnvironmentRecipe(task=query.query_id, environment_key=f"{swe.repo} {swe.version}", python=swe.python,
                             requirements=swe.requirements, pip_packages=swe.pip_packages,
                             pre_install=swe.pre_install, install=swe.install, repository=Path(query.start_dir),
                             workdir=spec.workdir or WORKDIR, packages_before=swe.packages_before)
