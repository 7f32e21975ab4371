"""How often honest code that crashes half-way keeps what passed, with and without the canary reruns.

The workspace of `tests/test_attack_evaluator.py::test_a_real_solution_with_a_partial_crash_keeps_what_passed`
(`add(1, 2)` calls `os._exit(1)`; 2 of its 4 hidden tests run before that one) evaluated N times, with
`Observer.run_through` allowed R reruns: prints how many evaluations scored each number of passed tests.
Upstream's run reaches 2 of 4. Usage: .venv/bin/python scripts/crash_reruns.py [N] [R]
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gyre.evaluators.observed as observed  # noqa: E402
from gyre.evaluators.formats.nl2repo import evaluate  # noqa: E402
from tests.test_evaluator_nl2repo import _calc_query, _workspace  # noqa: E402

CRASH = "def add(a, b):\n    if (a, b) == (1, 2):\n        import os; os._exit(1)\n    return a + b\n"


def main(count: int, reruns: int) -> None:
    observed.RERUNS_AFTER_A_CANARY_DIED = reruns
    passed: Counter[int] = Counter()
    for _ in range(count):
        with tempfile.TemporaryDirectory() as tmp:
            query = _calc_query(Path(tmp))
            score = evaluate(query, _workspace(Path(tmp), query, {"calc.py": CRASH}), Path(tmp) / "eval", "crash",
                             timeout_s=20)
            passed[score.tests_passed] += 1
    print(f"{count} evaluations, {reruns} reruns at most: " +
          ", ".join(f"{n}/4 passed in {passed[n]}" for n in sorted(passed, reverse=True)))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40, int(sys.argv[2]) if len(sys.argv) > 2 else 3)
