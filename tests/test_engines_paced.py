"""The paced rollout engine (`gyre.engines.paced`) around the real torch engine on the tiny model: a
call takes what the modelled cell says, calls beyond its slots share it, a stop ends a call at its
next release with what was released, and a prompt extending an earlier one prefills only what is new."""

from __future__ import annotations

import threading
import time

import pytest

from gyre.device.model import DeviceModel, Pacing
from gyre.engines.base import EngineDrainingError, GenerationRequest, SamplingParams, Submits
from gyre.engines.paced import PacedRolloutEngine
from gyre.engines.torch.rollout import TorchRolloutEngine

TOKEN_WALL_S = 0.1  # each real token: 100 ms of wall time at full speed (the tiny model needs ~1 ms)


def _device(slots: float) -> DeviceModel:
    # decode 1 device second per modelled token, 10 modelled tokens per real one: PACING's clock makes a
    # real token TOKEN_WALL_S of wall time
    return DeviceModel(name="test", cell_nodes=1.0, slots=slots, decode_s_per_token=1.0,
                       prefill_tokens_per_node_s=1e12, train_tokens_per_node_s=1e6, micro_step_overhead_s=0.0,
                       optimizer_s=0.0, publish_s=0.0, switch_to_train_s=0.0, switch_to_rollout_s=0.0,
                       weights_gb=0.0, rdma_gb_per_node_s=1.0)


PACING = Pacing(scale_s_per_h=3600.0 * TOKEN_WALL_S / 10.0, tokens_per_token=10.0)


@pytest.fixture(scope="module")
def inner(tiny_model_dir):
    engine = TorchRolloutEngine(tiny_model_dir, "paced-test", seed=0)
    engine.generate(_request(8))  # warm: a cold engine's first call is slower than any pace here
    yield engine
    engine.close()


def _request(n: int, prompt: list[int] | None = None, stop: threading.Event | None = None, on_token=None):
    params = SamplingParams(temperature=1.0, max_new_tokens=n, stop_token_ids=())
    return GenerationRequest(prompt or [1, 2, 3, 4, 5], params, stop=stop, on_token=on_token)


def test_a_call_takes_the_modelled_decode_time_and_returns_the_real_tokens(inner):
    engine = PacedRolloutEngine(inner, _device(slots=4), PACING)
    seen = []
    started = time.monotonic()
    result = engine.generate(_request(8, on_token=lambda t, lp: seen.append((t, time.monotonic() - started))))
    took = time.monotonic() - started
    assert len(result.output_ids) == 8 and result.finish_reason == "length"
    assert [t for t, _ in seen] == result.output_ids  # every token released, in order
    assert 8 * TOKEN_WALL_S <= took < 8 * TOKEN_WALL_S + 1.0  # slack: a loaded box's thread wake-ups
    assert seen[0][1] >= TOKEN_WALL_S * 0.99 and seen[-1][1] >= 8 * TOKEN_WALL_S * 0.99  # one by one, paced
    assert engine.stats.output_tokens == 8 and engine.stats.calls == 1
    # the inner torch engine takes requests without blocking; the paced one must not pass that on (the
    # proxy would submit past the pacing): it blocks in `generate`, the rest is the inner engine's
    assert isinstance(inner, Submits) and not isinstance(engine, Submits)
    assert getattr(engine, "submit", None) is None and engine.rng_state() is not None


def test_a_call_whose_real_tokens_come_after_their_release_is_counted_late(inner):
    """A pace far faster than the box: the real tokens set the call's time, and the call says so."""
    engine = PacedRolloutEngine(inner, _device(slots=4), Pacing(scale_s_per_h=1e-6, tokens_per_token=10.0))
    result = engine.generate(_request(8))
    assert len(result.output_ids) == 8 and engine.stats.late_calls == 1 and engine.stats.late_s > 0


def test_calls_beyond_the_cells_slots_share_it(inner):
    engine = PacedRolloutEngine(inner, _device(slots=2), PACING)
    took: list[float] = []

    def one():
        started = time.monotonic()
        engine.generate(_request(6))
        took.append(time.monotonic() - started)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # 4 calls on 2 slots: each at half speed, 6 tokens x TOKEN_WALL_S x 2
    assert all(2 * 6 * TOKEN_WALL_S * 0.95 <= t < 2 * 6 * TOKEN_WALL_S + 1.0 for t in took), took
    assert engine.device_clock.peak_active == 4


def test_a_stop_ends_the_call_at_its_next_release_with_the_released_tokens(inner):
    engine = PacedRolloutEngine(inner, _device(slots=4), PACING)
    stop = threading.Event()
    seen = []
    threading.Timer(3.5 * TOKEN_WALL_S, stop.set).start()
    started = time.monotonic()
    result = engine.generate(_request(20, stop=stop, on_token=lambda t, lp: seen.append(t)))
    assert time.monotonic() - started < 6 * TOKEN_WALL_S
    assert result.finish_reason == "abort" and result.output_ids == seen and 2 <= len(seen) <= 4


def test_a_prompt_extending_an_earlier_call_prefills_only_what_is_new_and_a_drain_waits(inner):
    engine = PacedRolloutEngine(inner, _device(slots=4), PACING)
    prompt = list(range(3, 40))
    first = engine.generate(_request(2, prompt=prompt))
    engine.generate(_request(2, prompt=prompt + first.output_ids + [7, 8, 9]))
    assert engine.stats.cached_tokens == 32  # two whole 16-token blocks of the first prompt + its output
    running = threading.Thread(target=engine.generate, args=(_request(5),))
    running.start()
    time.sleep(TOKEN_WALL_S)
    started = time.monotonic()
    assert engine.drain(timeout_s=5)
    assert time.monotonic() - started >= 2 * TOKEN_WALL_S  # waited for the running call's releases
    running.join()
    with pytest.raises(EngineDrainingError):
        engine.generate(_request(1))
    engine.resume()
    assert len(engine.generate(_request(1)).output_ids) == 1
