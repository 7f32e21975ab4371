"""The torch reference engines: exact behaviour log-probs, batching, weight swaps, training."""

from __future__ import annotations

import math

import threading
import time

import pytest
import torch

from gyre.algo.gspo import GSPO
from gyre.engines.base import ContextLengthError, GenerationRequest, SamplingParams
from gyre.trajectories.rows import TrainSequence
from gyre.engines.models.hf import ModelDirError, check_model_dir, load_causal_lm, stop_token_ids
from gyre.engines.models.tiny import TinyModelSpec, build_tiny_model
from gyre.engines.torch.rollout import TorchRolloutEngine
from gyre.engines.torch.train import NonFiniteError, TorchTrainEngine, micro_batches, token_logprobs


def _prompt(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def test_tiny_model_is_deterministic_and_loads_as_hf_dir(tmp_path, tiny_model_dir):
    again = build_tiny_model(tmp_path / "again", TinyModelSpec())
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name
    model = load_causal_lm(again)
    assert type(model).__name__ == "Qwen3ForCausalLM"


def test_chat_template_renders_tool_calls(tiny_tokenizer):
    text = tiny_tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "run_shell", "arguments": {"command": "ls"}}}]},
            {"role": "tool", "content": "a.py"},
        ],
        tools=[{"type": "function", "function": {"name": "run_shell", "parameters": {}}}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert '<tool_call>\n{"name": "run_shell", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>' in text
    assert "<tool_response>\na.py\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_model_dir_errors_name_what_is_missing(tmp_path, tiny_model_dir):
    with pytest.raises(ModelDirError, match="does not exist"):
        check_model_dir(tmp_path / "nope")
    broken = tmp_path / "noweights"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    with pytest.raises(ModelDirError, match="no weights"):
        check_model_dir(broken)
    (broken / "model.safetensors").write_bytes((tiny_model_dir / "model.safetensors").read_bytes())
    with pytest.raises(ModelDirError, match="no tokenizer"):
        check_model_dir(broken)
    (broken / "tokenizer.json").write_text((tiny_model_dir / "tokenizer.json").read_text())
    (broken / "config.json").write_text('{"architectures": ["BertForMaskedLM"], "model_type": "bert"}')
    with pytest.raises(ModelDirError, match="not a causal LM"):
        check_model_dir(broken)


def test_behaviour_logprobs_match_a_full_forward(tiny_model_dir, tiny_tokenizer):
    """Batched, left-padded, KV-cached sampling reports exactly what a plain forward gives."""
    engine = TorchRolloutEngine(tiny_model_dir, seed=1)
    stops = stop_token_ids(tiny_tokenizer)
    prompts = [_prompt(tiny_tokenizer, t) for t in ("a", "write calc.py please", "x" * 40)]
    results = [None] * len(prompts)

    def call(i):
        results[i] = engine.generate(GenerationRequest(prompts[i], SamplingParams(0.8, 24, stops)))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.close()
    model = load_causal_lm(tiny_model_dir)
    for prompt, res in zip(prompts, results):
        assert 0 < len(res.output_ids) <= 24 and len(res.logprobs) == len(res.output_ids)
        ids = torch.tensor([prompt + res.output_ids])
        with torch.no_grad():
            logp = token_logprobs(model, ids, torch.ones_like(ids), temperature=0.8)[0, len(prompt):]
        assert torch.allclose(logp, torch.tensor(res.logprobs), atol=1e-4), (logp, res.logprobs)
        assert res.finish_reason == ("stop" if res.output_ids[-1] in stops else "length")


def test_rows_that_finish_early_leave_the_batch_and_the_rest_decode_exactly(tiny_model_dir, tiny_tokenizer):
    """One batch whose rows end at 1, 2, 3, 5, 9 and 30 tokens: the decode loop drops finished rows
    (several times), and every row's tokens and behaviour log-probs are still a plain forward's; a
    dropped row's prompt + answer is in the prefix cache for its next call."""
    engine = TorchRolloutEngine(tiny_model_dir, seed=3)
    budgets = [1, 2, 3, 5, 9, 30]
    prompts = [_prompt(tiny_tokenizer, f"row {i} " + "y" * (3 * i)) for i in range(len(budgets))]
    results = [None] * len(budgets)

    def call(i):
        results[i] = engine.generate(GenerationRequest(prompts[i], SamplingParams(0.9, budgets[i])))

    engine.pause()  # queue every request, then let them run as one batch
    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(budgets))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60  # the paused worker holds the first request, the queue the rest
    while (engine._pending, engine._queue.qsize()) != (len(budgets), len(budgets) - 1):
        assert time.monotonic() < deadline, "the requests never queued"
        time.sleep(0.01)
    engine.resume()
    for t in threads:
        t.join()
    model = load_causal_lm(tiny_model_dir)
    for prompt, budget, res in zip(prompts, budgets, results):
        assert len(res.output_ids) == budget and res.finish_reason == "length"
        ids = torch.tensor([prompt + res.output_ids])
        with torch.no_grad():
            logp = token_logprobs(model, ids, torch.ones_like(ids), temperature=0.9)[0, len(prompt):]
        assert torch.allclose(logp, torch.tensor(res.logprobs), atol=1e-4), (budget, logp, res.logprobs)
    cache = engine.prefix_cache
    for prompt, res in zip(prompts, results):  # all but the last sampled token was fed through the model
        known = prompt + res.output_ids[:-1]
        assert cache.match(known + [5], len(known)).length == len(known)
    engine.close()


