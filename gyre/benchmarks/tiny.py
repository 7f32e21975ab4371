"""Generate `tiny`: a bundled set of small repository-generation queries.

A laptop-sized model cannot write a whole NL2RepoBench repository, yet the RL loop needs
queries that it can sometimes solve and sometimes not, scored exactly the way the real
benchmark is scored. `tiny` is that set: each query asks for one small Python module
(`calc.py` with `add(a, b)`, a greeting with an exact string, a constant, ...) and hides
2-5 independent pytest tests, so partial credit is possible. The files use NL2RepoBench's
layout exactly (see `gyre.benchmarks.nl2repo`), so `load_nl2repo(out, "tiny")` loads them
through the same code path as the real benchmark.

One addition NL2RepoBench does not have: `<project>/reference/<module>.py`, a correct
solution. The loader ignores it and sandboxes never copy it; tests use it as a known-good
answer, and supervised warm-start demonstrations are built from it. Because a query's
`root` holds both `reference/` and `hidden_tests/`, a harness must never expose `root`.

Determinism: the same (seed, num_queries) writes byte-identical files, and query i
depends only on (seed, i), so a larger set extends a smaller one. The set is written to a
temporary sibling directory and renamed into place, so a crash never leaves half a set;
`out/tiny.json` records the parameters, and asking again for the same ones is a no-op.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FORMAT_VERSION = 1
MANIFEST_FILE = "tiny.json"
TEST_COMMAND = "python -m pytest -q -p no:cacheprovider tests"

_MODULES = ("calc", "mathkit", "helpers", "funcs", "toolbox", "basics", "snippets", "little")
_NAMES = ("Ada", "Linus", "Grace", "Alan", "Edsger", "Barbara", "Ken", "Margaret")
_WORDS = ("red", "green", "blue", "fast", "slow", "cat", "dog", "sun", "moon", "tree", "river", "stone")


@dataclass(frozen=True)
class TinyTask:
    """One generated query before it is written to disk."""

    kind: str
    module: str
    instruction: str
    reference: str
    test_header: str
    tests: tuple[str, ...]

    def test_source(self) -> str:
        return self.test_header + "\n\n" + "\n\n".join(self.tests)


def _cases(rng: random.Random, pool: list[str]) -> tuple[str, ...]:
    """2-5 distinct test functions chosen from `pool`, in pool order."""
    k = rng.randint(2, min(5, len(pool)))
    return tuple(pool[i] for i in sorted(rng.sample(range(len(pool)), k)))


def _test(name: str, assertion: str) -> str:
    return f"def test_{name}():\n    assert {assertion}\n"


def _add(rng: random.Random, module: str) -> TinyTask:
    fn = rng.choice(("add", "plus", "add_numbers", "sum_two"))
    pairs = [(rng.randint(-50, 50), rng.randint(-50, 50)) for _ in range(4)]
    pool = [_test(f"{fn}_{i}", f"{fn}({a}, {b}) == {a + b}") for i, (a, b) in enumerate(pairs)]
    pool.append(_test(f"{fn}_floats", f"abs({fn}(0.5, 0.25) - 0.75) < 1e-9"))
    return TinyTask(
        kind="add",
        module=module,
        instruction=f"Create `{module}.py` in the repository root with a function `{fn}(a, b)` "
        f"that returns the sum a + b of two numbers.",
        reference=f"def {fn}(a, b):\n    return a + b\n",
        test_header=f"from {module} import {fn}\n",
        tests=_cases(rng, pool),
    )


def _greet(rng: random.Random, module: str) -> TinyTask:
    fn = rng.choice(("greet", "hello", "welcome", "salute"))
    word = rng.choice(("Hello", "Hi", "Welcome", "Greetings", "Good day"))
    mark = rng.choice(("!", ".", "?"))
    pool = [_test(f"{fn}_{name.lower()}", f"{fn}({name!r}) == {f'{word}, {name}{mark}'!r}") for name in _NAMES[:5]]
    return TinyTask(
        kind="greet",
        module=module,
        instruction=f"Create `{module}.py` in the repository root with a function `{fn}(name)` "
        f"that returns exactly '{word}, <name>{mark}'; for example {fn}('Ada') returns '{word}, Ada{mark}'.",
        reference=f"def {fn}(name):\n    return f{f'{word}, {{name}}{mark}'!r}\n",
        test_header=f"from {module} import {fn}\n",
        tests=_cases(rng, pool),
    )


def _constant(rng: random.Random, module: str) -> TinyTask:
    name = rng.choice(("ANSWER", "MAX_ITEMS", "LIMIT", "PORT", "RETRIES", "BATCH_SIZE"))
    value = rng.randint(2, 9999)
    pool = [
        _test("value", f"{module}.{name} == {value}"),
        _test("is_int", f"type({module}.{name}) is int"),
        _test("positive", f"{module}.{name} > 0"),
    ]
    return TinyTask(
        kind="constant",
        module=module,
        instruction=f"Create `{module}.py` in the repository root that defines the integer constant "
        f"`{name}` with the value {value}.",
        reference=f"{name} = {value}\n",
        test_header=f"import {module}\n",
        tests=_cases(rng, pool),
    )


def _reverse_words(rng: random.Random, module: str) -> TinyTask:
    fn = rng.choice(("reverse_words", "flip_words", "words_backwards"))
    sentences = [" ".join(rng.sample(_WORDS, n)) for n in (2, 3, 4)]
    pool = [
        _test(f"{fn}_{i}", f"{fn}({s!r}) == {' '.join(reversed(s.split()))!r}") for i, s in enumerate(sentences)
    ]
    pool.append(_test(f"{fn}_single", f"{fn}('word') == 'word'"))
    pool.append(_test(f"{fn}_extra_spaces", f"{fn}('  a   b  ') == 'b a'"))
    return TinyTask(
        kind="reverse_words",
        module=module,
        instruction=f"Create `{module}.py` in the repository root with a function `{fn}(s)` that returns "
        f"the whitespace-separated words of s in reverse order, joined by single spaces.",
        reference=f"def {fn}(s):\n    return ' '.join(reversed(s.split()))\n",
        test_header=f"from {module} import {fn}\n",
        tests=_cases(rng, pool),
    )


def _divisible(rng: random.Random, module: str) -> TinyTask:
    k = rng.randint(2, 9)
    fn = "is_even" if k == 2 else f"divisible_by_{k}"
    numbers = [0, k * rng.randint(1, 20), k * rng.randint(1, 20) + 1, -k * rng.randint(1, 5), k * 7 - 1]
    pool = [_test(f"{fn}_{i}", f"{fn}({n}) is {n % k == 0}") for i, n in enumerate(numbers)]
    return TinyTask(
        kind="divisible",
        module=module,
        instruction=f"Create `{module}.py` in the repository root with a function `{fn}(n)` that returns "
        f"True if the integer n is divisible by {k} and False otherwise.",
        reference=f"def {fn}(n):\n    return n % {k} == 0\n",
        test_header=f"from {module} import {fn}\n",
        tests=_cases(rng, pool),
    )


def _clamp(rng: random.Random, module: str) -> TinyTask:
    fn = rng.choice(("clamp", "bound", "limit_to"))
    lo = rng.randint(-20, 0)
    hi = rng.randint(1, 20)
    pool = [
        _test(f"{fn}_inside", f"{fn}({(lo + hi) // 2}, {lo}, {hi}) == {(lo + hi) // 2}"),
        _test(f"{fn}_below", f"{fn}({lo - 5}, {lo}, {hi}) == {lo}"),
        _test(f"{fn}_above", f"{fn}({hi + 5}, {lo}, {hi}) == {hi}"),
        _test(f"{fn}_at_low", f"{fn}({lo}, {lo}, {hi}) == {lo}"),
        _test(f"{fn}_at_high", f"{fn}({hi}, {lo}, {hi}) == {hi}"),
    ]
    return TinyTask(
        kind="clamp",
        module=module,
        instruction=f"Create `{module}.py` in the repository root with a function `{fn}(x, lo, hi)` that "
        f"returns x limited to the range [lo, hi] (lo <= hi): lo if x < lo, hi if x > hi, else x.",
        reference=f"def {fn}(x, lo, hi):\n    return max(lo, min(x, hi))\n",
        test_header=f"from {module} import {fn}\n",
        tests=_cases(rng, pool),
    )


def _scale(rng: random.Random, module: str) -> TinyTask:
    fn = rng.choice(("scale", "multiply", "times"))
    factor = rng.randint(2, 12)
    xs = [rng.randint(-30, 30) for _ in range(4)]
    pool = [_test(f"{fn}_{i}", f"{fn}({x}) == {x * factor}") for i, x in enumerate(xs)]
    pool.append(_test(f"{fn}_zero", f"{fn}(0) == 0"))
    return TinyTask(
        kind="scale",
        module=module,
        instruction=f"Create `{module}.py` in the repository root with a function `{fn}(x)` that returns "
        f"x multiplied by {factor}.",
        reference=f"def {fn}(x):\n    return x * {factor}\n",
        test_header=f"from {module} import {fn}\n",
        tests=_cases(rng, pool),
    )


TEMPLATES: tuple[Callable[[random.Random, str], TinyTask], ...] = (
    _add,
    _greet,
    _constant,
    _reverse_words,
    _divisible,
    _clamp,
    _scale,
)


def tiny_task(seed: int, index: int) -> TinyTask:
    """Query `index` of the set generated with `seed`; independent of the set's size."""
    rng = random.Random(f"gyre-tiny:{seed}:{index}")
    template = TEMPLATES[(seed + index) % len(TEMPLATES)]
    return template(rng, rng.choice(_MODULES))


