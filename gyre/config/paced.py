"""The paced engine's configuration (`rollout.paced:`): which modelled cell it runs on, and how fast.

`rollout.engine: paced` samples with the torch reference engine and releases each call's tokens
when a modelled accelerator cell would have (`gyre.engines.paced`); the cell's costs come from a
simulator workload's device model (`gyre.sim.workloads.Workload.device`), the same one the
simulator computes with. Its own module to keep `run.py` under the house's size; re-exported there.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gyre.config.base import Section


class PacedConfig(Section):
    workload: Literal["nl2repo-122b", "nl2repo-2.4t", "deepswe-122b", "terminalbench-122b"] = "nl2repo-122b"
    """The simulator workload whose cluster the cells model (`gyre simulate --workload`): decode and
    prefill per token, training throughput, weights, pulls, switches and publication all come from
    its parameters (docs/scheduler.md lists each with its source)."""
    scale_s_per_h: float | None = Field(default=None, gt=0)
    """Wall-clock seconds per modelled hour. null: `harness.sleepy_scale` (the sleepy harness draws
    its executions' durations on the same clock; a paced run with another harness must set it)."""
    tokens_per_token: float = Field(default=4096.0, gt=0)
    """Modelled tokens each token the real model samples stands for: a call of a few real tokens
    carries the device time of a modelled call thousands of tokens long. A unit, not a fit: it sets
    how often the box computes (one real token per `tokens_per_token x decode` modelled seconds:
    56 ms of wall time at the defaults, nl2repo-122b and 5 s per hour), chosen so the tiny model's
    compute (about 1 ms a token here) stays well inside it."""
    cell_nodes: float | None = Field(default=None, gt=0)
    """Nodes of the modelled cluster per cell. null: the workload's pool scaled to the run's batch
    (its nodes x this run's executions per step / the workload's) cut into `scheduler.num_cells`
    cells, so each execution has the slots and training throughput it has on the full cluster."""