def test_greedy_is_deterministic_and_context_is_checked(tiny_model_dir, tiny_tokenizer):
    engine = TorchRolloutEngine(tiny_model_dir)
    prompt = _prompt(tiny_tokenizer, "hello")
    a = engine.generate(GenerationRequest(prompt, SamplingParams(0.0, 16)))
    b = engine.generate(GenerationRequest(prompt, SamplingParams(0.0, 16)))
    assert a.output_ids == b.output_ids
    with pytest.raises(ContextLengthError):
        engine.generate(GenerationRequest([1] * engine.max_context, SamplingParams(1.0, 4)))
    engine.close()


def _sampled_sequences(engine, tokenizer, advantages):
    seqs = []
    for i, adv in enumerate(advantages):
        prompt = _prompt(tokenizer, f"task {i}")
        res = engine.generate(GenerationRequest(prompt, SamplingParams(1.0, 16)))
        n = len(res.output_ids)
        seqs.append(TrainSequence(
            tokens=prompt + res.output_ids,
            trainable=[False] * len(prompt) + [True] * n,
            behaviour_logprobs=[0.0] * len(prompt) + res.logprobs,
            weights=[0.0] * len(prompt) + [1.0 / n / len(advantages)] * n,
            advantage=adv,
        ))
    return seqs


def test_train_step_updates_weights_and_reports_tito_gap(tiny_model_dir, tiny_tokenizer, tmp_path):
    rollout = TorchRolloutEngine(tiny_model_dir, seed=3)
    trainer = TorchTrainEngine(tiny_model_dir, lr=1e-2, micro_batch_tokens=64)
    seqs = _sampled_sequences(rollout, tiny_tokenizer, [1.0, -1.0, 0.5])
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    stats = trainer.train_step(seqs, GSPO().loss)
    assert stats.logprob_abs_diff < 1e-4
    assert stats.tokens_trained == sum(sum(s.trainable) for s in seqs)
    assert stats.grad_norm > 0
    changed = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed
    # the new weights reach the rollout engine with a bumped version
    snap = trainer.save_snapshot(tmp_path / "snap" / "v1.safetensors")
    rollout.load_weights(snap, 1)
    assert rollout.policy_version == 1
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(rollout.model.state_dict()[name], tensor), name
    res = rollout.generate(GenerationRequest(_prompt(tiny_tokenizer, "x"), SamplingParams(1.0, 4)))
    assert res.policy_version == 1
    rollout.close()


def test_zero_advantage_gives_zero_loss_and_nan_is_refused(tiny_model_dir, tiny_tokenizer):
    rollout = TorchRolloutEngine(tiny_model_dir)
    trainer = TorchTrainEngine(tiny_model_dir, lr=1e-2)
    seqs = _sampled_sequences(rollout, tiny_tokenizer, [0.0, 0.0])
    rollout.close()
    stats = trainer.train_step(seqs, GSPO().loss)
    assert stats.loss == 0.0 and stats.grad_norm == 0.0
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    def nan_loss(logp, *_):
        return logp.sum() * float("nan"), {}

    with pytest.raises(NonFiniteError):
        trainer.train_step(seqs, nan_loss)
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, before[k])


