"""A seeded synthetic execution shaped like Claude Code traffic through the proxy.

Benchmarks and property tests need million-token executions with the branching of a real
harness, without running one for hours. Token ids are random (content does not matter to
the tree, only which runs repeat); the *shape* follows what public write-ups of Claude
Code 2.x requests show, which the defaults below cite:

* main-agent calls re-send a ~6k-character system prompt in 3 blocks (~1.5k tokens at ~4
  characters a token) and 12-24 tool definitions (~76 KB request bodies before any
  history: ~10-19k tokens), then the whole conversation; each call adds the model's
  output and a tool result (file reads and command output: tens to thousands of tokens).
* sub-agents (the Task tool) run with their own system prompt and a smaller tool set on a
  task the main agent wrote; their final report comes back to the main agent as a tool
  result (the same token ids, spliced by the proxy).
* compaction: past `context_limit` tokens (Claude Code compacts near ~155k of a 200k
  window) the harness appends its summary instruction (~5.4k characters, "Your task is to
  create a detailed summary of the conversation so far ...") to the conversation, and
  continues in a fresh context: system prompt + tools + the summary. With
  `compaction_shares_prefix=False` the summary request instead runs under its own short
  system prompt (older harness versions).
* retries: a request that failed mid-stream (an aborted, partial output) is re-sent with
  the same prompt.

`total_tokens` counts the unique tokens the execution puts into the tree (what it reads
and writes once); generation stops at the first call past it. Prompts are views into one
growing buffer per context, so a 1M-token execution takes megabytes, not gigabytes.
Nothing here is timed by the benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gyre.trajectories.tokens import CallTokens


@dataclass(frozen=True)
class SyntheticSpec:
    total_tokens: int = 200_000
    seed: int = 0
    vocab_size: int = 151_000  # Qwen3 tokenizer size
    system_block_tokens: tuple[int, int, int] = (150, 1100, 250)  # ~6k characters in 3 blocks
    tool_defs: tuple[int, int] = (12, 24)
    tool_def_tokens: tuple[int, int] = (300, 1200)  # each; 12-24 of them make ~76 KB bodies
    task_tokens: tuple[int, int] = (200, 1500)
    output_tokens: tuple[int, int] = (30, 800)  # per main call
    tool_result_tokens: tuple[int, int] = (40, 4000)
    context_limit: int = 155_000
    compaction_marker_tokens: int = 1350  # ~5.4k characters
    summary_tokens: tuple[int, int] = (800, 3000)
    compaction_shares_prefix: bool = True
    summariser_system_tokens: int = 40
    subagent_prob: float = 0.05  # per main call
    subagent_calls: tuple[int, int] = (4, 20)
    subagent_system_tokens: int = 900
    subagent_tool_defs: tuple[int, int] = (4, 8)
    subagent_context_limit: int = 60_000
    retry_prob: float = 0.03  # per call
    agent_ids: bool = False  # record agent ids, as a harness sending session headers would


@dataclass(frozen=True)
class SyntheticExecution:
    calls: list[CallTokens]
    compaction_marker: np.ndarray  # token ids of the summary instruction (a classifier hint)
    num_compactions: int
    num_subagents: int
    num_retries: int


class _Context:
    def __init__(self, first: np.ndarray) -> None:
        self.buf = np.empty(max(4 * len(first), 1 << 16), np.int32)
        self.n = 0
        self.extend(first)

    def extend(self, tokens: np.ndarray) -> None:
        if self.n + len(tokens) > len(self.buf):
            new = np.empty(max(2 * len(self.buf), self.n + len(tokens)), np.int32)
            new[: self.n] = self.buf[: self.n]
            self.buf = new  # earlier prompts keep viewing the old buffer
        self.buf[self.n : self.n + len(tokens)] = tokens
        self.n += len(tokens)

    def view(self) -> np.ndarray:
        return self.buf[: self.n]


class _Generator:
    def __init__(self, spec: SyntheticSpec, execution_id: str) -> None:
        self.spec = spec
        self.eid = execution_id
        self.rng = np.random.default_rng(spec.seed)
        self.calls: list[CallTokens] = []
        self.unique = 0
        self.clock = 0.0
        self.retries = 0

    def tokens(self, n: int) -> np.ndarray:
        self.unique += n
        return self.rng.integers(16, self.spec.vocab_size, size=n, dtype=np.int32)

    def between(self, lo_hi: tuple[int, int]) -> int:
        lo, hi = lo_hi  # log-uniform: many short results, a few long ones
        return int(np.exp(self.rng.uniform(np.log(lo), np.log(hi + 1))))

    def call(self, prompt: np.ndarray, num_out: int, agent: str) -> np.ndarray:
        spec = self.spec
        agent_id = agent if spec.agent_ids else None
        if self.rng.random() < spec.retry_prob and num_out > 1:
            partial = self.tokens(int(self.rng.integers(1, num_out)))
            self._record(prompt, partial, agent_id, "abort")
            self.retries += 1
        out = self.tokens(num_out)
        self._record(prompt, out, agent_id, "stop")
        return out

    def _record(self, prompt, out, agent_id, finish) -> None:
        self.clock += 1.0
        logprobs = -self.rng.exponential(0.7, size=len(out)).astype(np.float32)
        self.calls.append(CallTokens(
            call_id=f"{self.eid}-c{len(self.calls):04d}", execution_id=self.eid, prompt_ids=prompt,
            output_ids=out, logprobs=logprobs, policy_version=0, agent_id=agent_id,
            started_at=self.clock, finish_reason=finish,
        ))


def generate(spec: SyntheticSpec = SyntheticSpec(), execution_id: str = "synthetic") -> SyntheticExecution:
    g = _Generator(spec, execution_id)
    system = np.concatenate([g.tokens(n) for n in spec.system_block_tokens])
    tools = np.concatenate([g.tokens(g.between(spec.tool_def_tokens)) for _ in range(g.between(spec.tool_defs))])
    preamble = np.concatenate([system, tools])
    sub_preamble = np.concatenate(
        [g.tokens(spec.subagent_system_tokens)]
        + [g.tokens(g.between(spec.tool_def_tokens)) for _ in range(g.between(spec.subagent_tool_defs))]
    )
    marker = g.tokens(spec.compaction_marker_tokens)
    summariser = g.tokens(spec.summariser_system_tokens)
    main = _Context(np.concatenate([preamble, g.tokens(g.between(spec.task_tokens))]))
    compactions = subagents = 0

    def compact(ctx: _Context, own_preamble: np.ndarray, agent: str) -> _Context:
        if spec.compaction_shares_prefix:
            prompt = np.concatenate([ctx.view(), marker])
        else:
            prompt = np.concatenate([summariser, ctx.view()[len(own_preamble):], marker])
        g.unique += len(marker) if spec.compaction_shares_prefix else len(prompt)
        summary = g.call(prompt, g.between(spec.summary_tokens), agent)
        wrapper = g.tokens(30)  # "This session is being continued from a previous conversation ..."
        g.unique += len(summary)
        return _Context(np.concatenate([own_preamble, wrapper, summary]))

    while g.unique < spec.total_tokens:
        out = g.call(main.view(), g.between(spec.output_tokens), "main")
        main.extend(out)
        if g.rng.random() < spec.subagent_prob:
            subagents += 1
            task = out[-min(len(out), 200):]  # the Task tool's prompt, written by the main agent
            g.unique += len(task)
            sub = _Context(np.concatenate([sub_preamble, task]))
            for _ in range(g.between(spec.subagent_calls)):
                sub_out = g.call(sub.view(), g.between(spec.output_tokens), f"sub-{subagents}")
                sub.extend(sub_out)
                sub.extend(g.tokens(g.between(spec.tool_result_tokens)))
                if sub.n > spec.subagent_context_limit:
                    sub = compact(sub, sub_preamble, f"sub-{subagents}")
            report = g.call(sub.view(), g.between(spec.output_tokens), f"sub-{subagents}")
            main.extend(np.concatenate([g.tokens(8), report]))  # tool result: wrapper + the report
            g.unique += len(report)
        else:
            main.extend(g.tokens(g.between(spec.tool_result_tokens)))
        if main.n > spec.context_limit:
            compactions += 1
            main = compact(main, preamble, "main")
    return SyntheticExecution(g.calls, marker, compactions, subagents, g.retries)
