"""Benchmark of the trajectory processor: build cost at 1M tokens, tokens and time per packing.

    gyre bench trajectories [--quick] [--no-fb] [--json]

Measured in one run, on synthetic executions shaped like Claude Code traffic
(gyre/trajectories/synthetic.py, seeded):

* `build_seconds_1m`: tree + classification + Jmax sampling + weights for one 1M-token
  execution (generation not timed; best of 3). `peak_rss_mb`: the process's peak RSS
  right after (torch not yet imported).
* For one batch at Jmax=5 (`fb_executions` executions of the CPU-scaled workload, the
  same shape at ~1/40 of the lengths so the bundled tiny model can run it): the tokens a
  forward-backward computes when every call is its own sample (`tokens_per_call`), with
  one row per kept trajectory (`tokens_naive`) and with tree packing (`tokens_tree`), and
  the forward-backward seconds of the latter two on the tiny model (best of 3, after a
  warm-up, naive and tree alternating). The same for a retry-heavy workload (retry probability 0.3) and for the
  uncapped batch, whose forward-backward time the capped one is compared with (the paper:
  74.8 %). The 1M execution's token counts are reported too (`scale_1m`).

Targets (issue 6): build_seconds_1m < 1.0; tokens_per_call / tokens_tree >= 3;
tokens_naive / tokens_tree > 1 and fb_seconds_tree < fb_seconds_naive on the default
workload.
"""

from __future__ import annotations

import resource
import time
from dataclasses import replace

from gyre.trajectories.packing import PerTrajectoryPacker, TreePacker, tokens_in, tokens_per_call
from gyre.trajectories.processor import ProcessorSettings, plan
from gyre.trajectories.synthetic import SyntheticSpec, generate

# The default spec at ~1/40 of its lengths, on the tiny model's vocabulary.
CPU_SCALED = SyntheticSpec(
    total_tokens=30_000, vocab_size=500, system_block_tokens=(4, 28, 6), tool_defs=(12, 24),
    tool_def_tokens=(8, 30), task_tokens=(5, 40), output_tokens=(4, 40), tool_result_tokens=(4, 100),
    context_limit=4_000, compaction_marker_tokens=34, summary_tokens=(20, 75), subagent_prob=0.05,
    subagent_calls=(4, 20), subagent_system_tokens=23, subagent_tool_defs=(4, 8),
    subagent_context_limit=1_500, retry_prob=0.03,
)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _build_1m(total_tokens: int, seed: int) -> dict:
    execution = generate(SyntheticSpec(total_tokens=total_tokens, seed=seed), "bench-1m")
    settings = ProcessorSettings(jmax=5)
    timings = []
    for _ in range(3):
        t0 = time.perf_counter()
        execution_plan = plan(execution.calls, 1.0, settings)
        timings.append(time.perf_counter() - t0)
    tree = execution_plan.tree
    naive = PerTrajectoryPacker().pack([execution_plan], 1)
    return {
        "build_seconds_1m": round(min(timings), 4),
        "peak_rss_mb": round(_rss_mb(), 1),
        "scale_1m": {
            "calls": len(tree.calls),
            "prompt_tokens_sent": int(sum(len(c.prompt_ids) for c in tree.calls)),
            "tree_tokens": tree.num_tokens,
            "trajectories": len(tree.trajectories),
            "compactions": execution.num_compactions,
            "subagents": execution.num_subagents,
            "retries": execution.num_retries,
            "tokens_per_call": tokens_per_call([execution_plan]),
            "tokens_naive": tokens_in(naive),
            "tokens_tree": tokens_in(TreePacker(row_tokens=10**9).pack([execution_plan], 1)),
        },
    }


def _batch(spec: SyntheticSpec, executions: int, jmax: int | None) -> list:
    settings = ProcessorSettings(jmax=jmax)
    return [
        plan(generate(replace(spec, seed=spec.seed + i), f"e{i}").calls, 1.0 if i % 2 else -1.0, settings)
        for i in range(executions)
    ]


