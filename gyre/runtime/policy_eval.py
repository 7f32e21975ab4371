"""A saved policy, ready for the run's own evaluation round (`gyre.flows.evaluate`).

The policy is a train-engine checkpoint (a run's `checkpoints/step-NNNNNN/`, `state.json`
inside) or a model directory (Hugging Face layout, `config.json` inside). A checkpoint holds
weights of the config's model (same architecture, same tokenizer), so the coordinator starts
from the config's model and the checkpoint's weights are loaded into its train engine and
published to its rollout engine, as `--resume` does; the evaluation is labelled with the
checkpoint's steps taken (its policy version). A model directory replaces `model.path` and
turns the warm start off: it is the policy, evaluated at version 0.

What is measured is the run's own evaluation round (`gyre.flows.rl_run.eval_round`): every
held-out query of the chosen split, `evaluation.samples_per_query` executions each, through the
coordinator's execute / evaluate stages, recorded in `evals` and `executions`. The train
split is not offered: its queries are what the policy was trained on, and `evals.split` has
no name for it.
"""

from __future__ import annotations

from pathlib import Path

from gyre.config.run import RunConfig, WarmstartSettings
from gyre.engines.checkpoint import STATE, load_checkpoint
from gyre.runtime.coordinator import Coordinator

SPLITS = ("in_distribution", "generalisation")


def is_checkpoint(policy: Path) -> bool:
    return (Path(policy) / STATE).is_file()


def config_for_policy(config: RunConfig, policy: Path) -> RunConfig:
    """`config`, with a model directory `policy` as its model; unchanged for a checkpoint."""
    policy = Path(policy)
    if is_checkpoint(policy):
        return config
    if not (policy / "config.json").is_file():
        raise FileNotFoundError(f"{policy}: neither a checkpoint ({STATE}) nor a model directory (config.json)")
    model = config.model.model_copy(update={"path": policy.resolve(), "warmstart": WarmstartSettings()})
    return config.model_copy(update={"model": model})


def check_split(coord: Coordinator, split: str) -> None:
    """ValueError unless `split` names a held-out set that has queries in this run's benchmark."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    queries = coord.eval_queries if split == "in_distribution" else coord.generalisation_queries
    if not queries:
        need = "benchmark.eval_fraction" if split == "in_distribution" else "benchmark.held_out_kinds"
        raise ValueError(f"the config's benchmark has no {split} queries (set {need})")


def load_policy(coord: Coordinator, policy: Path) -> int:
    """Put a checkpoint's weights into `coord`'s engines; returns the policy version evaluated
    (the checkpoint's steps taken; 0 for a model directory, already loaded)."""
    if not is_checkpoint(policy):
        return 0
    load_checkpoint(coord.trainer, Path(policy))
    coord.publish_weights(coord.trainer.steps_taken)
    return coord.trainer.steps_taken
