"""One request's generation, continued exactly across engines.

A request is generated in segments. Each segment is one attempt on one engine leased from
the router, for prompt + every token sampled so far, with the remaining token budget.
A segment ends one of three ways:

- the engine finishes (end of turn or budget): the generation is done;
- the engine was drained (its lease's stop event was set) and returns its tokens so far
  with `finish_reason == "abort"`: the next segment continues them on another engine;
- the engine fails (raises: connection reset, 5xx, a crash): the tokens it had reported
  through `on_token` are kept and the next segment continues them, on another engine when
  there is one, after a backoff, at most `MAX_ENGINE_FAILURES` times per request.

Because every segment is sampled from prompt + all earlier tokens, the concatenation is
an exact sample of one response; each segment records its engine and policy version.

An engine that offers `submit` (`engines.base.Submits`) is awaited on its own future; the proxy
holds a thread per attempt in flight (`executor`) only for an engine that blocks in `generate`.

Tokens become visible to a streaming consumer as the engine samples them: the engine's
thread appends to the current segment and wakes the event loop (coalesced), where
`on_tokens` receives them in order. A client that goes away calls `cancel()`: the current
attempt is stopped and the generation ends with `finish_reason == "abort"`. A stop string
found in the output (`stops.py`, fed from `on_tokens`) calls `stop_after(n)`: the attempt
is stopped and the output cut to its first n tokens, `finish_reason == "stop"`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from datetime import datetime

from gyre.engines.base import ContextLengthError, GenerationRequest, GenerationResult, SamplingParams
from gyre.proxy.router import EngineRouter, Lease
from gyre.records import OutputSegment, utc_now

MAX_ENGINE_FAILURES = 3
"""Engine failures one request survives; the next one fails the request."""
FAILURE_BACKOFF_S = 0.05
"""Wait before retrying after the first failure; doubles per failure."""


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():  # not cancelled meanwhile
        waiter.set_result(None)


class EngineFailedError(RuntimeError):
    """The engines failed this request more often than MAX_ENGINE_FAILURES allows."""


@dataclass
class Generated:
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segments: list[OutputSegment] = field(default_factory=list)
    finish_reason: str = "length"
    first_token_at: datetime | None = None


class Generation:
    def __init__(
        self,
        router: EngineRouter,
        executor: Executor,
        execution_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> None:
        self._router, self._executor = router, executor
        self._execution_id, self._prompt_ids, self._params = execution_id, prompt_ids, params
        self._on_tokens = on_tokens
        self.out = Generated()
        self._cancelled = False
        self._keep: int | None = None  # set by stop_after
        self._lease: Lease | None = None
        self._partial_ids: list[int] = []  # the current segment, appended by the engine thread
        self._partial_logprobs: list[float] = []
        self._delivered = 0  # output tokens handed to on_tokens
        self._wake_pending = False  # a delivery is scheduled on the loop (engine thread sets, loop clears)
        self._loop: asyncio.AbstractEventLoop | None = None

    def cancel(self) -> None:
        """The client went away: stop the current attempt; run() ends with "abort"."""
        self._cancelled = True
        if self._lease is not None:
            self._lease.stop.set()

    def stop_after(self, keep: int) -> None:
        """A stop string was found: end the generation with its first `keep` output tokens."""
        self._keep = keep
        if self._lease is not None:
            self._lease.stop.set()

    def _cut(self) -> Generated:
        out, keep = self.out, self._keep
        out.output_ids, out.logprobs = out.output_ids[:keep], out.logprobs[:keep]
        out.segments = [s.model_copy(update={"end": min(s.end, keep)}) for s in out.segments if s.start < keep]
        out.finish_reason = "stop"
        return out

    async def run(self) -> Generated:
        self._loop = asyncio.get_running_loop()
        failures = 0
        avoid: frozenset[str] = frozenset()
        out = self.out
        while True:
            if self._cancelled:
                out.finish_reason = "abort"
                return out
            if self._keep is not None:
                return self._cut()
            remaining = self._params.max_new_tokens - len(out.output_ids)
            if remaining <= 0:
                out.finish_reason = "length"
                return out
            lease = await self._router.acquire(self._execution_id, avoid)
            self._lease = lease
            if self._cancelled or self._keep is not None:
                lease.stop.set()
            self._partial_ids, self._partial_logprobs = [], []
            params = self._params
            if remaining != params.max_new_tokens:
                params = replace(params, max_new_tokens=remaining)
            request = GenerationRequest(
                self._prompt_ids + out.output_ids if out.output_ids else self._prompt_ids,  # no copy of 50k ids
                params,
                stop=lease.stop,
                on_token=self._on_token,
                affinity=self._execution_id,
            )
            try:
                submit = getattr(lease.engine, "submit", None)  # `engines.base.Submits`
                if submit is None:  # a blocking engine: one of the proxy's threads waits on it
                    result = await self._loop.run_in_executor(self._executor, lease.engine.generate, request)
                else:
                    result = await self._settled(submit(request))
            except ContextLengthError:
                if not out.output_ids:
                    raise
                out.finish_reason = "length"  # the continuation no longer fits the context
                return out
            except Exception as exc:  # the engine failed: keep what it sampled, retry elsewhere
                self._commit(lease.engine_id, lease.engine.policy_version, self._partial_ids, self._partial_logprobs)
                failures += 1
                if failures > MAX_ENGINE_FAILURES:
                    raise EngineFailedError(
                        f"engines failed this request {failures} times; last ({lease.engine_id}): {exc!r}"
                    ) from exc
                avoid = avoid | {lease.engine_id}
                await asyncio.sleep(FAILURE_BACKOFF_S * 2 ** (failures - 1))
                continue
            finally:
                self._lease = None
                self._router.release(lease)
            reported = self._partial_ids
            if result.output_ids[: len(reported)] != reported:
                raise RuntimeError(f"engine {result.engine_id}: result disagrees with the tokens it reported")
            self._commit(result.engine_id, result.policy_version, result.output_ids, result.logprobs)
            if self._keep is not None and not self._cancelled:
                return self._cut()
            if result.finish_reason != "abort":
                out.finish_reason = result.finish_reason
                return out
            # aborted: drained (continue elsewhere) or cancelled (checked at the loop's top)

    async def _settled(self, future: Future) -> GenerationResult:
        """The result of an engine's future (`engines.base.Submits`): at once if the engine answered
        while taking the request, else once its thread completes the future (one wake-up of the loop,
        no thread of the proxy's in between). Cancelling this wait leaves the engine's future alone:
        an attempt is stopped through its lease's stop event, as a blocking `generate` is. (Not
        `asyncio.shield(asyncio.wrap_future(...))`: after a cancel, an engine error would sit in the
        wrapping future unretrieved and be logged as such.)"""
        if not future.done():
            waiter = self._loop.create_future()
            future.add_done_callback(lambda _: self._loop.call_soon_threadsafe(_wake, waiter))
            await waiter
        return future.result()

    # -- token plumbing -----------------------------------------------------------------

    def _on_token(self, token_id: int, logprob: float) -> None:
        """Engine thread: remember the token, wake the event loop once per burst."""
        if self.out.first_token_at is None:
            self.out.first_token_at = utc_now()
        self._partial_ids.append(token_id)
        self._partial_logprobs.append(logprob)
        if self._on_tokens is not None and not self._wake_pending:
            self._wake_pending = True
            self._loop.call_soon_threadsafe(self._deliver_partial)

    def _deliver_partial(self) -> None:
        self._wake_pending = False
        committed = len(self.out.output_ids)
        visible = self._partial_ids[: len(self._partial_ids)]
        if committed + len(visible) > self._delivered:
            new = visible[self._delivered - committed :]
            self._delivered += len(new)
            self._on_tokens(new)

    def _commit(self, engine_id: str, version: int, ids: list[int], logprobs: list[float]) -> None:
        out = self.out
        if ids:
            if out.first_token_at is None:
                out.first_token_at = utc_now()
            start = len(out.output_ids)
            out.output_ids += ids
            out.logprobs += logprobs[: len(ids)]
            out.segments.append(OutputSegment(engine_id=engine_id, policy_version=version, start=start, end=start + len(ids)))
        if self._on_tokens is not None and len(out.output_ids) > self._delivered:
            new = out.output_ids[self._delivered :]
            self._delivered = len(out.output_ids)
            self._on_tokens(new)
