"""The paced rollout engine (`rollout.engine: paced`): real tokens, released on a modelled cell's clock.

On a CPU box every cell's engine shares the same cores, so capacity a policy hands back to
rollout buys nothing and the real stack cannot show what the simulator predicts. This engine
wraps the torch reference engine: every call is sampled for real (tokens, behaviour log-probs,
policy version, batching all as before), but its tokens are handed out only when a modelled
cell (`gyre.device.model.DeviceModel`, the one the simulator computes with) would have produced
them: the uncached prompt's prefill first, then one output token per `decode_s_per_token`, each
real token standing for `tokens_per_token` modelled ones (`Pacing`), on a clock running
`scale_s_per_h` wall seconds per modelled hour. As SGLang's simulator mode keeps its scheduler
and predicts each forward's time, only the release is modelled.

The cell's device is shared the way the simulator shares it: up to `slots` calls in the cell run
at full speed; with more, each runs at `slots / calls` of it (`DeviceModel.rollout_rate`). One
served-time clock per cell (`DeviceClock`) advances at that rate; a call's k-th token is released
when the clock has served it `prefill + k x decode` since it joined. Whatever asks for a stop (a
drain, the proxy's failover, a client gone) ends the call at the next release with the tokens
released so far (`abort`), so no token the proxy saw was sampled after the modelled device
stopped.

Uncached prompt tokens are those past the longest prefix this engine has seen in 16-token blocks
(hash chains, as vLLM's prefix caching keys its blocks); weights changing empties it, as SGLang
flushes its cache. Real compute normally finishes long before the release; a call whose real
tokens came after their release time was CPU-bound (`late_calls`, `late_s`): then the box, not
the model, set its time, and a measurement that has many is not a measurement of the model.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from gyre.device.model import DeviceModel, Pacing
from gyre.engines.base import EngineDrainingError, GenerationRequest, GenerationResult

STOP_POLL_S = 0.02  # a call waiting for its release looks at its stop event this often
PREFIX_BLOCK_TOKENS = 16
PREFIX_BLOCKS = 1 << 16  # blocks remembered per engine (least recently used forgotten first)
_NOT_DELEGATED = frozenset({"inner", "submit"})
"""Never the inner engine's: `submit` would generate past the pacing (the proxy blocks in `generate`)."""


class DeviceClock:
    """One cell's modelled device: the service each of its calls has had, in device seconds."""

    def __init__(self, device: DeviceModel, pacing: Pacing, clock: Callable[[], float] = time.monotonic) -> None:
        self.device, self.pacing, self.clock = device, pacing, clock
        self._cond = threading.Condition()
        self._active = 0
        self._served_s = 0.0  # device seconds served to each call in the cell since the start
        self._at = clock()
        self.peak_active = 0

    def _advance(self) -> None:
        now = self.clock()
        if self._active:
            self._served_s += (now - self._at) * self.device.rollout_rate(self._active) / self.pacing.wall_per_device_s
        self._at = now

    def join(self) -> float:
        """A call enters the cell; returns the served time it starts from."""
        with self._cond:
            self._advance()
            self._active += 1
            self.peak_active = max(self.peak_active, self._active)
            self._cond.notify_all()
            return self._served_s

    def leave(self) -> None:
        with self._cond:
            self._advance()
            self._active -= 1
            self._cond.notify_all()

    @property
    def active(self) -> int:
        return self._active

    def served(self) -> float:
        with self._cond:
            self._advance()
            return self._served_s

    def wait_until(self, served_s: float, stop: threading.Event | None) -> bool:
        """Block until the cell has served `served_s`; False if `stop` is set first."""
        with self._cond:
            while True:
                self._advance()
                if self._served_s >= served_s:
                    return True
                if stop is not None and stop.is_set():
                    return False
                rate = self.device.rollout_rate(self._active) / self.pacing.wall_per_device_s
                self._cond.wait(min((served_s - self._served_s) / rate, STOP_POLL_S if stop is not None else 1.0))


class PrefixBlocks:
    """Which prompt prefixes the modelled cell holds KV for: 16-token blocks keyed by hash chains."""

    def __init__(self, capacity: int = PREFIX_BLOCKS) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _chain(ids: list[int]):
        h = 0
        for end in range(PREFIX_BLOCK_TOKENS, len(ids) + 1, PREFIX_BLOCK_TOKENS):
            h = hash((h, tuple(ids[end - PREFIX_BLOCK_TOKENS : end])))
            yield end, h

    def cached(self, ids: list[int]) -> int:
        """Tokens of `ids`' longest remembered block-aligned prefix."""
        with self._lock:
            found = 0
            for end, h in self._chain(ids):
                if h not in self._blocks:
                    break
                self._blocks.move_to_end(h)
                found = end
            return found

    def add(self, ids: list[int]) -> None:
        with self._lock:
            for _, h in self._chain(ids):
                self._blocks[h] = None
                self._blocks.move_to_end(h)
            while len(self._blocks) > self.capacity:
                self._blocks.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()


