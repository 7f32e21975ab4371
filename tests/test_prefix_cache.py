"""The prefix cache: radix-tree behaviour, and the rollout engine with it on and off.

An agent's calls extend each other (prompt + answer + tool result); with the cache the engine
prefills only what is new, and what it samples (greedy tokens, behaviour log-probs) must not
change. A weight update empties the cache. The bundled model's default context holds prompts
far past the old 8192 tokens.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from gyre.engines.base import GenerationRequest, SamplingParams
from gyre.engines.models.tiny import TinyModelSpec, cached_tiny_model
from gyre.engines.torch.kv_buffer import left_padded, row_cache, row_kv
from gyre.engines.torch.prefix_cache import PrefixCache
from gyre.engines.torch.rollout import TorchRolloutEngine

HEADS, DIM, LAYERS = 2, 4, 2
TOKEN_BYTES = LAYERS * 2 * HEADS * DIM * 4  # fp32 keys and values of one position


def _kv(tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Synthetic KV whose entries encode (layer, position, token), so a lookup's result is checkable."""
    kv = []
    for layer in range(LAYERS):
        base = torch.tensor(tokens, dtype=torch.float32)[None, :, None].expand(HEADS, len(tokens), DIM)
        kv.append((base + 1000 * layer, -(base + 1000 * layer)))
    return kv


def _assert_kv(match, tokens: list[int]) -> None:
    assert match.length == len(tokens)
    for got, want in zip(match.kv, _kv(tokens)):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_longest_prefix_match_and_insert_split_shared_runs():
    cache = PrefixCache(max_bytes=10**6)
    assert cache.match([1, 2, 3]).kv is None
    cache.insert([1, 2, 3, 4, 5], _kv([1, 2, 3, 4, 5]))
    _assert_kv(cache.match([1, 2, 3, 4, 5, 6]), [1, 2, 3, 4, 5])
    _assert_kv(cache.match([1, 2, 3, 9]), [1, 2, 3])  # ends inside a run
    _assert_kv(cache.match([1, 2, 3, 4, 5], limit=4), [1, 2, 3, 4])  # the engine keeps one token to compute
    assert cache.match([7, 1, 2]).length == 0
    cache.insert([1, 2, 3, 7, 8], _kv([1, 2, 3, 7, 8]))  # splits the run after 3
    assert len(cache) == 3 and cache.nbytes == 7 * TOKEN_BYTES  # shared [1, 2, 3] stored once
    _assert_kv(cache.match([1, 2, 3, 7, 8, 9]), [1, 2, 3, 7, 8])
    _assert_kv(cache.match([1, 2, 3, 4, 5]), [1, 2, 3, 4, 5])
    cache.insert([1, 2, 3, 4, 5, 6], _kv([1, 2, 3, 4, 5, 6]))  # extends a leaf: only the new token is added
    assert cache.nbytes == 8 * TOKEN_BYTES
    _assert_kv(cache.match([1, 2, 3, 4, 5, 6]), [1, 2, 3, 4, 5, 6])
    long = list(range(100, 1400))  # runs longer than the comparison chunk
    cache.insert(long, _kv(long))
    _assert_kv(cache.match(long[:1200] + [0, 0]), long[:1200])
    with pytest.raises(ValueError, match="layer 0: KV covers 2/2 positions, the sequence has 3"):
        cache.insert([1, 2, 3], _kv([1, 2]))


def test_hit_and_miss_tokens_are_counted():
    cache = PrefixCache(max_bytes=10**6)
    cache.match([1, 2, 3])
    cache.insert([1, 2, 3], _kv([1, 2, 3]))
    cache.match([1, 2, 3, 4], limit=3)
    assert (cache.hit_tokens, cache.miss_tokens) == (3, 3 + 1)


