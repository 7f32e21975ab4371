"""Tree packing and per-trajectory packing give the naive expansion's loss and gradients.

The reference here is written independently of gyre.trajectories: each kept trajectory
is its last call's prompt + output, trained as its own causal row; a target is identified
by its full prefix (a dict trie over the raw calls), trainable if the call that first
produced that prefix sampled it, and counted by the first kept trajectory (rank order)
that contains it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gyre.algo.gspo import GSPO
from gyre.engines.torch.train import TorchTrainEngine, token_logprobs
from gyre.trajectories.packing import PerTrajectoryPacker, TreePacker
from gyre.trajectories.processor import ProcessorSettings, plan
from gyre.trajectories.rows import TrainSequence
from gyre.trajectories.synthetic import SyntheticSpec, generate

SMALL = dict(
    vocab_size=500, system_block_tokens=(6, 20, 8), tool_defs=(2, 4), tool_def_tokens=(5, 15), task_tokens=(5, 20),
    output_tokens=(3, 25), tool_result_tokens=(3, 40), context_limit=260, compaction_marker_tokens=6,
    summary_tokens=(8, 20), subagent_prob=0.25, subagent_calls=(1, 3), subagent_system_tokens=12,
    subagent_tool_defs=(1, 2), subagent_context_limit=150, retry_prob=0.2,
)


def _small(seed: int, total: int = 900, **over) -> list:
    return generate(SyntheticSpec(total_tokens=total, seed=seed, **{**SMALL, **over}), f"e{seed}").calls


def reference_rows(plans, advantages) -> list[TrainSequence]:
    """Naive expansion from the raw calls: one plain row per kept trajectory."""
    rows = []
    for p in plans:
        trie: dict[tuple[int, int], int] = {}
        info: list[tuple[bool, float]] = []
        for call in p.tree.calls:  # start order
            key = -1
            seq = np.concatenate([call.prompt_ids, call.output_ids])
            for t, tok in enumerate(seq.tolist()):
                nxt = trie.get((key, tok))
                if nxt is None:
                    nxt = trie[(key, tok)] = len(info)
                    out = t >= len(call.prompt_ids)
                    info.append((out, float(call.logprobs[t - len(call.prompt_ids)]) if out else 0.0))
                key = nxt
        sequences, owned, seen = [], [], set()
        for traj in p.kept:
            leaf = p.tree.calls[traj.leaf_call]
            seq = np.concatenate([leaf.prompt_ids, leaf.output_ids])
            keys, key = [], -1
            for tok in seq.tolist():
                key = trie[(key, tok)]
                keys.append(key)
            mine = [info[k][0] and k not in seen for k in keys]
            seen.update(k for k, m in zip(keys, mine) if m)
            sequences.append((seq, keys))
            owned.append(mine)
        num_targets = len(seen)
        for (seq, keys), mine in zip(sequences, owned):
            if not any(mine):
                continue
            w = 1.0 / num_targets / len(plans)
            rows.append(TrainSequence(
                tokens=seq.tolist(), trainable=mine, behaviour_logprobs=[info[k][1] for k in keys],
                weights=[w if m else 0.0 for m in mine], advantage=advantages[p.execution_id],
            ))
    return rows


def _loss_and_grads(engine, rows, loss_fn):
    stats = engine.forward_backward(rows, loss_fn)
    grads = {n: p.grad.detach().clone() for n, p in engine.model.named_parameters() if p.grad is not None}
    return stats.loss, grads


def _plans(seeds, jmax, advantages):
    return [plan(_small(s), advantages[f"e{s}"], ProcessorSettings(jmax=jmax)) for s in seeds]


@pytest.mark.slow
@pytest.mark.parametrize("jmax", [2, None])
def test_tree_and_per_trajectory_packing_match_the_naive_expansion(tiny_model_dir, jmax):
    engine = TorchTrainEngine(tiny_model_dir, lr=1e-3, micro_batch_tokens=4096)
    seeds = [1, 2, 3]
    advantages = {"e1": 1.0, "e2": -0.5, "e3": 2.0}
    plans = _plans(seeds, jmax, advantages)
    # off-policy behaviour log-probs, so ratios differ from 1 and the clip and cap matter
    loss_fn = GSPO(seq_clip_low=0.5, seq_clip_high=2.0).loss
    ref_loss, ref_grads = _loss_and_grads(engine, reference_rows(plans, advantages), loss_fn)
    for rows in (PerTrajectoryPacker().pack(plans, 3), TreePacker(row_tokens=1500).pack(plans, 3),
                 TreePacker(row_tokens=300).pack(plans, 3)):
        loss, grads = _loss_and_grads(engine, rows, loss_fn)
        assert loss == pytest.approx(ref_loss, abs=1e-5)
        assert grads.keys() == ref_grads.keys()
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], atol=1e-5, rtol=0, msg=name)
    tree_rows = TreePacker(row_tokens=1500).pack(plans, 3)
    assert sum(len(r.tokens) for r in tree_rows) < sum(len(r.tokens) for r in PerTrajectoryPacker().pack(plans, 3))


def test_tree_row_scores_each_token_as_its_own_path_does(tiny_model_dir):
    """Log-probs from one tree row equal those of each trajectory's own causal row."""
    engine = TorchTrainEngine(tiny_model_dir, lr=1e-3)
    (p,) = _plans([4], None, {"e4": 1.0})
    (row,) = TreePacker(row_tokens=10**6).pack([p], 1)
    from gyre.engines.torch.train import _collate

    cols = _collate([row], engine.pad_id, "mask")
    with torch.no_grad():
        tree_logp = token_logprobs(engine.model, cols["input_ids"], cols["attention"], 1.0,
                                   cols["position_ids"], cols["prev"])[0]
    span_nodes = _span_nodes(row, p)
    for traj in p.kept:
        tokens = torch.tensor(np.concatenate([n.tokens for n in traj.nodes]), dtype=torch.long)[None]
        with torch.no_grad():
            own = token_logprobs(engine.model, tokens, torch.ones_like(tokens), 1.0)[0]
        at = 0
        for node in traj.nodes:
            lo = int(row.tree.span_starts_S[next(i for i, n in enumerate(span_nodes) if n is node)])
            skip = 1 if at == 0 else 0  # the first token of a path has no context
            torch.testing.assert_close(tree_logp[lo + skip: lo + node.n], own[at + skip: at + node.n],
                                       atol=1e-5, rtol=0)
            at += node.n


def _span_nodes(row, p):
    """The tree nodes of a one-execution tree row, in span order (by position ids and tokens)."""
    nodes = {n.index: n for n in p.tree.nodes}
    out = []
    starts = list(row.tree.span_starts_S) + [len(row.tokens)]
    for lo, hi in zip(starts[:-1], starts[1:]):
        depth = int(row.tree.position_ids_T[lo])
        match = [n for n in nodes.values() if n.start_depth == depth and n.n == hi - lo
                 and np.array_equal(n.tokens, np.asarray(row.tokens[lo:hi]))]
        out.append(match[0])
    return out
