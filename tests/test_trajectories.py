"""The trajectory processor: tree, kinds, Jmax sampling, targets once, weights, bad input."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from gyre.config.run import TrajectoryConfig
from gyre.records import Call
from gyre.trajectories.classify import ClassifierHints, RuleClassifier
from gyre.trajectories.packing import PerTrajectoryPacker, TreePacker
from gyre.trajectories.processor import ProcessorSettings, plan, process_batch, settings_from_config
from gyre.trajectories.sampling import rank_key, sample
from gyre.trajectories.synthetic import SyntheticSpec, generate
from gyre.trajectories.tokens import CallInputError, CallTokens
from gyre.trajectories.tree import build_tree

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _call(i, prompt, output, eid="e1", agent=None):
    return Call(call_id=f"c{i}", execution_id=eid, prompt_ids=prompt, output_ids=output, agent_id=agent,
                logprobs=[-0.1 * (j + 1) for j in range(len(output))], policy_version=0, engine_id="x",
                finish_reason="stop", started_at=T0 + timedelta(seconds=i))


def _tokens(i, prompt, output, eid="e1", logprobs=None):
    return CallTokens(f"c{i}", eid, np.asarray(prompt, np.int32), np.asarray(output, np.int32),
                      np.asarray(logprobs if logprobs is not None else [-0.5] * len(output), np.float32),
                      started_at=float(i))


def _settings(jmax=5):
    return ProcessorSettings(jmax=jmax)


def test_extending_calls_are_one_node_with_exact_targets():
    calls = [_call(0, [1, 2], [3, 4]), _call(1, [1, 2, 3, 4, 9], [5])]
    p = plan(calls, 1.0, _settings())
    (traj,) = p.kept
    assert len(p.tree.nodes) == 1 and traj.kind == "main"
    node = traj.nodes[0]
    assert node.tokens.tolist() == [1, 2, 3, 4, 9, 5]
    assert node.trainable.tolist() == [False, False, True, True, False, True]
    assert node.logprobs.tolist() == pytest.approx([0, 0, -0.1, -0.2, 0, -0.1])
    assert traj.call_indices == [0, 1] and p.num_targets == 3


def test_a_retry_branches_at_its_prompt_and_sorts_last():
    calls = [_call(0, [1, 2], [3]), _call(1, [1, 2, 3, 7], [8, 8]), _call(2, [1, 2, 3, 7], [9]),
             _call(3, [1, 2, 3, 7, 9, 4], [5])]
    p = plan(calls, 1.0, _settings(jmax=None))
    assert [t.retried for t in p.kept] == [False, True]  # call 1's prompt was re-sent by call 2
    assert p.kept[0].num_tokens == 7 and p.kept[1].num_tokens == 6
    # target 3 (call 0) is shared by both paths and counted once: 3, 9, 5 + the retry's 8, 8
    assert p.num_targets == 5
    rows = PerTrajectoryPacker().pack([p], 1)
    assert sum(int(np.sum(r.trainable)) for r in rows) == 5
    assert sum(float(np.sum(r.weights)) for r in rows) == pytest.approx(1.0)
    assert plan(calls, 1.0, _settings(jmax=1)).kept[0].retried is False


def test_a_prompt_that_contradicts_a_recorded_output_is_counted_and_never_trained():
    calls = [_call(0, [1, 2], [3, 4, 5]), _call(1, [1, 2, 3, 6, 5, 7], [8])]  # 6 replaces sampled 4
    p = plan(calls, 1.0, _settings(jmax=None))
    assert p.tree.contradictions == [1]
    assert p.num_targets == 4  # 3, 4, 5 of call 0 and 8 of call 1; the re-sent 6, 5 are context


def test_weights_average_within_then_across_executions():
    batch = process_batch(
        {"e1": [_call(0, [1], [2, 3, 4, 5], "e1")], "e2": [_call(0, [1], [2], "e2")], "e3": [_call(0, [1], [2], "e3")]},
        {"e1": 1.0, "e2": -1.0},
        ProcessorSettings(packing="per_trajectory"),
    )
    per_exec: dict[str, float] = {}
    for s in batch.sequences:
        per_exec[s.execution_id] = per_exec.get(s.execution_id, 0.0) + float(np.sum(s.weights))
    assert per_exec == pytest.approx({"e1": 0.5, "e2": 0.5})
    assert [d.execution_id for d in batch.drops] == ["e3"]  # no advantage: dropped, recorded


@pytest.mark.parametrize("packing", ["per_trajectory", "tree"])
def test_a_constant_token_norm_weighs_every_token_alike_whatever_its_execution_s_length(packing):
    calls = {"e1": [_call(0, [1], [2, 3, 4, 5], "e1")], "e2": [_call(0, [1], [2], "e2")]}
    settings = settings_from_config(TrajectoryConfig(packing=packing, loss_norm_tokens=8), 4096)
    assert settings.norm_tokens == 8
    batch = process_batch(calls, {"e1": 1.0, "e2": -1.0}, settings)
    for s in batch.sequences:
        assert np.asarray(s.weights)[np.asarray(s.trainable)] == pytest.approx(1 / 16)  # 1 / (N * E): N 8, E 2
    assert sum(float(np.sum(s.weights)) for s in batch.sequences) == pytest.approx(5 / 16)  # 5 targets
    assert [p.token_weight(2) for p in batch.plans] == pytest.approx([1 / 16, 1 / 16])  # per-exec mean: 1/8, 1/2
    with pytest.raises(ValueError, match="loss_norm_tokens"):
        TrajectoryConfig(loss_norm_tokens=0)


def _kinds(execution, **hints):
    tree = build_tree(execution.calls)
    return sorted(RuleClassifier(ClassifierHints(**hints)).classify(tree)), tree


@pytest.mark.parametrize("shares_prefix", [True, False])
def test_kinds_from_the_call_stream_match_the_agent_id_hints(shares_prefix):
    spec = SyntheticSpec(total_tokens=420_000, seed=3, compaction_shares_prefix=shares_prefix, retry_prob=0.0)
    blind, tree = _kinds(generate(spec))
    told, _ = _kinds(generate(replace(spec, agent_ids=True)))
    assert blind == told
    compactions = generate(spec).num_compactions
    assert compactions >= 1 and "sub-agent" in blind
    # the synthetic truth: one main-summary per compaction of the main agent; the main
    # contexts before each compaction end in it (shared prefix) or are main of their own
    assert blind.count("main-summary") == compactions
    assert blind.count("main") == (1 if shares_prefix else compactions + 1)


def test_compaction_marker_hint_marks_summaries_without_a_later_call():
    execution = generate(SyntheticSpec(total_tokens=170_000, seed=5, retry_prob=0.0, subagent_prob=0.0))
    calls = execution.calls
    # cut the stream right after the first compaction call: nothing continues from its summary
    first_summary = next(i for i, c in enumerate(calls) if len(c.prompt_ids) and
                         np.array_equal(c.prompt_ids[-len(execution.compaction_marker):], execution.compaction_marker))
    cut = calls[: first_summary + 1]
    blind, _ = _kinds(replace(execution, calls=cut))
    hinted, _ = _kinds(replace(execution, calls=cut), compaction_markers=(tuple(execution.compaction_marker.tolist()),))
    assert blind == ["main"]
    assert hinted == ["main-summary"]


def test_jmax_keeps_the_best_ranked_trajectories():
    p = plan(generate(SyntheticSpec(total_tokens=300_000, seed=1)).calls, 1.0, _settings(jmax=None))
    everything = p.tree.trajectories
    assert len(everything) > 5
    kept = sample(everything, 5)
    assert kept == sorted(everything, key=rank_key)[:5]
    assert [t.kind for t in kept][0] == "main"
    assert all(rank_key(k) <= rank_key(d) for k in kept for d in everything if d not in kept)
    with pytest.raises(ValueError, match="jmax"):
        sample(everything, 0)


def test_bad_input_is_a_clear_error_or_a_recorded_drop():
    with pytest.raises(CallInputError, match="2 output ids but 1 behaviour log-probs"):
        build_tree([_tokens(0, [1], [2, 3], logprobs=[-1.0])])
    with pytest.raises(CallInputError, match="empty prompt"):
        build_tree([_tokens(0, [], [2])])
    with pytest.raises(CallInputError, match="no calls"):
        build_tree([])
    with pytest.raises(CallInputError, match="one execution"):
        build_tree([_tokens(0, [1], [2], "a"), _tokens(1, [1], [2], "b")])
    with pytest.raises(KeyError, match="unknown execution ids"):
        process_batch({"e1": [_call(0, [1], [2])]}, {"e1": 1.0, "ghost": 1.0})
    batch = process_batch(
        {"ok": [_call(0, [1], [2], "ok")], "empty": [], "positive": [_tokens(0, [1], [2], "positive", [0.5])],
         "misfiled": [_call(0, [1], [2], "other")], "prompt-only": [_call(0, [1, 2], [], "prompt-only")]},
        {"ok": 1.0, "empty": 1.0, "positive": 1.0, "misfiled": 1.0, "prompt-only": 1.0},
    )
    reasons = {d.execution_id: d.reason for d in batch.drops}
    assert set(reasons) == {"empty", "positive", "misfiled", "prompt-only"}
    assert "above 0" in reasons["positive"] and "filed under" in reasons["misfiled"]
    assert [s.execution_id for s in batch.sequences] == ["ok"]
    assert batch.stats()["executions_dropped"] == 4


def test_tree_memory_is_linear_in_unique_tokens():
    execution = generate(SyntheticSpec(total_tokens=300_000, seed=2))
    tree = build_tree(execution.calls)
    sent = sum(c.num_tokens for c in execution.calls)
    stored = sum(len(n._tok) for n in tree.nodes)  # allocated capacity, not just used
    assert sent > 20 * tree.num_tokens  # the calls repeat their history ...
    assert stored <= 2.5 * tree.num_tokens  # ... the tree stores each token about once


def test_tree_packing_computes_fewer_tokens_and_holds_every_target_once():
    plans = [plan(generate(SyntheticSpec(total_tokens=120_000, seed=s, retry_prob=0.2)).calls, 1.0, _settings(None))
             for s in (1, 2)]
    naive = PerTrajectoryPacker().pack(plans, 2)
    tree = TreePacker(row_tokens=10**7).pack(plans, 2)
    assert sum(len(r.tokens) for r in tree) < sum(len(r.tokens) for r in naive)
    for rows in (naive, tree):
        assert sum(int(np.sum(r.trainable)) for r in rows) == sum(p.num_targets for p in plans)
        assert sum(float(np.sum(r.weights)) for r in rows) == pytest.approx(1.0, rel=1e-5)


def test_config_maps_to_settings():
    assert settings_from_config(TrajectoryConfig(jmax="uncapped"), 4096).jmax is None
    settings = settings_from_config(TrajectoryConfig(packing="per_trajectory"), 4096)
    assert settings.jmax == 5 and settings.packing == "per_trajectory" and settings.row_tokens == 4096
    with pytest.raises(ValueError, match="tokenizer"):
        settings_from_config(TrajectoryConfig(compaction_markers=["Your task is to create a detailed summary"]), 1)
