"""SWE-bench's per-repository, per-version install specifications, as gyre reads them, and what follows from a row.

SWE-bench grades an instance in an image made from its repository's specification for the row's `version`
(SWE-bench/SWE-bench@25c5235, `swebench/harness/constants/python.py`: `SPECS_*`, `MAP_REPO_TO_REQS_PATHS`; the
scripts that use them are `swebench/harness/test_spec/python.py`): a Python, dependencies (a requirements file
read from the repository at `environment_setup_commit`, or conda packages), extra pip packages, an install
command run in the repository at `base_commit`, and a test command whose directives are the files the row's
`test_patch` touches (less data files). This module holds gyre's own table of those facts for the repositories of
SWE-bench Lite's dev split (read off upstream's file, not copied; each entry names the `SPECS_` dict it follows),
which `--specs FILE` extends (`load_extra_specs`, the same fields as JSON), and the small derivations the
builder needs: the test directives, the requirements of a commit.

Where gyre departs: upstream creates the Python and the `packages` with conda; here the Python is a Debian suite's
(`gyre.sandboxes.suite_base`) and those packages are installed with pip from the package index (`pandas scipy`
for pvlib, `numpy` for pydicom: all on PyPI). A `pre_install` that runs apt (pyvista >= 0.24) needs a network
this machine's image builds do not have: the builder keeps it and the image build fails with that reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

PYTEST_RA = "pytest -rA"
"""Upstream's `TEST_PYTEST` as the specifications below see it (it is assigned twice; the second wins)."""
PYTEST_PARSER = "pytest"
PYTEST_OPTIONS_PARSER = "pytest-options"
LOG_PARSERS = (PYTEST_PARSER, PYTEST_OPTIONS_PARSER)
NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")
"""A test patch's files with these endings are no test directive (upstream's list, `csv` without its dot)."""
EXCLUDED_REQUIREMENT_PREFIXES = ("-e .", "#", ".[test")
REPLACED_REQUIREMENTS = (("types-pkg_resources", "types-setuptools"),)
"""Packages yanked from PyPI and what upstream installs instead (`REPLACE_REQ_PACKAGES`)."""


@dataclass(frozen=True)
class InstallSpec:
    """One repository version's environment and commands."""

    python: str
    install: str
    test_cmd: str = PYTEST_RA
    requirements_paths: tuple[str, ...] = ()
    """`"packages": "requirements.txt"`: the first of these files found at `environment_setup_commit`."""
    packages: tuple[str, ...] = ()
    """Conda packages the specification names (installed with pip here)."""
    pip_packages: tuple[str, ...] = ()
    pre_install: tuple[str, ...] = ()
    log_parser: str = PYTEST_PARSER
    source: str = ""
    """The upstream specification this entry follows."""


def _versions(spec: InstallSpec, versions: str) -> dict[str, InstallSpec]:
    return {version: spec for version in versions.split()}


_SQLFLUFF = InstallSpec("3.9", "python -m pip install -e .", requirements_paths=("requirements_dev.txt",),
                        source="SPECS_SQLFLUFF")
_MARSHMALLOW = InstallSpec("3.9", "python -m pip install -e '.[dev]'", source="SPECS_MARSHMALLOW")
_PVLIB = InstallSpec("3.9", "python -m pip install -e .[all]", packages=("pandas", "scipy"),
                     pip_packages=("jupyter", "ipython", "matplotlib", "pytest", "flake8"), source="SPECS_PVLIB")
_ASTROID = InstallSpec("3.9", "python -m pip install -e .", pip_packages=("pytest",), source="SPECS_ASTROID")
_PYVISTA_OLD = InstallSpec("3.9", "python -m pip install -e .", pip_packages=("pytest",), source="SPECS_PYVISTA")
_PYVISTA = replace(_PYVISTA_OLD, requirements_paths=("requirements_test.txt", "requirements.txt"),
                   pre_install=("apt-get update && apt-get install -y ffmpeg libsm6 libxext6 libxrender1",))
_PYDICOM = InstallSpec("3.6", "python -m pip install -e .", packages=("numpy",), pip_packages=("pytest",),
                       log_parser=PYTEST_OPTIONS_PARSER, source="SPECS_PYDICOM")

