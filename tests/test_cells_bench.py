"""`gyre bench cells` (`gyre/benches/cells.py`): the real runs' measurements become the simulator's
inputs on its own clock, and one small bench run returns every field the issue names."""

from __future__ import annotations

import json

import pytest

from gyre.benches.cells import POLICIES, run, scaled_workload, simulate, slots_per_cell
from gyre.config.run import load_config
from gyre.sim.engine import execution_rate
from gyre.sim.workloads import get_workload

COSTS = {"switch_to_train": 0.01, "switch_to_rollout": 0.02, "pull": 0.5, "micro_step": 0.05,
         "optimizer_step": 0.03, "publish": 0.01}


def _config(tmp_path, tiny_model_dir, scale: float = 1.0):
    path = tmp_path / "sleepy.yaml"
    path.write_text(
        f"name: bench-cells\nseed: 0\nsteps: 2\ncache_dir: {tmp_path / 'cache'}\nmodel:\n  path: {tiny_model_dir}\n"
        "benchmark:\n  num_queries: 16\nevaluation:\n  every_steps: 0\n"
        "rollout:\n  queries_per_step: 2\n  group_size: 2\n  max_new_tokens: 8\n"
        f"harness:\n  type: sleepy\n  sleepy_workload: nl2repo-122b\n  sleepy_scale: {scale}\n  sleepy_calls: 1\n"
        "train:\n  checkpoint_every: 0\n"
        "scheduler:\n  policy: elastic\n  num_cells: 2\n  slots_per_cell: 4\n  lookahead_groups: 1\n"
        "  executions_per_micro_step: 1\n"
    )
    return path


def test_measured_costs_land_on_the_simulators_clock(tmp_path, tiny_model_dir):
    config = load_config(_config(tmp_path, tiny_model_dir, scale=5.0))
    workload = scaled_workload(config, COSTS)
    k = 3600 / 5.0  # simulated seconds per wall second
    assert workload.durations == get_workload("nl2repo-122b").durations  # the same draws as the harness
    assert (workload.num_nodes, workload.cell_nodes, workload.group_size, workload.queries_per_step) == (2, 1, 2, 2)
    assert workload.switch_to_train_s == pytest.approx(0.01 * k) and workload.optimizer_s == pytest.approx(0.03 * k)
    assert workload.micro_step_overhead_s == pytest.approx(0.05 * k)
    assert workload.pull_s(1) == pytest.approx(0.5 * k)  # weights / bandwidth + 2 s, solved for the measured pull
    assert workload.topology().slots_per_cell == pytest.approx(4)  # 4 slots x 2 cells = 8 = batches_in_flight x 4
    wall_s, staleness = simulate(config, COSTS)
    assert wall_s > 0 and staleness >= 0
    assert simulate(config, COSTS) == (wall_s, staleness)  # deterministic: same durations, same answer
    assert slots_per_cell(config, 4) == 2  # two steps of 4 executions over 4 cells
    assert scaled_workload(config, COSTS, 0.05).engine_share == 0.05 and workload.engine_share == 1.0


def test_only_the_engine_share_of_an_execution_slows_when_the_engines_are_shared():
    assert execution_rate(0.5, 1.0) == 0.5  # engine-bound: the engines' rate itself
    assert execution_rate(0.5, 0.0) == 1.0  # never calls the engines
    assert execution_rate(0.5, 0.1) == pytest.approx(1 / (0.1 / 0.5 + 0.9))
    assert execution_rate(1.0, 0.1) == 1.0 and execution_rate(0.0, 0.1) == 0.0  # full speed; no engine: stalled


def test_a_mostly_waiting_workload_is_predicted_faster_under_async_not_under_elastic():
    """Async oversubscribes its half pool: with 5 % of each execution in calls, the simulator
    predicts a shorter run than with every execution engine-bound."""
    from dataclasses import replace

    from gyre.sim.tuning import run_once

    base = get_workload("nl2repo-122b")
    bound = run_once(base, "async", 4, 4, seed=0)
    waiting = run_once(replace(base, engine_share=0.05), "async", 4, 4, seed=0)
    assert waiting.makespan_h < bound.makespan_h


@pytest.mark.slow
def test_a_small_bench_runs_the_three_policies_and_predicts_each(tmp_path, tiny_model_dir):
    result = run(_config(tmp_path, tiny_model_dir), tmp_path / "out", steps=2, num_cells=2)
    json.dumps(result)  # JSON-ready
    for policy in POLICIES:
        r = result[policy]
        assert r["policy"] == policy and r["steps"] == 2 and r["wall_s"] > 0
        assert r["mean_staleness"] >= 0
        # the same executions all in engine calls can only be slower on shared engines (`execution_rate`)
        assert r["simulated_wall_s_engine_bound"] >= r["simulated_wall_s"] > 0
        assert 0 < r["engine_share"] < 1  # sleepy executions mostly wait
        assert set(r["costs_s"]) == set(COSTS)
        for direction, phases in r["switch_s"].items():
            assert direction in ("to_train", "to_rollout") and phases["total"] >= 0 and phases["count"] >= 1
    assert result["elastic"]["switch_s"]  # elastic moved cells (2 cells, one step's worth of slots each)
    assert set(result["ratios"]) == {"async/elastic", "colocate/elastic"}
    assert set(result["checks"]) == {"staleness_matched_within_0.25", "simulator_within_20pct", "elastic_1.3x_faster",
                                     "switches_within_bound"}
    bound = result["switch_bound"]
    assert bound["snapshot_bytes"] == result["elastic"]["snapshot_bytes"] > 0 and bound["memcpy_bytes_per_s"] > 0
    assert bound["bound_s"] == pytest.approx(3 * bound["snapshot_bytes"] / bound["memcpy_bytes_per_s"] + 0.5)
    assert set(result["checks"]["switches_within_bound"]["elastic"]) == set(result["elastic"]["switch_s"])
