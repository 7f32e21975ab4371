"""Any local HF causal-LM directory, not only the bundled model: Llama and Qwen2 shapes.

Small random models of each family are written locally (no download) with the bundled
tokenizer; both reference engines load them through the same path, the rollout engine's
behaviour log-probs equal the train engine's recomputation, and a GSPO step trains them.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from gyre.algo.gspo import GSPO
from gyre.engines.base import GenerationRequest, SamplingParams
from gyre.engines.torch.rollout import TorchRolloutEngine
from gyre.engines.torch.train import TorchTrainEngine
from gyre.trajectories.rows import TrainSequence

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _family_dir(tmp_path, tiny_model_dir, tokenizer, family: str):
    import transformers

    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[family]
    config = config_cls(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id or 0, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    out = tmp_path / family
    model_cls(config).save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tiny_model_dir / name).is_file():
            shutil.copy(tiny_model_dir / name, out / name)
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_reference_engines_serve_and_train_other_families(tmp_path, tiny_model_dir, tiny_tokenizer, family):
    model_dir = _family_dir(tmp_path, tiny_model_dir, tiny_tokenizer, family)
    rollout = TorchRolloutEngine(model_dir, seed=2)
    trainer = TorchTrainEngine(model_dir, lr=1e-3, temperature=0.9)
    try:
        prompt = tiny_tokenizer("write calc.py", add_special_tokens=False)["input_ids"]
        seqs = []
        for adv in (1.0, -1.0):
            res = rollout.generate(GenerationRequest(prompt, SamplingParams(0.9, 12)))
            n = len(res.output_ids)
            assert n == 12 and len(res.logprobs) == n
            seqs.append(TrainSequence(
                tokens=prompt + res.output_ids, trainable=[False] * len(prompt) + [True] * n,
                behaviour_logprobs=[0.0] * len(prompt) + res.logprobs,
                weights=[0.0] * len(prompt) + [0.5 / n] * n, advantage=adv,
            ))
        stats = trainer.train_step(seqs, GSPO().loss)
        assert stats.logprob_abs_diff < 1e-4  # the engines agree on what was sampled
        assert stats.grad_norm > 0 and stats.tokens_trained == 24
    finally:
        rollout.close()