def test_micro_batches_respect_the_token_budget():
    seqs = [TrainSequence([1] * n, [True] * n, [0.0] * n, [0.0] * n, 0.0) for n in (10, 30, 5, 40, 40)]
    batches = micro_batches(seqs, 80)
    assert [len(b) for b in batches] == [2, 2, 1]  # [10,30] [5,40] [40]
    assert all(max(len(s.tokens) for s in b) * len(b) <= 80 for b in batches)
    assert micro_batches([TrainSequence([1] * 100, [True] * 100, [0.0] * 100, [0.0] * 100, 0.0)], 10)[0]


def test_streamed_micro_steps_on_core_and_satellite_equal_one_batch(tiny_model_dir, tiny_tokenizer):
    """What `gyre.runtime.live.cells` relies on: micro-steps accumulated on the core, plus a
    satellite replica's reduced onto it, give the gradients of the whole step at once."""
    rollout = TorchRolloutEngine(tiny_model_dir, seed=5)
    seqs = _sampled_sequences(rollout, tiny_tokenizer, [1.0, -1.0, 0.5, -0.5])
    rollout.close()
    whole = TorchTrainEngine(tiny_model_dir, lr=1e-2)
    whole.forward_backward(seqs, GSPO().loss)
    core, satellite = TorchTrainEngine(tiny_model_dir, lr=1e-2), TorchTrainEngine(tiny_model_dir, lr=1e-2, seed=9)
    satellite.copy_weights_from(core)
    core.forward_backward(seqs[:1], GSPO().loss, accumulate=True)
    satellite.forward_backward(seqs[1:3], GSPO().loss, accumulate=True)
    core.forward_backward(seqs[3:], GSPO().loss, accumulate=True)
    core.add_gradients_from(satellite)
    assert all(p.grad is None for p in satellite.model.parameters())
    for (name, mine), theirs in zip(core.model.named_parameters(), whole.model.parameters()):
        assert torch.allclose(mine.grad, theirs.grad, atol=1e-6, rtol=1e-4), name
    before = [p.detach().clone() for p in core.model.parameters()]
    assert math.isclose(core.apply_gradients(), whole.apply_gradients(), rel_tol=1e-4)
    assert core.steps_taken == 1 and all(p.grad is None for p in core.model.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, core.model.parameters()))


def test_gspo_diagnostics_show_clip_and_cap_on_stale_data(tiny_model_dir, tiny_tokenizer):
    """Trained on behaviour log-probs one update old (staleness 1), GSPO's clip acts, and the
    step's diagnostics (summed over micro-batches by the engine) say so; on fresh data it does not."""
    from gyre.algo.gspo import diagnostics, is_summed

    rollout = TorchRolloutEngine(tiny_model_dir, seed=7)
    seqs = _sampled_sequences(rollout, tiny_tokenizer, [1.0, -1.0, 0.5, -0.5])
    rollout.close()
    trainer = TorchTrainEngine(tiny_model_dir, lr=3e-2, micro_batch_tokens=64)
    fresh = trainer.train_step(seqs, GSPO().loss)  # on-policy: every ratio 1 (up to numerics)
    stale = trainer.train_step(seqs, GSPO().loss)  # the same behaviour log-probs, one update later
    before, after = (diagnostics({k: v for k, v in s.extra.items() if is_summed(k)}) for s in (fresh, stale))
    assert before["clip_low_frac"] == before["clip_high_frac"] == before["token_cap_frac"] == 0.0
    assert after["clip_low_frac"] + after["clip_high_frac"] > 0, after
    assert after["mean_response_tokens"] == before["mean_response_tokens"] > 0
    assert after["sampled_entropy"] > 0


def test_models_loaded_from_parallel_threads_are_whole(tiny_model_dir):
    """Live cells build replicas and engines from worker threads; transformers' loading is not
    thread-safe (meta tensors, silently re-initialised weights): `load_causal_lm` serialises it."""
    import threading

    from gyre.engines.models.hf import load_causal_lm

    reference = load_causal_lm(tiny_model_dir).state_dict()
    loaded, errors = [], []

    def load():
        try:
            loaded.append(load_causal_lm(tiny_model_dir).state_dict())
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    for _ in range(3):
        threads = [threading.Thread(target=load) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == [] and len(loaded) == 9
    for state in loaded:
        assert all(not t.is_meta and torch.equal(t, reference[name]) for name, t in state.items())
