"""The error bar of a learning bench's gain: over seeds alone, and by a bootstrap over seeds, tasks and samples.

Why it exists: the seed-only standard error (`learning.stats`) counts how far 3-5 seeds' gains spread. Every
seed is read on the same few tasks with a few samples each, so the seeds share the tasks' luck, and with 3
seeds the spread itself is a noisy estimate: one eval round of 40 tasks x 4 samples at p ~ 0.47 varies by
about 0.04 on its own. The bootstrap here resamples all three levels, paired as the bench is paired: each
replicate draws the seeds with replacement (a seed's two rounds stay together), one draw of the tasks with
replacement shared by every round of the replicate (all rounds read the same tasks), and each drawn task's
solved count again from a binomial at its observed rate (the samples). The standard deviation of the
replicates' mean gain is the se reported beside the seed-only one; resampling every level counts the
lower levels' noise more than once, so it errs large (Field & Welsh 2007 on the multilevel bootstrap).

The 2-se rule (docs/learning.md, "The protocol"): a difference counts only when its mean is at least 2 se
from 0, with se the larger of the two, and at least 2 seeds; else the arms are "level".

A round's per-task counts: rounds recorded from this module's time on carry them (`per_task`, query id ->
[n, c], `pass_at_k.round_pass_at_k`). Rounds committed before carry only per-template summaries (tasks,
pass@1, the share of tasks with no solved sample, k = every task's sample count); `task_counts` rebuilds
counts consistent with them: a template's unsolved tasks at 0, its solved samples spread as evenly as they go
over its other tasks (the least task-to-task spread those summaries allow), keyed by (template, rank).
"""

from __future__ import annotations

import numpy as np

BOOTSTRAP_REPLICATES = 2000
BOOTSTRAP_SEED = 0
"""Fixed, so a result file reprints the same se every time."""
RULE_SE = 2.0
"""How many standard errors a difference needs to count."""


def task_counts(rnd: dict) -> dict[str, tuple[int, int]]:
    """Task key -> (samples n, solved c) of an eval round (a `RoundPassK.as_dict()`); ValueError when the round
    carries neither per-task counts nor per-template summaries they can be rebuilt from."""
    if rnd.get("per_task"):
        return {qid: (int(n), int(c)) for qid, (n, c) in rnd["per_task"].items()}
    k, tasks, samples = int(rnd["k"]), int(rnd["tasks"]), int(rnd["samples"])
    if samples != tasks * k:
        raise ValueError(f"round at step {rnd['step']}: no per-task counts, and its tasks do not all have k = {k} "
                         f"samples ({samples} samples over {tasks} tasks), so they cannot be rebuilt")
    counts: dict[str, tuple[int, int]] = {}
    for kind, summary in sorted(rnd["kinds"].items()):
        n_tasks = int(summary["tasks"])
        unsolved = round(summary["zero_tasks"] * n_tasks)
        solved = round(summary["pass_at_1"] * n_tasks * k)
        some = n_tasks - unsolved
        if (some == 0) != (solved == 0) or solved > some * k or solved < some:
            raise ValueError(f"round at step {rnd['step']}, template {kind}: {solved} solved samples cannot sit on "
                             f"{some} tasks of {k} samples")
        per = [solved // some + (i < solved % some) for i in range(some)] if some else []
        for rank, c in enumerate(per + [0] * unsolved):
            counts[f"{kind}#{rank}"] = (k, c)
    return counts


def bootstrap_se(pairs: list[tuple[dict, dict]], replicates: int = BOOTSTRAP_REPLICATES,
                 seed: int = BOOTSTRAP_SEED) -> float | None:
    """The se of mean(pass@1 of a - pass@1 of b) over seeds, each pair (round a, round b) one seed's, by the
    bootstrap over seeds, tasks and samples. None without a pair. ValueError when the rounds read other tasks."""
    if not pairs:
        return None
    tables = [(task_counts(a), task_counts(b)) for a, b in pairs]
    keys = sorted(tables[0][0])
    for a, b in tables:
        if sorted(a) != keys or sorted(b) != keys:
            raise ValueError("the rounds compared read different tasks: a paired bootstrap needs the same ones")
    # arrays (seeds, tasks) of n and c for side a and side b
    n = np.array([[[t[key][0] for key in keys] for t in pair] for pair in tables], dtype=np.int64)
    c = np.array([[[t[key][1] for key in keys] for t in pair] for pair in tables], dtype=np.int64)
    rng = np.random.default_rng(seed)
    n_seeds, n_tasks = len(pairs), len(keys)
    seed_draw = rng.integers(0, n_seeds, size=(replicates, n_seeds))
    task_draw = rng.integers(0, n_tasks, size=(replicates, n_tasks))
    gains = np.zeros(replicates)
    for j in range(n_seeds):
        rows = seed_draw[:, j][:, None]
        side = []
        for s in (0, 1):
            nn, cc = n[rows, s, task_draw], c[rows, s, task_draw]
            side.append((rng.binomial(nn, cc / nn) / nn).mean(axis=1))
        gains += side[0] - side[1]
    gains /= n_seeds
    return float(gains.std(ddof=1))


def judge(s: dict, points: float = 0.0) -> dict:
    """A difference's verdict by the 2-se rule: "above" when its mean is >= 2 se above 0, "below" when <= -2
    se, else "level"; se is the larger of the seed-only and the bootstrap one; `met`: above and the mean at
    least `points`. Fewer than 2 seeds judge nothing ("n/a")."""
    ses = [v for v in (s.get("se"), s.get("se_bootstrap")) if v is not None]
    if s.get("mean") is None or s.get("n", 0) < 2 or not ses:
        return {"verdict": "n/a", "se_rule": None, "met": False}
    se = max(ses)
    mean = s["mean"]
    verdict = "above" if mean >= RULE_SE * se else "below" if mean <= -RULE_SE * se else "level"
    return {"verdict": verdict, "se_rule": se, "met": verdict == "above" and mean >= points}
