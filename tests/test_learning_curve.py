"""The run's headline: held-out pass rate in the first quarter of steps against the last."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gyre.records import EvalRecord, utc_now
from gyre.report.learning_curve import quarter_gain, read_eval_rounds
from gyre.storage.store import RunStore


def test_quarters_take_the_rounds_of_the_first_and_last_quarter_of_steps():
    rounds = [(0, 0.2), (4, 0.25), (8, 0.3), (12, 0.35), (16, 0.45)]
    gain = quarter_gain(rounds, 16)
    assert gain.first_steps == (0,) and gain.first_mean == pytest.approx(0.2)
    assert gain.last_steps == (12, 16) and gain.last_mean == pytest.approx(0.4)
    assert gain.gain_points == pytest.approx(20.0)
    assert "+20.0 points" in gain.describe()


def test_rounds_without_a_rate_are_skipped_and_missing_sides_say_so():
    gain = quarter_gain([(0, None), (3, 0.5)], 12)
    assert gain.first_steps == () and gain.first_mean is None and gain.gain_points is None
    assert "n/a" in gain.describe()
    with pytest.raises(ValueError):
        quarter_gain([], 0)


def test_read_eval_rounds_from_a_run_file(tmp_path):
    store = RunStore(tmp_path / "gyre.duckdb")
    now = utc_now()
    store.append_evals([
        EvalRecord(step=s, policy_version=s, pass_rate=r, num_executions=4, num_dropped=0, started_at=now, finished_at=now)
        for s, r in ((0, 0.25), (4, 0.5))
    ])
    store.close()
    assert read_eval_rounds(tmp_path / "gyre.duckdb") == [(0, 0.25), (4, 0.5)]


def test_a_rounds_newest_row_wins_even_when_every_evaluation_failed(tmp_path):
    """A resumed run re-evaluates step 4: its newer round, all evaluator failures (pass rate NULL),
    is the one read back, not the older rate."""
    store = RunStore(tmp_path / "gyre.duckdb")
    now = utc_now()
    later = now + timedelta(minutes=5)
    store.append_evals([
        EvalRecord(step=4, policy_version=4, pass_rate=0.5, num_executions=4, num_dropped=0, started_at=now,
                   finished_at=now),
        EvalRecord(step=4, policy_version=4, pass_rate=None, num_executions=4, num_dropped=4, started_at=later,
                   finished_at=later),
    ])
    store.close()
    assert read_eval_rounds(tmp_path / "gyre.duckdb") == [(4, None)]