@dataclass
class PacedStats:
    calls: int = 0
    late_calls: int = 0
    """Calls whose real tokens came after their modelled release: the box set their time."""
    late_s: float = 0.0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0


class PacedRolloutEngine:
    """A rollout engine (the torch reference engine) whose calls complete when `device` would have
    finished them (module docstring). Everything but generation is the inner engine's."""

    def __init__(self, inner, device: DeviceModel, pacing: Pacing, clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.engine_id = inner.engine_id
        self.device, self.pacing = device, pacing
        self.device_clock = DeviceClock(device, pacing, clock)
        self.prefixes = PrefixBlocks()
        self.stats = PacedStats()
        self._clock = clock
        self._idle = threading.Condition()
        self._pending = 0
        self._draining = False

    def __getattr__(self, name: str):  # rng_state, set_rng_state, prefix_cache, ...: the inner engine's
        if name in _NOT_DELEGATED:
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    def generate(self, request: GenerationRequest) -> GenerationResult:
        with self._idle:
            if self._draining:
                raise EngineDrainingError(f"engine {self.engine_id} is draining")
            self._pending += 1
        try:
            return self._paced(request)
        finally:
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()

    def _paced(self, request: GenerationRequest) -> GenerationResult:
        device, per_token = self.device, self.pacing.tokens_per_token
        cached = self.prefixes.cached(request.prompt_ids)
        start = self.device_clock.join()
        try:
            result = self.inner.generate(replace(request, on_token=None))  # real tokens, released below
            first = start + device.prefill_s((len(request.prompt_ids) - cached) * per_token)
            last = first + device.decode_s(len(result.output_ids) * per_token)
            behind = self.device_clock.served() - last
            if result.output_ids and behind > 0:  # the real tokens came after the modelled release
                self.stats.late_calls += 1
                self.stats.late_s += self.pacing.wall_s(behind)
            released, stopped = 0, False
            for token, logprob in zip(result.output_ids, result.logprobs):
                if not self.device_clock.wait_until(first + device.decode_s((released + 1) * per_token), request.stop):
                    stopped = True
                    break
                released += 1
                if request.on_token is not None:
                    request.on_token(token, logprob)
            if not result.output_ids:  # nothing sampled: the prefill is still the cell's work
                stopped = not self.device_clock.wait_until(first, request.stop)
        finally:
            self.device_clock.leave()
        self._count(request, cached, result.output_ids[:released])
        if not stopped:
            return result
        return GenerationResult(result.output_ids[:released], result.logprobs[:released], "abort",
                                result.policy_version, result.engine_id)

    def _count(self, request: GenerationRequest, cached: int, released: list[int]) -> None:
        stats = self.stats
        stats.calls += 1
        stats.cached_tokens += cached
        stats.prefill_tokens += len(request.prompt_ids) - cached
        stats.output_tokens += len(released)
        self.prefixes.add(request.prompt_ids + released)  # the cell holds KV for what it sent out

    def warm(self) -> None:
        """One real one-token generation on the inner engine, outside the pace and the counts: a cold
        engine's first call costs the box a second or more that no modelled cell pays."""
        from gyre.engines.base import SamplingParams

        self.inner.generate(GenerationRequest([1, 2, 3], SamplingParams(max_new_tokens=1)))

    def load_weights(self, snapshot, version: int) -> None:
        self.inner.load_weights(snapshot, version)
        self.prefixes.clear()  # the modelled cell's KV is stale too

    def load_snapshot(self, snapshot) -> None:
        self.inner.load_snapshot(snapshot)
        self.prefixes.clear()

    def pause(self) -> None:
        self.inner.pause()

    def resume(self) -> None:
        with self._idle:
            self._draining = False
        self.inner.resume()

    def drain(self, timeout_s: float | None = None) -> bool:
        """Refuse new calls; True once every call (its real tokens and their release) is done."""
        with self._idle:
            self._draining = True
        deadline = None if timeout_s is None else self._clock() + timeout_s
        if not self.inner.drain(timeout_s):
            return False
        with self._idle:
            left = None if deadline is None else max(0.0, deadline - self._clock())
            return self._idle.wait_for(lambda: self._pending == 0, timeout=left)

    def close(self) -> None:
        self.inner.close()
