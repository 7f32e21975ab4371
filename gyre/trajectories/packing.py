"""Packing kept trajectories into train rows, two ways behind one interface.

Both packers take the execution plans of a batch (kept trajectories in rank order, the
owner of every node, the weight of every target) and return `TrainSequence` rows that the
train engine groups into micro-batches under its token budget. Both give the same loss
and gradients as training each kept trajectory on its own (tests/test_packing.py checks
it on the torch engine in fp32): every target is scored once, in its full context, at the
position it has in its trajectory, and its GSPO sequence ratio is that of its owner.

* `PerTrajectoryPacker` (a): one plain causal row per kept trajectory, all of its
  tokens; targets owned by a higher-ranked trajectory are context there (not trainable,
  weight 0). Shared prefixes are computed once per trajectory.
* `TreePacker` (b): the union of kept paths in one row, node by node (parents before
  children), with a `TreeLayout`: ancestor-only attention, depth position ids, and
  `segment_ids` naming the owner trajectory of each target. Shared prefixes are computed
  once per row. A row holds whole trajectories (several executions' trees may share a row
  as separate roots). The next trajectory joins the current row if the row stays within
  `row_tokens` and merging is cheaper than a row of its own under the engine's cost model
  (`pair_cost`: the cost of one attention pair in units of one token's other work; a
  dense tree mask pays every pair of the row, a plain causal row half of its own); else
  it starts a new row, where its already-trained nodes come back as context only. A row
  left with one trajectory is emitted as a plain causal row, exactly as in (a).

`tokens_per_call` counts what a step-wise trainer (every call its own sample) would compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from gyre.trajectories.rows import TrainSequence, TreeLayout
from gyre.trajectories.targets import ExecutionPlan

PackingMode = Literal["tree", "per_trajectory"]


class Packer(Protocol):
    name: str

    def pack(self, plans: list[ExecutionPlan], num_executions: int) -> list[TrainSequence]:
        """Rows for these executions; `num_executions` is E in the weight 1 / (U_e * E)."""
        ...


class PerTrajectoryPacker:
    name = "per_trajectory"

    def pack(self, plans: list[ExecutionPlan], num_executions: int) -> list[TrainSequence]:
        return [
            self.row(plan, j, plan.token_weight(num_executions))
            for plan in plans
            for j in range(len(plan.kept))
            if plan.owned_targets(j) > 0  # else nothing to learn that a higher-ranked row does not teach
        ]

    @staticmethod
    def row(plan: ExecutionPlan, j: int, weight: float) -> TrainSequence:
        nodes = plan.kept[j].nodes
        trainable = np.concatenate(
            [n.trainable if plan.owner[n.index] == j else np.zeros(n.n, np.bool_) for n in nodes]
        )
        return TrainSequence(
            tokens=np.concatenate([n.tokens for n in nodes]),
            trainable=trainable,
            behaviour_logprobs=np.concatenate([n.logprobs for n in nodes]),
            weights=trainable * np.float32(weight),
            advantage=plan.advantage,
            execution_id=plan.execution_id,
        )


@dataclass
class _Row:
    spans: list = field(default_factory=list)  # (plan index, node, parent span, trained segment or -1)
    span_of: dict = field(default_factory=dict)  # (plan index, node index) -> span
    segments: list = field(default_factory=list)  # (plan index, kept position)
    size: int = 0

    def new_tokens(self, p: int, nodes) -> int:
        return sum(n.n for n in nodes if (p, n.index) not in self.span_of)

    def add(self, p: int, plan: ExecutionPlan, j: int) -> None:
        segment = len(self.segments)
        self.segments.append((p, j))
        for node in plan.kept[j].nodes:
            if (p, node.index) in self.span_of:
                continue
            parent = self.span_of.get((p, node.parent.index), -1)
            self.span_of[(p, node.index)] = len(self.spans)
            self.spans.append((p, node, parent, segment if plan.owner[node.index] == j else -1))
            self.size += node.n

    def finish(self, plans: list[ExecutionPlan], num_executions: int) -> TrainSequence:
        if len(self.segments) == 1:  # one trajectory: a plain causal row, exactly as in (a)
            p, j = self.segments[0]
            return PerTrajectoryPacker.row(plans[p], j, plans[p].token_weight(num_executions))
        nodes = [s[1] for s in self.spans]
        lengths = np.array([n.n for n in nodes], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        trained = [seg >= 0 for _, _, _, seg in self.spans]
        trainable = np.concatenate([n.trainable & t for n, t in zip(nodes, trained)])
        segment_ids = np.repeat(np.array([seg for *_, seg in self.spans], dtype=np.int64), lengths)
        segment_ids[~trainable] = -1
        span_weight = np.array(
            [plans[p].token_weight(num_executions) for p, *_ in self.spans], dtype=np.float32
        )
        first = plans[self.segments[0][0]]
        return TrainSequence(
            tokens=np.concatenate([n.tokens for n in nodes]),
            trainable=trainable,
            behaviour_logprobs=np.concatenate([n.logprobs for n in nodes]),
            weights=np.repeat(span_weight, lengths) * trainable,
            advantage=first.advantage,
            execution_id=first.execution_id,
            tree=TreeLayout(
                span_starts_S=starts,
                span_parent_S=np.array([parent for _, _, parent, _ in self.spans], dtype=np.int64),
                position_ids_T=np.concatenate([n.start_depth + np.arange(n.n) for n in nodes]),
            ),
            segment_ids=segment_ids,
            segment_advantages=[plans[p].advantage for p, _ in self.segments],
            segment_execution_ids=[plans[p].execution_id for p, _ in self.segments],
        )


class TreePacker:
    name = "tree"

    def __init__(self, row_tokens: int, pair_cost: float = 0.0) -> None:
        if row_tokens < 1:
            raise ValueError(f"row_tokens must be >= 1, got {row_tokens}")
        if pair_cost < 0:
            raise ValueError(f"pair_cost must be >= 0, got {pair_cost}")
        self.row_tokens = row_tokens
        self.pair_cost = pair_cost

    def _cost(self, tokens: int, trajectories: int) -> float:
        """Cost in token-equivalents: a tree row's mask is dense, a one-trajectory row is causal."""
        pairs = tokens * tokens if trajectories > 1 else tokens * tokens / 2
        return tokens + self.pair_cost * pairs

    def _worth_merging(self, row: "_Row", new_tokens: int, path_tokens: int) -> bool:
        if row.size + new_tokens > self.row_tokens:
            return False
        merged = self._cost(row.size + new_tokens, 2)
        return merged <= self._cost(row.size, len(row.segments)) + self._cost(path_tokens, 1)

    def pack(self, plans: list[ExecutionPlan], num_executions: int) -> list[TrainSequence]:
        rows: list[TrainSequence] = []
        row = _Row()
        for p, plan in enumerate(plans):
            for j, traj in enumerate(plan.kept):
                if plan.owned_targets(j) == 0:
                    continue
                if row.size and not self._worth_merging(row, row.new_tokens(p, traj.nodes), traj.num_tokens):
                    rows.append(row.finish(plans, num_executions))
                    row = _Row()
                row.add(p, plan, j)
        if row.spans:
            rows.append(row.finish(plans, num_executions))
        return rows


def make_packer(mode: PackingMode, row_tokens: int, pair_cost: float = 0.0) -> Packer:
    if mode == "tree":
        return TreePacker(row_tokens, pair_cost)
    if mode == "per_trajectory":
        return PerTrajectoryPacker()
    raise ValueError(f"unknown packing mode {mode!r}; expected 'tree' or 'per_trajectory'")


def tokens_per_call(plans: list[ExecutionPlan]) -> int:
    """Tokens a step-wise trainer computes: every call on a kept path as its own sample."""
    total = 0
    for plan in plans:
        calls = {c for traj in plan.kept for c in traj.call_indices}
        total += sum(plan.tree.calls[c].num_tokens for c in calls)
    return total


def tokens_in(rows: list[TrainSequence]) -> int:
    return sum(len(r.tokens) for r in rows)
