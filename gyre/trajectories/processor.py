"""The trajectory processor: a batch's recorded calls in, train rows out.

For each execution with an advantage: numpy form of its calls (checked), prefix-sharing
tree (tree.py), a kind per trajectory (classify.py), the Jmax kept trajectories by rank
(sampling.py), owners and weights of the targets (targets.py); then all executions are
packed together (packing.py), since the weights divide by the number of executions that
contribute. Pure: no Prefect, no I/O.

Nothing is dropped silently. An execution is dropped, and the drop recorded with its
reason, when it has no calls, no valid advantage (its evaluation failed), a call that
cannot be trained on (`CallInputError`), or no trainable token on its kept paths; the
rest of the batch trains. An advantage for an execution the batch has no entry for is a
caller bug and raises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from gyre.config.run import TrajectoryConfig
from gyre.trajectories.rows import TrainSequence
from gyre.records import Call
from gyre.trajectories.classify import KINDS, Classifier, ClassifierHints, RuleClassifier
from gyre.trajectories.packing import PackingMode, make_packer
from gyre.trajectories.sampling import sample
from gyre.trajectories.targets import ExecutionPlan, plan_execution
from gyre.trajectories.tokens import CallInputError, CallTokens, as_call_tokens
from gyre.trajectories.tree import TrajectoryTree, build_tree


@dataclass(frozen=True)
class ProcessorSettings:
    jmax: int | None = 5
    packing: PackingMode = "tree"
    row_tokens: int = 16384
    pair_cost: float = 0.0  # the train engine's attention cost per pair, in token units (TreePacker)
    norm_tokens: int | None = None  # a target's weight 1 / (norm_tokens * E) instead of 1 / (U_e * E) (targets.py)
    classifier: Classifier = field(default_factory=RuleClassifier)


def settings_from_config(
    config: TrajectoryConfig, micro_batch_tokens: int, tokenizer=None, pair_cost: float = 0.0
) -> ProcessorSettings:
    """Settings of a run; `tokenizer` turns the configured compaction markers into token ids,
    `pair_cost` is the train engine's attention cost model (`TorchTrainEngine.pair_cost`)."""
    markers: tuple[tuple[int, ...], ...] = ()
    if config.compaction_markers:
        if tokenizer is None:
            raise ValueError("trajectories.compaction_markers needs the run's tokenizer")
        markers = tuple(tuple(tokenizer(m, add_special_tokens=False)["input_ids"]) for m in config.compaction_markers)
    return ProcessorSettings(
        jmax=config.jmax_or_none,
        packing=config.packing,
        row_tokens=config.row_tokens or micro_batch_tokens,
        pair_cost=pair_cost,
        norm_tokens=config.loss_norm_tokens,
        classifier=RuleClassifier(ClassifierHints(compaction_markers=markers, main_share=config.main_share)),
    )


@dataclass(frozen=True)
class Drop:
    execution_id: str
    reason: str


@dataclass
class ProcessedBatch:
    sequences: list[TrainSequence]
    plans: list[ExecutionPlan]
    drops: list[Drop]

    def stats(self) -> dict[str, float]:
        kept = [t for p in self.plans for t in p.kept]
        out: dict[str, float] = {
            "executions_trained": len(self.plans),
            "executions_dropped": len(self.drops),
            "trajectories_total": sum(len(p.tree.trajectories) for p in self.plans),
            "trajectories_kept": len(kept),
            "targets_unique": sum(p.num_targets for p in self.plans),
            "tokens_packed": sum(len(s.tokens) for s in self.sequences),
            "prompt_contradictions": sum(len(p.tree.contradictions) for p in self.plans),
        }
        for kind in KINDS:
            out[f"kept_{kind}"] = sum(t.kind == kind for t in kept)
        return out


def classify_and_sample(tree: TrajectoryTree, settings: ProcessorSettings) -> list:
    kinds = settings.classifier.classify(tree)
    if len(kinds) != len(tree.trajectories) or any(k not in KINDS for k in kinds):
        raise ValueError(f"classifier returned {kinds!r}; expected one of {KINDS} per trajectory")
    for traj, kind in zip(tree.trajectories, kinds):
        traj.kind = kind
    return sample(tree.trajectories, settings.jmax)


def plan(calls: Sequence[Call] | Sequence[CallTokens], advantage: float, settings: ProcessorSettings) -> ExecutionPlan:
    """Tree, kinds, Jmax sampling and target owners for one execution."""
    tree = build_tree(as_call_tokens(list(calls)))
    return plan_execution(tree, classify_and_sample(tree, settings), advantage, settings.norm_tokens)


def process_batch(
    calls_by_execution: Mapping[str, Sequence[Call] | Sequence[CallTokens]],
    advantages: Mapping[str, float],
    settings: ProcessorSettings = ProcessorSettings(),
    num_executions: int | None = None,
) -> ProcessedBatch:
    """`num_executions`: how many executions the loss averages over (default: the kept
    executions of this batch). A micro-step of a larger optimizer step passes the step's
    count, so its rows carry the weights they would have in the whole step."""
    unknown = sorted(set(advantages) - set(calls_by_execution))
    if unknown:
        raise KeyError(f"advantages given for unknown execution ids {unknown}")
    plans: list[ExecutionPlan] = []
    drops: list[Drop] = []
    for eid, calls in calls_by_execution.items():
        advantage = advantages.get(eid)
        if advantage is None:
            drops.append(Drop(eid, "no advantage (evaluation failed or not scored)"))
            continue
        if not math.isfinite(advantage):
            drops.append(Drop(eid, f"advantage {advantage} is not finite"))
            continue
        if not calls:
            drops.append(Drop(eid, "no calls"))
            continue
        try:
            tokens = as_call_tokens(list(calls))
            wrong = sorted({c.execution_id for c in tokens} - {eid})
            if wrong:
                raise CallInputError(f"calls of executions {wrong} filed under execution {eid!r}")
            execution_plan = plan(tokens, advantage, settings)
        except CallInputError as exc:
            drops.append(Drop(eid, str(exc)))
            continue
        if execution_plan.num_targets == 0:
            drops.append(Drop(eid, "no trainable token on its kept trajectories"))
            continue
        plans.append(execution_plan)
    packer = make_packer(settings.packing, settings.row_tokens, settings.pair_cost)
    return ProcessedBatch(packer.pack(plans, len(plans) if num_executions is None else num_executions), plans, drops)
