"""The `sleepy` harness: the simulator's durations, scaled, waited out between real model calls.

Durations are checked against `gyre.sim.engine.Simulation.execution` built the plain way;
executions run through a real coordinator (its proxy over HTTP and the tiny torch engine),
so the execution's slot is the one a run passes.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import get_args

import pytest

from gyre.cells.registry import make_policy
from gyre.config.run import ConfigError, HarnessConfig, RunConfig, load_config
from gyre.harnesses import make_harness
from gyre.harnesses.base import ExecutionSlot
from gyre.harnesses.sleepy import SleepyHarness
from gyre.records import ExecutionStatus
from gyre.runtime.coordinator import Coordinator
from gyre.runtime.simulated_durations import SimulatedDurations, _simulation, draw, draw_for, for_harness
from gyre.sim.engine import Simulation
from gyre.sim.workloads import WORKLOADS, get_workload

ROOT = Path(__file__).resolve().parents[1]


def _simulated_s(workload: str, seed: int, execution_id: int, group_size: int = 16) -> tuple[float, int]:
    shaped = get_workload(workload)
    if group_size != shaped.group_size:
        shaped = replace(shaped, group_size=group_size)
    sim = Simulation(shaped, make_policy("colocate"), steps=2, seed=seed)
    duration_s, end, _ = sim.execution(execution_id)
    return duration_s, end


@pytest.mark.parametrize("workload", ["nl2repo-122b", "terminalbench-122b"])
def test_draws_are_the_simulators_for_the_same_execution_id_scaled(workload):
    scale, ends = 7.5, set()
    for group_size in (16, 4):
        # groups in the first and second RNG chunk (CHUNK_GROUPS = 256)
        for group_id in [*range(40), 255, 256, 300]:
            for index in (0, group_size - 1):
                got = draw(workload, scale, 3, group_id, index, group_size)
                duration_s, end = _simulated_s(workload, 3, group_id * group_size + index, group_size)
                assert got.wall_s == pytest.approx(duration_s / 3600 * scale, rel=1e-12)
                assert got.simulated_h == pytest.approx(duration_s / 3600, rel=1e-12)
                assert got.status is [ExecutionStatus.completed, ExecutionStatus.harness_timeout,
                                      ExecutionStatus.overall_timeout][end]
                ends.add(end)
    if workload == "nl2repo-122b":
        assert ends == {0, 1, 2}  # completions, harness and overall timeouts all came through


def test_draws_are_deterministic_whatever_the_order_and_differ_by_seed():
    keys = [(g, i) for g in range(0, 600, 37) for i in range(8)]
    first = [draw("nl2repo-122b", 10.0, 5, g, i, 8).wall_s for g, i in keys]
    _simulation.cache_clear()
    again = [draw("nl2repo-122b", 10.0, 5, g, i, 8).wall_s for g, i in reversed(keys)][::-1]
    assert first == again
    assert first != [draw("nl2repo-122b", 10.0, 6, g, i, 8).wall_s for g, i in keys]
    # the scale is the only thing between simulated hours and wall seconds
    assert [draw("nl2repo-122b", 20.0, 5, g, i, 8).wall_s for g, i in keys] == pytest.approx([2 * s for s in first])
    slot = ExecutionSlot("s0003-q-g01", "train", 5, 74, 1, 8)
    assert draw_for("nl2repo-122b", 10.0, slot) == draw("nl2repo-122b", 10.0, 5, 74, 1, 8)
    evaluation = draw_for("nl2repo-122b", 10.0, replace(slot, purpose="eval", group_id=None))
    assert evaluation.wall_s == 0.0 and evaluation.status is ExecutionStatus.completed
    with pytest.raises(ValueError, match="outside a group of 8"):
        draw("nl2repo-122b", 10.0, 5, 0, 8, 8)


def _coordinator(tmp_path, tiny_model_dir, harness: dict) -> Coordinator:
    config = RunConfig.model_validate({
        "cache_dir": str(tmp_path / "cache"),
        "model": {"path": str(tiny_model_dir)},
        "benchmark": {"num_queries": 4},
        "rollout": {"queries_per_step": 2, "group_size": 2, "max_new_tokens": 12},
        "evaluator": {"timeout_s": 60},
        "harness": {"type": "sleepy", "sleepy_workload": "nl2repo-122b", **harness},
    })
    return Coordinator(config, tmp_path / "run")


def test_an_execution_makes_its_calls_through_the_proxy_and_takes_its_drawn_duration(tmp_path, tiny_model_dir):
    step, place, index, target_s = 1, 1, 1, 3.0
    hours = draw("nl2repo-122b", 1.0, 0, step * 2 + place, index, 2).simulated_h
    coord = _coordinator(tmp_path, tiny_model_dir, {"sleepy_scale": target_s / hours, "sleepy_calls": 3})
    try:
        query = coord.sample_queries(step)[place]
        assert coord.group_id(step, query) == 3  # what live_cells' DispatchExecution(group_id=3) maps back to
        planned = draw("nl2repo-122b", target_s / hours, 0, 3, index, 2)
        started = time.monotonic()
        result = coord.run_execution(query, step, index)
        elapsed = time.monotonic() - started
    finally:
        coord.close()
    execution = result.execution
    assert execution.status is planned.status and execution.error is None
    assert execution.num_calls == 3 == len(result.calls)
    assert all(len(c.output_ids) > 0 for c in result.calls)  # real tokens sampled by the tiny engine
    assert planned.wall_s == pytest.approx(target_s)
    assert planned.wall_s <= elapsed < planned.wall_s + 30  # waits, plus calls and sandbox set-up


def test_the_run_deadline_cuts_a_longer_draw_and_eval_executions_do_not_wait(tmp_path, tiny_model_dir):
    hours = draw("nl2repo-122b", 1.0, 0, 0, 0, 2).simulated_h
    coord = _coordinator(tmp_path, tiny_model_dir,
                         {"sleepy_scale": 120.0 / hours, "sleepy_calls": 2, "harness_timeout_s": 10.0})
    try:
        query = coord.sample_queries(0)[0]
        started = time.monotonic()
        cut = coord.run_execution(query, 0, 0)
        cut_s = time.monotonic() - started
        started = time.monotonic()
        evaluation = coord.run_execution(query, 0, 0, purpose="eval")
        evaluation_s = time.monotonic() - started
    finally:
        coord.close()
    assert cut.execution.status is ExecutionStatus.harness_timeout and cut.execution.num_calls == 1
    assert 9.9 <= cut_s < 30  # stopped at the 10 s deadline, in the first 60 s wait of a 120 s draw
    assert evaluation.execution.status is ExecutionStatus.completed and evaluation.execution.num_calls == 2
    assert evaluation_s < 20


def test_the_factory_builds_it_and_the_bundled_config_loads():
    harness_config = HarnessConfig(type="sleepy", sleepy_workload="deepswe-122b", sleepy_scale=2.5, sleepy_calls=6)
    harness = make_harness(harness_config, durations=for_harness(harness_config))
    assert isinstance(harness, SleepyHarness)
    assert harness.durations == SimulatedDurations("deepswe-122b", 2.5) and harness.calls == 6
    assert for_harness(HarnessConfig()) is None  # only a sleepy harness waits
    with pytest.raises(ValueError, match="none were given"):
        make_harness(harness_config)
    config = load_config(ROOT / "configs" / "tiny-cpu-sleepy.yaml")
    assert config.harness.type == "sleepy" and config.scheduler.policy == "elastic"
    assert 2 <= config.scheduler.num_cells <= 4
    with pytest.raises(ValueError, match="needs the execution's slot"):
        harness.run(None, None, None, time.monotonic() + 1)


def test_the_workload_choices_are_the_simulators():
    literal = HarnessConfig.model_fields["sleepy_workload"].annotation
    assert set(get_args(literal)) == set(WORKLOADS)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("sleepy_workload", "nl2repo-9t", "harness.sleepy_workload"),
    ("sleepy_scale", 0, "harness.sleepy_scale"),
    ("sleepy_scale", -3.0, "harness.sleepy_scale"),
    ("sleepy_calls", 0, "harness.sleepy_calls"),
])
def test_bad_config_is_an_error_naming_the_field(tmp_path, field, value, message):
    path = tmp_path / "bad.yaml"
    path.write_text(f"harness:\n  type: sleepy\n  {field}: {value}\n")
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(path)
    durations = dict(workload="nl2repo-122b", scale_s_per_h=1.0)
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        if field == "sleepy_calls":
            SleepyHarness(SimulatedDurations(**durations), calls=value)
        else:
            durations[{"sleepy_workload": "workload", "sleepy_scale": "scale_s_per_h"}[field]] = value
            SimulatedDurations(**durations)
