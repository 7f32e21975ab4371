"""`gyre bench cells`: Elastic against Async and Colocate on the real stack, and the simulator's
prediction of each, in one run.

The three policies run one after another on the same sleepy workload (`harness.type:
sleepy`: real model calls through the proxy, most of each execution spent waiting out the
duration the simulator draws for it, scaled from hours to seconds), so execution i of group
g waits the same under every policy. They are compared at matched mean staleness E[d], each
through its own knob (`lookahead_groups`): Elastic runs with the config's; Async's and
Colocate's lookahead is the one at which the simulator, fed Elastic's measured costs, gives
Elastic's measured E[d] (the real E[d] of each run is reported next to it).

Every run's cells are provisioned as the simulator's workloads are: rollout slots for two
steps' executions over the pool (`slots_per_cell`), so rollout capacity binds as it does on
the simulated cluster (with more slots every policy just waits out the same long tail).

Each policy's `simulated_wall_s` is the simulator's prediction for that run: the same
workload durations (same seed, group size and scale), the same cells, slots, batch shape and
lookahead, and that run's own measured costs as inputs (median switch time per direction
without the pull, snapshot pull, micro-step, optimizer step, publication), converted to the
simulator's clock (`HOUR_S / scale` simulated seconds per wall second), and its measured
`engine_share` (its calls' seconds over its executions' seconds): only that share of an
execution slows when the engines are oversubscribed (`gyre.sim.engine.execution_rate`); a
sleepy execution mostly waits, so it barely does. `simulated_wall_s_engine_bound` is the
prediction with every execution engine-bound instead (share 1.0, the paper reproduction's
assumption). What the simulator does not model: a sleepy execution's own calls and sandbox (0.5-1 s each here) come on top
of its drawn wait, and the box's two cores are shared by every cell.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from gyre.config.run import RunConfig, load_config
from gyre.runtime.simulated_durations import HOUR_S

POLICIES = ("elastic", "async", "colocate")
SWITCH_BOUND_FACTOR = 3.0  # the check: each switch <= 3 x (snapshot bytes / memcpy bandwidth) + 0.5 s
SWITCH_BOUND_SLACK_S = 0.5


@dataclass
class PolicyRun:
    """One policy's real run and the simulator's prediction of it."""

    policy: str
    lookahead_groups: int
    wall_s: float
    mean_staleness: float
    steps: int
    switch_s: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per direction (`to_train`, `to_rollout`): median seconds of the whole switch and of each phase."""
    costs_s: dict[str, float] = field(default_factory=dict)
    """Median wall seconds of the costs the simulator takes as inputs."""
    simulated_wall_s: float | None = None
    simulated_mean_staleness: float | None = None
    snapshot_bytes: int = 0
    """Bytes of the policy's weights (what a switch's pull or load moves)."""
    engine_share: float = 1.0
    """Its training executions' calls' seconds over their own seconds (a simulator input)."""
    simulated_wall_s_engine_bound: float | None = None
    """The prediction with `engine_share` 1.0: every execution slowed as the engines are shared."""
    run_dir: str = ""


def slots_per_cell(base: RunConfig, num_cells: int) -> int:
    """Rollout slots per cell as the simulator's workloads provision them: the pool hosts
    `batches_in_flight` (2) steps' executions at once (gyre/sim/workloads.py's assumption)."""
    from gyre.sim.workloads import get_workload

    per_step = base.rollout.queries_per_step * base.rollout.group_size
    return max(1, math.ceil(get_workload(base.harness.sleepy_workload).batches_in_flight * per_step / num_cells))


def policy_config(base: RunConfig, policy: str, lookahead: int, num_cells: int, steps: int) -> RunConfig:
    scheduler = base.scheduler.model_copy(update={"policy": policy, "lookahead_groups": lookahead,
                                                  "num_cells": num_cells,
                                                  "slots_per_cell": slots_per_cell(base, num_cells)})
    return base.model_copy(update={"scheduler": scheduler, "steps": steps, "name": f"{base.name}-{policy}"})