def test_lru_eviction_keeps_the_budget_and_the_recently_used():
    cache = PrefixCache(max_bytes=10 * TOKEN_BYTES)
    cache.insert([1, 2, 3, 4], _kv([1, 2, 3, 4]))
    cache.insert([5, 6, 7, 8], _kv([5, 6, 7, 8]))
    cache.match([1, 2, 3, 4])  # now [5..8] is the least recently used
    cache.insert([9, 10, 11, 12], _kv([9, 10, 11, 12]))
    assert cache.nbytes == 8 * TOKEN_BYTES <= cache.max_bytes
    assert cache.match([5, 6, 7, 8]).length == 0
    _assert_kv(cache.match([1, 2, 3, 4]), [1, 2, 3, 4])
    _assert_kv(cache.match([9, 10, 11, 12]), [9, 10, 11, 12])
    cache.insert([1, 2, 3, 4, 20], _kv([1, 2, 3, 4, 20]))  # 9 tokens
    cache.insert([1, 2, 3, 4, 30, 31], _kv([1, 2, 3, 4, 30, 31]))  # 11: [9..12] is the oldest leaf
    assert cache.nbytes == 7 * TOKEN_BYTES and cache.match([9, 10]).length == 0
    # a shared parent outlives its children: the older branch goes, the prefix stays
    cache.insert([1, 2, 3, 4, 40, 41, 42, 43], _kv([1, 2, 3, 4, 40, 41, 42, 43]))
    assert cache.nbytes == 10 * TOKEN_BYTES and cache.evicted_tokens == 4 + 4 + 1
    assert cache.match([1, 2, 3, 4, 20]).length == 4
    _assert_kv(cache.match([1, 2, 3, 4, 30, 31]), [1, 2, 3, 4, 30, 31])
    _assert_kv(cache.match([1, 2, 3, 4, 40, 41, 42, 43]), [1, 2, 3, 4, 40, 41, 42, 43])
    cache.insert(list(range(50, 70)), _kv(list(range(50, 70))))  # larger than the whole budget
    assert cache.nbytes == 0 and len(cache) == 0


def test_clear_forgets_everything():
    cache = PrefixCache(max_bytes=10**6)
    cache.insert([1, 2, 3], _kv([1, 2, 3]))
    cache.clear()
    assert (len(cache), cache.nbytes, cache.clears) == (0, 0, 1)
    assert cache.match([1, 2, 3]).length == 0
    with pytest.raises(ValueError, match="must be positive"):
        PrefixCache(0)


def test_left_padded_rows_are_right_aligned_in_one_growing_buffer():
    rows = [row_cache(LAYERS, 3, [_kv([1, 2]), _kv([3])]), row_cache(LAYERS, 1, [_kv([4])])]  # runs copied in
    assert rows[0].get_seq_length() == 3 and torch.equal(rows[0].layers[1].keys[0], _kv([1, 2, 3])[1][0])
    batch, lengths = left_padded(rows, capacity=4)
    assert lengths == [3, 1]
    keys, values = batch.layers[1].keys, batch.layers[1].values
    assert keys.shape == (2, HEADS, 3, DIM)
    assert torch.equal(keys[0], _kv([1, 2, 3])[1][0]) and torch.equal(values[1, :, 2:], _kv([4])[1][1])
    assert not keys[1, :, :2].any()
    storage = keys.untyped_storage().data_ptr()
    new = torch.ones(2, HEADS, 1, DIM)
    batch.layers[1].update(new, -new)  # a decode step writes in place: no copy of what is there
    assert batch.get_seq_length(1) == 4 and batch.layers[1].keys.untyped_storage().data_ptr() == storage
    batch.layers[1].update(new, -new)  # past the capacity: the buffer grows, the contents stay
    assert batch.layers[1].keys.shape[2] == 5 and torch.equal(batch.layers[1].keys[0, :, :3], _kv([1, 2, 3])[1][0])
    assert torch.equal(row_kv(batch, 1, slice(2, 5))[1][1][:, 1:], -torch.ones(HEADS, 2, DIM))
    assert left_padded(rows[:1], capacity=9)[0] is rows[0]  # one row: its own buffer, no copy


def test_a_match_hands_back_views_of_the_cached_runs():
    cache = PrefixCache(max_bytes=10**6)
    cache.insert([1, 2, 3, 4], _kv([1, 2, 3, 4]))
    cache.insert([1, 2, 5], _kv([1, 2, 5]))  # split: runs [1, 2] and [3, 4]
    found = cache.match([1, 2, 3, 9])
    assert [run[0][0].shape[1] for run in found.runs] == [2, 1]
    node_keys = cache._root.children[1].kv[0][0]
    assert found.runs[0][0][0].untyped_storage().data_ptr() == node_keys.untyped_storage().data_ptr()


def test_causal_attention_over_a_longer_kv_matches_the_masked_reference():
    from gyre.engines.torch.causal_attention import causal_attention

    torch.manual_seed(0)
    for heads, kv_heads, q_len, kv_len in [(4, 2, 7, 40), (4, 4, 30, 100), (2, 1, 1, 50), (4, 2, 9, 9)]:
        q = torch.randn(1, heads, q_len, 16)
        k, v = torch.randn(1, kv_heads, kv_len, 16), torch.randn(1, kv_heads, kv_len, 16)
        sees = torch.arange(kv_len)[None, :] <= (kv_len - q_len + torch.arange(q_len))[:, None]
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=sees, enable_gqa=heads != kv_heads)
        with torch.no_grad():
            got = causal_attention(q, k, v)
        assert got.shape == want.shape and (got - want).abs().max() <= 1e-6
    with pytest.raises(ValueError, match="must be the last"):
        causal_attention(torch.randn(1, 2, 5, 16), torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16))


