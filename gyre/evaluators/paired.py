"""An evaluation's two runs: what each run places, and where its files go.

Every evaluation runs the task's test command(s) twice (`observed`, `gyre.evaluators.integrity.mutants`):
each run on its own variant of the pristine files, in which some real tests carry one changed assertion,
each test counting from the run where it is itself. This module plans the variants (`plan_pristine`: the
pristine files with their mutations, each assigned to a run), writes a run's variant where the task
expects its tests (`write_pristine`), says which runs mutations go to (`pair_runs`: Harbor's reward is one
whole run's), and keeps each run's directories apart at the same paths (`retire`, `run_path`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from gyre.evaluators.integrity.cases import case_counts, data_driven, dynamic_conftest, skip_marked
from gyre.evaluators.integrity.mutants import RUNS, assertion_helpers, base_names, plan_mutations
from gyre.evaluators.integrity.pristine import (
    DEFAULT_PYTHON_FILES, PristineFile, defined_tests, doctest_holders, is_test_module, maybe_tests, pristine_classes,
)
from gyre.evaluators.integrity.pytest_guard import clear_shadows
from gyre.sandboxes.paths import clear_path


def read_sources(root: Path, rels: list[str]) -> dict[str, bytes]:
    return {rel: (Path(root) / rel).read_bytes() for rel in rels}


REACTING_HOOKS = (b"pytest_runtest_makereport", b"pytest_runtest_logreport", b"pytest_report_teststatus")
"""Hooks through which a pristine conftest can make one test's outcome change another's."""


def plan_pristine(sources: Mapping[str, bytes], inside: str, rng: random.Random,
                  python_files: tuple[str, ...] = DEFAULT_PYTHON_FILES, runs: tuple[int, ...] = (0, 1)
                  ) -> list[PristineFile]:
    """`sources` (relative path -> bytes) as `PristineFile`s placed under `inside`, the test modules (those pytest
    collects under `python_files`, the project's setting) with their mutations planned, each assigned to one of
    `runs` (`mutants.plan_mutations`)."""
    capped = not any(PurePosixPath(rel).name == "conftest.py" and dynamic_conftest(data.decode("utf-8", "replace"))
                     for rel, data in sources.items())
    texts = {rel: data.decode("utf-8", "replace") for rel, data in sources.items() if rel.endswith(".py")}
    helpers = {name: places for text in texts.values() for name, places in assertion_helpers(text).items()}
    subclassed = frozenset(name for text in texts.values() for name in base_names(text))
    classes = pristine_classes(list(texts.values()))
    collectors = frozenset(str(PurePosixPath(inside) / rel) for rel, data in sources.items()
                           if PurePosixPath(rel).name == "conftest.py" and b"pytest_collect_file" in data)
    # a pristine conftest that reacts to a test's outcome (pytest's "incremental" recipe xfails a class's later
    # steps after a failure) would carry a mutant's failure into real tests: the modules under it get no mutant
    reacting = [PurePosixPath(rel).parent for rel, data in sources.items()
                if PurePosixPath(rel).name == "conftest.py" and any(hook in data for hook in REACTING_HOOKS)]
    planned: list[PristineFile] = []
    for rel, data in sources.items():
        at = str(PurePosixPath(inside) / rel)
        if PurePosixPath(rel).suffix not in (".py", ".pyc") and any(
                PurePosixPath(at).is_relative_to(PurePosixPath(c).parent) for c in collectors):
            planned.append(PristineFile(at, set(), data=data, collected_by=collectors, rel=rel))
        elif is_test_module(rel, python_files):
            text = data.decode("utf-8", errors="replace")
            mutable = "\ufffd" not in text and not any(PurePosixPath(rel).is_relative_to(d) for d in reacting)
            planned.append(PristineFile(at, defined_tests(text, classes), data=data, rel=rel,
                                        mutations=tuple(plan_mutations(text, rng, runs, helpers, subclassed))
                                        if mutable else (), cases=case_counts(text) if capped else {},
                                        optional=maybe_tests(text, classes), data_driven=data_driven(text),
                                        skip_marked=skip_marked(text), doctests=doctest_holders(text)))
        else:  # a helper or conftest: no tests of its own, but test code (the runtime monitor tells it apart)
            planned.append(PristineFile(at, set(), data=data, rel=rel,
                                        doctests=doctest_holders(texts[rel]) if rel in texts else set()))
    return planned


def write_pristine(dest: Path, files: list[PristineFile], run: int) -> None:
    """Run `run`'s variant of every pristine file under `dest` (see the module docstring)."""
    clear_shadows(dest, [f.rel for f in files])
    for f in files:
        clear_path(dest, f.rel).write_bytes(f.variant(run))


def retire(eval_dir: Path, run: int, names: tuple[str, ...]) -> Path:
    """Move run `run`'s fresh directories (`names` under `eval_dir`) to `eval_dir/runs/<run>/`, returned: the next
    run is prepared at the same paths, so nothing a command can read tells the runs apart."""
    kept = Path(eval_dir) / "runs" / str(run)
    kept.mkdir(parents=True)
    for name in names:
        if (Path(eval_dir) / name).exists() or (Path(eval_dir) / name).is_symlink():
            (Path(eval_dir) / name).rename(kept / name)
    return kept


def run_path(eval_dir: Path, run: int, name: str) -> Path:
    """Where run `run`'s directory `name` lies after every run (`retire` moved all but the last one's)."""
    return Path(eval_dir) / name if run == RUNS - 1 else Path(eval_dir) / "runs" / str(run) / name


def pair_runs(harbor: bool, rng: random.Random) -> tuple[tuple[int, ...], int]:
    """(the runs mutations go to, the run a test mutated in neither counts from). Each test's mutant goes to a run
    of its own coin and the test counts from the other, so both runs hold mutants; but Harbor's score is the reward
    its verifier writes for one whole run: there one run is plain (scored), the other holds every mutant, in an
    order drawn here."""
    if not harbor:
        return tuple(range(RUNS)), 0
    plain = rng.randrange(RUNS)
    return (1 - plain,), plain
