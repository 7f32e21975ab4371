"""pass@1 and pass@k of an eval round: how often a policy solves a task, and the ceiling RL can sharpen toward.

A round's mean score (`evals.pass_rate`) gives partial credit; pass@k counts a task solved only
when every hidden test passes (score 1.0). From n samples of a task with c solved, pass@k is
the unbiased estimate 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, the Codex paper), averaged over
tasks; pass@1 is the mean of c / n. RL that sharpens a policy raises pass@1 toward pass@k at the
same k; a pass@k near pass@1 leaves it little to find. Executions whose evaluation failed are
left out (they are no zeros: `evals.num_dropped`), so a task's n can be below the round's samples.
Per template too (`gyre.benchmarks.content.kind_of`), which is how a task mix is chosen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from math import comb
from pathlib import Path

import duckdb

from gyre.benchmarks.content import kind_of_id


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of a task with `c` of `n` samples solved (k <= n)."""
    if not 0 <= c <= n or not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 0 < k <= n; got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class RoundPassK:
    """One eval round's pass rates over its tasks (and per template in `kinds`)."""

    step: int
    tasks: int
    samples: int
    """Valid samples in all."""
    k: int
    pass_at_1: float
    pass_at_k: float
    mean_score: float
    zero_tasks: float
    """Share of tasks no sample solved: what no sharpening can reach."""
    kinds: dict[str, dict[str, float | int]]
    per_task: dict[str, list[int]]
    """Query id -> [valid samples n, solved c] of every task: what a bootstrap over tasks and samples redraws."""
    calls_per_execution: float | None = None
    """Mean model calls (the harness's turns) of the round's valid samples."""
    calls_per_solved: float | None = None
    """Mean model calls of its solved samples (None when none solved): whether a policy solves in fewer turns."""

    def as_dict(self) -> dict:
        return asdict(self)


def _summary(per_task: list[tuple[int, int, float]], k: int) -> dict[str, float | int]:
    usable = [(n, c, s) for n, c, s in per_task if n >= k]
    if not usable:
        return {"tasks": 0, "pass_at_1": 0.0, "pass_at_k": 0.0, "mean_score": 0.0, "zero_tasks": 0.0}
    return {"tasks": len(usable),
            "pass_at_1": sum(c / n for n, c, _ in usable) / len(usable),
            "pass_at_k": sum(pass_at_k(n, c, k) for n, c, _ in usable) / len(usable),
            "mean_score": sum(s for _, _, s in usable) / len(usable),
            "zero_tasks": sum(c == 0 for _, c, _ in usable) / len(usable)}


def round_pass_at_k(db: Path, step: int, k: int | None = None) -> RoundPassK:
    """pass@1 and pass@k (k: the fewest valid samples of a task, unless given) of the eval round before `step`.

    Tasks with fewer than k valid samples are left out of pass@k and pass@1 alike."""
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "select query_id, count(*), count(*) filter (where score >= 1.0), avg(score) from executions "
            "where purpose = 'eval' and step = ? and eval_status = 'ok' group by query_id order by query_id",
            [step]).fetchall()
        calls, calls_solved = con.execute(
            "select avg(num_calls), avg(num_calls) filter (where score >= 1.0) from executions "
            "where purpose = 'eval' and step = ? and eval_status = 'ok'", [step]).fetchone()
    if not rows:
        raise ValueError(f"{db}: no scored eval execution before step {step}")
    k = k if k is not None else min(n for _, n, _, _ in rows)
    per_task = {qid: (int(n), int(c), float(s)) for qid, n, c, s in rows}
    overall = _summary(list(per_task.values()), k)
    kinds: dict[str, list[tuple[int, int, float]]] = {}
    for qid, counts in per_task.items():
        kinds.setdefault(kind_of_id(qid) or "-", []).append(counts)
    return RoundPassK(step=step, tasks=int(overall["tasks"]), samples=sum(n for n, _, _ in per_task.values()), k=k,
                      pass_at_1=float(overall["pass_at_1"]), pass_at_k=float(overall["pass_at_k"]),
                      mean_score=float(overall["mean_score"]), zero_tasks=float(overall["zero_tasks"]),
                      kinds={kind: _summary(v, k) for kind, v in sorted(kinds.items())},
                      per_task={qid: [n, c] for qid, (n, c, _) in per_task.items() if n >= k},
                      calls_per_execution=None if calls is None else float(calls),
                      calls_per_solved=None if calls_solved is None else float(calls_solved))
