"""Calls chain into trajectories; targets count once; weights average per execution."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gyre.records import Call
from gyre.trajectories.chains import build_trajectories, to_train_sequences

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _call(i, prompt, output, eid="e1"):
    return Call(call_id=f"c{i}", execution_id=eid, prompt_ids=prompt, output_ids=output,
                logprobs=[-0.1 * (j + 1) for j in range(len(output))], policy_version=0, engine_id="x",
                finish_reason="stop", started_at=T0 + timedelta(seconds=i))


def test_extending_calls_form_one_chain_with_exact_targets():
    calls = [_call(0, [1, 2], [3, 4]), _call(1, [1, 2, 3, 4, 9], [5])]
    (traj,) = build_trajectories(calls)
    assert traj.tokens == [1, 2, 3, 4, 9, 5]
    assert traj.trainable == [False, False, True, True, False, True]
    assert traj.behaviour_logprobs == pytest.approx([0, 0, -0.1, -0.2, 0, -0.1])
    assert traj.call_ids == ["c0", "c1"]


def test_a_diverging_call_starts_a_branch_and_shared_targets_count_once():
    calls = [_call(0, [1], [2, 3]), _call(1, [1, 2, 3, 7], [8]), _call(2, [1, 2, 3, 6], [9, 9])]
    trajs = build_trajectories(calls)
    assert [t.kind for t in trajs] == ["main", "branch"]
    # The branch does not extend the main chain's full token list, so it starts fresh and
    # repeats call 0's targets as prompt tokens: not trainable there.
    seqs = to_train_sequences({"e1": trajs}, {"e1": 1.0})
    trained = sum(sum(s.trainable) for s in seqs)
    assert trained == 2 + 1 + 2
    total_weight = sum(w for s in seqs for w in s.weights)
    assert total_weight == pytest.approx(1.0)


def test_weights_average_within_then_across_executions():
    e1 = build_trajectories([_call(0, [1], [2, 3, 4, 5], "e1")])
    e2 = build_trajectories([_call(0, [1], [2], "e2")])
    e3 = build_trajectories([_call(0, [1], [2], "e3")])
    seqs = to_train_sequences({"e1": e1, "e2": e2, "e3": e3}, {"e1": 1.0, "e2": -1.0})
    per_exec = {}
    for s in seqs:
        per_exec[s.execution_id] = per_exec.get(s.execution_id, 0.0) + sum(s.weights)
    assert per_exec == pytest.approx({"e1": 0.5, "e2": 0.5})  # e3 has no advantage: not trained
    assert [s.advantage for s in seqs] == [1.0, -1.0]


def test_calls_of_two_executions_are_refused():
    with pytest.raises(ValueError, match="one execution"):
        build_trajectories([_call(0, [1], [2], "a"), _call(1, [1], [2], "b")])


def test_mismatched_logprobs_are_refused():
    with pytest.raises(ValueError, match="logprobs"):
        Call(call_id="c", execution_id="e", prompt_ids=[1], output_ids=[2, 3], logprobs=[-1.0],
             policy_version=0, engine_id="x", finish_reason="stop")
