"""Typed run configuration, loaded from YAML files under `configs/`.

One `RunConfig` says everything a run does; the resolved config is written next to the
results (`<run_dir>/config.yaml`). Every field carries a docstring (shown by
`RunConfig.model_json_schema()`); unknown keys and wrong types are errors that name the
file and the field. Backends are chosen by a `type` field, so adding SGLang or
Megatron-core adds a variant, not a flag. The strict section base and the YAML loader are in
`gyre.config.base`, the model section in `gyre.config.model`, the sandbox's in `gyre.config.sandbox`, the
evaluator's and the eval rounds' in `gyre.config.evaluator`, the cell scheduler's in `gyre.config.scheduler`;
all are re-exported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, field_validator, model_validator

from gyre.config.base import ConfigError, Section, load_yaml_model
from gyre.config.evaluator import EvaluationConfig, EvaluatorConfig
from gyre.config.model import ModelConfig, TinyModelSettings, WarmstartSettings
from gyre.config.paced import PacedConfig
from gyre.config.sandbox import DockerConfig, SandboxConfig
from gyre.config.scheduler import SchedulerConfig

__all__ = [  # the sections in config_model and the base in config_base are re-exported here
    "Section", "ConfigError", "load_yaml_model", "TinyModelSettings", "WarmstartSettings", "ModelConfig",
    "BenchmarkConfig", "RolloutConfig", "HarnessConfig", "SandboxConfig", "DockerConfig",
    "EvaluatorConfig", "EvaluationConfig",
    "MegatronConfig", "TrainConfig", "TrajectoryConfig", "AlgoConfig", "MetricsConfig", "SchedulerConfig", "PacedConfig",
    "RunConfig", "load_config", "dump_config",
]


class BenchmarkConfig(Section):
    kind: Literal["tiny", "nl2repo", "terminal-bench", "harbor", "r2e", "swe-bench", "auto"] = "tiny"
    """`tiny`: the bundled generated set (NL2RepoBench layout). Otherwise the native format of the
    directory at `path`: `nl2repo`, `terminal-bench`, `harbor`, `r2e` (R2E-Gym / DeepSWE rows), `swe-bench`
    (instances built by `gyre benchmark build swe-bench`), or
    `auto` to detect it."""
    path: Path | None = None
    """Benchmark directory. For `tiny`, None generates it under the cache directory."""
    name: str | None = None
    """Benchmark name recorded with every execution (defaults to the kind)."""
    num_queries: int = Field(default=64, gt=0)
    """Queries the `tiny` generator writes."""
    seed: int = 0
    """Seed of the `tiny` generator."""
    tiny_module: str | None = Field(default=None, pattern=r"^[a-z_][a-z0-9_]*$")
    """`tiny`: every query asks for this one module (e.g. `solution`: `solution.py`), the file a single-file
    agent writes by default (`harness.text_default_file`); None: a module name drawn per query. The queries
    are otherwise the same."""
    tiny_family: Literal["tiny", "probe"] = "tiny"
    """`tiny`: which templates the generator writes. `tiny`: one-turn single-module tasks; `probe`: the answer is
    what a script in the workspace prints, so the agent must run it and act on its output (several turns;
    `gyre/benchmarks/probe_tasks.py`, with `harness.text_run_first`)."""
    eval_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Share of content groups held out for evaluation (in-distribution), never trained on. Queries
    sharing an instruction, hidden tests or a reference solution form one group and stay on one side
    (`gyre.benchmarks.content`), so no copy of a training query is held out."""
    validation_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Share of the training side's content groups carved out as a validation set (after the held-out
    sets are taken): never trained on, whatever `evaluation.set` says, so a run that tunes knobs on it
    trains on exactly the queries the final run trains on. Choose knobs with `evaluation.set: validation`;
    the held-out sets then stay unseen."""
    held_out_kinds: list[str] = Field(default_factory=list)
    """`tiny` templates never trained on (e.g. `[scale]`): their queries form a second held-out set,
    `generalisation`, evaluated beside the in-distribution one (`evals.split`)."""
    skip_malformed: bool = False
    """False: the first malformed task stops the run before it starts (its file and field named).
    True: malformed tasks are left out, each named with its reason in one warning, and the run
    goes on with the rest (`gyre benchmark check` lists them too)."""


class RolloutConfig(Section):
    engine: Literal["torch", "sglang", "paced"] = "torch"
    """Rollout engine backend: `torch`, the reference engine in this process (the default), or
    `sglang`, SGLang servers already running (one per rollout cell, `sglang_urls`), reached over
    HTTP (`gyre/engines/sglang/adapter.py`; servers launched with `--skip-tokenizer-init` on the
    run's model directory). With `sglang` each server is given the run's start weights before
    the first step, and every published snapshot after that. `paced`: the torch engine with each
    call's tokens released when a modelled accelerator cell would have produced them (`paced`
    below, `gyre/engines/paced.py`); under the cell scheduler the cells' training, pulls,
    switches and publications are paced by the same cell model."""
    paced: PacedConfig = PacedConfig()
    """`engine: paced`: the modelled cell and the clock it runs on."""
    sglang_urls: list[str] = Field(default_factory=list)
    """`engine: sglang`: base URLs of the servers (e.g. `http://10.0.0.5:30000`), one per rollout
    engine: the first serves the run (cell 0), the next ones cells 1.. of the cell scheduler and
    the evaluation engine (so `scheduler.num_cells` + 1 under the cell scheduler)."""
    sglang_healthy_timeout_s: float = Field(default=300.0, gt=0)
    """`engine: sglang`: how long a server may take to answer `/health_generate` before the run
    stops with an error naming it."""
    queries_per_step: int = Field(default=2, gt=0)
    """Distinct queries per optimizer step."""
    group_size: int = Field(default=16, ge=2)
    """Executions per query per step (a group); advantages are relative within it."""
    temperature: float = Field(default=1.0, gt=0.0)
    """Sampling temperature; the trainer scores tokens at the same temperature."""
    max_new_tokens: int = Field(default=128, gt=0)
    """Default cap on tokens per model call when the harness does not set one."""
    max_batch_size: int = Field(default=32, gt=0)
    """Most concurrent calls the engine batches together."""
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:[0-9]+)?)$")
    """`engine: torch`: torch device of the reference rollout engines (`cpu`, `cuda`, `cuda:N`):
    this process's, and under `scheduler.runtime: ray` each rank's, on the GPU its bundle holds
    (`scheduler.gpus_per_rank`). An SGLang server places itself."""
    prefix_cache_bytes: int = Field(default=2**30, ge=0)
    """Memory budget of the engine's prefix cache: the KV of earlier prompts, so a call that extends
    an earlier call's prompt (an agent's next turn) prefills only what is new. Evicted least recently
    used, emptied on every weight update. 0 turns the cache off."""


class HarnessConfig(Section):
    type: Literal["builtin", "text", "claude-code", "mini-swe-agent", "command", "sleepy"] = "builtin"
    """Harness that drives the model: `builtin` (gyre's reference agent, runs on the host and
    acts through the sandbox with tool calls), `text` (the same on the host, for models without
    tool calling: actions are fenced code blocks in plain replies, `gyre.harnesses.text_agent`), or one run
    inside the sandbox against the proxy: `claude-code`
    (the `claude` CLI in print mode), `mini-swe-agent` (the `mini` CLI), `command` (`command`).
    `sleepy` is a systems-benchmark load, not an agent: real model calls spread over a wait
    drawn from a simulator workload (`sleepy_*`); it writes nothing to the workspace, which scores
    what an untouched one does (0 on the tiny benchmark)."""
    command: list[str] = []
    """argv of the `command` harness; it gets the proxy URL/key and GYRE_INSTRUCTION in its env."""
    max_turns: int = Field(default=4, gt=0)
    """Model calls per execution before the harness stops."""
    text_default_file: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")
    """`text`: the file a code block that names none writes (a single-file task set: e.g. `solution.py` with
    `benchmark.tiny_module: solution`); the task is followed by "answer with the complete code of the file in one
    ```python block". None: only blocks that name their file write one."""
    text_run_first: bool = False
    """`text` with a default file: the format after the task also says that a ```bash block runs a command whose
    output comes back, before the file is written (tasks whose answer a command prints: `benchmark.tiny_family:
    probe`). False: only the one-file format."""
    harness_timeout_s: float = Field(default=300.0, gt=0)
    """Wall-clock budget of the harness; past it the agent is stopped, the execution ends as
    harness_timeout and its kept workspace is still scored."""
    overall_timeout_s: float | None = Field(default=None, gt=0)
    """Wall-clock budget of the whole execution: sandbox, harness and evaluation. The harness is
    stopped `evaluator.timeout_s` before it (status overall_timeout, still scored); an evaluation
    still running at it is an evaluator failure (dropped, retryable). None: no overall bound."""
    command_timeout_s: float = Field(default=20.0, gt=0)
    """Time limit of one shell command run by the agent."""
    max_tool_output_chars: int = Field(default=2000, gt=0)
    """Tool output (`text`: a command's output) beyond this many characters is cut before it goes back to the model."""
    compaction_threshold_tokens: int | None = Field(default=None, gt=0)
    """`builtin`: when an agent's context (the last call's prompt + output tokens) reaches this, it
    asks the model for a summary and continues in a fresh context, as Claude Code does. None: never."""
    max_sub_agents: int = Field(default=0, ge=0)
    """`builtin`: sub-agents the main agent may spawn per execution (its `spawn_agent` tool, offered
    only when this is above 0); each works in a fresh context and returns a report."""
    sub_agent_max_turns: int = Field(default=4, gt=0)
    """`builtin`: model calls per sub-agent before it stops."""
    sleepy_workload: Literal["nl2repo-122b", "nl2repo-2.4t", "deepswe-122b", "terminalbench-122b"] = "nl2repo-122b"
    """`sleepy`: the simulator workload (`gyre simulate --workload`) whose execution durations it
    draws: execution i of group g gets the duration the simulator gives execution g x group_size + i
    of that workload at the run's seed and `rollout.group_size`, so every policy sees the same ones."""
    sleepy_scale: float = Field(default=10.0, gt=0)
    """`sleepy`: wall-clock seconds per simulated hour (10: a 4 h harness timeout lasts 40 s)."""
    sleepy_calls: int = Field(default=4, gt=0)
    """`sleepy`: model calls per execution; the drawn duration is spread as equal waits after each."""


class MegatronConfig(Section):
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel size: each weight matrix split over this many ranks (one process per rank;
    world = tp x pp x data-parallel). Must divide the attention heads, key/value heads and MLP width."""
    pp: int = Field(default=1, ge=1)
    """Pipeline-parallel size: the decoder layers split into this many consecutive stages, one
    per rank (the embedding on the first, the final norm and LM head on the last; a tied head is
    kept as a copy on the last stage, its gradients summed with the embedding's). Megatron's
    1F1B schedule runs the micro-batches through the stages. world = tp x pp x data-parallel;
    num_hidden_layers must divide by pp. The engine refuses, naming the numbers, a model whose
    layers do not divide or a world that is not a multiple of tp x pp."""


class TrainConfig(Section):
    engine: Literal["torch", "megatron"] = "torch"
    """Train engine backend. `torch`: the reference engine (one replica per process). `megatron`:
    Megatron-core's GPTModel built from the HF config (Qwen3/Qwen2/Llama), split by
    `train.megatron`; needs `pip install gyre-rl[megatron]`. Same loss, same HF snapshots."""
    megatron: MegatronConfig = MegatronConfig()
    """`megatron` engine: model-parallel sizes."""
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:[0-9]+)?)$")
    """Torch device of the train engine (`cpu`, `cuda`, `cuda:N`): the core's, and under
    `scheduler.runtime: ray` each training rank's, on the GPU its bundle holds
    (`scheduler.gpus_per_rank`). On CUDA the cells' gradient reduction runs over NCCL."""
    trainable_layers: int | None = Field(default=None, gt=0)
    """`torch` engine: train only the top N decoder layers and the final norm; the embedding, a head tied to it
    and the layers below stay frozen, so the backward pass stops early (a real model on a CPU box). None: all."""
    lr: float = Field(default=1e-3, gt=0)
    """AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW decoupled weight decay."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Global gradient-norm clip."""
    micro_batch_tokens: int = Field(default=16384, gt=0)
    """Padded tokens per micro-batch; gradients accumulate across micro-batches."""
    checkpoint_every: int = Field(default=0, ge=0)
    """Write a checkpoint (weights, optimizer, step, RNG) every N steps and after the last; 0: never."""
    keep_checkpoints: int = Field(default=0, ge=0)
    """Keep only the newest N checkpoints (older ones are removed after each new one); 0: keep all."""


class TrajectoryConfig(Section):
    jmax: int | Literal["uncapped"] = Field(default=5)
    """Most trajectories trained per execution, by rank main > main-summary > sub-agent >
    sub-agent-summary (ties: see gyre/trajectories/sampling.py); "uncapped" keeps all."""
    packing: Literal["tree", "per_trajectory"] = "tree"
    """`tree`: each execution's kept trajectories in one row with ancestor-only attention, shared
    prefixes computed once. `per_trajectory`: one causal row per kept trajectory. Same loss."""
    row_tokens: int | None = Field(default=None, gt=0)
    """Most tokens in one tree-packed row; None: `train.micro_batch_tokens`."""
    main_share: float = Field(default=0.5, gt=0, le=1)
    """Without agent ids, a trajectory is the main agent's iff it shares this fraction of the first prompt."""
    compaction_markers: list[str] = []
    """Text of the harness's compaction instruction(s), tokenized with the run's tokenizer (a classifier hint)."""
    loss_norm_tokens: int | None = Field(default=None, gt=0)
    """None (DESIGN.md's rule): the loss is the mean over an execution's trainable tokens, then over executions.
    N: every token weighs 1 / (N * executions), a constant (Dr. GRPO's aggregation; N about the longest reply):
    the per-execution mean pushes a long failed reply down less per token than a short one, so under RL
    replies can drift longer. Applies to every objective (`gspo`, `rft`). Measured on SmolLM2 (docs/learning.md,
    attempt 5): it stopped RL's drift to the length cap on one seed of two, and did not lift RL above RFT."""

    @field_validator("jmax")
    @classmethod
    def _jmax_positive(cls, value):
        if isinstance(value, int) and value < 1:
            raise ValueError('jmax must be >= 1 or "uncapped"')
        return value

    @property
    def jmax_or_none(self) -> int | None:
        return None if self.jmax == "uncapped" else self.jmax


class AlgoConfig(Section):
    name: Literal["gspo", "rft"] = "gspo"
    """Objective. `gspo`: the GSPO variant of DESIGN.md. `rft`: rejection-sampling fine-tuning, the supervised
    baseline RL must beat: the NLL of each step's solved samples (`gyre.algo.rft`; the ratio and clip fields
    and `normalize_std` do not apply)."""
    token_ratio_cap: float = Field(default=5.0, gt=1.0)
    """Cap on the per-token importance ratio trainer/behaviour."""
    seq_clip_low: float = Field(default=0.995, gt=0, le=1)
    """Lower clip of the sequence-level ratio."""
    seq_clip_high: float = Field(default=1.005, ge=1)
    """Upper clip of the sequence-level ratio."""
    normalize_std: bool = True
    """Divide group-relative advantages by the group's standard deviation."""
    baseline: Literal["group_mean", "none"] = "group_mean"
    """`gspo`: what a score's advantage is measured from. `group_mean` (GRPO's): its group's mean, so a group's
    advantages sum to zero and a group scored alike trains nothing. `none` (REINFORCE without a baseline): the
    score itself, every partly solved sample pushed up by its score, nothing down (`gyre.algo.advantages`)."""
    reward: Literal["score", "solved"] = "score"
    """`gspo`: the reward advantages are taken from. `score`: the evaluation's score (partial credit: the share of
    hidden tests passed). `solved`: 1 at `rft_solved_score` or above, else 0 (what `rft` filters on)."""
    negative_weight: float = Field(default=1.0, ge=0.0, le=1.0)
    """`gspo`: scale on negative advantages. 1 (GSPO's): a group's advantages sum to zero. Below 1 the failed samples
    of a group with a solved one are pushed down by that share of their advantage while the solved ones keep all of
    theirs, so the tokens they share (format, the `def` line) get a net push up; 0 keeps only the pushes up
    (docs/learning.md, attempt 7)."""
    rft_solved_score: float = Field(default=1.0, gt=0.0, le=1.0)
    """`rft`: the score at which a sample counts as solved and is trained on (1.0: every hidden test passed)."""


class MetricsConfig(Section):
    sinks: list[Literal["tensorboard", "wandb"]] = Field(default_factory=list)
    """Optional mirrors of the step metrics (`gyre.metrics`), beside DuckDB (always written):
    `tensorboard` (events under `<run_dir>/tensorboard`) and `wandb` (offline, under `<run_dir>`),
    each used when its package is installed. A failing sink is warned about once, never stops a run."""
    project: str = "gyre"
    """wandb project name."""


class RunConfig(Section):
    name: str = "gyre"
    """Run name, shown in the Prefect UI and recorded in DuckDB."""
    seed: int = 0
    """Seed for query sampling, rollout sampling and training."""
    steps: int = Field(default=2, ge=0)
    """Optimizer steps to run (the CLI's --steps overrides it); 0 only evaluates the starting policy
    (with `evaluation.every_steps` set), as `gyre bench learning`'s supervised arm does."""
    cache_dir: Path = Path(".gyre-cache")
    """Where the bundled tiny model and benchmark are built (and a `pkg:` model converted) once and reused."""
    model: ModelConfig = ModelConfig()
    """The policy's starting weights and tokenizer."""
    benchmark: BenchmarkConfig = BenchmarkConfig()
    """Where the training queries come from."""
    rollout: RolloutConfig = RolloutConfig()
    """Rollout engine and sampling; queries and group size per step."""
    harness: HarnessConfig = HarnessConfig()
    """The agent that drives the model through the proxy."""
    sandbox: SandboxConfig = SandboxConfig()
    """Where executions act, and their resource limits."""
    evaluator: EvaluatorConfig = EvaluatorConfig()
    """How kept workspaces are scored."""
    evaluation: EvaluationConfig = EvaluationConfig()
    """Periodic evaluation of the policy on held-out queries (`steps.eval_pass_rate`)."""
    train: TrainConfig = TrainConfig()
    """Train engine and optimizer."""
    algo: AlgoConfig = AlgoConfig()
    """The RL objective and advantage estimation."""
    trajectories: TrajectoryConfig = TrajectoryConfig()
    """How recorded calls become trained trajectories: Jmax sampling, packing, classifier hints."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """Cell scheduling on the box (off by default: the step-synchronous loop)."""
    metrics: MetricsConfig = MetricsConfig()
    """Where step metrics go besides DuckDB."""

    @model_validator(mode="after")
    def _paced_engine_has_a_clock(self) -> "RunConfig":
        """A paced engine runs on the sleepy harness's clock unless it names its own."""
        paced = self.rollout.paced
        if self.rollout.engine == "paced" and paced.scale_s_per_h is None and self.harness.type != "sleepy":
            raise ValueError("rollout.engine: paced needs rollout.paced.scale_s_per_h (wall seconds per modelled "
                             f"hour) with harness.type: {self.harness.type}; only the sleepy harness lends its clock")
        if (self.rollout.engine == "paced" and self.harness.type == "sleepy" and paced.scale_s_per_h is not None
                and paced.scale_s_per_h != self.harness.sleepy_scale):
            raise ValueError(f"rollout.paced.scale_s_per_h ({paced.scale_s_per_h}) differs from harness.sleepy_scale "
                             f"({self.harness.sleepy_scale}): the executions' durations and the cells' device would "
                             "run on two clocks")
        return self

    @model_validator(mode="after")
    def _ray_cells_run_torch_engines(self) -> "RunConfig":
        """`scheduler.runtime: ray` builds the torch engines inside each cell's actor (the Megatron
        train engine in tensor-parallel cells)."""
        if self.scheduler.runtime == "ray":
            if self.rollout.engine == "sglang":
                raise ValueError("scheduler.runtime: ray runs the torch rollout engine in each cell's actor; with "
                                 "rollout.engine: sglang the servers are already separate (runtime: threads)")
            sched = self.scheduler
            split = (f"scheduler.cell_tensor_parallel: {sched.cell_tensor_parallel}, cell_pipeline_parallel: "
                     f"{sched.cell_pipeline_parallel}")
            if sched.cell_model_parallel > 1 and self.train.engine != "megatron":
                raise ValueError(f"{split} split the train engine with Megatron: it needs train.engine: megatron "
                                 f"(got {self.train.engine})")
            if sched.cell_model_parallel > 1 and (self.train.megatron.tp, self.train.megatron.pp) != (1, 1):
                raise ValueError(f"{split} needs train.megatron.tp: 1 and pp: 1: the core trains in the driver, one "
                                 f"process (got tp: {self.train.megatron.tp}, pp: {self.train.megatron.pp})")
            if sched.cell_model_parallel == 1 and self.train.engine != "torch":
                raise ValueError("scheduler.runtime: ray trains torch replicas in the cells' actors; "
                                 f"train.engine: {self.train.engine} runs under runtime: threads, or in "
                                 "model-parallel cells (scheduler.cell_tensor_parallel or cell_pipeline_parallel > 1)")
        return self


def load_config(path: Path | str) -> RunConfig:
    return load_yaml_model(path, RunConfig)


def dump_config(config: RunConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
