"""GSPO and group advantages against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from gyre.algo.advantages import group_advantages
from gyre.algo.gspo import GSPO, diagnostics, is_summed


def _loss(logp, behaviour, adv, weights=None, mask=None, algo=GSPO()):
    logp_BT = torch.tensor([logp], dtype=torch.float64, requires_grad=True)
    behaviour_BT = torch.tensor([behaviour], dtype=torch.float64)
    mask_BT = torch.tensor([mask or [True] * len(logp)])
    weight_BT = torch.tensor([weights or [1.0 / len(logp)] * len(logp)], dtype=torch.float64)
    loss, stats = algo.loss(logp_BT, behaviour_BT, mask_BT, weight_BT, torch.tensor([adv], dtype=torch.float64))
    loss.backward()
    return loss.item(), logp_BT.grad[0].tolist(), stats


def test_on_policy_reduces_to_policy_gradient():
    loss, grad, stats = _loss([-1.0, -2.0], [-1.0, -2.0], adv=2.0, weights=[0.25, 0.75])
    assert loss == pytest.approx(-2.0)
    assert grad == pytest.approx([-0.5, -1.5])
    assert stats["seq_ratio_mean"] == pytest.approx(1.0)


def test_sequence_ratio_is_exp_mean_token_log_ratio():
    # log r = [0, log 0.5] -> s = exp(log(0.5) / 2) = sqrt(0.5); A = 1 takes the unclipped branch.
    s = math.sqrt(0.5)
    loss, grad, stats = _loss([math.log(0.5), math.log(0.25)], [math.log(0.5), math.log(0.5)], adv=1.0)
    assert loss == pytest.approx(-s)
    assert grad == pytest.approx([-0.5 * s, -0.5 * s])
    assert stats["seq_ratio_mean"] == pytest.approx(s)
    assert stats["seq_clip_frac"] == 1.0


def test_clipped_branch_passes_no_gradient():
    # A = -1 with s = sqrt(0.5) < 0.995: min(-s, -0.995) = -0.995 is the clipped term.
    loss, grad, _ = _loss([math.log(0.5), math.log(0.25)], [math.log(0.5), math.log(0.5)], adv=-1.0)
    assert loss == pytest.approx(0.995)
    assert grad == pytest.approx([0.0, 0.0])


def test_token_ratio_is_capped_at_five():
    # one token with ratio 10 (capped to 5) and one with ratio 1: s = exp((log 5 + 0) / 2) = sqrt(5)
    loss, grad, stats = _loss([math.log(0.5), -1.0], [math.log(0.05), -1.0], adv=-1.0,
                              algo=GSPO(seq_clip_low=0.1, seq_clip_high=10.0))
    assert loss == pytest.approx(math.sqrt(5))
    assert grad[0] == 0.0  # the capped token passes no gradient
    assert grad[1] == pytest.approx(0.5 * math.sqrt(5))
    assert stats["token_cap_frac"] == pytest.approx(0.5)


def test_untrainable_tokens_do_not_count():
    loss, grad, _ = _loss([-1.0, -5.0], [-1.0, -1.0], adv=1.0, mask=[True, False], weights=[1.0, 1.0])
    assert loss == pytest.approx(-1.0)
    assert grad == pytest.approx([-1.0, 0.0])


def test_bad_hyperparameters_are_refused():
    with pytest.raises(ValueError):
        GSPO(token_ratio_cap=0.5)
    with pytest.raises(ValueError):
        GSPO(seq_clip_low=1.01)


def test_group_advantages_by_hand():
    adv = group_advantages({"a": 1.0, "b": 0.0, "c": 0.5, "d": None})
    # mean 0.5, population std sqrt(1/6)
    std = math.sqrt(((0.5) ** 2 * 2) / 3)
    assert adv["a"] == pytest.approx(0.5 / (std + 1e-6))
    assert adv["b"] == pytest.approx(-0.5 / (std + 1e-6))
    assert adv["c"] == 0.0
    assert "d" not in adv  # a failed evaluation is dropped, never a zero


def test_zero_variance_and_singleton_groups_give_no_gradient():
    assert group_advantages({"a": 0.3, "b": 0.3}) == {"a": 0.0, "b": 0.0}
    assert group_advantages({"a": 1.0, "b": None}) == {"a": 0.0}
    assert group_advantages({"a": 1.0, "b": 0.0}, normalize_std=False) == {"a": 0.5, "b": -0.5}
    with pytest.raises(ValueError, match="not finite"):
        group_advantages({"a": float("nan"), "b": 1.0})


def test_without_a_baseline_the_advantage_is_the_score():
    """`algo.baseline: none` (REINFORCE without a baseline): nothing pushed down, a group scored alike still trains,
    a failed evaluation still gets nothing; the run's config reaches the algorithm."""
    from gyre.algo import make_algorithm
    from gyre.config.run import AlgoConfig

    assert group_advantages({"a": 1.0, "b": 0.25, "c": 0.0, "d": None}, baseline="none") == {
        "a": 1.0, "b": 0.25, "c": 0.0}
    assert group_advantages({"a": 1.0, "b": 1.0}, baseline="none") == {"a": 1.0, "b": 1.0}
    algo = make_algorithm(AlgoConfig(baseline="none"))
    assert algo.advantages({"a": 0.5, "b": 0.5}) == {"a": 0.5, "b": 0.5}
    solved = make_algorithm(AlgoConfig(reward="solved"))  # partial credit ignored: 1 solved, 0 otherwise
    assert solved.advantages({"a": 1.0, "b": 0.75, "c": None}) == group_advantages({"a": 1.0, "b": 0.0})
    with pytest.raises(ValueError, match="baseline must be one of group_mean, none"):
        GSPO(baseline="running")
    with pytest.raises(ValueError, match="baseline"):
        AlgoConfig(baseline="running")


