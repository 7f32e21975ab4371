"""The chaos run's verdicts (gyre/benches/chaos_checks.py) read a real run file: a consistent small
run holds every check, and each kind of damage a chaos run could do fails the check that owns it."""

from __future__ import annotations

import pytest

from gyre.benches.chaos_checks import Kill, chaos_checks
from gyre.cells import events as ev
from gyre.storage.store import RunStore

STEPS, PER_STEP, PER_MICRO = 2, 4, 2
ENGINES = {0: "torch-0", 1: "cell-1", 2: "cell-2"}


def _run(store: RunStore) -> tuple[list, dict, list[Kill]]:
    """Two steps of four executions (two micro-steps each); cell 1 killed at 5 s, noticed at 5.6 s;
    one of step 0's micro-steps reduced from cell 2, the rest the core's (one recomputed after the kill)."""
    log, executions, calls, tokens, segments = [], [], [], [], []
    for s in range(STEPS):
        for i in range(PER_STEP):
            eid = s * PER_STEP + i
            log.append((float(eid), ev.DispatchExecution(eid, s, s)))
            name = f"s{s}-e{i}"
            executions.append({"execution_id": name, "step": s, "purpose": "train", "status": "completed",
                               "eval_status": "ok", "score": 1.0, "num_calls": 1})
            calls.append({"call_id": f"c-{name}", "execution_id": name, "output_tokens": 6})
            tokens.append({"call_id": f"c-{name}", "prompt_ids": [1], "output_ids": [2] * 6, "logprobs": [0.0] * 6})
            # the call moved from the killed cell 1 to cell 2 half way: two segments cover its output
            segments += [{"call_id": f"c-{name}", "execution_id": name, "segment_index": 0, "engine_id": "cell-1",
                          "output_start": 0, "output_end": 3},
                         {"call_id": f"c-{name}", "execution_id": name, "segment_index": 1, "engine_id": "cell-2",
                          "output_start": 3, "output_end": 6}]
        for m in range(PER_STEP // PER_MICRO):
            ids = tuple(s * PER_STEP + m * PER_MICRO + k for k in range(PER_MICRO))
            log.append((10.0 + s, ev.ClaimMicroStep(2 if (s, m) == (0, 0) else 0, m, s, ids, 100)))
    store.append("executions", executions)
    store.append("calls", calls)
    store.append("call_tokens", tokens)
    store.append("call_segments", segments)
    store.append("steps", [{"step": s, "policy_version": s + 1} for s in range(STEPS)])
    store.append("grad_reductions", [{"step": 0, "cells": [2], "micro_steps": 1, "recomputed": 0}])
    store.append("cell_faults", [{"cell": 1, "at_s": 5.6, "what": "failed"}, {"cell": 1, "at_s": 9.0, "what": "rejoined"}])
    store.append("role_switches", [{"cell": 2, "from_role": "rollout", "to_role": "train", "seconds": 0.1}])
    applied = {0: {0: 2, 1: 0}, 1: {0: 0, 1: 0}}
    return log, applied, [Kill(5.0, 1, 4242)]


def _checks(store, log, applied, kills, **over):
    args = {"steps": STEPS, "executions_per_step": PER_STEP, "victim": 1, "max_restarts": 3,
            "faults_in_memory": 2, "switches_in_memory": 1, **over}
    return chaos_checks(store, kills, log, applied, ENGINES, **args)


@pytest.fixture
def store(tmp_path):
    s = RunStore(tmp_path / "gyre.duckdb")
    yield s
    s.close()


def test_a_whole_run_holds_every_check(store):
    log, applied, kills = _run(store)
    result = _checks(store, log, applied, kills)
    assert result["verdict"], result
    assert result["deaths"]["noticed"] == 1 and result["deaths"]["notice_s"]["max"] == pytest.approx(0.6)
    assert result["executions"]["served_by_a_killed_cell"] == 8
    assert result["steps"]["micro_steps"][0] == {"claimed": 2, "applied": 2, "by_core": 1, "reduced": 1,
                                                 "claimed_without_rows": 0}


def test_a_death_without_its_failed_row_is_unnoticed(store):
    log, applied, kills = _run(store)
    kills.append(Kill(20.0, 2, 4343))  # cell 2 killed, no `failed` row for it
    result = _checks(store, log, applied, kills)
    assert not result["every_death_noticed"] and not result["verdict"]
    assert result["deaths"]["unnoticed"] == [{"at_s": 20.0, "cell_id": 2, "pid": 4343}]


def test_a_victim_killed_past_its_restarts_must_be_lost(store):
    log, applied, kills = _run(store)
    kills = [Kill(5.0 + i, 1, 100 + i) for i in range(4)]
    store.append("cell_faults", [{"cell": 1, "at_s": 6.1 + i, "what": "failed"} for i in range(1, 4)])
    result = _checks(store, log, applied, kills, faults_in_memory=5)
    assert result["deaths"]["noticed"] == 4 and result["deaths"]["victim_lost"] is False
    assert not result["every_death_noticed"]


def test_an_execution_neither_scored_nor_dropped_fails_and_a_dropped_zero_is_not_a_drop(store):
    log, applied, kills = _run(store)
    store.query("UPDATE executions SET eval_status = NULL, score = NULL WHERE execution_id = 's0-e1'")
    store.query("UPDATE executions SET eval_status = 'error', score = 0.0 WHERE execution_id = 's1-e1'")
    result = _checks(store, log, applied, kills)
    assert not result["every_execution_scored_or_dropped"]
    assert result["executions"]["neither"] == 2 and result["executions"]["served_by_a_killed_cell_scored_or_dropped"] == 6


def test_a_micro_step_both_reduced_and_recomputed_is_applied_twice(store):
    log, applied, kills = _run(store)
    applied[0][0] = 0  # the core recomputed micro-step 0 ... while cell 2's gradients for it arrived too
    result = _checks(store, log, applied, kills)
    assert not result["no_step_applied_twice"] and not result["steps"]["each_micro_step_once"]


def test_a_step_recorded_twice_or_an_execution_in_two_micro_steps_fails(store):
    log, applied, kills = _run(store)
    store.append("steps", [{"step": 1, "policy_version": 2}])
    assert not _checks(store, log, applied, kills)["steps"]["each_step_once"]
    log2 = [*log, (30.0, ev.ClaimMicroStep(0, 2, 1, (4, 5), 100))]  # executions 4 and 5 again, in another
    assert not _checks(store, log2, applied, kills)["steps"]["executions_split_once"]


def test_records_lost_from_duckdb_fail_nothing_lost(store):
    log, applied, kills = _run(store)
    store.query("DELETE FROM call_tokens WHERE call_id = 'c-s0-e0'")
    store.query("DELETE FROM call_segments WHERE call_id = 'c-s0-e1' AND segment_index = 1")
    store.query("DELETE FROM calls WHERE call_id = 'c-s1-e0'")
    lost = _checks(store, log, applied, kills, switches_in_memory=2)["records"]
    assert not lost["holds"]
    assert (lost["calls_without_tokens"], lost["calls_whose_segments_differ"], lost["executions_whose_calls_differ"],
            lost["role_switches_rows"], lost["switches_in_memory"]) == (1, 1, 1, 1, 2)
    log3 = [*log, (40.0, ev.DispatchExecution(99, 9, 1))]  # dispatched, never recorded
    assert _checks(store, log3, applied, kills)["records"]["dispatched"] == STEPS * PER_STEP + 1


def test_the_scale_bench_sizes_each_run_for_two_steps_in_flight():
    from pathlib import Path

    from gyre.benches.cells_scale import DEFAULT_CONFIG, scale_config
    from gyre.config.run import load_config

    base = load_config(Path(__file__).parent.parent / DEFAULT_CONFIG)
    config = scale_config(base, 16, 8, 3, ranks=2)
    s = config.scheduler
    assert (s.policy, s.runtime, s.num_cells, s.slots_per_cell, s.ranks_per_cell) == ("elastic", "ray", 16, 8, 2)
    # 128 slots hold two steps of 16 groups of 4; the benchmark has queries for four steps
    assert config.rollout.queries_per_step * config.rollout.group_size * 2 == 16 * 8
    assert config.benchmark.num_queries >= 4 * config.rollout.queries_per_step and config.steps == 3
    assert config.rollout.engine == "paced"