def tiny_reference(query) -> tuple[str, str]:
    """The reference solution of a generated query: (file name, content)."""
    files = sorted((Path(query.root) / "reference").glob("*.py"))
    if len(files) != 1:
        raise FileNotFoundError(f"{query.root}/reference: expected one reference module, found {len(files)}")
    return files[0].name, files[0].read_text(encoding="utf-8")


def generate_tiny(out: Path, num_queries: int = 64, seed: int = 0) -> Path:
    """Write the tiny set to `out` (NL2RepoBench layout) and return `out`.

    If `out` already holds the set for the same (seed, num_queries) it is returned
    unchanged; if it holds anything else, FileExistsError.
    """
    if num_queries < 1:
        raise ValueError(f"num_queries must be >= 1, got {num_queries}")
    out = Path(out)
    manifest = {"format_version": FORMAT_VERSION, "generator": __name__, "num_queries": num_queries, "seed": seed}
    if out.exists():
        _check_existing(out, manifest)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        for index in range(num_queries):
            task = tiny_task(seed, index)
            _write_query(tmp / f"q{index:04d}-{task.kind}", task)
        _write(tmp / "README.md", _readme(num_queries, seed))
        _write(tmp / MANIFEST_FILE, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        try:
            os.rename(tmp, out)
        except OSError:
            if not out.exists():
                raise
            _check_existing(out, manifest)  # another process won the race with the same set
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def _write_query(project: Path, task: TinyTask) -> None:
    test_file = f"tests/test_{task.module}.py"
    _write(project / "start.md", task.instruction + "\n")
    _write(project / "test_case_count.txt", f"{len(task.tests)}\n")
    _write(project / "test_commands.json", json.dumps([TEST_COMMAND], indent=2) + "\n")
    _write(project / "test_files.json", json.dumps([test_file], indent=2) + "\n")
    _write(project / "hidden_tests" / test_file, task.test_source())
    _write(project / "reference" / f"{task.module}.py", task.reference)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def _check_existing(out: Path, manifest: dict) -> None:
    manifest_path = out / MANIFEST_FILE
    try:
        found = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        found = None
    if found != manifest:
        raise FileExistsError(
            f"{out} exists but is not the tiny set with seed={manifest['seed']}, "
            f"num_queries={manifest['num_queries']} ({manifest_path} holds {found!r}); "
            f"remove it or choose another directory"
        )


def _readme(num_queries: int, seed: int) -> str:
    return f"""# tiny: {num_queries} small repository-generation queries (seed {seed})

Generated by `gyre.benchmarks.tiny.generate_tiny`; do not edit by hand, regenerate instead.
Each query asks for one small Python module and is scored by 2-5 independent hidden pytest
tests, so partial credit is possible (score = passed / test_case_count).

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
