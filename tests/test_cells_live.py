"""Real cells driven by the pure scheduler: the simulator's decisions, carried out on the box.

The tiny model really rolls out through the proxy, micro-steps really run forward-backward
on the core and satellite replicas, switches really drain engines out of the router, and
the run lands in DuckDB like the step-synchronous loop's.
"""

from __future__ import annotations

import math

import duckdb
import pytest

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.runtime.live.cells import LiveCells
from gyre.config.run import RunConfig
from gyre.runtime.coordinator import Coordinator


def _config(tiny_model_dir, tmp_path, **scheduler) -> RunConfig:
    return RunConfig.model_validate({
        "name": "live", "steps": 3, "cache_dir": str(tmp_path / "cache"),
        "model": {"path": str(tiny_model_dir)},
        "benchmark": {"num_queries": 16},
        "rollout": {"queries_per_step": 2, "group_size": 4, "max_new_tokens": 24},
        "harness": {"max_turns": 2},
        "train": {"lr": 3e-4},
        "scheduler": scheduler,
    })  # fmt: skip


def _run(config: RunConfig, run_dir) -> tuple[LiveCells, list]:
    coord = Coordinator(config, run_dir)
    cells = LiveCells(coord, config.steps)
    try:
        records = cells.run()
        cells.close()
        # the box is handed back with the newest weights on the coordinator's own engine
        assert coord.rollout.policy_version == coord.policy_version == config.steps
        assert [e.engine_id for e in coord.router.engines()] == [coord.rollout.engine_id]
    finally:
        coord.close()
    return cells, records


@pytest.mark.slow
def test_elastic_cells_train_and_record(tiny_model_dir, tmp_path):
    config = _config(
        tiny_model_dir, tmp_path, policy="elastic", num_cells=3, slots_per_cell=8, lookahead_groups=2,
        executions_per_micro_step=2,
    )
    config.train.checkpoint_every = 2
    cells, records = _run(config, tmp_path / "run")
    assert [r.step for r in records] == [0, 1, 2]
    assert [r.policy_version for r in records] == [1, 2, 3]
    assert all(r.tokens_trained > 0 and r.grad_norm is not None and math.isfinite(r.grad_norm) for r in records)
    assert cells.coord.trainer.steps_taken == 3
    assert [c.version for c in cells.log.of(ev.PublishWeights)] == [1, 2, 3]
    # the waterlevel moved cells: some went to train and came back, every micro-step ran once
    switches = cells.log.of(ev.SwitchCell)
    assert any(s.role is Role.train for s in switches)
    claims = cells.log.of(ev.ClaimMicroStep)
    assert len({c.micro_step_id for c in claims}) == len(claims) == 3 * 2 * 4 // 2
    # satellites joined the in-flight batches; their gradients were reduced onto the core
    assert any(c.cell_id != 0 for c in claims)
    assert any(a.num_satellites > 0 for a in cells.log.of(ev.ApplyOptimizerStep))
    # dispatch ran ahead of training: some executions were consumed by a later version
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    rows = con.execute("select count(*), max(staleness), count(score) from executions where purpose = 'train'").fetchone()
    assert rows[0] == 24 and rows[2] == 24
    assert rows[1] >= 1
    steps = con.execute("select step, mean_staleness from steps order by step").fetchall()
    assert [s[0] for s in steps] == [0, 1, 2]
    assert steps[0][1] == 0.0 and max(s[1] for s in steps) > 0
    # GSPO's diagnostics per step, summed over every cell's micro-steps (this untrained model scores 0
    # everywhere: advantages 0, no update, so the ratios stay 1 and clip and cap stay at 0 here)
    diag = con.execute("select token_cap_frac, clip_low_frac, clip_high_frac, sampled_entropy, "
                       "mean_response_tokens from steps order by step").fetchall()
    assert all(None not in d and d[3] > 0 and d[4] > 0 for d in diag), diag
    # each execution is filed under the step whose batch it joined
    per_step = con.execute("select step, count(*) from executions group by step order by step").fetchall()
    assert per_step == [(0, 8), (1, 8), (2, 8)]
    # the cells' timeline: every cell accounted for over the whole run, drawn next to the data
    segments = con.execute("select cell_id, state, sum(end_s - start_s) from cell_segments group by all").fetchall()
    assert {c for c, _, _ in segments} == {0, 1, 2}
    assert {s for _, s, _ in segments} <= {"rollout", "switching", "train-idle", "train-busy"}
    assert any(s == "train-busy" for _, s, _ in segments) and any(s == "rollout" for _, s, _ in segments)
    spans = con.execute("select cell_id, sum(end_s - start_s), max(end_s) from cell_segments group by cell_id").fetchall()
    assert all(abs(total - end) < 1e-6 for _, total, end in spans)  # contiguous from 0, no overlap
    assert (tmp_path / "run" / "cells.png").read_bytes()[:4] == b"\x89PNG"
    # every switch timed per phase, one row each, matching the switching segments of the timeline
    rows = con.execute("select cell, from_role, to_role, seconds, phases, start_s from role_switches "
                       "order by start_s").fetchall()
    assert len(rows) == len(switches) == len(cells.switches.records)
    expected = {"train": ["drain", "unroute"], "rollout": ["load", "route"]}
    for cell, from_role, to_role, seconds, phases, start_s in rows:
        names = [p["name"] for p in phases]
        assert from_role != to_role and names[:2] == expected[to_role]
        assert names[2:] in ([], ["pull"]) and (names[2:] == [] or cell != 0)  # only a satellite pulls
        assert 0 <= sum(p["seconds"] for p in phases) <= seconds + 1e-6
        assert any(c == cell and s == "switching" and abs(a - start_s) < 0.5
                   for c, s, a, _ in cells.timeline.segments)
    assert any(to == "train" for _, _, to, *_ in rows)
    # checkpoints after step 1 (every 2) and after the last step, with the core's weights
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-000002", "step-000003"]


