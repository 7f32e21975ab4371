"""Cells beyond the core as Ray actors (`scheduler.runtime: ray`): their rollout engines live in
their own processes, reached over HTTP by the proxy's router, switch roles and take every
published version as the thread cells do; the run's Ray is gone when the run closes."""

from __future__ import annotations

import os

import duckdb
import pytest

from gyre.cells import events as ev
from gyre.cells.events import Role
from gyre.config import RunConfig
from gyre.coordinator import Coordinator
from gyre.engines.sglang_adapter import SGLangRolloutEngine
from gyre.live_cells import LiveCells
from gyre.cluster.ray_local import session_pids as _session


@pytest.mark.slow
def test_elastic_cells_with_a_ray_actor_cell_train_and_switch_across_processes(tiny_model_dir, tmp_path):
    config = RunConfig.model_validate({
        "name": "ray-cells", "steps": 2, "cache_dir": str(tmp_path / "cache"),
        "model": {"path": str(tiny_model_dir)},
        "benchmark": {"num_queries": 16},
        "rollout": {"queries_per_step": 2, "group_size": 4, "max_new_tokens": 16},
        "harness": {"max_turns": 2},
        "scheduler": {"policy": "elastic", "num_cells": 2, "slots_per_cell": 8, "lookahead_groups": 1,
                      "executions_per_micro_step": 2, "runtime": "ray"},
    })  # fmt: skip
    coord = Coordinator(config, tmp_path / "run")
    head = None
    try:
        cells = LiveCells(coord, config.steps)
        head = cells.ray.local.process.pid
        import ray

        remote = cells.cells[1].engine
        assert isinstance(remote, SGLangRolloutEngine) and remote.engine_id == "cell-1"
        actor_pid = ray.get(cells.ray.cells[0].actor.pid.remote())
        assert actor_pid != os.getpid() and actor_pid in _session(head)
        assert remote.base_url.startswith("http://127.0.0.1:")
        records = cells.run()
        switches = cells.log.of(ev.SwitchCell)
        cells.close()
        assert [r.policy_version for r in records] == [1, 2]
        assert any(s.cell_id == 1 and s.role is Role.train for s in switches)
    finally:
        coord.close()
    con = duckdb.connect(str(tmp_path / "run" / "gyre.duckdb"), read_only=True)
    served = dict(con.execute("select engine_id, count(*) from calls group by engine_id").fetchall())
    assert served.get("cell-1", 0) > 0, served  # the actor's engine served calls through the router
    # the actor cell switched roles: drained out of the router, and back with the newest weights
    phases = con.execute("select to_role, phases from role_switches where cell = 1").fetchall()
    assert {to for to, _ in phases} >= {"train"}
    assert _session(head) == []  # the run's Ray (head, raylet, the actor) closed with the cells
