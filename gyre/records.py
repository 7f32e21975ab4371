"""Records that cross a boundary: between processes, over HTTP, into DuckDB, or from disk.

Every fact gyre learns about a run is one of these pydantic models, so each boundary
validates what it receives and names the field that is wrong. Inside a module, plain
dataclasses and tensors are used instead; these records are the contract between modules.

Glossary (see docs/architecture.md): a *query* is one benchmark item; an *execution* is
one harness run of one query in one sandbox; a *call* is one model request/response
recorded token-in/token-out; a *score* is the evaluator's verdict on an execution's kept
workspace.
"""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class Record(BaseModel):
    """Base: unknown fields are an error, so a typo never silently drops data."""

    model_config = ConfigDict(extra="forbid")


class Query(Record):
    """One benchmark item: what the agent is asked, what it starts from, how it is scored."""

    query_id: str
    benchmark: str
    instruction: str = Field(description="The task text the harness gives the agent (start.md).")
    root: Path = Field(description="The query's directory on disk, in its benchmark's native layout.")
    start_dir: Path | None = Field(
        default=None, description="Files copied into a fresh workspace before the agent starts."
    )
    hidden_tests_dir: Path = Field(description="Pristine hidden tests; never visible to the agent.")
    test_files: list[str] = Field(description="Paths (relative to the workspace) of the hidden tests.")
    test_commands: list[str] = Field(description="Shell commands that run the hidden tests.")
    test_case_count: int = Field(gt=0, description="Denominator of the partial-credit score.")


class ExecutionStatus(str, Enum):
    """How the harness run ended (not how it scored)."""

    completed = "completed"
    harness_timeout = "harness_timeout"
    overall_timeout = "overall_timeout"
    harness_error = "harness_error"
    sandbox_error = "sandbox_error"
    """Its sandbox could not start (the task's image did not build, the engine refused): no agent ran; its
    evaluation is an evaluator failure (dropped), never a 0."""


class EvalStatus(str, Enum):
    """Whether the evaluator produced a valid score.

    `error` means the evaluator itself failed (crash, infra error): such an execution is
    dropped from its group and never counted as a zero. `tampering` means the evaluation
    caught the workspace forging its result (a canary, a forged message, a monitor hit
    set to act): it scores 0, counts in its group like any 0, and keeps its evidence.
    """

    ok = "ok"
    error = "error"
    tampering = "tampering"


class Score(Record):
    execution_id: str
    status: EvalStatus
    score: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Partial credit in [0, 1]; None iff status is error."
    )
    tests_passed: int = 0
    tests_total: int = 0
    detail: str = ""
    evidence: list[str] = Field(default_factory=list, description="What made the evaluation suspect tampering.")
    flags: list[str] = Field(default_factory=list, description="The reward-hacking monitor's hits on the workspace.")

    @model_validator(mode="after")
    def _score_iff_ok(self) -> "Score":
        if (self.status is not EvalStatus.error) != (self.score is not None):
            raise ValueError("score must be set exactly when status is not 'error'")
        if self.status is EvalStatus.tampering and self.score != 0.0:
            raise ValueError("a tampering verdict scores 0")
        return self


class OutputSegment(Record):
    """A run of a call's output tokens sampled by one engine at one policy version.

    A call has several when the proxy continued it on another engine (drain, failure):
    segment k+1 was sampled from prompt + the tokens of segments 0..k.
    """

    engine_id: str
    policy_version: int = Field(ge=0)
    start: int = Field(ge=0, description="First output index of the segment.")
    end: int = Field(ge=0, description="One past its last output index.")