SPECS: dict[str, dict[str, InstallSpec]] = {
    "sqlfluff/sqlfluff": _versions(_SQLFLUFF, "0.4 0.5 0.6 0.8 0.9 0.10 0.11 0.12 0.13 1.0 1.1 1.2 1.3 1.4 "
                                              "2.0 2.1 2.2"),
    "marshmallow-code/marshmallow": _versions(_MARSHMALLOW, "2.18 2.19 2.20 3.0 3.1 3.2 3.4 3.8 3.9 3.10 3.11 "
                                                            "3.12 3.13 3.15 3.16 3.19"),
    "pvlib/pvlib-python": _versions(_PVLIB, "0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9"),
    "pylint-dev/astroid": _versions(_ASTROID, "2.5 2.6 2.7 2.8 2.9 2.10 2.12 2.13 2.14 2.15 2.16 3.0"),
    "pyvista/pyvista": {**_versions(_PYVISTA_OLD, "0.20 0.21 0.22 0.23"),
                        **_versions(_PYVISTA, " ".join(f"0.{n}" for n in range(24, 44)))},
    "pydicom/pydicom": {**_versions(_PYDICOM, "1.0 1.1 1.2 1.3"),
                        **_versions(replace(_PYDICOM, python="3.8"), "1.4 2.0"),
                        **_versions(replace(_PYDICOM, python="3.9"), "2.1 2.2"),
                        **_versions(replace(_PYDICOM, python="3.10"), "2.3"),
                        **_versions(replace(_PYDICOM, python="3.11"), "2.4 3.0")},
}
UPSTREAM = "SWE-bench/SWE-bench@25c5235 swebench/harness/constants/python.py"


@dataclass
class SpecTable:
    """The install specifications a build uses: gyre's table, with a user's additions over it."""

    specs: dict[str, dict[str, InstallSpec]] = field(default_factory=lambda: {k: dict(v) for k, v in SPECS.items()})

    def find(self, repo: str, version: str) -> InstallSpec | None:
        return self.specs.get(repo, {}).get(version)

    def why_missing(self, repo: str, version: str) -> str:
        if repo not in self.specs:
            return (f"no install specification for repository {repo!r} (gyre's table follows {UPSTREAM} for "
                    f"{', '.join(sorted(self.specs))}; add it with --specs)")
        return (f"no install specification for {repo} version {version!r} (known: "
                f"{', '.join(sorted(self.specs[repo], key=_version_key))}; add it with --specs)")


def load_extra_specs(path: Path, table: SpecTable | None = None) -> SpecTable:
    """`table` (gyre's by default) with the specifications of the JSON file `path` over it:
    `{"owner/name": {"version": {"python": "3.11", "install": "...", "test_cmd": "...", "requirements_paths": [],
    "packages": [], "pip_packages": [], "pre_install": [], "log_parser": "pytest"}}}`; ValueError naming the
    entry that is wrong."""
    table = table or SpecTable()
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a JSON object of repository -> version -> specification")
    known = set(InstallSpec.__dataclass_fields__)
    for repo, versions in data.items():
        if not isinstance(versions, dict):
            raise ValueError(f"{path}: {repo}: must be an object of version -> specification")
        for version, raw in versions.items():
            where = f"{path}: {repo} {version}"
            if not isinstance(raw, dict) or not isinstance(raw.get("python"), str) or \
                    not isinstance(raw.get("install"), str):
                raise ValueError(f"{where}: needs string fields python and install")
            unknown = set(raw) - known
            if unknown:
                raise ValueError(f"{where}: unknown fields {', '.join(sorted(unknown))}")
            if raw.get("log_parser", PYTEST_PARSER) not in LOG_PARSERS:
                raise ValueError(f"{where}: log_parser must be one of {', '.join(LOG_PARSERS)}")
            values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
            table.specs.setdefault(repo, {})[version] = InstallSpec(**{"source": str(path), **values})
    return table


def test_directives(test_patch: str) -> list[str]:
    """The files `pytest` is given: every `b/` path of the test patch's `diff --git` headers, less data files
    (upstream's `get_test_directives`)."""
    found = re.findall(r"^diff --git a/.* b/(.*)$", test_patch, re.MULTILINE)
    return [path for path in found if not any(path.endswith(ext) for ext in NON_TEST_EXTS)]


def test_command(spec: InstallSpec, test_patch: str) -> str:
    return " ".join([spec.test_cmd, *test_directives(test_patch)])


def requirements_at(spec: InstallSpec, show: Callable[[str], str | None]) -> list[str] | None:
    """The requirement lines the environment installs for `spec`, read by `show(path)` (a file's text at the
    environment commit, None when absent): the first of `requirements_paths` found, its `-r` files (relative to
    its directory) first, lines for the project itself and comments left out, yanked packages replaced; or the
    specification's `packages`. None: it names requirement files and none exists."""
    if not spec.requirements_paths:
        return list(spec.packages)
    for path in spec.requirements_paths:
        text = show(path)
        if text is not None:
            break
    else:
        return None
    here = PurePosixPath(path).parent
    own, included = [], []
    for line in text.split("\n"):
        if line.strip().startswith("-r"):
            extra = show(str(here / line.strip()[2:].strip()))
            included += [x for x in (extra or "").split("\n") if not _excluded(x)]
        elif not _excluded(line):
            own.append(line)
    return [_replace_yanked(line) for line in [*included, *own] if line.strip()]


def _excluded(line: str) -> bool:
    return any(line.strip().startswith(prefix) for prefix in EXCLUDED_REQUIREMENT_PREFIXES)


def _replace_yanked(line: str) -> str:
    for old, new in REPLACED_REQUIREMENTS:
        if re.match(rf"^{re.escape(old)}([<>=!~]=?.*|$)", line):
            return new
    return line


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in version.split("."))
