"""RFT, the supervised baseline: only solved samples train, by their NLL, with the processor's weights."""

from __future__ import annotations

import torch

from gyre.algo import make_algorithm
from gyre.algo.advantages import group_advantages
from gyre.algo.rft import RFT
from gyre.config.run import AlgoConfig


def test_only_solved_samples_are_kept_and_failed_evaluations_get_nothing():
    assert RFT().advantages({"a": 1.0, "b": 0.5, "c": 0.0, "d": None}) == {"a": 1.0, "b": 0.0, "c": 0.0}
    assert RFT(0.5).advantages({"a": 1.0, "b": 0.5, "c": 0.25}) == {"a": 1.0, "b": 1.0, "c": 0.0}


def test_the_loss_is_the_weighted_nll_of_the_kept_trajectories_tokens_plain_and_packed():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, requires_grad=True)
    targets = torch.randint(0, 7, (2, 5))
    logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]])
    weight = torch.full((2, 5), 0.25)
    loss, stats = RFT().loss(logp, logp.detach(), mask, weight, torch.tensor([1.0, 0.0]))
    expected = -(logp[0, 1:4] * 0.25).sum()
    assert torch.allclose(loss, expected) and stats["n_tokens"] == 6 and stats["n_kept_tokens"] == 3
    assert stats["n_seqs"] == 2
    loss.backward()
    assert logits.grad[1].abs().sum() == 0 and logits.grad[0].abs().sum() > 0  # the unsolved row trains nothing
    # one packed row holding both trajectories as segments: the same loss
    packed_logp = torch.cat([logp[0, 1:4], logp[1, 2:5]])[None]
    segment = torch.tensor([[0, 0, 0, 1, 1, 1]])
    packed, _ = RFT().loss(packed_logp, packed_logp.detach(), torch.ones(1, 6), torch.full((1, 6), 0.25),
                           torch.tensor([1.0, 0.0]), segment)
    assert torch.allclose(packed, expected)


def test_the_config_chooses_the_objective_and_gspo_keeps_its_group_advantages():
    gspo = make_algorithm(AlgoConfig())
    scores = {"a": 1.0, "b": 0.0, "c": 0.5}
    assert gspo.name == "gspo" and gspo.advantages(scores) == group_advantages(scores)
    assert make_algorithm(AlgoConfig(normalize_std=False)).advantages(scores) == group_advantages(
        scores, normalize_std=False)
    assert make_algorithm(AlgoConfig(name="rft")).name == "rft"

