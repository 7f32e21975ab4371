"""One model call, API-neutral: TITO prompt, generation across engines, parse, record.

The OpenAI and Anthropic front ends translate their requests into template messages and
hand them here; they translate the outcome (and, streaming, the reasoning/content deltas)
back into their own shapes. Everything that decides what is trained happens here, once:

1. the prompt is rendered with the chat template and the exact sampled ids of earlier
   outputs of the same execution are spliced in (`prompt.py`);
2. the generation runs on engines leased from the router, continued exactly across
   drains and failures (`generation.py`);
3. the output is parsed (`output.py`) and recorded as a `Call` BEFORE the response
   completes; the turn as the harness will send it back (`assistant_message`) is
   remembered for splicing.

A call that ends without a complete output (client gone, engines failed after sampling
some tokens) is recorded with `finish_reason == "abort"` and never remembered for
splicing: a partial record is never passed off as complete.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from gyre.engines.base import ContextLengthError, SamplingParams
from gyre.proxy.errors import ProxyError
from gyre.proxy.generation import EngineFailedError, Generated, Generation
from gyre.proxy.output import IncrementalDecoder, OutputStreamer, ParsedOutput, parse_output
from gyre.proxy.prompt import BuiltPrompt, PromptBuilder
from gyre.proxy.router import EngineRouter, NoEngineError
from gyre.proxy.sessions import ExecutionSession, SessionRegistry
from gyre.proxy.toolcalls import ToolCallParser
from gyre.records import Call, utc_now


class ProxyDefaults(BaseModel):
    """Sampling applied when a request does not say (the run's rollout settings)."""

    temperature: float = 1.0
    max_new_tokens: int = 128
    max_new_tokens_cap: int = 4096
    force_temperature: bool = False
    """Sample at `temperature` whatever the harness asks (the trainer scores at the run's
    temperature, so an RL run wants this)."""


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


@dataclass
class TurnResult:
    call: Call
    parsed: ParsedOutput
    finish_reason: str  # stop | length | abort

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
    ) -> None:
        self.router, self.sessions, self.tokenizer, self.executor = router, sessions, tokenizer, executor
        self.stop_token_ids = frozenset(stop_token_ids)
        self._stop_tuple = tuple(stop_token_ids)
        self.defaults, self.parser = defaults, parser
        self.builder = PromptBuilder(tokenizer)

    def build_prompt(self, req: TurnRequest) -> BuiltPrompt:
        try:
            return self.builder.build(req.messages, req.tools, req.session.tito)
        except Exception as exc:  # the chat template rejected the conversation: bad input
            raise ProxyError(400, f"cannot render messages with the chat template: {exc}") from exc

    def turn(self, req: TurnRequest) -> "Turn":
        prompt = self.build_prompt(req)
        d = self.defaults
        temperature = d.temperature if (req.temperature is None or d.force_temperature) else req.temperature
        params = SamplingParams(
            temperature=temperature,
            max_new_tokens=min(req.max_tokens or d.max_new_tokens, d.max_new_tokens_cap),
            stop_token_ids=self._stop_tuple,
        )
        return Turn(self, req, prompt, params)


class Turn:
    def __init__(self, core: CompletionCore, req: TurnRequest, prompt: BuiltPrompt, params: SamplingParams) -> None:
        self.core, self.req, self.prompt, self.params = core, req, prompt, params
        self.call_id = f"call-{uuid.uuid4().hex[:16]}"

    async def complete(self) -> TurnResult:
        """Generate the whole output, record it, return it."""
        return await self._run(Generation(
            self.core.router, self.core.executor, self.req.session.execution_id, self.prompt.ids, self.params
        ))

    async def stream(self) -> AsyncIterator[tuple[str, Any]]:
        """("reasoning" | "content", text) events as tokens arrive, then ("result", TurnResult).
        Closing the iterator early (client gone) cancels the generation; it is recorded as
        an abort once the engine has stopped."""
        core = self.core
        queue: asyncio.Queue[list[int] | None] = asyncio.Queue()
        generation = Generation(
            core.router, core.executor, self.req.session.execution_id, self.prompt.ids, self.params,
            on_tokens=queue.put_nowait,
        )
        task = asyncio.ensure_future(self._run(generation))
        task.add_done_callback(lambda t: (queue.put_nowait(None), t.cancelled() or t.exception()))
        decoder, streamer = IncrementalDecoder(core.tokenizer), OutputStreamer(core.parser)
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
        ended = finish == "stop" and bool(out.output_ids) and out.output_ids[-1] in self.core.stop_token_ids
        text_ids = out.output_ids[:-1] if ended else out.output_ids
        text = self.core.tokenizer.decode(text_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        parsed = parse_output(text, self.core.parser)
        call = self._record(out, finish, started)
        if finish != "abort":
            self.core.builder.remember(
                self.req.session.tito, self.prompt, self.req.messages, self.req.tools,
                self.req.assistant_message(parsed), out.output_ids, ended,
            )
        return TurnResult(call, parsed, finish)

    def _record(self, out: Generated, finish: str, started) -> Call:
        req, segments = self.req, out.segments
        call = Call(
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
