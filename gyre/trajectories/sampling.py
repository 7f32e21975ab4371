"""Jmax sampling: keep at most Jmax trajectories per execution, by rank.

Training every branch of a harness run costs forward-backward time on branches that add
little (the paper: Jmax = 5 matched the uncapped score at 74.8 % of the uncapped
forward-backward time). The rank order is fixed and total, so the same tree always keeps
the same trajectories:

  1. not retried before retried: a trajectory whose last call's prompt was re-sent later
     (the harness retried it) is a failed attempt whose whole prefix is shared with the
     attempt that replaced it; it sorts after every trajectory that was not retried. This
     refines the paper's order, which does not say where retries go.
  2. kind: main > main-summary > sub-agent > sub-agent-summary.
  3. more trainable tokens on the path first (more learning signal per token computed).
  4. earlier last call first (call order in the execution: start time, then record order).

`jmax=None` keeps every trajectory ("uncapped").
"""

from __future__ import annotations

from gyre.trajectories.classify import KIND_RANK
from gyre.trajectories.tree import Trajectory


def rank_key(traj: Trajectory) -> tuple[bool, int, int, int]:
    return (traj.retried, KIND_RANK[traj.kind], -traj.num_trainable, traj.leaf_call)


def sample(trajectories: list[Trajectory], jmax: int | None) -> list[Trajectory]:
    """The kept trajectories in rank order (classified first: every `kind` must be set)."""
    if jmax is not None and jmax < 1:
        raise ValueError(f"jmax must be >= 1 or None (uncapped), got {jmax}")
    unclassified = [t for t in trajectories if t.kind not in KIND_RANK]
    if unclassified:
        raise ValueError(f"{len(unclassified)} trajectories have no kind; classify the tree first")
    ranked = sorted(trajectories, key=rank_key)
    return ranked if jmax is None else ranked[:jmax]