def test_step_diagnostics_add_up_over_micro_batches():
    """Counts from two micro-batches give the same diagnostics as one batch holding both."""
    algo = GSPO()
    # trajectory 0: ratios 1 (on policy); trajectory 1: s = sqrt(0.5) -> clipped low; trajectory 2: one
    # token at ratio 10 -> capped, s = sqrt(5) -> clipped high
    rows = [([-1.0, -2.0], [-1.0, -2.0]), ([math.log(0.5), math.log(0.25)], [math.log(0.5), math.log(0.5)]),
            ([math.log(0.5), -1.0], [math.log(0.05), -1.0])]
    sums: dict[str, float] = {}
    for logp, behaviour in rows:
        _, _, stats = _loss(logp, behaviour, adv=1.0, algo=algo)
        for key, value in stats.items():
            if is_summed(key):
                sums[key] = sums.get(key, 0.0) + value
    d = diagnostics(sums)
    assert d["clip_low_frac"] == pytest.approx(1 / 3) and d["clip_high_frac"] == pytest.approx(1 / 3)
    assert d["token_cap_frac"] == pytest.approx(1 / 6)
    assert d["mean_response_tokens"] == pytest.approx(2.0)
    nll = -sum(sum(logp) for logp, _ in rows) / 6
    assert d["sampled_entropy"] == pytest.approx(nll)
    assert diagnostics({}) == dict.fromkeys(d)


def test_negative_weight_scales_only_the_pushes_down():
    """`algo.negative_weight`: a failed sample's advantage shrinks by the factor, a solved one's is GSPO's own; 1 is
    the zero-sum default, out-of-range values are refused at the config and at the class."""
    from gyre.algo import make_algorithm
    from gyre.config.run import AlgoConfig

    scores = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0, "e": None}
    full = group_advantages(scores)
    asym = make_algorithm(AlgoConfig(negative_weight=0.25)).advantages(scores)
    assert set(asym) == {"a", "b", "c", "d"}
    assert asym["a"] == pytest.approx(full["a"]) and full["a"] > 0
    for eid in "bcd":
        assert full[eid] < 0 and asym[eid] == pytest.approx(0.25 * full[eid])
    assert sum(asym.values()) > 0 and sum(full.values()) == pytest.approx(0.0, abs=1e-9)
    assert make_algorithm(AlgoConfig()).advantages(scores) == full
    assert make_algorithm(AlgoConfig(negative_weight=0.0)).advantages({"a": 0.0, "b": 0.0}) == {"a": 0.0, "b": 0.0}
    with pytest.raises(ValueError, match="negative_weight"):
        GSPO(negative_weight=1.5)
    with pytest.raises(ValueError, match="negative_weight"):
        AlgoConfig(negative_weight=-0.1)
