"""The `probe` task family: the answer is what a script in the workspace prints, so one turn cannot solve it.

Why it exists: every `tiny` template is answered in one turn from the instruction alone, so RL on it can
teach an output format but never acting on feedback, which is what an agent framework is for. Here each
query ships a probe script in its starting files (`start/<script>`) that computes a value (a number, a
factor, a word) and prints it; the instruction names the script and says what to do with the value, never
the value itself; it ends with the exact ```bash block of the first reply. The agent has to run the script
(through the `text` harness), read its output in the next observation, then write `solution.py` with the value
in it: two turns at least.

What keeps a single turn from solving it:
- the value is computed, not written, in the script (`(a * b + c) % m`, a reversed string), so it cannot be
  copied from the source by reading it in the instruction (there is none) or guessed (thousands of numbers,
  dozens of factors, a pool of words);
- one hidden test checks that the solution holds the answer itself: its source names neither the script
  nor a way to run one (`subprocess`, `os.system`, `os.popen`, `exec`, `open(`), so a one-turn solution
  that calls the probe at import time passes the value tests but not that one, and pass@1 counts a task
  solved only when every hidden test passes.

Tests check exact types first, as `tiny`'s do (`tiny_tasks._exact`). Query i depends only on (seed, i).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from gyre.benchmarks.tiny_tasks import _FUNCTIONS, TinyTask, _cases, _exact, _returns, _test

_SCRIPTS = ("probe.py", "lookup.py", "oracle.py", "inspect_env.py", "reveal.py", "query_value.py",
            "show_setting.py", "read_config.py")
_CONSTANTS = ("ANSWER", "LIMIT", "PORT", "RETRIES", "BATCH_SIZE", "TIMEOUT", "SEED", "CAPACITY")
_WORDS = ("river", "stone", "maple", "falcon", "copper", "lantern", "meadow", "harbor", "velvet", "thunder",
          "pepper", "glacier", "orbit", "saddle", "cinder", "willow", "marble", "canyon", "quartz", "ember",
          "violet", "anchor", "summit", "breeze", "cobalt", "juniper", "pebble", "tundra", "walnut", "zephyr")
FORBIDDEN = ("subprocess", "os.system", "os.popen", "exec(", "open(")
"""What a solution's source may not hold: the ways to fetch the answer at test time instead of writing it."""


def _arith(rng: random.Random, lo: int, hi: int) -> tuple[str, int]:
    """A Python expression computing a value in [lo, hi] that its text does not show, and the value."""
    a, b, c = rng.randint(101, 997), rng.randint(101, 997), rng.randint(0, 10_000)
    span = hi - lo + 1
    return f"({a} * {b} + {c}) % {span} + {lo}", (a * b + c) % span + lo


def _written_not_fetched(module: str, script: str) -> str:
    stem = script.removesuffix(".py")
    banned = (stem, *FORBIDDEN)
    return _test("answer_is_written_not_fetched",
                 "import pathlib",
                 f"text = (pathlib.Path(__file__).resolve().parents[1] / '{module}.py').read_text()",
                 f"assert not any(word in text for word in {banned!r})")


def _instruction(script: str, prints: str, then: str, module: str) -> str:
    return (f"The repository has a script `{script}`. Run `python {script}` to see {prints}; it is not written "
            f"anywhere else. Then create `{module}.py` in the repository root {then}. Write the value itself "
            f"into `{module}.py`: do not run or import `{script}` from it.\n\nYour first reply runs the script, "
            f"exactly this:\n```bash\npython {script}\n```")


def _probe_constant(rng: random.Random, module: str) -> TinyTask:
    script, name = rng.choice(_SCRIPTS), rng.choice(_CONSTANTS)
    expr, value = _arith(rng, 1000, 9999)
    pool = [_test("value", f"assert {_exact(f'{module}.{name}', value)}"),
            _test("is_int", f"assert type({module}.{name}) is int")]
    return TinyTask(
        kind="probe_constant", module=module,
        instruction=_instruction(script, f"the value of `{name}`", f"that defines the integer constant `{name}` "
                                 "with that value", module),
        reference=f"{name} = {value}\n", test_header=f"import {module}\n",
        tests=(*pool, _written_not_fetched(module, script)),
        start_files=((script, f"print('{name} =', {expr})\n"),))


def _probe_scale(rng: random.Random, module: str) -> TinyTask:
    script, fn = rng.choice(_SCRIPTS), rng.choice(_FUNCTIONS)
    expr, factor = _arith(rng, 13, 97)
    xs = [rng.randint(-30, 30) for _ in range(3)] + [0]
    pool = [_returns(f"{fn}_{i}", f"{fn}({x})", x * factor) for i, x in enumerate(xs)]
    return TinyTask(
        kind="probe_scale", module=module,
        instruction=_instruction(script, "a factor", f"with a function `{fn}(x)` that returns x multiplied by "
                                 "that factor", module),
        reference=f"def {fn}(x):\n    return x * {factor}\n", test_header=f"from {module} import {fn}\n",
        tests=(*_cases(rng, pool), _written_not_fetched(module, script)),
        start_files=((script, f"print('factor:', {expr})\n"),))


def _probe_word(rng: random.Random, module: str) -> TinyTask:
    script, fn, word = rng.choice(_SCRIPTS), rng.choice(_FUNCTIONS), rng.choice(_WORDS)
    return TinyTask(
        kind="probe_word", module=module,
        instruction=_instruction(script, "a word", f"with a function `{fn}()` that returns that word as a "
                                 "string", module),
        reference=f"def {fn}():\n    return {word!r}\n", test_header=f"from {module} import {fn}\n",
        tests=(_returns(f"{fn}_word", f"{fn}()", word), _written_not_fetched(module, script)),
        start_files=((script, f"print('word:', {word[::-1]!r}[::-1])\n"),))


def _probe_greet(rng: random.Random, module: str) -> TinyTask:
    script, fn = rng.choice(_SCRIPTS), rng.choice(_FUNCTIONS)
    greeting = rng.choice(_WORDS).capitalize()
    names = rng.sample(("Ada", "Linus", "Grace", "Alan", "Edsger", "Barbara"), 3)
    pool = [_returns(f"{fn}_{n.lower()}", f"{fn}({n!r})", f"{greeting}, {n}!") for n in names]
    return TinyTask(
        kind="probe_greet", module=module,
        instruction=_instruction(script, "a greeting word", f"with a function `{fn}(name)` that returns "
                                 "exactly '<greeting>, <name>!' with that greeting word", module),
        reference=f"def {fn}(name):\n    return f{f'{greeting}, {{name}}!'!r}\n",
        test_header=f"from {module} import {fn}\n",
        tests=(*_cases(rng, pool), _written_not_fetched(module, script)),
        start_files=((script, f"print('greeting:', {greeting[::-1]!r}[::-1])\n"),))


TEMPLATES: tuple[Callable[[random.Random, str], TinyTask], ...] = (
    _probe_constant, _probe_scale, _probe_word, _probe_greet)


def probe_task(seed: int, index: int, module: str | None = None) -> TinyTask:
    """Query `index` of the probe family generated with `seed` (independent of the set's size); its module
    is `module`, default `solution`."""
    rng = random.Random(f"gyre-probe:{seed}:{index}")
    return TEMPLATES[(seed + index) % len(TEMPLATES)](rng, module or "solution")
