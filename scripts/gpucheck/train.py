"""(c) train: the torch train engine cast to bf16 against fp32 on one packed micro-batch.

Also the micro-batch itself (plain and tree-packed rows) and the gradient comparison, which the
Megatron section reuses against its own engine.
"""

from __future__ import annotations

import math
import time

from gpucheck.config import TOL_BF16_GRAD_REL, TOL_BF16_LOSS_REL
from gpucheck.context import Ctx, cleanup
from gpucheck.results import Section, fmt, verdict


BIG_MICRO_BATCH = 1 << 22  # tokens: every row in one micro-batch


def _train_batch(ctx: Ctx, ref) -> list:
    """Plain rows of different lengths (padding) and one tree-packed row (two trajectories
    sharing a prefix); behaviour log-probs = the fp32 reference's + N(0, 1e-3), so GSPO's
    ratios stay near 1 and the tokens pass gradient."""
    import numpy as np
    import torch

    from gyre.trajectories.rows import TrainSequence, TreeLayout
    from gyre.engines.torch.train import _collate, token_logprobs

    rng = np.random.default_rng(7)
    s = ctx.sizes
    vocab = ctx.vocab()
    rows = []
    for i in range(s.train_rows):
        n = max(6, s.train_tokens - i * s.train_tokens // (2 * s.train_rows))
        tr = np.zeros(n, np.bool_)
        tr[n // 3:] = True
        rows.append(TrainSequence(tokens=rng.integers(9, vocab, n), trainable=tr, behaviour_logprobs=np.zeros(n),
                                  weights=tr / tr.sum() / (s.train_rows + 1), advantage=(1.0, -0.5, 0.75)[i % 3],
                                  execution_id=f"e{i}"))
    n = max(9, s.train_tokens)
    a, b = n // 2, n // 2 + n // 4  # spans: root [0, a), child [a, b), child [b, n)
    tr = np.zeros(n, np.bool_)
    tr[a:] = True
    seg = np.where(tr, np.r_[np.full(b, 0), np.full(n - b, 1)], -1)
    rows.append(TrainSequence(
        tokens=rng.integers(9, vocab, n), trainable=tr, behaviour_logprobs=np.zeros(n),
        weights=tr / tr.sum() / (s.train_rows + 1), advantage=0.0, execution_id="tree",
        tree=TreeLayout(np.array([0, a, b]), np.array([-1, 0, 0]), np.r_[np.arange(b), np.arange(a, a + n - b)]),
        segment_ids=seg, segment_advantages=[0.8, -1.2],
    ))
    with torch.no_grad():
        for seq in rows:
            cols = _collate([seq], ref.pad_id, "mask")
            logp = token_logprobs(ref.model, cols["input_ids"].to(ctx.device), cols["attention"].to(ctx.device), 1.0,
                                  *(cols[k].to(ctx.device) if k in cols else None for k in ("position_ids", "prev")))
            logp = logp[0].float().cpu().numpy()
            seq.behaviour_logprobs = np.where(seq.trainable, logp + rng.normal(0, 1e-3, len(logp)), 0.0)
    return rows


def _grads(model) -> dict:
    return {n: (p.grad.detach().float().clone() if p.grad is not None else None) for n, p in model.named_parameters()}


def _grad_compare(ours: dict, ref: dict) -> tuple[float, float, float, float]:
    """(relative L2 of the difference, max |diff|, our norm, reference norm) over the
    reference's tensors (names must match; a missing gradient counts as zeros)."""
    import torch

    diff_sq = ref_sq = our_sq = 0.0
    max_abs = 0.0
    for name, g_ref in ref.items():
        if g_ref is None:
            continue
        g = ours.get(name)
        g = torch.zeros_like(g_ref) if g is None else g.to(g_ref.device, torch.float32)
        d = (g - g_ref).double()
        diff_sq += float(d.pow(2).sum())
        ref_sq += float(g_ref.double().pow(2).sum())
        our_sq += float(g.double().pow(2).sum())
        max_abs = max(max_abs, float(d.abs().max()))
    ref_norm = math.sqrt(ref_sq)
    return math.sqrt(diff_sq) / max(ref_norm, 1e-30), max_abs, math.sqrt(our_sq), ref_norm


def sec_train(ctx: Ctx, sec: Section) -> None:
    import torch

    from gyre.algo.gspo import GSPO
    from gyre.engines.torch.train import TorchTrainEngine

    model_dir = ctx.need_model()
    loss_fn = GSPO().loss
    ref = TorchTrainEngine(model_dir, lr=1e-5, device=str(ctx.device), micro_batch_tokens=BIG_MICRO_BATCH)
    seqs = _train_batch(ctx, ref)
    ref.forward_backward(seqs, loss_fn)  # warm-up
    ctx.sync()
    t = time.perf_counter()
    ref_stats = ref.forward_backward(seqs, loss_fn)
    ctx.sync()
    ref_s = time.perf_counter() - t
    ref_grads = _grads(ref.model)
    del ref
    cleanup()
    low = TorchTrainEngine(model_dir, lr=1e-5, device=str(ctx.device), micro_batch_tokens=BIG_MICRO_BATCH)
    low.model.to(torch.bfloat16)  # the engines take no dtype: the check casts the model
    low.forward_backward(seqs, loss_fn)
    ctx.sync()
    t = time.perf_counter()
    low_stats = low.forward_backward(seqs, loss_fn)
    ctx.sync()
    low_s = time.perf_counter() - t
    low_grads = _grads(low.model)
    del low
    cleanup()
    tokens = sum(len(q.tokens) for q in seqs)
    sec.row("micro-batch", f"{len(seqs) - 1} plain + 1 tree row, {tokens} tokens ({ref_stats.tokens_trained} trained); "
            f"fwd-bwd fp32 {ref_s * 1e3:.0f} ms, bf16 {low_s * 1e3:.0f} ms",
            "info", fp32_s=ref_s, bf16_s=low_s, tokens=tokens)
    loss_rel = abs(low_stats.loss - ref_stats.loss) / max(abs(ref_stats.loss), 1e-12)
    sec.row("GSPO loss rel diff", f"{fmt(loss_rel)} (fp32 {ref_stats.loss:.6g}, bf16 {low_stats.loss:.6g})",
            verdict(loss_rel <= TOL_BF16_LOSS_REL), rel=loss_rel, fp32=ref_stats.loss, bf16=low_stats.loss)
    nll_ref, nll_low = ref_stats.extra.get("nll_sum", 0.0), low_stats.extra.get("nll_sum", 0.0)
    nll_rel = abs(nll_low - nll_ref) / max(abs(nll_ref), 1e-12)
    sec.row("sum -logp rel diff", f"{fmt(nll_rel)} (logprob_abs_diff fp32 {fmt(ref_stats.logprob_abs_diff)}, "
            f"bf16 {fmt(low_stats.logprob_abs_diff)})", verdict(nll_rel <= TOL_BF16_LOSS_REL),
            rel=nll_rel, lp_diff_fp32=ref_stats.logprob_abs_diff, lp_diff_bf16=low_stats.logprob_abs_diff)
    rel, max_abs, norm_low, norm_ref = _grad_compare(low_grads, ref_grads)
    norm_rel = abs(norm_low - norm_ref) / max(norm_ref, 1e-30)
    sec.row("grad norm rel diff", f"{fmt(norm_rel)} (fp32 {fmt(norm_ref)}, bf16 {fmt(norm_low)})",
            verdict(norm_rel <= TOL_BF16_GRAD_REL), rel=norm_rel, fp32=norm_ref, bf16=norm_low)
    sec.row("grad rel L2 diff", f"{fmt(rel)} (max |diff| {fmt(max_abs)}; seq clip frac fp32 "
            f"{fmt(ref_stats.extra.get('seq_clip_frac', 0.0))}, bf16 {fmt(low_stats.extra.get('seq_clip_frac', 0.0))})",
            verdict(rel <= TOL_BF16_GRAD_REL), rel=rel, max_abs=max_abs)
