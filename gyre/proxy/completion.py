"""One model call, API-neutral: TITO prompt, generation across engines, parse, record.

The OpenAI and Anthropic front ends translate their requests into template messages and
hand them here; they translate the outcome (and, streaming, the reasoning/content deltas)
back into their own shapes. Everything that decides what is trained happens here, once:

1. the prompt is checked against the context by a cheap character bound (`limits.py`),
   then rendered with the chat template and the exact sampled ids of earlier outputs of
   the same execution are spliced in (`prompt.py`), in a worker thread (`offload.py`), unless
   the call is alone in the proxy and its new text short (`INLINE_BUILD_CHARS`);
2. the generation runs on engines leased from the router, continued exactly across
   drains and failures (`generation.py`);
3. the output is parsed (`output.py`) and recorded as a `Call` BEFORE the response
   completes; the turn as the harness will send it back (`assistant_message`) is
   remembered for splicing; in a worker thread too, unless the output is short
   (`INLINE_FINISH_TOKENS`: the hop would cost more). While other calls are in flight the
   event loop never templates or tokenises a prompt; it never decodes or parses a long output.

With build worker processes (`build_processes.py`, the proxy's `build_processes` > 0) the build of
step 1 and the remember of step 3 run in the execution's worker instead, outside this process's GIL.

A call that ends without a complete output (client gone, streaming or not; engines failed
after sampling some tokens) is recorded with `finish_reason == "abort"` and never
remembered for splicing: a partial record is never passed off as complete.

Stop strings cut the output at a token boundary (`stops.py` says which tokens are kept and
why); such a call is recorded with `finish_reason == "stop"` and no end-of-turn token.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from gyre.engines.base import ContextLengthError, SamplingParams
from gyre.proxy.build_processes import BuildProcesses
from gyre.proxy.errors import ProxyError
from gyre.proxy.generation import EngineFailedError, Generated, Generation
from gyre.proxy.limits import PromptLimit, counted_chars
from gyre.proxy.offload import PromptLanes
from gyre.proxy.output import IncrementalDecoder, OutputStreamer, ParsedOutput, parse_output
from gyre.proxy.prompt import BuiltPrompt, PromptBuilder
from gyre.proxy.router import EngineRouter, NoEngineError
from gyre.proxy.sessions import ExecutionSession, SessionRegistry
from gyre.proxy.stops import StopMatcher
from gyre.proxy.toolcalls import NO_TOOL_CALLS, ToolCallParser
from gyre.records import Call, utc_now


DISCONNECT_WATCH_AFTER_S = 0.05
"""A non-streaming call watches for its client going away once it has run this long
(calls shorter than that finish before a cancel could save anything)."""
_CALL_ID_PREFIX = secrets.token_hex(4)  # per process; a counter makes ids unique within it
_CALL_NUMBERS = itertools.count()

INLINE_FINISH_TOKENS = 256
"""Outputs up to this many tokens are decoded, parsed and recorded on the event loop (tens of
microseconds: the call's prompt ids are handed to its record, not copied); a hop to a worker
thread and back costs more than that (~0.15 ms of an agent-shaped call: `scripts/proxy_stages.py`).
Longer outputs take the call's prompt lane."""

INLINE_BUILD_CHARS = 16_384
"""A call's build runs on the event loop, not in a prompt lane, when nothing else is in flight in
the proxy (no other build, no generation) and the text it must tokenise anew is at most this many
counted characters (`new_chars`: a few milliseconds of tokenising at most). With nothing else in
flight the loop has nothing to do meanwhile, and the hop to a lane and back costs 0.2-1.3 ms of a
call, quiet box to loaded (`scripts/proxy_stages.py`, `build_await` minus `build_thread`;
docs/benches.md); a request that arrives during such a build waits for it. Any other call in flight
sends builds to the lanes."""

MAX_STOP_STRINGS = 32
"""Most stop strings one request may give (OpenAI allows 4; some clients send more)."""
MAX_STOP_CHARS = 512
"""Longest stop string accepted."""


class ProxyDefaults(BaseModel):
    """Sampling applied when a request does not say (the run's rollout settings)."""

    temperature: float = 1.0
    max_new_tokens: int = 128
    max_new_tokens_cap: int = 4096
    force_temperature: bool = False
    """Sample at `temperature`, untruncated (top_p = 1, no top_k), whatever the harness
    asks: the trainer scores tokens under the full softmax at the run's temperature, so an
    RL run wants this."""


@dataclass
class TurnRequest:
    session: ExecutionSession
    messages: list[dict[str, Any]]  # template messages
    tools: list[dict[str, Any]] | None  # template tools (OpenAI function shape)
    temperature: float | None
    max_tokens: int | None
    kind: str  # "chat" (OpenAI) | "messages" (Anthropic)
    assistant_message: Callable[[ParsedOutput], dict[str, Any]]
    """How this API's harness will send the output back, as a template message."""
    agent_id: str | None = None
    session_hint: str | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    """Stop strings (non-empty)."""
    parse_tool_calls: bool = True
    """False for tool_choice "none": the output is plain text, never tool calls."""


@dataclass
class TurnResult:
    call: Call
    parsed: ParsedOutput
    finish_reason: str  # stop | length | abort
    stop_sequence: str | None = None
    """The stop string that ended the output, if one did."""

    @property
    def prompt_tokens(self) -> int:
        return len(self.call.prompt_ids)

    @property
    def output_tokens(self) -> int:
        return len(self.call.output_ids)


class CompletionCore:
    def __init__(
        self,
        router: EngineRouter,
        sessions: SessionRegistry,
        tokenizer,
        executor: Executor,
        *,
        stop_token_ids: tuple[int, ...],
        defaults: ProxyDefaults,
        parser: ToolCallParser,
        limit: PromptLimit | None = None,
        lanes: PromptLanes | None = None,
        builds: BuildProcesses | None = None,
    ) -> None:
        """`limit`: the context's character bound (None: only the engine checks the context);
        `builds`: worker processes that build prompts (None: built in this process)."""
        self.router, self.sessions, self.tokenizer, self.executor = router, sessions, tokenizer, executor
        self.stop_token_ids = frozenset(stop_token_ids)
        self._stop_tuple = tuple(stop_token_ids)
        self.defaults, self.parser = defaults, parser
        self.builder = PromptBuilder(tokenizer)
        self.limit = limit
        self.lanes = lanes or PromptLanes()
        self._lane_builds = 0  # builds in a lane now (read and changed on the event loop only)
        self.builds = builds

    def prompt_chars(self, req: TurnRequest) -> int:
        """The request's counted characters, refused (400) when they cannot fit the context."""
        return self.limit.check(req.messages) if self.limit is not None else counted_chars(req.messages)

    async def build_prompt(self, req: TurnRequest, chars: int | None = None) -> BuiltPrompt:
        """The TITO prompt, built after the character bound passed: in a worker thread, or on the
        loop when nothing else is in flight and its new text is short (`INLINE_BUILD_CHARS`)."""
        if chars is None:
            chars = self.prompt_chars(req)
        if self.builds is not None:
            return await self.builds.build(req.session, req.messages, req.tools)
        # alone first: under load that answers, and the O(messages) count is not made
        if self._lane_builds == 0 and not self.router.busy() and new_chars(req) <= INLINE_BUILD_CHARS:
            return self._build(req)
        self._lane_builds += 1
        try:
            return await self.lanes.run(chars, self._build, req)
        finally:
            self._lane_builds -= 1

    def _build(self, req: TurnRequest) -> BuiltPrompt:
        try:
            return self.builder.build(req.messages, req.tools, req.session.tito)
        except Exception as exc:  # the chat template rejected the conversation: bad input
            raise ProxyError(400, f"cannot render messages with the chat template: {exc}") from exc

    async def turn(self, req: TurnRequest) -> "Turn":
        chars = self.prompt_chars(req)
        prompt = await self.build_prompt(req, chars)
        d = self.defaults
        forced = d.force_temperature
        params = SamplingParams(
            temperature=d.temperature if (req.temperature is None or forced) else req.temperature,
            max_new_tokens=min(req.max_tokens or d.max_new_tokens, d.max_new_tokens_cap),
            stop_token_ids=self._stop_tuple,
            top_p=1.0 if (req.top_p is None or forced) else req.top_p,
            top_k=0 if (req.top_k is None or forced) else req.top_k,
        )
        return Turn(self, req, prompt, params, chars)


class Turn:
    def __init__(self, core: CompletionCore, req: TurnRequest, prompt: BuiltPrompt, params: SamplingParams,
                 chars: int) -> None:
        self.core, self.req, self.prompt, self.params = core, req, prompt, params
        self.chars = chars  # the prompt's counted characters: which lane its work takes
        self.call_id = f"call-{_CALL_ID_PREFIX}{next(_CALL_NUMBERS):08x}"
        self.parser = core.parser if req.parse_tool_calls else NO_TOOL_CALLS
        self._stops = StopMatcher(core.tokenizer, req.stop, core.stop_token_ids) if req.stop else None
        self._queue: asyncio.Queue[list[int] | None] | None = None
        self._generation: Generation | None = None

    def _start(self, streaming: bool) -> Generation:
        if streaming:
            self._queue = asyncio.Queue()
        watch = streaming or self._stops is not None
        self._generation = Generation(
            self.core.router, self.core.executor, self.req.session.execution_id, self.prompt.ids, self.params,
            on_tokens=self._on_tokens if watch else None,
        )
        return self._generation

    def _on_tokens(self, ids: list[int]) -> None:
        """Sampled ids, in order, on the event loop: cut at stop strings, feed the stream."""
        if self._stops is not None:
            ids = self._stops.push(ids)
            if self._stops.keep is not None:
                self._generation.stop_after(self._stops.keep)
        if self._queue is not None and ids:
            self._queue.put_nowait(ids)

    async def complete(self, receive=None) -> TurnResult:
        """Generate the whole output, record it, return it. With `receive` (the ASGI
        receive of a request whose body was read), a client that disconnects meanwhile
        cancels the generation, which is then recorded as an abort."""
        generation = self._start(streaming=False)
        if receive is None:
            return await self._run(generation)
        watcher: asyncio.Task | None = None

        def watch() -> None:
            nonlocal watcher
            watcher = asyncio.ensure_future(_disconnect(receive))
            watcher.add_done_callback(lambda t: t.cancelled() or generation.cancel())

        timer = asyncio.get_running_loop().call_later(DISCONNECT_WATCH_AFTER_S, watch)
        try:
            return await self._run(generation)
        finally:
            timer.cancel()
            if watcher is not None:
                watcher.cancel()

    async def stream(self) -> AsyncIterator[tuple[str, Any]]:
        """("reasoning" | "content", text) events as tokens arrive, then ("result", TurnResult).
        Closing the iterator early (client gone) cancels the generation; it is recorded as
        an abort once the engine has stopped."""
        core = self.core
        generation = self._start(streaming=True)
        queue = self._queue
        task = asyncio.ensure_future(self._run(generation))
        task.add_done_callback(lambda t: (queue.put_nowait(None), t.cancelled() or t.exception()))
        decoder, streamer = IncrementalDecoder(core.tokenizer), OutputStreamer(self.parser)
        try:
            while (ids := await queue.get()) is not None:
                ids = [t for t in ids if t not in core.stop_token_ids]
                if ids:
                    for event in streamer.push(decoder.push(ids)):
                        yield event
            result = task.result()  # raises the generation's error, if any
            for event in streamer.finish(result.parsed):
                yield event
            yield ("result", result)
        finally:
            if not task.done():
                generation.cancel()  # the task records the abort when the engine returns

    async def _run(self, generation: Generation) -> TurnResult:
        started = utc_now()
        try:
            out = await generation.run()
        except ContextLengthError as exc:
            raise ProxyError(400, str(exc), "context_length") from exc
        except NoEngineError as exc:
            raise ProxyError(503, str(exc), "overloaded") from exc
        except EngineFailedError as exc:
            if generation.out.output_ids:
                self._record(generation.out, "abort", started)
            raise ProxyError(502, str(exc), "engine_failed") from exc
        except asyncio.CancelledError:
            generation.cancel()
            raise
        finish = out.finish_reason
        stop_sequence = self._stops.matched if self._stops is not None and finish == "stop" else None
        if self._stops is not None and self._queue is not None and finish != "abort":
            rest = self._stops.flush()  # no stop string: what was held back is shown now
            if rest:
                self._queue.put_nowait(rest)
        if len(out.output_ids) <= INLINE_FINISH_TOKENS:
            result = self._finish(out, finish, stop_sequence, started)
        else:
            result = await self.core.lanes.run(self.chars, self._finish, out, finish, stop_sequence, started)
        if finish != "abort" and self.core.builds is None:  # remembered after the answer is written (this task
            # runs on to it first); a build worker remembers in its own process
            asyncio.get_running_loop().call_soon(self.core.lanes.submit, self.chars, self.req.session.tito.settle)
        return result

    def _finish(self, out: Generated, finish: str, stop_sequence: str | None, started) -> TurnResult:
        """Worker thread: decode and parse the output, record the call; the turn is remembered
        later (`TitoCache.defer`): by a worker once the answer is out, or by the execution's
        next build, whichever comes first."""
        ended = finish == "stop" and bool(out.output_ids) and out.output_ids[-1] in self.core.stop_token_ids
        text_ids = out.output_ids[:-1] if ended else out.output_ids
        text = self.core.tokenizer.decode(text_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        parsed = parse_output(text, self.parser)
        call = self._record(out, finish, started)
        if finish != "abort":
            session, prompt, assistant = self.req.session, self.prompt, self.req.assistant_message(parsed)
            if self.core.builds is not None:  # in the execution's build worker, sent before the answer
                self.core.builds.remember(session, prompt, assistant, out.output_ids, ended)
            else:
                tito = session.tito
                tito.defer(lambda: self.core.builder.remember(tito, prompt, assistant, out.output_ids, ended))
        return TurnResult(call, parsed, finish, stop_sequence)

    def _record(self, out: Generated, finish: str, started) -> Call:
        req, segments = self.req, out.segments
        call = Call.assembled(
            handed_over=("prompt_ids",),  # this call's own list, never changed after the build
            call_id=self.call_id,
            execution_id=req.session.execution_id,
            agent_id=req.agent_id,
            kind=req.kind,
            prompt_ids=self.prompt.ids,
            output_ids=out.output_ids,
            logprobs=out.logprobs,
            policy_version=min((s.policy_version for s in segments), default=0),
            engine_id=segments[0].engine_id if segments else "",
            finish_reason=finish,
            started_at=started,
            finished_at=utc_now(),
            segments=segments,
            prompt_fallback_spans=self.prompt.fallback_spans,
            session_hint=req.session_hint,
            first_token_at=out.first_token_at,
        )
        self.core.sessions.record(req.session, call, self.prompt.fallback_turns)
        return call


def new_chars(req: TurnRequest) -> int:
    """About the counted characters (`limits.counted_chars`) the build will tokenise anew: those after
    the last assistant turn once the execution has a turn remembered for splicing (the prefix up to
    it is reused), else the whole conversation's. An estimate (the template's own text is not
    counted; a turn the harness changed is tokenised again): it only decides where a build runs."""
    messages = req.messages
    if req.session.tito.remembered():
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
        messages = messages[last + 1 :]
    return counted_chars(messages)


async def _disconnect(receive) -> None:
    """Returns when the client of a request whose body was read disconnects."""
    while (await receive())["type"] != "http.disconnect":
        pass
