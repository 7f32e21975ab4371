"""Generate `tiny`: a bundled set of small repository-generation queries.

A laptop-sized model cannot write a whole NL2RepoBench repository, yet the RL loop needs
queries that it can sometimes solve and sometimes not, scored exactly the way the real
benchmark is scored. `tiny` is that set: each query asks for one small Python module
(`calc.py` with a function such as `compute(a, b)` that returns a + b, a greeting with an exact
string, a constant, ...; function names come from one pool shared by every template) and hides
2-5 independent pytest tests, so partial credit is possible. The files use NL2RepoBench's
layout exactly (see `gyre.benchmarks.nl2repo`), so `load_nl2repo(out, "tiny")` loads them
through the same code path as the real benchmark. The templates are in `tiny_tasks.py`.

Hidden tests check the type before the value (`_exact`): `r = add(3, 4)` then
`assert type(r) is int and r == 7`; floats `type(r) is float and abs(r - 0.75) < 1e-9`;
booleans `r is True`. A plain `assert add(3, 4) == 7` is satisfied by any object whose
`__eq__` returns True, and an agent trained by RL finds such "always-equal" objects (with
`__abs__`, `__sub__`, `__lt__`, ... overridden to match): against format 1's tests one
scored about 0.8 over a 64-query set without solving anything. `type(r) is T` cannot be
overridden (it also refuses subclasses of T, which can override `__eq__`), and `and`
stops there, so the object's operators never run; once the type is the exact builtin, `==`
is the builtin's own comparison, so a JSON round trip would add nothing. (This guards the
tests' expressions only: a module that patches pytest or builtins when imported is out of
their reach, see `gyre.evaluators.integrity.pytest_guard`.)

One addition NL2RepoBench does not have: `<project>/reference/<module>.py`, a correct
solution. The loader ignores it and sandboxes never copy it; tests use it as a known-good
answer, and supervised warm-start demonstrations are built from it. Because a query's
`root` holds both `reference/` and `hidden_tests/`, a harness must never expose `root`.

Determinism: the same (seed, num_queries) writes byte-identical files, and query i
depends only on (seed, i), so a larger set extends a smaller one. The set is written to a
temporary sibling directory and renamed into place, so a crash never leaves half a set;
`out/tiny.json` records the parameters, and asking again for the same ones is a no-op.
A set written by an older `FORMAT_VERSION` with the same parameters (a cached one, say)
is regenerated in place, the same way, if it holds only what the generator writes;
otherwise, or if it is newer, `generate_tiny` refuses with FileExistsError saying why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from gyre.benchmarks.probe_tasks import probe_task
from gyre.benchmarks.tiny_tasks import TinyTask, tiny_task

# 2: hidden tests check the exact type before the value (1: plain `==`, beaten by always-equal objects).
# 3: function names from one pool shared by every template (2: 3-4 names per template, learnt by heart).
# 4: the probe family's instruction ends with the exact command its first reply runs (a ```bash block).
FORMAT_VERSION = 4
MANIFEST_FILE = "tiny.json"
FAMILIES = {"tiny": tiny_task, "probe": probe_task}
"""Template families: `tiny` (one-turn single-module tasks, `tiny_tasks.py`) and `probe` (the answer is what a
script in the workspace prints: several turns, `probe_tasks.py`)."""
TEST_COMMAND = "python -m pytest -q -p no:cacheprovider tests"



def tiny_reference(query) -> tuple[str, str]:
    """The reference solution of a generated query: (file name, content)."""
    files = sorted((Path(query.root) / "reference").glob("*.py"))
    if len(files) != 1:
        raise FileNotFoundError(f"{query.root}/reference: expected one reference module, found {len(files)}")
    return files[0].name, files[0].read_text(encoding="utf-8")


def generate_tiny(out: Path, num_queries: int = 64, seed: int = 0, module: str | None = None,
                  family: str = "tiny") -> Path:
    """Write the tiny set to `out` (NL2RepoBench layout) and return `out`. `module`: every query asks for
    `<module>.py` (recorded in the manifest; a single-file agent's default file), else a module per query.
    `family`: whose templates (`FAMILIES`; recorded in the manifest unless `tiny`).

    If `out` already holds the set for the same (seed, num_queries) it is returned
    unchanged; if it holds the same set written by an older FORMAT_VERSION, and nothing
    else, it is regenerated; if it holds anything else, FileExistsError.
    """
    if num_queries < 1:
        raise ValueError(f"num_queries must be >= 1, got {num_queries}")
    out = Path(out)
    if module is not None and not re.fullmatch(r"[a-z_][a-z0-9_]*", module):
        raise ValueError(f"module must be a lower-case Python module name, got {module!r}")
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r}; families: {', '.join(FAMILIES)}")
    manifest = {"format_version": FORMAT_VERSION, "generator": __name__, "num_queries": num_queries, "seed": seed,
                **({"module": module} if module else {}), **({"family": family} if family != "tiny" else {})}
    outdated = False
    if out.exists():
        found = _read_manifest(out)
        if found == manifest:
            return out
        _check_outdated(out, found, manifest)  # FileExistsError unless an older format of this very set
        outdated = True
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        for index in range(num_queries):
            task = FAMILIES[family](seed, index, module)
            _write_query(tmp / f"q{index:04d}-{task.kind}", task)
        _write(tmp / "README.md", _readme(num_queries, seed))
        _write(tmp / MANIFEST_FILE, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if outdated:
            _replace(out, tmp, manifest)
        else:
            _install(out, tmp, manifest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def _install(out: Path, tmp: Path, manifest: dict) -> None:
    try:
        os.rename(tmp, out)
    except OSError:
        if not out.exists():
            raise
        _check_existing(out, manifest)  # another process won the race with the same set


def _replace(out: Path, tmp: Path, manifest: dict) -> None:
    """Swap the outdated set at `out` for the fresh one at `tmp` (two renames, then delete the old)."""
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    try:
        if _read_manifest(out) == manifest:
            return  # another process regenerated it meanwhile
        try:
            os.rename(out, aside / "set")
        except FileNotFoundError:
            pass  # another process is swapping it too; one of the installs below wins
        _install(out, tmp, manifest)
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _write_query(project: Path, task: TinyTask) -> None:
    test_file = f"tests/test_{task.module}.py"
    _write(project / "start.md", task.instruction + "\n")
    _write(project / "test_case_count.txt", f"{len(task.tests)}\n")
    _write(project / "test_commands.json", json.dumps([TEST_COMMAND], indent=2) + "\n")
    _write(project / "test_files.json", json.dumps([test_file], indent=2) + "\n")
    _write(project / "hidden_tests" / test_file, task.test_source())
    _write(project / "reference" / f"{task.module}.py", task.reference)
    for path, content in task.start_files:
        _write(project / "start" / path, content)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def _read_manifest(out: Path):
    try:
        return json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _check_existing(out: Path, manifest: dict) -> None:
    found = _read_manifest(out)
    if found != manifest:
        raise FileExistsError(
            f"{out} exists but is not the tiny set with seed={manifest['seed']}, "
            f"num_queries={manifest['num_queries']} ({out / MANIFEST_FILE} holds {found!r}); "
            f"remove it or choose another directory"
        )


_QUERY_DIR = re.compile(r"q\d{4}-[a-z_]+")
_QUERY_ENTRIES = {
    "start.md", "test_case_count.txt", "test_commands.json", "test_files.json", "hidden_tests", "reference", "start",
}


def _check_outdated(out: Path, found, manifest: dict) -> None:
    """Return if `out` holds this set (same seed and size) in an older format and nothing else;
    raise FileExistsError saying why not otherwise."""
    keys = ("generator", "num_queries", "seed")
    same_set = isinstance(found, dict) and all(found.get(k) == manifest[k] for k in keys)
    version = found.get("format_version") if same_set else None
    if not same_set or type(version) is not int or version == FORMAT_VERSION:
        _check_existing(out, manifest)  # raises: not this set, or this set with a manifest of its own
    if version > FORMAT_VERSION:
        raise FileExistsError(
            f"{out} holds the tiny set with seed={manifest['seed']}, num_queries={manifest['num_queries']} "
            f"in format_version {version}, written by a newer gyre (this one writes {FORMAT_VERSION}); "
            f"remove it or choose another directory"
        )
    entries = {p.name: p for p in out.iterdir()}
    queries = [p for name, p in entries.items() if _QUERY_DIR.fullmatch(name) and p.is_dir()]
    foreign = sorted(set(entries) - {MANIFEST_FILE, "README.md"} - {p.name for p in queries})
    foreign += sorted(f"{q.name}/{e.name}" for q in queries for e in q.iterdir() if e.name not in _QUERY_ENTRIES)
    if foreign or len(queries) != manifest["num_queries"]:
        problem = f"files the generator does not write ({', '.join(foreign[:5])})" if foreign else (
            f"{len(queries)} query directories instead of {manifest['num_queries']}")
        raise FileExistsError(
            f"{out} holds the tiny set with seed={manifest['seed']}, num_queries={manifest['num_queries']} "
            f"in the outdated format_version {version} (now {FORMAT_VERSION}), but also {problem}, so it is "
            f"not regenerated in place; remove it to regenerate, or choose another directory"
        )


def _readme(num_queries: int, seed: int) -> str:
    return f"""# tiny: {num_queries} small repository-generation queries (seed {seed})

Generated by `gyre.benchmarks.tiny.generate_tiny`; do not edit by hand, regenerate instead.
Each query asks for one small Python module and is scored by 2-5 independent hidden pytest
tests, so partial credit is possible (score = passed / test_case_count). Each test checks the
result's exact type before its value, so an object whose `==` is always True earns nothing.

Layout per query (NL2RepoBench's, plus one extra directory):

    <query>/start.md              instruction given to the agent
    <query>/test_case_count.txt   number of hidden test functions
    <query>/test_commands.json    commands that run the hidden tests
    <query>/test_files.json       hidden test paths, relative to the repository
    <query>/hidden_tests/         pristine hidden tests (never shown to the agent)
    <query>/reference/            a correct solution (not part of NL2RepoBench; never shown
                                  to the agent; used by tests and warm-start demonstrations)

Load with `gyre.benchmarks.load_benchmark("nl2repo", <this dir>, "tiny")`.
"""