def run_policy(config: RunConfig, run_dir: Path) -> tuple[PolicyRun, dict[str, list[float]]]:
    """One real run under `config`'s policy: its measurements and its raw command times."""
    from gyre.runtime.coordinator import Coordinator
    from gyre.runtime.live.cells import LiveCells

    coord = Coordinator(config, run_dir)
    try:
        cells = LiveCells(coord, config.steps)
        try:
            started = time.monotonic()
            cells.run()
            wall_s = time.monotonic() - started
        finally:
            cells.close()
        coord.call_log.flush()
        state = cells.scheduler.state
        run = PolicyRun(config.scheduler.policy, config.scheduler.lookahead_groups, wall_s, state.mean_staleness,
                        config.steps, switch_s=_switches(cells.switches.records), run_dir=str(run_dir))
        seconds = {kind: list(v) for kind, v in cells.command_seconds.items()}
        run.costs_s = _costs(cells.switches.records, seconds)
        run.snapshot_bytes = sum(t.numel() * t.element_size() for t in coord.trainer.model.state_dict().values())
        run.engine_share = engine_share(coord.store)
        return run, seconds
    finally:
        coord.close()


def engine_share(store, executions_s: float | None = None) -> float:
    """Seconds its training executions spent in model calls over their own seconds (`executions_s`:
    the seconds to count them over instead, e.g. with their sandboxes and evaluations)."""
    seconds = "sum(epoch(t.finished_at) - epoch(t.started_at))"
    [(calls_s,)] = store.query(f"SELECT coalesce({seconds}, 0) FROM calls t JOIN executions e USING (execution_id) "
                               "WHERE e.purpose = 'train'")
    if executions_s is None:
        [(executions_s,)] = store.query(f"SELECT coalesce({seconds}, 0) FROM executions t WHERE purpose = 'train'")
    if executions_s <= 0:
        raise ValueError("the run recorded no training executions: no engine share to measure")
    return min(1.0, calls_s / executions_s)


def memcpy_bytes_per_s(nbytes: int, repeats: int = 20) -> float:
    """Host memcpy bandwidth for a buffer of `nbytes`, best of `repeats`, measured now. One
    thread (numpy's copy is a plain memcpy): torch's `copy_` splits a buffer over its OpenMP
    threads, and on a loaded box it waited for a descheduled one (0.07 GB/s measured that way)."""
    import numpy as np

    src = np.ones(max(nbytes, 1), dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - started)
    return src.size / best


def _switches(records) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for direction in ("train", "rollout"):
        chosen = [r for r in records if r.to_role == direction]
        if not chosen:
            continue
        phases: dict[str, list[float]] = {}
        for r in chosen:
            for name, seconds in r.phases:
                phases.setdefault(name, []).append(seconds)
        out[f"to_{direction}"] = {"total": statistics.median(r.seconds for r in chosen), "count": len(chosen),
                                  "max": max(r.seconds for r in chosen),
                                  **{name: statistics.median(v) for name, v in phases.items()}}
    return out


def _costs(records, seconds: dict[str, list[float]]) -> dict[str, float]:
    """The simulator's inputs, measured: medians in wall seconds (0 when the run had none)."""
    def median(values) -> float:
        values = list(values)
        return statistics.median(values) if values else 0.0

    pulls = [s for r in records for name, s in r.phases if name == "pull"] + seconds.get("pull", [])
    return {
        "switch_to_train": median(r.seconds - sum(s for n, s in r.phases if n == "pull")
                                  for r in records if r.to_role == "train"),
        "switch_to_rollout": median(r.seconds for r in records if r.to_role == "rollout"),
        "pull": median(pulls),
        "micro_step": median(seconds.get("micro_step", [])),
        "optimizer_step": median(seconds.get("optimizer_step", [])),
        "publish": median(seconds.get("publish", [])),
    }


def scaled_workload(config: RunConfig, costs: dict[str, float], engine_share: float = 1.0):
    """The simulator's workload for `config`'s sleepy run: its durations, its cells and batch
    shape, `costs` (wall seconds) on the simulator's clock, and the executions' `engine_share`."""
    from gyre.sim.workloads import RDMA_GB_PER_NODE_S, get_workload

    harness, rollout, cells = config.harness, config.rollout, config.scheduler
    k = HOUR_S / harness.sleepy_scale  # simulated seconds per wall second
    per_step = rollout.queries_per_step * rollout.group_size
    pull_sim_s = costs["pull"] * k
    return replace(
        get_workload(harness.sleepy_workload),
        num_nodes=cells.num_cells, cell_nodes=1, min_train_nodes=1,
        queries_per_step=rollout.queries_per_step, group_size=rollout.group_size,
        executions_per_micro_step=cells.executions_per_micro_step,
        batches_in_flight=cells.slots_per_cell * cells.num_cells / per_step,
        tokens_per_node_s=1e18,  # a micro-step's cost is its measured time (the overhead below)
        micro_step_overhead_s=costs["micro_step"] * k, optimizer_s=costs["optimizer_step"] * k,
        publish_s=costs["publish"] * k,
        switch_to_train_s=costs["switch_to_train"] * k, switch_to_rollout_s=costs["switch_to_rollout"] * k,
        weights_gb=max(0.0, pull_sim_s - 2.0) * RDMA_GB_PER_NODE_S,  # pull_s = weights / bandwidth + 2 s
        engine_share=engine_share,
    )  # fmt: skip


