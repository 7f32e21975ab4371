"""The run store: schema, batched appends, rows survive a failed batch."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from gyre.records import Call, EvalStatus, Execution, ExecutionStatus, Score, StepRecord, utc_now
from gyre.storage.store import RunStore


def _call(i):
    return Call(call_id=f"c{i}", execution_id="e", prompt_ids=list(range(i + 1)), output_ids=[7, 8],
                logprobs=[-0.5, -0.25], policy_version=1, engine_id="torch-0", finish_reason="stop")


def test_batched_appends_land_in_every_table(tmp_path):
    store = RunStore(tmp_path / "gyre.duckdb")
    assert store.append_calls([_call(i) for i in range(1000)]) == 1000
    ex = Execution(execution_id="e", step=0, query_id="q", benchmark="tiny", group_index=0,
                   status=ExecutionStatus.completed, workspace=Path("/w"), policy_version_dispatched=0)
    store.append_executions([(ex, Score(execution_id="e", status=EvalStatus.ok, score=0.5, tests_passed=1,
                                        tests_total=2), 0, 0.7)])
    now = utc_now()
    store.append_steps([StepRecord(step=0, policy_version=1, reward_mean=0.5, num_executions=1, num_dropped=0,
                                   mean_staleness=0.0, logprob_abs_diff=1e-6, loss=0.1, grad_norm=0.2,
                                   tokens_trained=2, started_at=now, finished_at=now)])
    store.close()
    con = duckdb.connect(str(tmp_path / "gyre.duckdb"), read_only=True)
    assert con.execute("select count(*), sum(output_tokens) from calls").fetchone() == (1000, 2000)
    assert con.execute("select prompt_ids, output_ids from call_tokens where call_id='c2'").fetchone() == (
        [0, 1, 2], [7, 8])
    assert con.execute("select status, eval_status, score, advantage from executions").fetchone() == (
        "completed", "ok", 0.5, 0.7)
    assert con.execute("select step, policy_version, logprob_abs_diff from steps").fetchone() == (0, 1, 1e-6)


def test_a_bad_batch_is_refused_whole_and_earlier_rows_stay(tmp_path):
    store = RunStore(tmp_path / "gyre.duckdb")
    store.append_calls([_call(0)])
    with pytest.raises(ValueError, match="unknown columns"):
        store.append("calls", [{"call_id": "x", "bogus": 1}])
    with pytest.raises(duckdb.Error):
        store.append("steps", [{"step": "not a number"}])
    assert store.query("select count(*) from calls") == [(1,)]
    assert store.query("select count(*) from steps") == [(0,)]
    store.close()
    reopened = RunStore(tmp_path / "gyre.duckdb")  # reopening keeps the schema and the rows
    assert reopened.query("select count(*) from calls") == [(1,)]
    reopened.close()


def test_segments_and_fallback_spans_show_which_engines_served_each_call(tmp_path):
    from gyre.records import OutputSegment

    moved = Call(call_id="m", execution_id="e1", prompt_ids=list(range(20)), output_ids=[1, 2, 3, 4, 5],
                 logprobs=[-0.1] * 5, policy_version=3, engine_id="a", finish_reason="stop",
                 segments=[OutputSegment(engine_id="a", policy_version=3, start=0, end=2),
                           OutputSegment(engine_id="b", policy_version=4, start=2, end=5)],
                 prompt_fallback_spans=[(4, 9), (12, 15)])
    plain = _call(1)  # recorded without segments: one segment of its engine
    empty = Call(call_id="z", execution_id="e1", prompt_ids=[1], output_ids=[], logprobs=[], policy_version=0,
                 engine_id="", finish_reason="abort")
    store = RunStore(tmp_path / "gyre.duckdb")
    store.append_calls([moved, plain, empty])
    assert store.query("select call_id, segment_index, engine_id, policy_version, output_start, output_end "
                       "from call_segments order by call_id, segment_index") == [
        ("c1", 0, "torch-0", 1, 0, 2), ("m", 0, "a", 3, 0, 2), ("m", 1, "b", 4, 2, 5)]
    assert store.query("select call_id, execution_id, prompt_start, prompt_end from call_fallbacks "
                       "order by prompt_start") == [("m", "e1", 4, 9), ("m", "e1", 12, 15)]
    assert store.query("select count(*) from calls") == [(3,)]
    store.close()
