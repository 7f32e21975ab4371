"""Property tests (hypothesis) of the trajectory processor over random call streams.

A stream is built like a harness would: each call starts a fresh context, extends an
earlier call's prompt + output (with a tool result), re-sends an earlier prompt (a
retry), or cuts an earlier sequence short and continues differently. A tiny vocabulary
makes outputs collide with existing runs, so shared targets and mid-node splits are common.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.algo.gspo import GSPO
from gyre.trajectories.packing import PerTrajectoryPacker, TreePacker
from gyre.trajectories.processor import ProcessorSettings, plan
from gyre.trajectories.sampling import rank_key
from gyre.trajectories.tokens import CallTokens
from tests.test_packing import _loss_and_grads, reference_rows

VOCAB = 6


@st.composite
def call_streams(draw, eid="e", max_calls=10):
    tokens = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)
    calls: list[CallTokens] = []
    for i in range(draw(st.integers(1, max_calls))):
        op = draw(st.sampled_from(["fresh", "extend", "retry", "cut"])) if calls else "fresh"
        if op == "fresh":
            prompt = draw(tokens)
        else:
            base = calls[draw(st.integers(0, len(calls) - 1))]
            full = np.concatenate([base.prompt_ids, base.output_ids]).tolist()
            if op == "extend":
                prompt = full + draw(tokens)
            elif op == "retry":
                prompt = base.prompt_ids.tolist()
            else:
                prompt = full[: draw(st.integers(1, len(full)))] + draw(tokens)
        output = draw(st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=6))
        logprobs = draw(st.lists(st.floats(-3.0, 0.0), min_size=len(output), max_size=len(output)))
        agent = draw(st.sampled_from([None, None, "main", "sub"]))
        calls.append(CallTokens(f"{eid}{i}", eid, np.asarray(prompt, np.int32), np.asarray(output, np.int32),
                                np.asarray(logprobs, np.float32), agent_id=agent, started_at=float(i)))
    return calls


def _prefix_keys(plans):
    """Reference targets: (execution, full prefix) of every trainable token on a kept path."""
    keys = set()
    for p in plans:
        produced: dict[tuple, bool] = {}
        for call in p.tree.calls:
            seq = np.concatenate([call.prompt_ids, call.output_ids]).tolist()
            for t in range(len(seq)):
                produced.setdefault(tuple(seq[: t + 1]), t >= len(call.prompt_ids))
        for traj in p.kept:
            leaf = p.tree.calls[traj.leaf_call]
            seq = np.concatenate([leaf.prompt_ids, leaf.output_ids]).tolist()
            keys |= {(p.execution_id, tuple(seq[: t + 1])) for t in range(len(seq)) if produced[tuple(seq[: t + 1])]}
    return keys


def _trained_keys(rows):
    """(execution, full prefix) of every trained token of packed rows, with repetitions."""
    out = []
    for row in rows:
        tokens = np.asarray(row.tokens).tolist()
        trainable = np.asarray(row.trainable)
        if row.tree is None:
            out += [(row.execution_id, tuple(tokens[: t + 1])) for t in np.flatnonzero(trainable)]
            continue
        starts = list(row.tree.span_starts_S) + [len(tokens)]
        parents = list(row.tree.span_parent_S)
        for s, (lo, hi) in enumerate(zip(starts[:-1], starts[1:])):
            chain, a = [], parents[s]
            while a >= 0:
                chain.append(a)
                a = parents[a]
            prefix = [tok for a in reversed(chain) for tok in tokens[starts[a] : starts[a + 1]]]
            for t in range(lo, hi):
                if trainable[t]:
                    eid = row.segment_execution_ids[row.segment_ids[t]]
                    out.append((eid, tuple(prefix + tokens[lo : t + 1])))
    return out


def _token_executions(row):
    if row.tree is None:
        return [row.execution_id] * len(row.tokens)
    return [row.segment_execution_ids[s] if s >= 0 else "" for s in np.asarray(row.segment_ids)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(call_streams(), min_size=1, max_size=3), st.sampled_from([1, 2, 5, None]), st.integers(1, 40))
def test_every_kept_target_is_trained_once_and_weights_sum_to_one(streams, jmax, row_tokens):
    plans = []
    for e, calls in enumerate(streams):
        calls = [CallTokens(c.call_id, f"x{e}", c.prompt_ids, c.output_ids, c.logprobs, agent_id=c.agent_id,
                            started_at=c.started_at) for c in calls]
        p = plan(calls, 1.0, ProcessorSettings(jmax=jmax))
        if p.num_targets:
            plans.append(p)
    expected = _prefix_keys(plans)
    for rows in (PerTrajectoryPacker().pack(plans, len(plans)), TreePacker(row_tokens).pack(plans, len(plans))):
        trained = _trained_keys(rows)
        assert len(trained) == len(set(trained))  # once
        assert set(trained) == expected  # every kept target, nothing else
        per_execution: dict[str, float] = {}
        for row, execs in ((r, _token_executions(r)) for r in rows):
            for eid, w in zip(execs, np.asarray(row.weights, dtype=np.float64)):
                if w:
                    per_execution[eid] = per_execution.get(eid, 0.0) + w
        assert all(v * len(plans) == pytest.approx(1.0, rel=1e-5) for v in per_execution.values())
        assert len(per_execution) == len(plans)


@settings(max_examples=60, deadline=None)
@given(call_streams(max_calls=14), st.sampled_from([1, 2, 3, 5, None]))
def test_jmax_is_respected_in_rank_order(calls, jmax):
    p = plan(calls, 1.0, ProcessorSettings(jmax=jmax))
    everything = p.tree.trajectories
    assert len(p.kept) == (len(everything) if jmax is None else min(jmax, len(everything)))
    assert [rank_key(t) for t in p.kept] == sorted(rank_key(t) for t in p.kept)
    dropped = [t for t in everything if t not in p.kept]
    assert all(rank_key(k) < rank_key(d) for k in p.kept for d in dropped)
    # a trajectory's tokens are its last call's prompt + output
    for t in everything:
        leaf = p.tree.calls[t.leaf_call]
        assert np.array_equal(p.tree.path_tokens(t), np.concatenate([leaf.prompt_ids, leaf.output_ids]))


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(call_streams(max_calls=8), min_size=1, max_size=2), st.sampled_from([2, None]))
def test_tree_packing_agrees_with_the_naive_expansion(tiny_engine, streams, jmax):
    plans = []
    for e, calls in enumerate(streams):
        calls = [CallTokens(c.call_id, f"x{e}", c.prompt_ids + 10, c.output_ids + 10, c.logprobs,
                            started_at=c.started_at) for c in calls]
        p = plan(calls, [1.0, -2.0][e], ProcessorSettings(jmax=jmax))
        if p.num_targets:
            plans.append(p)
    if not plans:
        return
    loss_fn = GSPO(seq_clip_low=0.5, seq_clip_high=2.0).loss
    advantages = {p.execution_id: p.advantage for p in plans}
    ref_loss, ref_grads = _loss_and_grads(tiny_engine, reference_rows(plans, advantages), loss_fn)
    loss, grads = _loss_and_grads(tiny_engine, TreePacker(10**6).pack(plans, len(plans)), loss_fn)
    assert loss == pytest.approx(ref_loss, abs=1e-5)
    for name, g in grads.items():
        assert float((g - ref_grads[name]).abs().max()) < 1e-5, name


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    from gyre.engines.torch.train import TorchTrainEngine

    return TorchTrainEngine(tiny_model_dir, lr=1e-3, micro_batch_tokens=4096)
