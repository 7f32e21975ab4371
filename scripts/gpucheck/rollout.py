"""(b) rollout: the torch rollout engine cast to bf16 against the same engine in fp32.

Greedy tokens and behaviour log-probs of both engines on the same prompts, and each engine's
tokens re-scored by the fp32 model in one full forward (TITO: what the trainer sees).
"""

from __future__ import annotations

import statistics
import time

from gpucheck.config import TOL_BF16_LOGPROB, TOL_FP32_TITO
from gpucheck.context import Ctx, cleanup
from gpucheck.results import Section, fmt, verdict


def _prompts(ctx: Ctx, seed: int = 0) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    s = ctx.sizes
    lengths = [max(2, s.prompt_tokens - (i * s.prompt_tokens) // (2 * s.prompts)) for i in range(s.prompts)]
    return [rng.integers(9, ctx.vocab(), n).tolist() for n in lengths]  # 0..8: special tokens


def _generate_all(engine, prompts, params):
    """All prompts at once from threads (the engine batches them); results and seconds."""
    from concurrent.futures import ThreadPoolExecutor

    from gyre.engines.base import GenerationRequest

    t = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: engine.generate(GenerationRequest(list(p), params)), prompts))
    return results, time.perf_counter() - t


def _rescore(model, device, prompts, outputs) -> list[list[float]]:
    """log p(output token | prefix) under `model`, one full forward (no KV cache), temperature 1."""
    import torch

    from gyre.engines.torch.train import token_logprobs

    rows = [list(p) + list(o) for p, o in zip(prompts, outputs)]
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
    with torch.no_grad():
        logp = token_logprobs(model, ids.to(device), attn.to(device), 1.0).float().cpu()
    return [logp[i, len(p): len(p) + len(o)].tolist() for i, (p, o) in enumerate(zip(prompts, outputs))]


def _max_abs(a: list[list[float]], b: list[list[float]]) -> float:
    diffs = [abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return max(diffs) if diffs else 0.0


def sec_rollout(ctx: Ctx, sec: Section) -> None:
    import torch

    from gyre.engines.base import SamplingParams
    from gyre.engines.torch.rollout import TorchRolloutEngine

    model_dir = ctx.need_model()
    prompts = _prompts(ctx)
    params = SamplingParams(temperature=0.0, max_new_tokens=ctx.sizes.new_tokens)
    ref = TorchRolloutEngine(model_dir, "ref-fp32", device=str(ctx.device), prefix_cache_bytes=0)
    try:
        _generate_all(ref, prompts[:1], params)  # warm-up (kernels, allocator)
        ref_out, ref_s = _generate_all(ref, prompts, params)
        low = TorchRolloutEngine(model_dir, "bf16", device=str(ctx.device), prefix_cache_bytes=0)
        try:
            low.model.to(torch.bfloat16)  # the engines take no dtype: the check casts the model
            _generate_all(low, prompts[:1], params)
            low_out, low_s = _generate_all(low, prompts, params)
        finally:
            low.close()
        n_tok = sum(len(r.output_ids) for r in ref_out)
        sec.row("generated", f"{len(prompts)} prompts x {ctx.sizes.new_tokens} tokens (greedy, one batch): "
                f"fp32 {n_tok / ref_s:.0f} tok/s, bf16 {n_tok / low_s:.0f} tok/s", "info",
                fp32_tok_s=n_tok / ref_s, bf16_tok_s=n_tok / low_s)
        same = sum(a.output_ids == b.output_ids for a, b in zip(ref_out, low_out))
        first_div = []
        for a, b in zip(ref_out, low_out):
            k = next((i for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids)) if x != y), None)
            if k is not None:
                first_div.append(k)
        sec.row("greedy tokens bf16 == fp32", f"{same}/{len(prompts)} prompts identical"
                + (f"; earliest divergence at token {min(first_div)} (random weights: near-ties flip)" if first_div else ""),
                "ok" if same == len(prompts) else "info", identical=same, prompts=len(prompts))
        # behaviour log-probs on the tokens both sampled (up to each prompt's first divergence)
        common_a, common_b = [], []
        for a, b in zip(ref_out, low_out):
            k = next((i for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids)) if x != y), len(a.output_ids))
            k = min(k + 1, len(a.output_ids), len(b.output_ids))  # the diverging token's own log-prob still compares
            common_a.append(a.logprobs[:k])
            common_b.append(b.logprobs[:k])
        d = _max_abs(common_a, common_b)
        sec.row("max |behaviour logprob| bf16 vs fp32", fmt(d) + " (same positions, up to first divergence)",
                verdict(d <= TOL_BF16_LOGPROB), max_abs=d, tol=TOL_BF16_LOGPROB)
        # TITO: what the trainer recomputes (fp32 full forward) against each rollout's behaviour log-probs
        ref_rescored = _rescore(ref.model, ctx.device, prompts, [r.output_ids for r in ref_out])
        d32 = _max_abs([r.logprobs for r in ref_out], ref_rescored)
        sec.row("fp32 rollout vs fp32 re-scoring", f"max |diff| {fmt(d32)} (KV-cached decode vs full forward)",
                verdict(d32 <= TOL_FP32_TITO), max_abs=d32, tol=TOL_FP32_TITO)
        low_rescored = _rescore(ref.model, ctx.device, prompts, [r.output_ids for r in low_out])
        d16 = _max_abs([r.logprobs for r in low_out], low_rescored)
        mean16 = statistics.fmean(abs(x - y) for a, b in zip(low_out, low_rescored) for x, y in zip(a.logprobs, b))
        sec.row("bf16 rollout vs fp32 re-scoring", f"max |diff| {fmt(d16)}, mean {fmt(mean16)} (the trainer's gap)",
                verdict(d16 <= TOL_BF16_LOGPROB), max_abs=d16, mean_abs=mean16, tol=TOL_BF16_LOGPROB)
    finally:
        ref.close()
        cleanup()
