"""(d) megatron: the Megatron-core engine (TP=1, fp32) against the torch engine in fp32.

On CUDA none of the engine's CPU patches apply, so this is the only place its upstream code
paths run: loss, every gradient in HF names, and the weights after one AdamW step.
"""

from __future__ import annotations

import sys
import time

from gpucheck.config import TOL_MEGATRON_REL
from gpucheck.context import Ctx, _imports, _quiet_warnings, cleanup
from gpucheck.results import Section, Skip, fmt, verdict
from gpucheck.train import BIG_MICRO_BATCH, _grad_compare, _grads, _train_batch


def sec_megatron(ctx: Ctx, sec: Section) -> None:
    model_dir = ctx.need_model()
    if not _imports("megatron.core"):
        raise Skip("megatron-core does not import (carry its wheel in .whl/, scripts/README.md)")
    from gyre.algo.gspo import GSPO
    from gyre.engines.megatron.train import MegatronTrainEngine
    from gyre.engines.torch.train import TorchTrainEngine

    lr = 1e-4
    loss_fn = GSPO().loss
    ref = TorchTrainEngine(model_dir, lr=lr, device=str(ctx.device), micro_batch_tokens=BIG_MICRO_BATCH,
                           tree_attention="mask")
    seqs = _train_batch(ctx, ref)
    ref_stats = ref.forward_backward(seqs, loss_fn)
    ref_grads = {n: g.cpu() for n, g in _grads(ref.model).items() if g is not None}
    ref_norm = ref.apply_gradients()
    ref_weights = {n: p.detach().float().cpu() for n, p in ref.model.named_parameters()}
    del ref
    cleanup()
    with _quiet_warnings():
        t = time.perf_counter()
        meg = MegatronTrainEngine(model_dir, lr=lr, device=str(ctx.device), micro_batch_tokens=BIG_MICRO_BATCH)
        build_s = time.perf_counter() - t
    try:
        sec.row("engine", f"MegatronTrainEngine TP=1 fp32 on {ctx.device}, built in {build_s:.1f} s "
                f"(CPU patches applied: {_megatron_patched()})", "info", build_s=build_s)
        meg.forward_backward(seqs, loss_fn)  # warm-up
        ctx.sync()
        t = time.perf_counter()
        stats = meg.forward_backward(seqs, loss_fn)
        ctx.sync()
        fb_s = time.perf_counter() - t
        grads = meg.hf_gradients()
        loss_rel = abs(stats.loss - ref_stats.loss) / max(abs(ref_stats.loss), 1e-12)
        sec.row("GSPO loss rel diff", f"{fmt(loss_rel)} (torch {ref_stats.loss:.8g}, megatron {stats.loss:.8g}); "
                f"forward-backward {fb_s * 1e3:.0f} ms", verdict(loss_rel <= TOL_MEGATRON_REL),
                rel=loss_rel, torch=ref_stats.loss, megatron=stats.loss, fb_s=fb_s)
        rel, max_abs, norm_meg, norm_ref = _grad_compare(grads, ref_grads)
        missing = sorted(set(ref_grads) - set(grads))
        sec.row("grad rel L2 diff", f"{fmt(rel)} (max |diff| {fmt(max_abs)}, norms {fmt(norm_ref)} / {fmt(norm_meg)}"
                + (f"; {len(missing)} HF tensors missing, e.g. {missing[0]}" if missing else "") + ")",
                verdict(rel <= TOL_MEGATRON_REL and not missing), rel=rel, max_abs=max_abs)
        norm = meg.apply_gradients()
        weights = meg.hf_state_dict()
        w_rel, w_max, _, _ = _grad_compare(weights, ref_weights)
        sec.row("after one AdamW step", f"grad norm {fmt(norm)} vs {fmt(ref_norm)}; weights max |diff| {fmt(w_max)}",
                verdict(w_max <= TOL_MEGATRON_REL and abs(norm - ref_norm) <= TOL_MEGATRON_REL * max(ref_norm, 1.0)),
                max_abs=w_max, norm=norm, ref_norm=ref_norm)
    finally:
        meg.close()
        del meg
        cleanup()


def _megatron_patched() -> bool:
    for name in ("gyre.engines.megatron.bootstrap", "gyre.engines.megatron.train"):  # where the flag lives
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "_patched"):
            return bool(mod._patched)
    return False
