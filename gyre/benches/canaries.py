"""`gyre bench canaries`: how many canaries each real task gets, the k of "caught with probability 1 - 2^-k".

gyre's canaries are the real tests with one assertion changed (`gyre.evaluators.integrity.mutants`), so how many
an evaluation has depends on the task's own tests: a test qualifies when its last statement is an assertion.
A value mutant (a compared literal changed) catches every way of passing a test without its code (a runner
that reports it unrun, an object equal to everything, a literal read from the test); a negated one (`!=` for
`==`) catches a runner that reports tests unrun, not an always-equal object. A forger that forges k tests carrying
value mutants goes uncaught with probability at most 2^-k (docs/sandbox.md).

This bench plans the mutations exactly as an evaluation does (`paired.plan_pristine`, the same code) over:

- the 33 real NL2RepoBench projects of `gyre bench fidelity` (their hidden tests from the real releases'
  sdists, `fidelity_sources`; fetched from the package index once, then cached);
- any benchmark directory given with `--benchmark DIR` (`--format` as `gyre benchmark` takes it): Terminal-Bench,
  Harbor, R2E-Gym tasks, or more NL2RepoBench ones.

Per task: the tests the pristine files define, how many get a value mutant, a negated one, none, and the value
mutants' independent coins (tests of one file sharing a literal share one); per format the spread of k (those
coins). It runs no test: planning only, so it is fast and needs no sandbox.
"""

from __future__ import annotations

import random
import statistics
import tempfile
from pathlib import Path

from gyre.benches.fidelity_sources import fetch_sdist, load_projects, unpack, write_task
from gyre.benchmarks import load_benchmark, load_benchmark_report, task_spec
from gyre.benchmarks.spec import NL2REPO
from gyre.evaluators.integrity.mutants import FLIP, VALUE
from gyre.evaluators.integrity.pristine import DEFAULT_PYTHON_FILES
from gyre.evaluators.paired import plan_pristine, read_sources

SEED = 0
"""Which test lands in which run does not change the counts; the seed only fixes the plan."""


def task_canaries(query) -> dict:
    """One task's tests and canaries, planned as its evaluation plans them."""
    hidden = Path(query.hidden_tests_dir)
    rels = query.test_files or sorted(p.relative_to(hidden).as_posix() for p in hidden.rglob("*")
                                      if p.is_file() and not p.is_symlink())
    files = plan_pristine(read_sources(hidden, rels), "/tests", random.Random(SEED), DEFAULT_PYTHON_FILES)
    kinds = [m.kind for f in files for m in f.mutations]
    tests = sum(len(f.tests) for f in files)
    # tests of one file sharing a literal share its coin and new value (`plan_mutations`): one canary among them
    coins = {(f.inside, m.text, m.run) for f in files for m in f.mutations if m.kind == VALUE}
    return {"task": query.query_id, "format": task_spec(query).format, "tests": tests,
            "value": kinds.count(VALUE), "coins": len(coins), "flip": kinds.count(FLIP), "none": tests - len(kinds)}


def run(benchmark: Path | None = None, fmt: str = "auto", fidelity: bool = True) -> dict:
    """Per-task counts and a per-format summary (see the module docstring)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="gyre-canaries-") as scratch:
        root = Path(scratch)
        if fidelity:
            for project in load_projects():
                source = unpack(fetch_sdist(project), root / "src" / project.task)
                write_task(project, source, root / "nl2repo")
            rows += [task_canaries(q) for q in load_benchmark(NL2REPO, root / "nl2repo")]
        if benchmark is not None:
            rows += [task_canaries(q) for q in load_benchmark_report(fmt, benchmark)[0]]  # good tasks
    formats = {}
    for name in sorted({r["format"] for r in rows}):
        mine = [r for r in rows if r["format"] == name]
        ks = [r["coins"] for r in mine]  # k: independent value canaries
        tests = sum(r["tests"] for r in mine)
        formats[name] = {"tasks": len(mine), "k_min": min(ks), "k_median": statistics.median(ks), "k_max": max(ks),
                         "tasks_with_k_0": sum(k == 0 for k in ks),
                         "tests": tests,
                         "value_share": round(sum(r["value"] for r in mine) / tests, 3) if tests else 0.0,
                         "flip_share": round(sum(r["flip"] for r in mine) / tests, 3) if tests else 0.0}
    return {"formats": formats, "tasks": rows}
