"""Rollout engine control: pause / resume / drain, and the sampling RNG's state."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gyre.engines.base import EngineDrainingError, GenerationRequest, RolloutEngine, SamplingParams, Submits
from gyre.engines.torch.rollout import TorchRolloutEngine

PROMPT = [5, 6, 7, 8]


@pytest.fixture
def engine(tiny_model_dir):
    eng = TorchRolloutEngine(tiny_model_dir, seed=3)
    yield eng
    eng.close()


def _ask(engine, n=8, temperature=1.0):
    return engine.generate(GenerationRequest(PROMPT, SamplingParams(temperature, n)))


def test_paused_engine_holds_requests_until_resumed(engine):
    assert isinstance(engine, RolloutEngine)
    engine.pause()
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(_ask, engine) for _ in range(2)]
        time.sleep(0.3)
        assert not any(f.done() for f in futures)  # queued, not run
        engine.resume()
        results = [f.result(timeout=30) for f in futures]
    assert all(len(r.output_ids) == 8 for r in results)


def test_submitted_requests_complete_their_futures_and_a_cancelled_one_is_skipped(engine):
    """`submit` (the proxy's way in: no thread of its own waits on the engine) queues the request
    and returns; the engine's worker completes the future. One cancelled while queued is never run,
    and the worker goes on serving the rest."""
    assert isinstance(engine, Submits)
    engine.pause()
    kept = engine.submit(GenerationRequest(PROMPT, SamplingParams(1.0, 8)))
    dropped = engine.submit(GenerationRequest(PROMPT, SamplingParams(1.0, 8)))
    assert not kept.done() and dropped.cancel()
    engine.resume()
    assert len(kept.result(timeout=30).output_ids) == 8 and dropped.cancelled()
    assert len(_ask(engine).output_ids) == 8
    assert engine.drain(timeout_s=10) is True  # the cancelled request is not counted as pending


def test_drain_finishes_queued_work_refuses_new_and_resume_reopens(engine):
    engine.pause()
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_ask, engine, 16) for _ in range(4)]
        time.sleep(0.2)
        assert engine.drain(timeout_s=60) is True  # a paused engine runs its queue to drain
        assert all(len(f.result(timeout=5).output_ids) == 16 for f in futures)  # none was refused
    with pytest.raises(EngineDrainingError):
        _ask(engine)
    engine.resume()
    assert len(_ask(engine).output_ids) == 8


def test_restored_rng_state_repeats_the_sampled_tokens(engine):
    state = engine.rng_state()
    first = _ask(engine, 16)
    engine.set_rng_state(state)
    again = _ask(engine, 16)
    assert first.output_ids == again.output_ids and first.logprobs == again.logprobs
