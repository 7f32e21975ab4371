"""The rollout engine benchmark: sampled tokens per second at 1 and at N concurrent calls.

Agent executions call the engine concurrently, so what matters is throughput when calls
batch together, against the single-call baseline measured in the same run on the same
model. Each call samples exactly `new_tokens` tokens (no stop tokens) from its own prompt;
the figure is total sampled tokens / wall seconds, best of `repeats` after a warm-up.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from gyre.engines.base import GenerationRequest, SamplingParams
from gyre.engines.torch.rollout import TorchRolloutEngine


def _round(engine: TorchRolloutEngine, prompts: list[list[int]], new_tokens: int) -> tuple[int, float]:
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    counts = [0] * len(prompts)

    def call(i: int) -> None:
        counts[i] = len(engine.generate(GenerationRequest(prompts[i], params)).output_ids)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), time.perf_counter() - started


def run(
    model_dir: Path | None = None,
    concurrency: int = 16,
    prompt_tokens: int = 256,
    new_tokens: int = 64,
    repeats: int = 3,
) -> dict:
    if model_dir is None:
        import tempfile

        from gyre.engines.models.tiny import cached_tiny_model

        model_dir = cached_tiny_model(Path(tempfile.gettempdir()) / "gyre-bench-models")
    engine = TorchRolloutEngine(model_dir, max_batch_size=max(concurrency, 1))
    try:
        vocab = int(engine.model.config.vocab_size)
        prompts = [[(7 * i + 13 * j) % (vocab - 10) + 10 for j in range(prompt_tokens)] for i in range(concurrency)]
        _round(engine, prompts[:1], 8)  # warm-up
        results, sampled = {}, {}
        for name, subset in (("single", prompts[:1]), ("concurrent", prompts)):
            rounds = [_round(engine, subset, new_tokens) for _ in range(repeats)]
            results[name] = max(tokens / seconds for tokens, seconds in rounds)
            sampled[name] = min(tokens for tokens, _ in rounds)
    finally:
        engine.close()
    return {
        "model": str(model_dir),
        "prompt_tokens": prompt_tokens,
        "new_tokens_per_call": new_tokens,
        "tokens_per_s_1": round(results["single"], 1),
        f"tokens_per_s_{concurrency}": round(results["concurrent"], 1),
        "concurrency": concurrency,
        "speedup": round(results["concurrent"] / results["single"], 2),
        "tokens_sampled": sampled,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