def _chat(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def _one_batch(engine: TorchRolloutEngine, requests: list[GenerationRequest]) -> list:
    """Generate `requests` as one batch: queued while the engine is paused, then released."""
    engine.pause()
    results: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i, r=r: results.__setitem__(i, engine.generate(r)))
               for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    while engine._pending < len(requests):
        time.sleep(0.01)
    engine.resume()
    for t in threads:
        t.join()
    return [results[i] for i in range(len(requests))]


def _run_session(engine: TorchRolloutEngine, tokenizer, temperature: float) -> list[tuple[list[int], list[float]]]:
    """Two executions, three calls each: each call is the last prompt + its answer + a tool result.
    The second call of both executions runs as one batch (different lengths: left padding)."""
    params = SamplingParams(temperature, 6, stop_token_ids=[])
    tool = tokenizer("<|im_end|>\n<|im_start|>user\n<tool_response>\nexit code 0\n</tool_response><|im_end|>\n"
                     "<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    prompts = [_chat(tokenizer, "Create calc.py with add(a, b)."),
               _chat(tokenizer, "Write greet(name) in hello.py, then run the tests and finish.")]
    seen = []
    for turn in range(3):
        if turn == 1:  # both executions in one batch
            answers = _one_batch(engine, [GenerationRequest(p, params) for p in prompts])
        else:
            answers = [engine.generate(GenerationRequest(p, params)) for p in prompts]
        for i, answer in enumerate(answers):
            seen.append((answer.output_ids, answer.logprobs))
            prompts[i] = prompts[i] + answer.output_ids + tool
    return seen


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_gives_the_same_tokens_and_logprobs_with_and_without_the_cache(
    tiny_model_dir, tiny_tokenizer, temperature
):
    cached = TorchRolloutEngine(tiny_model_dir, engine_id="cached", seed=7)
    plain = TorchRolloutEngine(tiny_model_dir, engine_id="plain", seed=7, prefix_cache_bytes=0)
    try:
        with_cache = _run_session(cached, tiny_tokenizer, temperature)
        without = _run_session(plain, tiny_tokenizer, temperature)
    finally:
        cached.close()
        plain.close()
    assert plain.prefix_cache is None
    worst = 0.0
    for (ids_a, lp_a), (ids_b, lp_b) in zip(with_cache, without):
        assert ids_a == ids_b
        worst = max([worst] + [abs(a - b) for a, b in zip(lp_a, lp_b)])
    assert worst <= 1e-6, worst  # issue #17's bound for fp32
    stats = cached.prefix_cache
    # calls 2 and 3 of each execution reuse the previous prompt and all but the last answer token
    assert stats.hit_tokens > stats.miss_tokens > 0


def test_load_weights_empties_the_cache(tiny_model_dir, tiny_tokenizer, tmp_path):
    from safetensors.torch import save_model

    engine = TorchRolloutEngine(tiny_model_dir, seed=1)
    try:
        prompt = _chat(tiny_tokenizer, "Create calc.py with add(a, b).")
        request = GenerationRequest(prompt, SamplingParams(0.0, 4, stop_token_ids=[]))
        first = engine.generate(request)
        assert engine.prefix_cache.nbytes > 0
        engine.generate(request)
        assert engine.prefix_cache.hit_tokens == len(prompt) - 1
        with torch.no_grad():
            for param in engine.model.parameters():
                param.mul_(1.5)
        save_model(engine.model, str(tmp_path / "snap.safetensors"))
        engine.load_weights(tmp_path / "snap.safetensors", version=1)
        assert (len(engine.prefix_cache), engine.prefix_cache.nbytes) == (0, 0)
        again = engine.generate(request)
        assert engine.prefix_cache.hit_tokens == len(prompt) - 1  # no stale hit after the update
        assert again.policy_version == 1 and again.logprobs != first.logprobs
    finally:
        engine.close()


@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory):
    spec = TinyModelSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16)
    assert spec.max_position_embeddings >= 131_072
    return cached_tiny_model(tmp_path_factory.mktemp("long-models"), spec)


