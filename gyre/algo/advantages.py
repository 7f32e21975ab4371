"""Group-relative advantages over one query's executions.

A group is the executions of one query in a step (16 by default). Executions whose
evaluation failed carry score None: they are dropped before the mean and standard
deviation are taken and get no advantage at all (an infra failure is not a zero). A group
whose remaining scores have zero variance, or fewer than two of them, contributes no
gradient: every advantage is 0.

    A_i = (r_i - mean(r)) / (std(r) + eps)     (population std; or without the division)

With `baseline="none"` (REINFORCE without a baseline) the advantage is the score itself,
A_i = r_i: nothing is pushed down, every partly solved sample up in proportion to its score,
whatever its group's spread. The group mean makes a group's advantages sum to zero, so on the
tokens its samples share (a format, a `def` line) the solved samples' push and the failed ones'
cancel (docs/learning.md, "After the bench").
"""

from __future__ import annotations

import math


BASELINES = ("group_mean", "none")


def group_advantages(
    scores: dict[str, float | None], *, normalize_std: bool = True, eps: float = 1e-6, baseline: str = "group_mean"
) -> dict[str, float]:
    """Map execution id -> advantage, for the executions with a valid score only."""
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {', '.join(BASELINES)}, got {baseline!r}")
    valid = {eid: s for eid, s in scores.items() if s is not None}
    for eid, s in valid.items():
        if not math.isfinite(s):
            raise ValueError(f"execution {eid}: score {s} is not finite")
    if baseline == "none":
        return dict(valid)
    if len(valid) < 2:
        return {eid: 0.0 for eid in valid}
    mean = sum(valid.values()) / len(valid)
    var = sum((s - mean) ** 2 for s in valid.values()) / len(valid)
    if var <= 0.0:
        return {eid: 0.0 for eid in valid}
    scale = math.sqrt(var) + eps if normalize_std else 1.0
    return {eid: (s - mean) / scale for eid, s in valid.items()}