@pytest.mark.slow
def test_colocate_cells_match_the_synchronous_schedule(tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path, policy="colocate", num_cells=1, slots_per_cell=8)
    cells, records = _run(config, tmp_path / "run")
    assert [r.policy_version for r in records] == [1, 2, 3]
    assert all(r.mean_staleness == 0.0 for r in records)  # no lookahead: d = 0, as in the step loop
    roles = [s.role for s in cells.log.of(ev.SwitchCell)]
    assert roles == [Role.train, Role.rollout] * 2 + [Role.train]  # the whole pool flips each step
    assert all(r.logprob_abs_diff is not None and r.logprob_abs_diff < 1e-3 for r in records)


def test_a_topology_the_policy_cannot_run_is_refused_before_any_work(tiny_model_dir, tmp_path):
    from gyre.cells.topology import SchedulingConfigError

    coord = Coordinator(_config(tiny_model_dir, tmp_path, policy="elastic", num_cells=1), tmp_path / "run")
    try:
        with pytest.raises(SchedulingConfigError, match="needs at least 2 cells"):
            LiveCells(coord, 2)
        bad = _config(tiny_model_dir, tmp_path, policy="colocate", num_cells=1, slots_per_cell=2)
        coord.config = bad
        with pytest.raises(SchedulingConfigError, match="fewer than one group"):
            LiveCells(coord, 2)
    finally:
        coord.close()
    assert not list((tmp_path / "run" / "workspaces").glob("*"))


def test_evaluation_while_every_cell_trains_is_served_by_its_own_engine(tiny_model_dir, tmp_path):
    """Elastic moves every cell to train when nothing is live; an evaluation round held in
    the loop (no command goes out) must still find an engine, serving the published version."""
    config = _config(tiny_model_dir, tmp_path, policy="elastic", num_cells=2, slots_per_cell=8)
    coord = Coordinator(config, tmp_path / "run")
    cells = LiveCells(coord, 2)
    try:
        for cell in cells.cells:  # as after two switches to train
            coord.router.deregister(cell.engine.engine_id)
        seen = []

        def hook(version):
            result = coord.run_execution(coord.queries[0], version, 0, purpose="eval")
            seen.extend((c.engine_id, c.policy_version) for c in result.calls)

        cells._while_published(0, hook)
        assert seen and set(seen) == {("eval", 0)}
        assert "eval" not in {e.engine_id for e in coord.router.engines()}  # routed only meanwhile
    finally:
        cells.close()
        coord.close()


@pytest.mark.slow
def test_a_non_finite_loss_skips_its_step_and_the_run_goes_on(tiny_model_dir, tmp_path, monkeypatch):
    from gyre.algo.gspo import GSPO

    real_loss, calls = GSPO.loss, []

    def first_call_is_nan(self, logp, *args, **kwargs):
        loss, stats = real_loss(self, logp, *args, **kwargs)
        calls.append(1)
        return (loss * float("nan"), stats) if len(calls) == 1 else (loss, stats)

    monkeypatch.setattr(GSPO, "loss", first_call_is_nan)
    config = _config(tiny_model_dir, tmp_path, policy="elastic", num_cells=2, slots_per_cell=8)
    coord = Coordinator(config, tmp_path / "run")
    cells = LiveCells(coord, 3)
    try:
        records = cells.run()
    finally:
        cells.close()
        coord.close()
    assert "loss is nan" in records[0].skipped_reason and records[0].grad_norm is None
    assert all(r.skipped_reason is None and r.grad_norm is not None for r in records[1:])
    assert coord.trainer.steps_taken == 2  # the skipped step left the weights alone
    assert [r.policy_version for r in records] == [1, 2, 3]  # versions count steps