class Call(Record):
    """One model call, recorded token-in/token-out (TITO) by the proxy.

    `prompt_ids` are exactly what the engine consumed and `output_ids` exactly what it
    sampled; `logprobs[i]` is the behaviour log-probability of `output_ids[i]`. Only output
    ids are ever trainable; `prompt_fallback_spans` additionally names the prompt positions
    where the harness sent back an assistant turn the proxy could not match to recorded
    output ids (edited, truncated, compacted), so those template tokens stand in for it.
    """

    call_id: str
    execution_id: str
    agent_id: str | None = None
    kind: str = Field(default="chat", description="The API endpoint family: chat (OpenAI) or messages.")
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    policy_version: int = Field(ge=0, description="Policy version that sampled the output tokens.")
    engine_id: str
    finish_reason: str = Field(description="stop (end of turn), length (max tokens) or abort.")
    started_at: datetime = Field(default_factory=utc_now)
    finished_at: datetime = Field(default_factory=utc_now)
    segments: list[OutputSegment] = Field(
        default_factory=list,
        description="Engine and policy version per run of output tokens; empty means one segment "
        "(engine_id, policy_version) covering all of them.",
    )
    prompt_fallback_spans: list[tuple[int, int]] = Field(
        default_factory=list,
        description="[start, end) prompt positions holding template tokens of an assistant turn the "
        "harness changed; never trainable.",
    )
    session_hint: str | None = Field(
        default=None, description="The harness's own session id, when it sends one (e.g. Claude Code's)."
    )
    first_token_at: datetime | None = Field(default=None, description="When the first output token was sampled.")

    @model_validator(mode="after")
    def _lengths_match(self) -> "Call":
        if len(self.output_ids) != len(self.logprobs):
            raise ValueError(
                f"call {self.call_id}: {len(self.output_ids)} output ids but {len(self.logprobs)} logprobs"
            )
        if self.segments and (
            self.segments[0].start != 0
            or self.segments[-1].end != len(self.output_ids)
            or any(a.end != b.start for a, b in zip(self.segments, self.segments[1:]))
        ):
            raise ValueError(f"call {self.call_id}: segments do not tile the {len(self.output_ids)} output ids")
        return self

    @classmethod
    def assembled(cls, *, handed_over: tuple[str, ...] = (), **fields: Any) -> "Call":
        """A call the proxy assembled itself (ids it built and the engine returned, its own
        segments and times): constructed without validating each of its 10^4-10^5 ids one by
        one (1.7 ms of the GIL per 50k-token prompt, on every call), then checked as any call
        is across fields. Its lists are copied, so the record owns them, except the fields named
        in `handed_over`: lists the caller gives up and never changes again (the proxy's prompt
        ids, built for this call alone: a copy of 50k ids is ~0.1 ms on every call). Input from
        outside (files, HTTP) goes through validation."""
        if fields.get("policy_version", 0) < 0:
            raise ValueError(f"call {fields.get('call_id')}: negative policy_version")
        owned = {k: list(v) if isinstance(v, list) and k not in handed_over else v for k, v in fields.items()}
        return cls.model_construct(**owned)._lengths_match()


class Execution(Record):
    """One harness run of one query in one sandbox, with what it produced."""

    execution_id: str
    step: int = Field(ge=0, description="The step whose batch this execution trained in (the step-synchronous "
                      "loop dispatches it for that step; under the cell scheduler it joins a batch on arrival).")
    query_id: str
    benchmark: str
    group_index: int = Field(ge=0, description="Position of this execution inside its query's group.")
    purpose: Literal["train", "eval"] = Field(
        default="train", description="train: rolled out for a step's batch; eval: a held-out evaluation sample."
    )
    status: ExecutionStatus
    workspace: Path = Field(description="The kept workspace; evaluation can be rerun from it.")
    policy_version_dispatched: int = Field(ge=0)
    num_calls: int = 0
    num_tokens: int = 0
    error: str | None = None
    started_at: datetime = Field(default_factory=utc_now)
    finished_at: datetime = Field(default_factory=utc_now)
    image: str | None = Field(default=None, description="docker: the image its container ran from, `requested -> "
                              "used` when `sandbox.docker.base_images` replaced it; None in a local sandbox.")


class EvalRecord(Record):
    """One evaluation of a policy version on the held-out queries."""

    step: int = Field(ge=0, description="Evaluated before this step (== the number of steps taken).")
    policy_version: int = Field(ge=0)
    split: Literal["in_distribution", "generalisation", "validation"] = Field(
        default="in_distribution",
        description="Which held-out set: new content of trained templates, templates never trained on, or the "
                    "validation set carved from training (`evaluation.set: validation`).")
    pass_rate: float | None = Field(description="Mean score over valid eval executions; None if all failed.")
    num_executions: int
    num_dropped: int = Field(description="Eval executions whose evaluation failed (not counted as zeros).")
    started_at: datetime
    finished_at: datetime


class StepRecord(Record):
    """What one optimizer step consumed and did."""

    step: int = Field(ge=0)
    policy_version: int = Field(ge=0, description="Policy version produced by this step.")
    reward_mean: float | None
    num_executions: int
    num_dropped: int = Field(description="Executions dropped because their evaluation failed.")
    num_tampering: int = Field(default=0, description="Executions scored 0 because their evaluation caught tampering.")
    mean_staleness: float
    logprob_abs_diff: float | None = Field(
        description="Mean |trainer log-prob - behaviour log-prob| over trained tokens, before the update."
    )
    loss: float | None
    grad_norm: float | None
    tokens_trained: int
    token_cap_frac: float | None = Field(default=None, description="Share of trained tokens whose ratio hit GSPO's cap.")
    clip_low_frac: float | None = Field(default=None, description="Share of trajectories clipped below 1 - eps_low.")
    clip_high_frac: float | None = Field(default=None, description="Share of trajectories clipped above 1 + eps_high.")
    sampled_entropy: float | None = Field(
        default=None, description="Mean -log pi(token) over sampled tokens: the policy's entropy, estimated.")
    mean_response_tokens: float | None = Field(default=None, description="Trained tokens per trajectory.")
    eval_pass_rate: float | None = None
    skipped_reason: str | None = None
    started_at: datetime
    finished_at: datetime