def simulate(config: RunConfig, costs: dict[str, float], engine_share: float = 1.0) -> tuple[float, float]:
    """(wall seconds, E[d]) the simulator predicts for `config` with `costs`."""
    from gyre.sim.tuning import run_once

    workload = scaled_workload(config, costs, engine_share)
    cells = config.scheduler
    result = run_once(workload, cells.policy, config.steps, cells.lookahead_groups, seed=config.seed)
    return result.makespan_h * config.harness.sleepy_scale, result.mean_staleness


def matched_lookahead(config: RunConfig, costs: dict[str, float], engine_share: float, target: float) -> int:
    """The lookahead at which the simulator gives `config`'s policy E[d] nearest `target`."""
    from gyre.sim.tuning import max_lookahead, run_once

    workload = scaled_workload(config, costs, engine_share)
    policy = config.scheduler.policy
    best, best_gap = 0, float("inf")
    for lookahead in range(max_lookahead(workload, None, None) + 1):
        result = run_once(workload, policy, config.steps, lookahead, seed=config.seed)
        gap = abs(result.mean_staleness - target)
        if gap < best_gap - 1e-9:
            best, best_gap = lookahead, gap
    return best


def run(config_path: Path, out: Path, steps: int = 4, num_cells: int = 4) -> dict:
    """The three policies on `config_path`'s sleepy workload; one JSON-ready dict."""
    base = load_config(config_path)
    if base.harness.type != "sleepy":
        raise ValueError(f"{config_path}: gyre bench cells replays a sleepy workload; set harness.type: sleepy")
    if base.scheduler.policy is None:
        raise ValueError(f"{config_path}: set scheduler (cells, slots, lookahead) for the elastic run")
    out.mkdir(parents=True, exist_ok=True)
    elastic_config = policy_config(base, "elastic", base.scheduler.lookahead_groups, num_cells, steps)
    elastic, _ = run_policy(elastic_config, out / "elastic")
    runs = {"elastic": (elastic_config, elastic)}
    for policy in ("async", "colocate"):
        probe = policy_config(base, policy, 0, num_cells, steps)
        lookahead = matched_lookahead(probe, elastic.costs_s, elastic.engine_share, elastic.mean_staleness)
        config = policy_config(base, policy, lookahead, num_cells, steps)
        runs[policy] = (config, run_policy(config, out / policy)[0])
    result: dict = {}
    for policy, (config, measured) in runs.items():
        measured.simulated_wall_s, measured.simulated_mean_staleness = simulate(config, measured.costs_s,
                                                                                measured.engine_share)
        measured.simulated_wall_s_engine_bound = simulate(config, measured.costs_s)[0]
        result[policy] = asdict(measured)
    result["ratios"] = {
        f"{other}/elastic": {"real": runs[other][1].wall_s / elastic.wall_s,
                             "simulated": runs[other][1].simulated_wall_s / elastic.simulated_wall_s}
        for other in ("async", "colocate")
    }
    result["checks"] = {
        "staleness_matched_within_0.25": all(abs(r.mean_staleness - elastic.mean_staleness) <= 0.25
                                             for _, r in runs.values()),
        "simulator_within_20pct": {p: abs(r.simulated_wall_s - r.wall_s) / r.wall_s <= 0.2 for p, (_, r) in runs.items()},
        "elastic_1.3x_faster": {p: runs[p][1].wall_s / elastic.wall_s >= 1.3 for p in ("async", "colocate")},
    }
    bandwidth = memcpy_bytes_per_s(elastic.snapshot_bytes)
    bound = SWITCH_BOUND_FACTOR * elastic.snapshot_bytes / bandwidth + SWITCH_BOUND_SLACK_S
    result["switch_bound"] = {"snapshot_bytes": elastic.snapshot_bytes, "memcpy_bytes_per_s": bandwidth,
                              "bound_s": bound}
    result["checks"]["switches_within_bound"] = {
        p: {d: v["max"] <= bound for d, v in r.switch_s.items()} for p, (_, r) in runs.items()}
    result["workload"] = {"name": base.harness.sleepy_workload, "scale_s_per_h": base.harness.sleepy_scale,
                          "num_cells": num_cells, "slots_per_cell": slots_per_cell(base, num_cells), "steps": steps,
                          "seed": base.seed}
    return result
