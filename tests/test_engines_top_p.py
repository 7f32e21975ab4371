"""Nucleus (top_p) and top_k sampling in the torch reference rollout engine.

Sampled tokens stay inside the nucleus, and each behaviour log-prob is the log-prob of the
truncated, renormalised distribution the token was drawn from; at top_p = 1 the engine's
log-probs are exactly the full temperature-scaled softmax the trainer computes.
"""

from __future__ import annotations

import threading

import pytest

import torch

from gyre.engines.base import GenerationRequest, SamplingParams
from gyre.engines.models.hf import load_causal_lm
from gyre.engines.torch.rollout import TorchRolloutEngine
from gyre.engines.torch.sampling import truncated
from gyre.engines.torch.train import token_logprobs


def _prompt(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def test_truncation_keeps_the_nucleus_and_renormalises():
    logp_BV = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    out = truncated(logp_BV, torch.tensor([0.7, 1.0, 0.01]), torch.tensor([0, 2, 0]))
    assert torch.allclose(out[0].exp(), torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]))  # 0.5 < 0.7 -> take 0.3 too
    assert torch.allclose(out[1].exp(), torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]))  # top_k = 2
    assert torch.allclose(out[2].exp(), torch.tensor([1.0, 0.0, 0.0, 0.0]))  # the top token is always kept


def test_top_p_samples_inside_the_nucleus_with_its_logprobs(tiny_model_dir, tiny_tokenizer):
    engine = TorchRolloutEngine(tiny_model_dir, seed=5)
    prompt = _prompt(tiny_tokenizer, "write calc.py")
    results = {}

    def call(name, params):
        results[name] = engine.generate(GenerationRequest(prompt, params))

    # one batch: a truncating row next to a plain one
    threads = [threading.Thread(target=call, args=("nucleus", SamplingParams(0.9, 12, top_p=0.5))),
               threading.Thread(target=call, args=("full", SamplingParams(0.9, 12)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.close()
    model = load_causal_lm(tiny_model_dir)
    for name, res in results.items():
        ids = torch.tensor([prompt + res.output_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / 0.9
        full = torch.log_softmax(logits, -1)
        if name == "full":  # top_p = 1: exactly the trainer's log-probs
            train = token_logprobs(model, ids, torch.ones_like(ids), temperature=0.9)[0, len(prompt):]
            assert torch.allclose(train, torch.tensor(res.logprobs), atol=1e-4)
            continue
        for pos, (tok, lp) in enumerate(zip(res.output_ids, res.logprobs)):
            probs = full[pos].exp()
            ranked = torch.argsort(probs, descending=True)
            rank = int((ranked == tok).nonzero())
            mass_before = float(probs[ranked[:rank]].sum())
            assert mass_before < 0.5 + 1e-5  # inside the nucleus
            nucleus = int(((probs[ranked].cumsum(0) - probs[ranked]) < 0.5).sum())
            kept_mass = float(probs[ranked[:nucleus]].sum())
            assert abs(lp - (float(full[pos, tok]) - torch.log(torch.tensor(kept_mass)).item())) < 1e-4
            assert lp >= float(full[pos, tok]) - 1e-6  # renormalised: never below the full log-prob


def _requests(*params: SamplingParams) -> list[GenerationRequest]:
    return [GenerationRequest([1, 2, 3], p) for p in params]


def test_the_sampler_keeps_every_tensor_on_the_engines_device():
    """A temperature left on the CPU against CUDA logits failed the first decode step on a GPU (gpu_check on an
    H200); the meta device stands in for any device but the CPU here, through construction and row selection."""
    from gyre.engines.torch.sampling import BatchSampler

    reqs = _requests(SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=0.0),
                     SamplingParams(temperature=1.0, top_k=4))
    sampler = BatchSampler(reqs, torch.device("meta"))
    assert sampler.truncating
    assert {name: t.device.type for name, t in sampler.tensors().items()} == dict.fromkeys(sampler.tensors(), "meta")
    sampler.select(torch.tensor([0, 2], device="meta"))
    assert all(t.device.type == "meta" and t.shape[0] == 2 for t in sampler.tensors().values())
    assert not BatchSampler(_requests(SamplingParams(temperature=0.0, top_p=0.5)), "cpu").truncating  # greedy


@pytest.mark.gpu
def test_the_rollout_engine_samples_on_cuda(tiny_model_dir, tiny_tokenizer):
    """The engine's decode loop on CUDA (runs only where torch sees a GPU): tokens sampled, log-probs finite."""
    engine = TorchRolloutEngine(tiny_model_dir, seed=5, device="cuda")
    assert not torch.backends.cuda.cudnn_sdp_enabled()  # a plan per decode length: 9x slower bf16 decoding
    prompt = _prompt(tiny_tokenizer, "write calc.py")
    for params in (SamplingParams(temperature=0.7, max_new_tokens=8), SamplingParams(temperature=0.7, top_p=0.9,
                                                                                     max_new_tokens=8)):
        result = engine.generate(GenerationRequest(prompt, params))
        assert len(result.output_ids) == len(result.logprobs) > 0
        assert all(lp <= 0.0 and lp == lp for lp in result.logprobs)