def _fb_seconds(engine, loss_fn, repeats: int, **rows_by_name) -> dict[str, float]:
    """Best-of-`repeats` wall seconds per packing, measured alternately (a shared box is noisy)."""
    best = {name: float("inf") for name in rows_by_name}
    for _ in range(repeats):
        for name, rows in rows_by_name.items():
            t0 = time.perf_counter()
            engine.forward_backward(rows, loss_fn)
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def _workload(engine, loss_fn, spec, executions, jmax, row_tokens, repeats) -> dict:
    plans = _batch(spec, executions, jmax)
    naive = PerTrajectoryPacker().pack(plans, len(plans))
    tree = TreePacker(row_tokens, engine.pair_cost if engine is not None else 0.0).pack(plans, len(plans))
    out = {
        "trajectories_total": sum(len(p.tree.trajectories) for p in plans),
        "trajectories_kept": sum(len(p.kept) for p in plans),
        "tokens_per_call": tokens_per_call(plans),
        "tokens_naive": tokens_in(naive),
        "tokens_tree": tokens_in(tree),
        "rows_naive": len(naive),
        "rows_tree": len(tree),
        "tree_rows_with_several_trajectories": sum(r.tree is not None for r in tree),
    }
    out["per_call_over_tree"] = round(out["tokens_per_call"] / out["tokens_tree"], 3)
    out["naive_over_tree"] = round(out["tokens_naive"] / out["tokens_tree"], 3)
    if engine is not None:
        seconds = _fb_seconds(engine, loss_fn, repeats, naive=naive, tree=tree)
        out["fb_seconds_naive"] = round(seconds["naive"], 3)
        out["fb_seconds_tree"] = round(seconds["tree"], 3)
    return out


def run(
    *,
    total_tokens: int = 1_000_000,
    fb_executions: int = 4,
    fb_total_tokens: int = 30_000,
    row_tokens: int = 8192,
    repeats: int = 3,
    seed: int = 0,
    with_fb: bool = True,
    model_dir=None,
) -> dict:
    result = _build_1m(total_tokens, seed)
    engine = loss_fn = None
    if with_fb:
        import tempfile
        from pathlib import Path

        import torch

        from gyre.algo.gspo import GSPO
        from gyre.engines.models.tiny import cached_tiny_model
        from gyre.engines.torch.train import TorchTrainEngine

        torch.manual_seed(seed)
        model_dir = model_dir or cached_tiny_model(Path(tempfile.gettempdir()) / "gyre-bench-models")
        engine = TorchTrainEngine(model_dir, lr=1e-3, micro_batch_tokens=row_tokens)
        loss_fn = GSPO().loss
        warm = _batch(replace(CPU_SCALED, total_tokens=3_000), 1, 5)
        engine.forward_backward(TreePacker(row_tokens).pack(warm, 1), loss_fn)
        engine.forward_backward(PerTrajectoryPacker().pack(warm, 1), loss_fn)
    spec = replace(CPU_SCALED, total_tokens=fb_total_tokens, seed=seed)
    default = _workload(engine, loss_fn, spec, fb_executions, 5, row_tokens, repeats)
    result.update({k: default[k] for k in ("tokens_per_call", "tokens_naive", "tokens_tree")})
    if with_fb:
        result["fb_seconds_naive"] = default["fb_seconds_naive"]
        result["fb_seconds_tree"] = default["fb_seconds_tree"]
    result["default_workload"] = default
    result["retry_heavy"] = _workload(
        engine, loss_fn, replace(spec, retry_prob=0.3), fb_executions, 5, row_tokens, repeats
    )
    uncapped = _workload(engine, loss_fn, spec, fb_executions, None, row_tokens, repeats)
    result["uncapped"] = uncapped
    if with_fb:
        result["fb_capped_over_uncapped_tree"] = round(default["fb_seconds_tree"] / uncapped["fb_seconds_tree"], 3)
        result["fb_capped_over_uncapped_naive"] = round(
            default["fb_seconds_naive"] / uncapped["fb_seconds_naive"], 3
        )
    result["peak_rss_mb_total"] = round(_rss_mb(), 1)
    result["targets_met"] = {
        "build_seconds_1m<1.0": result["build_seconds_1m"] < 1.0,
        "per_call/tree>=3": default["per_call_over_tree"] >= 3,
        "naive/tree>1": default["naive_over_tree"] > 1,
        **({"fb_tree<fb_naive": default["fb_seconds_tree"] < default["fb_seconds_naive"]} if with_fb else {}),
    }
    return result
