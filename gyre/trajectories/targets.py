"""Targets and loss weights: which kept trajectory trains each token, and with what weight.

Only policy-generated tokens are targets (the tree marks them: output tokens of the call
that first put them there). A target shared by several kept trajectories (the history
before a retry, the main context that a compaction call extends) is trained once, by its
*owner*: the highest-ranked kept trajectory through its node. Ownership is per node, so
it costs O(nodes on kept paths), never O(tokens).

Weights make the loss a mean over trainable tokens inside an execution, then a mean over
executions in the batch: every target of execution e weighs 1 / (U_e * E), where U_e is
the number of unique targets on its kept paths and E the number of executions that
contribute. An execution with 5 branches weighs the same as one with 1.

With `norm_tokens` N set (`trajectories.loss_norm_tokens`), every target weighs 1 / (N * E)
instead: a constant per token (Dr. GRPO's aggregation), so a long execution weighs more than a
short one. Under the per-execution mean a failed reply's push down is spread over its tokens, so
a long failure is pushed down less per token than a short one and replies drift longer under RL;
a constant weight has no such bias.

The GSPO sequence ratio of a kept trajectory is taken over the targets it owns (for the
main trajectory: all of its own; for a retry: the tokens after it diverged), so it is
the same number whether the trajectory is its own row or a segment of a packed tree.
"""

from __future__ import annotations

from dataclasses import dataclass

from gyre.trajectories.tree import Trajectory, TrajectoryTree


@dataclass
class ExecutionPlan:
    """What one execution puts into a batch."""

    tree: TrajectoryTree
    kept: list[Trajectory]  # rank order
    owner: dict[int, int]  # node index -> position in `kept` of the trajectory that trains it
    num_targets: int  # unique trainable tokens over the kept trajectories
    advantage: float
    norm_tokens: int | None = None  # None: U_e (the mean over the execution's targets); N: a constant

    @property
    def execution_id(self) -> str:
        return self.tree.execution_id

    def owned_targets(self, j: int) -> int:
        return sum(n.num_trainable for n in self.kept[j].nodes if self.owner[n.index] == j)

    def token_weight(self, num_executions: int) -> float:
        return 1.0 / ((self.norm_tokens or self.num_targets) * num_executions)


def plan_execution(tree: TrajectoryTree, kept: list[Trajectory], advantage: float,
                   norm_tokens: int | None = None) -> ExecutionPlan:
    owner: dict[int, int] = {}
    num_targets = 0
    for j, traj in enumerate(kept):
        for node in traj.nodes:
            if node.index not in owner:
                owner[node.index] = j
                num_targets += node.num_trainable
    return ExecutionPlan(tree, kept, owner, num_targets, advantage, norm_tokens)