def test_a_prompt_past_the_old_8192_context_is_served_and_extended(long_model_dir):
    engine = TorchRolloutEngine(long_model_dir, seed=3)
    plain = TorchRolloutEngine(long_model_dir, seed=3, prefix_cache_bytes=0)
    try:
        assert engine.max_context == TinyModelSpec().max_position_embeddings
        rng = random.Random(0)
        prompt = [rng.randrange(20, 500) for _ in range(9000)]
        params = SamplingParams(0.0, 2, stop_token_ids=[])
        first = engine.generate(GenerationRequest(prompt, params))
        assert len(first.output_ids) == 2
        longer = prompt + first.output_ids + [rng.randrange(20, 500) for _ in range(50)]
        second = engine.generate(GenerationRequest(longer, params))
        assert engine.prefix_cache.hit_tokens == len(prompt) + 1  # the prompt and the fed-back answer token
        reference = plain.generate(GenerationRequest(longer, params))
        assert second.output_ids == reference.output_ids
        assert max(abs(a - b) for a, b in zip(second.logprobs, reference.logprobs)) <= 1e-6
    finally:
        engine.close()
        plain.close()


def test_a_group_of_identical_prompts_in_one_batch_prefills_once(tiny_model_dir, tiny_tokenizer):
    engine = TorchRolloutEngine(tiny_model_dir, seed=2)
    try:
        prompt = _chat(tiny_tokenizer, "Create calc.py with add(a, b).")
        request = GenerationRequest(prompt, SamplingParams(0.0, 5, stop_token_ids=[]))
        results = _one_batch(engine, [request] * 3)
        assert engine.prefix_cache.hit_tokens == 2 * (len(prompt) - 1)  # the 2nd and 3rd row reuse the 1st
        assert results[0].output_ids == results[1].output_ids == results[2].output_ids
        for other in results[1:]:  # rows of one batch can round differently (GEMM kernels per row block)
            assert max(abs(a - b) for a, b in zip(results[0].logprobs, other.logprobs)) <= 1e-6
    finally:
        engine.close()


def _chunked_and_padded(model_dir, own_attention: bool = True) -> tuple[list[list[int]], list]:
    """Two prompts prefilled in 16-token chunks (PREFILL_CHUNK_TOKENS patched by the caller), the
    first on top of a cached prefix, then decoded as one left-padded batch."""
    rng = random.Random(5)
    shared = [rng.randrange(20, 500) for _ in range(70)]
    prompts = [shared + [rng.randrange(20, 500) for _ in range(45)], [rng.randrange(20, 500) for _ in range(23)]]
    params = SamplingParams(0.0, 5, stop_token_ids=[])
    engine = TorchRolloutEngine(model_dir, seed=4)
    assert engine.model.config._attn_implementation == "gyre_paths"
    if not own_attention:  # what a model with sliding-window layers runs: transformers' attention and masks
        engine._own_attention = False
        engine.model.config._attn_implementation = "sdpa"
    try:
        engine.generate(GenerationRequest(shared, params))  # caches the shared prefix
        results = _one_batch(engine, [GenerationRequest(p, params) for p in prompts])
        assert engine.prefix_cache.hit_tokens >= len(shared)
    finally:
        engine.close()
    return prompts, results


def test_chunked_prefill_over_cached_kv_and_padded_decode_match_a_plain_forward(tiny_model_dir, monkeypatch):
    """The engine's own attention (prefix without a mask, new block causal) and its in-place KV
    buffers against transformers' model with its own attention on the whole sequence at once."""
    import gyre.engines.torch.rollout as torch_rollout
    from gyre.engines.models.hf import load_causal_lm

    monkeypatch.setattr(torch_rollout, "PREFILL_CHUNK_TOKENS", 16)
    prompts, results = _chunked_and_padded(tiny_model_dir)
    reference = load_causal_lm(tiny_model_dir)  # transformers' default attention, no cache
    for prompt, result in zip(prompts, results):
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([prompt + result.output_ids])).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
        want = logp.gather(-1, torch.tensor(result.output_ids)[:, None])[:, 0]
        assert result.output_ids == logp.argmax(-1).tolist()  # greedy
        assert max(abs(a - b) for a, b in zip(result.logprobs, want.tolist())) <= 1e-5


def test_the_models_own_attention_on_the_kv_buffers_gives_the_same_results(tiny_model_dir, monkeypatch):
    import gyre.engines.torch.rollout as torch_rollout

    monkeypatch.setattr(torch_rollout, "PREFILL_CHUNK_TOKENS", 16)
    _, own = _chunked_and_padded(tiny_model_dir)
    _, theirs = _chunked_and_padded(tiny_model_dir, own_attention=False)
    for a, b in zip(own, theirs):
        assert a.output_ids == b.output_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-6
