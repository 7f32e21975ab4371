"""The simulator's public functions: JSON fields, bad input, plot, DuckDB."""

import json

import duckdb
import pytest

from gyre.cells.topology import SchedulingConfigError
from gyre.sim import api


def test_simulate_reports_the_fields_the_cli_prints():
    result = api.simulate("nl2repo-122b", "elastic", steps=4, target_staleness=None)
    record = json.loads(result.model_dump_json())
    for field in ("makespan_h", "mean_staleness", "lower_bound_h", "efficiency", "cells"):
        assert field in record
    assert "segments" not in record and "waterlevel" not in record
    assert record["mean_staleness"] == 0.0
    assert 0 < record["efficiency"] <= 1.0
    assert len(record["cells"]) == 8
    total_h = sum(c["busy_h"] + c["idle_h"] + c["switching_h"] for c in record["cells"])
    assert total_h == pytest.approx(8 * record["makespan_h"], rel=1e-6)


def test_matched_staleness_is_within_tolerance():
    result = api.simulate("deepswe-122b", "colocate", steps=6, target_staleness=1.0)
    assert abs(result.mean_staleness - 1.0) <= 0.1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workload": "nl2repo-9t", "policy": "elastic"}, "unknown workload"),
        ({"workload": "nl2repo-122b", "policy": "greedy"}, "unknown policy"),
        ({"workload": "nl2repo-122b", "policy": "elastic", "num_cells": 5}, "do not divide"),
        ({"workload": "nl2repo-122b", "policy": "elastic", "num_cells": 1}, "at least 2 cells"),
        ({"workload": "nl2repo-2.4t", "policy": "elastic", "num_cells": 8}, "training replica"),
        ({"workload": "nl2repo-122b", "policy": "elastic", "steps": 3, "target_staleness": 9.0}, "unreachable"),
    ],
)
def test_bad_input_names_the_constraint(kwargs, message):
    with pytest.raises(SchedulingConfigError, match=message):
        api.simulate(**kwargs)


def test_gantt_and_duckdb(tmp_path):
    result = api.simulate("terminalbench-122b", "elastic", steps=3, target_staleness=None)
    png = api.plot_gantt(result, tmp_path / "gantt.png")
    assert png.stat().st_size > 10_000
    con = duckdb.connect()
    assert api.write_results({"a": result, "b": result}, con, sweep_id="t") == 2
    api.write_results([result], con, sweep_id="t2")
    rows = con.execute("SELECT sweep_id, run_index, policy FROM sim_results ORDER BY run_index").fetchall()
    assert rows == [("t", 0, "elastic"), ("t", 1, "elastic"), ("t2", 2, "elastic")]
    assert con.execute("SELECT count(*) FROM sim_cell_usage").fetchone()[0] == 3 * 8
    path = tmp_path / "sweep.duckdb"
    api.write_results([result], path)
    assert duckdb.connect(str(path)).execute("SELECT count(*) FROM sim_results").fetchone()[0] == 1
    # a file written before the bound columns existed keeps its rows and gains the columns
    old = duckdb.connect(str(tmp_path / "old.duckdb"))
    old.execute("CREATE TABLE sim_results (sweep_id VARCHAR, run_index INTEGER, policy VARCHAR, makespan_h DOUBLE)")
    old.execute("INSERT INTO sim_results VALUES ('before', 0, 'colocate', 9.5)")
    api.write_results([result], old, sweep_id="after")
    rows = old.execute("SELECT sweep_id, run_index, policy, lower_bound_room_h IS NULL FROM sim_results ORDER BY run_index")
    assert rows.fetchall() == [("before", 0, "colocate", True), ("after", 1, "elastic", False)]


@pytest.mark.parametrize("workload", ["deepswe-122b", "nl2repo-122b"])
def test_every_lower_bound_holds_for_every_policy_room_and_seed(workload):
    """The room bound claims no schedule with the same staleness room finishes sooner: check
    it (and the work and critical-path bounds) against every policy, several rooms and seeds."""
    from gyre.sim.tuning import run_once
    from gyre.sim.workloads import get_workload

    spec = get_workload(workload)
    for policy in api.policy_names():
        for lookahead in (0, 5, 17, 40):
            for seed in (0, 1):
                r = run_once(spec, policy, 8, lookahead, seed=seed)
                for bound in (r.lower_bound_work_h, r.lower_bound_critical_path_h, r.lower_bound_room_h):
                    assert bound <= r.makespan_h * (1 + 1e-9), (policy, lookahead, seed, bound, r.makespan_h)
                assert r.capacity_efficiency <= r.efficiency <= 1.0
