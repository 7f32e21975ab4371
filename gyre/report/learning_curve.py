"""Did the policy get better? The held-out pass rate early in a run against late in it.

A run evaluates before every N-th step and after the last one (`evals` table). One eval
round is noisy (a few queries, a few samples each), so the headline compares means over
quarters of the run: the rounds that evaluated a policy from the first quarter of the
steps (step < total / 4) against those from the last quarter (step >= 3 * total / 4, the
final round after the last step included). The CLI prints it at the end of `gyre run`; a
reader can recompute it from DuckDB with the query in `read_eval_rounds`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb


@dataclass(frozen=True)
class QuarterGain:
    first_steps: tuple[int, ...]
    first_mean: float | None
    last_steps: tuple[int, ...]
    last_mean: float | None

    @property
    def gain_points(self) -> float | None:
        """Last-quarter mean minus first-quarter mean, in points (0-100)."""
        if self.first_mean is None or self.last_mean is None:
            return None
        return 100.0 * (self.last_mean - self.first_mean)

    def describe(self) -> str:
        def side(steps, mean):
            return "n/a" if mean is None else f"{mean:.3f} (rounds at steps {', '.join(map(str, steps))})"

        gain = self.gain_points
        tail = "" if gain is None else f": {gain:+.1f} points"
        return f"first quarter {side(self.first_steps, self.first_mean)} -> last quarter {side(self.last_steps, self.last_mean)}{tail}"


def quarter_gain(rounds: list[tuple[int, float | None]], total_steps: int) -> QuarterGain:
    """`rounds`: (step evaluated before, pass rate) per eval round; None rates are skipped."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    valid = [(step, rate) for step, rate in rounds if rate is not None]
    first = [(s, r) for s, r in valid if s < total_steps / 4]
    last = [(s, r) for s, r in valid if s >= 3 * total_steps / 4]

    def mean(side):
        return sum(r for _, r in side) / len(side) if side else None

    return QuarterGain(tuple(s for s, _ in first), mean(first), tuple(s for s, _ in last), mean(last))


def read_eval_rounds(db_path: Path) -> list[tuple[int, float | None]]:
    """Every eval round of a run file, oldest first (a resumed run keeps the newest per step, also when
    its pass rate is NULL: every evaluation failed)."""
    with duckdb.connect(str(db_path), read_only=True) as con:
        return con.execute(
            "select step, arg_max_null(pass_rate, finished_at) from evals "
            "where coalesce(split, 'in_distribution') = 'in_distribution' group by step order by step"
        ).fetchall()
