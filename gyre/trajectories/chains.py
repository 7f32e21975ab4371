"""From recorded calls to trainable trajectories (the walking-skeleton processor).

A trajectory is a chain of calls whose prompts extend each other: call k+1 continues
call k when its prompt ids start with call k's prompt ids + output ids (the proxy splices
the exact sampled ids back in, so an agent loop is one chain). A call that extends no open
chain starts a new trajectory. Every token keeps its origin: output tokens are trainable
targets with their behaviour log-probs; prompt tokens (system text, tool results) are not.

Loss weights make the loss the mean over trainable tokens inside an execution, then the
mean over executions: a target token is identified by (call, index) and counts once even
when several trajectories contain it.

The training path no longer uses this module: `trajectories/processor.py` (prefix-sharing
tree, kinds, Jmax sampling, tree packing) replaced it in `Coordinator.train`. It stays only
because the proxy and harness tests use `build_trajectories` as a quick "one exact-token
chain" check; move them to `trajectories.tree.build_tree` and delete it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gyre.records import Call
from gyre.trajectories.rows import TrainSequence


@dataclass
class Trajectory:
    execution_id: str
    tokens: list[int] = field(default_factory=list)
    trainable: list[bool] = field(default_factory=list)
    behaviour_logprobs: list[float] = field(default_factory=list)
    target_keys: list[tuple[int, int] | None] = field(default_factory=list)
    call_ids: list[str] = field(default_factory=list)
    kind: str = "main"

    def extend_with(self, call: Call, call_index: int) -> None:
        start = len(self.tokens)
        new_prompt = call.prompt_ids[start:]
        self.tokens += new_prompt + call.output_ids
        self.trainable += [False] * len(new_prompt) + [True] * len(call.output_ids)
        self.behaviour_logprobs += [0.0] * len(new_prompt) + list(call.logprobs)
        self.target_keys += [None] * len(new_prompt) + [(call_index, j) for j in range(len(call.output_ids))]
        self.call_ids.append(call.call_id)

    def is_extended_by(self, call: Call) -> bool:
        n = len(self.tokens)
        return len(call.prompt_ids) >= n and call.prompt_ids[:n] == self.tokens


def build_trajectories(calls: list[Call]) -> list[Trajectory]:
    """Chain the calls of ONE execution (in the order they started) into trajectories."""
    if not calls:
        return []
    execution_ids = {c.execution_id for c in calls}
    if len(execution_ids) != 1:
        raise ValueError(f"build_trajectories takes one execution's calls, got {sorted(execution_ids)}")
    ordered = sorted(enumerate(calls), key=lambda ic: (ic[1].started_at, ic[0]))
    trajectories: list[Trajectory] = []
    for call_index, call in ordered:
        # Continue the longest open chain this call extends; else start a new one.
        candidates = [t for t in trajectories if t.is_extended_by(call)]
        if candidates:
            max(candidates, key=lambda t: len(t.tokens)).extend_with(call, call_index)
        else:
            traj = Trajectory(execution_id=call.execution_id, kind="main" if not trajectories else "branch")
            traj.extend_with(call, call_index)
            trajectories.append(traj)
    return trajectories


def to_train_sequences(
    trajectories_by_execution: dict[str, list[Trajectory]], advantages: dict[str, float]
) -> list[TrainSequence]:
    """Weighted rows for the train engine, for the executions that have an advantage.

    Weight of a target = 1 / (unique targets in its execution) / (executions in batch),
    given to its first occurrence only; duplicates get weight 0 and are not trainable.
    """
    executions = [eid for eid in trajectories_by_execution if eid in advantages]
    num_executions = len(executions)
    sequences: list[TrainSequence] = []
    for eid in executions:
        trajs = trajectories_by_execution[eid]
        unique = {k for t in trajs for k, tr in zip(t.target_keys, t.trainable) if tr}
        if not unique:
            continue
        w = 1.0 / len(unique) / num_executions
        seen: set[tuple[int, int]] = set()
        for traj in trajs:
            trainable, weights = [], []
            for key, is_target in zip(traj.target_keys, traj.trainable):
                first = is_target and key not in seen
                if first:
                    seen.add(key)
                trainable.append(first)
                weights.append(w if first else 0.0)
            if any(trainable):
                sequences.append(
                    TrainSequence(
                        tokens=list(traj.tokens),
                        trainable=trainable,
                        behaviour_logprobs=list(traj.behaviour_logprobs),
                        weights=weights,
                        advantage=advantages[eid],
                        execution_id=eid,
                    )
                )
    return sequences
