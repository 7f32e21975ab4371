"""The tiny set's query templates: what one generated query asks for and how it is tested.

`tiny.py` writes the set to disk in NL2RepoBench's layout; this is what each query is. A
template turns a seeded RNG and a module name into a `TinyTask`: the instruction, a correct
reference module, and 2-5 independent hidden pytest tests, each checking the exact type before
the value (`_exact`; why, in `tiny.py`'s docstring). Query i depends only on (seed, i).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

_MODULES = ("calc", "mathkit", "helpers", "funcs", "toolbox", "basics", "snippets", "little")
_NAMES = ("Ada", "Linus", "Grace", "Alan", "Edsger", "Barbara", "Ken", "Margaret")
# One name pool for every function template (format 3): a held-out (template, name) pair has a
# name trained on in other templates, so it is solved by copying the name from the instruction,
# not by recall (format 2's 3-4 names per template were learnt by heart; docs/learning.md).
# Never `result`: the hidden tests bind `result = fn(...)`.
_FUNCTIONS = ("compute", "solve", "apply", "handle", "process", "evaluate", "transform", "calc",
              "answer", "work", "outcome", "get_value", "make_value", "convert", "run", "do_task",
              "helper", "op", "logic", "step", "check", "action", "main_fn", "task")
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
    start_files: tuple[tuple[str, str], ...] = ()
    """(path, content) of files the workspace starts with (`start/`): the `probe` family's script."""

    def test_source(self) -> str:
        return self.test_header + "\n\n" + "\n\n".join(self.tests)


def _cases(rng: random.Random, pool: list[str]) -> tuple[str, ...]:
    """2-5 distinct test functions chosen from `pool`, in pool order."""
    k = rng.randint(2, min(5, len(pool)))
    return tuple(pool[i] for i in sorted(rng.sample(range(len(pool)), k)))


def _test(name: str, *lines: str) -> str:
    body = "".join(f"    {line}\n" for line in lines)
    return f"def test_{name}():\n{body}"


def _exact(expr: str, value: bool | int | float | str) -> str:
    """An assertion that `expr` is `value`: exact type first, so no overridden operator ever runs."""
    if isinstance(value, bool):
        return f"{expr} is {value}"
    if isinstance(value, float):
        return f"type({expr}) is float and abs({expr} - {value!r}) < 1e-9"
    return f"type({expr}) is {type(value).__name__} and {expr} == {value!r}"


def _returns(name: str, call: str, value: bool | int | float | str) -> str:
    """A test that `call` returns exactly `value`."""
    return _test(name, f"result = {call}", f"assert {_exact('result', value)}")


def _add(rng: random.Random, module: str) -> TinyTask:
    fn = rng.choice(_FUNCTIONS)
    pairs = [(rng.randint(-50, 50), rng.randint(-50, 50)) for _ in range(4)]
    pool = [_returns(f"{fn}_{i}", f"{fn}({a}, {b})", a + b) for i, (a, b) in enumerate(pairs)]
    pool.append(_returns(f"{fn}_floats", f"{fn}(0.5, 0.25)", 0.75))
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
    fn = rng.choice(_FUNCTIONS)
    word = rng.choice(("Hello", "Hi", "Welcome", "Greetings", "Good day"))
    mark = rng.choice(("!", ".", "?"))
    pool = [_returns(f"{fn}_{name.lower()}", f"{fn}({name!r})", f"{word}, {name}{mark}") for name in _NAMES[:5]]
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
        _test("value", f"assert {_exact(f'{module}.{name}', value)}"),
        _test("is_int", f"assert type({module}.{name}) is int"),
        _test("positive", f"assert type({module}.{name}) is int and {module}.{name} > 0"),
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
    fn = rng.choice(_FUNCTIONS)
    sentences = [" ".join(rng.sample(_WORDS, n)) for n in (2, 3, 4)]
    pool = [_returns(f"{fn}_{i}", f"{fn}({s!r})", " ".join(reversed(s.split()))) for i, s in enumerate(sentences)]
    pool.append(_returns(f"{fn}_single", f"{fn}('word')", "word"))
    pool.append(_returns(f"{fn}_extra_spaces", f"{fn}('  a   b  ')", "b a"))
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
    fn = rng.choice(_FUNCTIONS)
    numbers = [0, k * rng.randint(1, 20), k * rng.randint(1, 20) + 1, -k * rng.randint(1, 5), k * 7 - 1]
    pool = [_returns(f"{fn}_{i}", f"{fn}({n})", n % k == 0) for i, n in enumerate(numbers)]
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
    fn = rng.choice(_FUNCTIONS)
    lo = rng.randint(-20, 0)
    hi = rng.randint(1, 20)
    pool = [
        _returns(f"{fn}_inside", f"{fn}({(lo + hi) // 2}, {lo}, {hi})", (lo + hi) // 2),
        _returns(f"{fn}_below", f"{fn}({lo - 5}, {lo}, {hi})", lo),
        _returns(f"{fn}_above", f"{fn}({hi + 5}, {lo}, {hi})", hi),
        _returns(f"{fn}_at_low", f"{fn}({lo}, {lo}, {hi})", lo),
        _returns(f"{fn}_at_high", f"{fn}({hi}, {lo}, {hi})", hi),
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
    fn = rng.choice(_FUNCTIONS)
    factor = rng.randint(2, 12)
    xs = [rng.randint(-30, 30) for _ in range(4)]
    pool = [_returns(f"{fn}_{i}", f"{fn}({x})", x * factor) for i, x in enumerate(xs)]
    pool.append(_returns(f"{fn}_zero", f"{fn}(0)", 0))
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


def tiny_task(seed: int, index: int, module: str | None = None) -> TinyTask:
    """Query `index` of the set generated with `seed`; independent of the set's size. `module`: every
    query's module has this name (e.g. `solution`) instead of one drawn per query; nothing else changes."""
    rng = random.Random(f"gyre-tiny:{seed}:{index}")
    template = TEMPLATES[(seed + index) % len(TEMPLATES)]
    drawn = rng.choice(_MODULES)  # drawn either way: the rest of the query is the same with or without `module`
    return template(rng, module or drawn)
