"""The `evaluator` and `evaluation` sections: how an execution's workspace is scored (hidden tests' time limit,
network, where container tasks are tested, the reward-hacking monitors) and when the policy is evaluated on the
held-out queries. Re-exported by `gyre.config.run`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gyre.config.base import Section


class EvaluatorConfig(Section):
    timeout_s: float = Field(default=120.0, gt=0)
    """Time limit of one hidden-test command."""
    network: Literal["none", "package-index"] = "none"
    """What an evaluation's sandbox may reach. `none`: nothing (pip installs build offline with the
    evaluation's own setuptools). `package-index`: an allow-listed proxy of gyre's to `index_url`
    (pip and uv pointed at it; every request logged; NL2RepoBench's own project denied, so
    installing the real upstream package is tampering). The agent's sandbox never gets either."""
    index_url: str | None = None
    """The package index proxied with `network: package-index` (None: the index pip on this machine
    is configured with, else PyPI)."""
    index_hosts: list[str] = Field(default_factory=list)
    """Hosts allowed besides the index's own and its known files host."""
    container_tasks: Literal["in_place", "fresh"] = "in_place"
    """Where Terminal-Bench and Harbor tasks are tested. `in_place` (upstream's way): in the agent's own
    sandbox session after it stops, processes it left running still alive (a server the tests call),
    the tests copied in then (`gyre.evaluators.formats.in_place`; local sandbox with bubblewrap, gyre as root;
    `sandbox.type: docker`: the agent's own container, R2E-Gym's too, `gyre.evaluators.formats.in_container`; elsewhere
    `fresh` is used, with a warning). `fresh`: a new local sandbox on a copy of the workspace."""
    allow_unscorable: bool = False
    """Run queries this machine cannot score (their needs unmet here: `gyre benchmark check DIR`). False: a run
    holding any stops before any model is built, naming each query and what it needs; true (`gyre run
    --allow-unscorable`, a deployment's `allow_unscorable`): they run, their evaluations dropped, never zeros."""
    max_dropped_share: float = Field(default=0.5, ge=0.0, le=1.0)
    """A run whose evaluator failures (dropped executions, never counted as zeros) exceed this share of its
    executions ends `failed` (DuckDB `runs.status`, its Prefect flow run Failed) with the counts as its reason,
    as does a run that scored nothing at all (`gyre.runtime.run_status.verdict`)."""
    monitor: Literal["record", "zero", "off"] = "record"
    """Reward-hacking monitors: the static one (`gyre.evaluators.integrity.monitor`) over each kept workspace and the
    runtime one (`integrity.runtime`) in its test processes. `record` stores their flags with the execution
    (`executions.flags`); `zero` also scores 0 with status `tampering` a workspace with a flag that acts on its
    benchmark (`integrity.zero_policy`: on real benchmarks the kinds measured not to fire on correct code, on the
    tiny set every flag); `off` skips the static scan (the runtime flags are still recorded)."""


class EvaluationConfig(Section):
    every_steps: int = Field(default=0, ge=0)
    """Evaluate the policy on the held-out queries before every N-th step and after the last; 0: never."""
    samples_per_query: int = Field(default=4, gt=0)
    """Executions per eval query; the eval pass rate is the mean score over them (rollout temperature)."""
    max_queries: int | None = Field(default=None, gt=0)
    """Evaluate on at most this many held-out queries (the first by id); None: all."""
    at_start: bool = True
    """Evaluate the starting policy before step 0. False: another run already measured the same starting weights
    (`gyre bench learning`'s rft arm starts where its rl arm does); a run of 0 steps still evaluates once."""
    set: Literal["held_out", "validation"] = "held_out"
    """Which queries the eval rounds sample: the held-out sets (`in_distribution`, and `generalisation`
    when `benchmark.held_out_kinds` names templates), or the validation set carved from training
    (`benchmark.validation_fraction`; recorded as `evals.split = validation`), which is what every
    choice of knobs reads so the held-out sets measure the chosen ones only."""
