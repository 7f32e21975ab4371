"""What a run starts from: its queries (split train / eval) and its model directory.

Both are resolved from the config alone, before anything starts, so bad input fails early
with a clear error (`preflight`), and both are cached: the bundled `tiny` benchmark and
model are generated once under `cache_dir`, and a warm-started model is trained once per
(base model, training queries, warm-start settings).

The split is by content (`gyre.benchmarks.content`): queries that share an instruction,
hidden tests or a reference solution stay on one side, chosen by a hash of their content,
so a query stays on its side when the benchmark grows, no held-out query is a copy of a
training one, and the warm start only ever sees training queries. Templates listed in
`benchmark.held_out_kinds` form a second held-out set (generalisation). With
`model.warmstart.demonstrated_fraction` < 1 the training side is split again the same way:
the warm start sees demonstrations of one part, RL trains on the other.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from gyre.benchmarks import generate_tiny, load_benchmark_problems
from gyre.benchmarks.content import kind_of, split_by_content
from gyre.benchmarks.tiny import tiny_reference
from gyre.config.run import RunConfig
from gyre.engines.models.hf import load_tokenizer
from gyre.engines.models.packaged import is_package_ref, resolve_model_path
from gyre.engines.models.tiny import TinyModelSpec, cached_tiny_model
from gyre.evaluators.environments.needs import available_here, task_needs, unmet
from gyre.harnesses import make_harness
from gyre.harnesses.builtin import SYSTEM_PROMPT, TOOLS
from gyre.harnesses.text_agent import TextHarness
from gyre.harnesses.timeouts import execution_timeouts
from gyre.records import Query
from gyre.runtime.warmstart import WarmstartSpec, cached_warmstart
from gyre.sandboxes.factory import check_backend

log = logging.getLogger("gyre.runtime.resolve")


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """A warning about the benchmark, logged once per process: the CLI, the model task and the
    coordinator each resolve the same config."""
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


@dataclass(frozen=True)
class QuerySplit:
    train: list[Query]
    eval: list[Query]
    """In-distribution held-out queries (content never trained on, templates trained on)."""
    generalisation: list[Query] = field(default_factory=list)
    """Queries of templates never trained on (`benchmark.held_out_kinds`)."""
    validation: list[Query] = field(default_factory=list)
    """Carved from the training side by content (`benchmark.validation_fraction`), never trained on:
    what knobs are chosen on."""
    demonstrated: list[Query] = field(default_factory=list)
    """Training queries whose demonstrations the warm start sees, when RL trains on others
    (`model.warmstart.demonstrated_fraction` < 1); empty: the warm start sees `train`."""

    training_side: list[Query] = field(default_factory=list)
    """Both of those, in benchmark order (empty: `train`); the bundled tokenizer is built on them,
    so the base model is the same whatever the warm start demonstrates."""

    @property
    def warmstart_queries(self) -> list[Query]:
        return self.demonstrated or self.train


def resolve_queries(config: RunConfig) -> QuerySplit:
    bench = config.benchmark
    root = bench.path
    if bench.kind == "tiny" and root is None:
        suffix = f"-m{bench.tiny_module}" if bench.tiny_module else ""
        suffix += f"-f{bench.tiny_family}" if bench.tiny_family != "tiny" else ""
        root = generate_tiny(config.cache_dir / "benchmarks" / f"tiny-s{bench.seed}-n{bench.num_queries}{suffix}",
                             bench.num_queries, bench.seed, bench.tiny_module, bench.tiny_family)
    if root is None:
        raise ValueError(f"benchmark.path is required for benchmark kind {bench.kind!r}")
    kind = "nl2repo" if bench.kind == "tiny" else bench.kind
    queries, malformed = load_benchmark_problems(kind, Path(root), bench.name or bench.kind)
    if malformed and not bench.skip_malformed:
        raise malformed[0].error  # names the file and field; `benchmark.skip_malformed: true` runs the rest
    if malformed:
        _warn_once(f"{len(malformed)} malformed task(s) of the benchmark at {root} left out "
                   f"(benchmark.skip_malformed): " + "; ".join(f"{p.task}: {p.reason}" for p in malformed))
    if not queries:
        raise ValueError(f"the benchmark at {root} has no loadable task")
    kinds = {kind_of(q) for q in queries}
    unknown = sorted(set(bench.held_out_kinds) - kinds)
    if unknown:
        raise ValueError(f"benchmark.held_out_kinds names {unknown}: no query of the benchmark at {root} is of "
                         f"that kind (kinds there: {sorted(k for k in kinds if k)})")
    content = split_by_content(queries, bench.eval_fraction, bench.held_out_kinds)
    split = QuerySplit(train=content.train, eval=content.eval, generalisation=content.generalisation)
    if bench.validation_fraction:
        carved = split_by_content(split.train, bench.validation_fraction)
        if not carved.eval:
            raise ValueError(f"benchmark.validation_fraction {bench.validation_fraction} carves no validation query "
                             f"out of the {len(split.train)} training queries of the benchmark at {root}")
        split = QuerySplit(train=carved.train, eval=split.eval, generalisation=split.generalisation,
                           validation=carved.eval)
    if config.evaluation.set == "validation" and not split.validation:
        raise ValueError("evaluation.set is 'validation' but benchmark.validation_fraction carves no validation set")
    if not split.train:
        raise ValueError(f"the split of the benchmark at {root} leaves no training queries "
                         f"(eval_fraction {bench.eval_fraction}, held_out_kinds {bench.held_out_kinds})")
    warm = config.model.warmstart
    if warm.steps and warm.demonstrated_fraction < 1.0:  # the warm start's queries, then RL's: by content too
        parts = split_by_content(split.train, 1.0 - warm.demonstrated_fraction)
        if not parts.eval:
            raise ValueError(f"model.warmstart.demonstrated_fraction {warm.demonstrated_fraction} leaves RL no "
                             f"training query of the {len(split.train)} (every content group demonstrated)")
        split = QuerySplit(train=parts.eval, eval=split.eval, generalisation=split.generalisation,
                           validation=split.validation, demonstrated=parts.train, training_side=split.train)
    if config.rollout.queries_per_step > len(split.train):
        raise ValueError(
            f"rollout.queries_per_step={config.rollout.queries_per_step} exceeds the "
            f"{len(split.train)} training queries of the benchmark at {root}"
        )
    if config.evaluation.every_steps and config.evaluation.set == "held_out" and not (split.eval or split.generalisation):
        raise ValueError("evaluation.every_steps is set but benchmark.eval_fraction leaves no eval queries")
    return split


def _tokenizer_corpus(train: list[Query]) -> tuple[str, ...]:
    """What the run will send, so the bundled tokenizer compresses it: prompts, tools, tasks."""
    texts = [SYSTEM_PROMPT, json.dumps(TOOLS)]
    for query in train:
        texts.append(query.instruction)
        if (query.root / "reference").is_dir():
            texts.append(tiny_reference(query)[1])
    return tuple(texts)


def resolve_model_dir(config: RunConfig, split: QuerySplit) -> Path:
    """The configured model directory (a `pkg:` model converted once), or the bundled tiny model
    (warm-started if configured)."""
    if config.model.path is not None:  # a directory, or `pkg:<package>` converted once under the cache
        base = resolve_model_path(config.model.path, config.cache_dir / "models")
    else:
        tiny = config.model.tiny
        heads = 4
        spec = TinyModelSpec(
            vocab_size=tiny.vocab_size,
            hidden_size=tiny.hidden_size,
            intermediate_size=3 * tiny.hidden_size,
            num_hidden_layers=tiny.num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=heads // 2,
            head_dim=tiny.hidden_size // heads,
            max_position_embeddings=tiny.context_tokens,
            rope_theta=tiny.rope_theta,
            seed=tiny.seed,
            corpus=_tokenizer_corpus(split.training_side or split.train) if tiny.domain_tokenizer else (),
        )
        base = cached_tiny_model(config.cache_dir / "models", spec)
    warm = config.model.warmstart
    if warm.steps == 0:
        return base
    if config.benchmark.kind != "tiny":
        raise ValueError("model.warmstart needs demonstrations: only the bundled tiny benchmark ships them")
    style = warmstart_style(config)
    spec = WarmstartSpec(
        steps=warm.steps, lr=warm.lr, batch_size=warm.batch_size, seed=warm.seed,
        flawed_fraction=warm.flawed_fraction, **style,
    )
    warmed = cached_warmstart(base, config.cache_dir / "models", split.warmstart_queries, spec)
    if not warm.extra_steps:
        return warmed
    # more supervised steps from the same warm start, on every training query's demonstrations
    extra = WarmstartSpec(steps=warm.extra_steps, lr=warm.lr * 0.1, batch_size=warm.batch_size, seed=warm.seed,
                          **style)
    return cached_warmstart(warmed, config.cache_dir / "models", split.training_side or split.train, extra)


def text_harness(config: RunConfig) -> TextHarness | None:
    """The run's `text` harness as the run builds it (`make_harness`), None for any other harness."""
    return make_harness(config.harness) if config.harness.type == "text" else None


def warmstart_style(config: RunConfig) -> dict:
    """`WarmstartSpec`'s style fields for the run's harness: `text` demonstrations for the `text` harness (its
    default file, whether it runs commands first, its output cut), else the builtin harness's tool calls."""
    harness = text_harness(config)
    if harness is None:
        return {}
    return dict(style="text", run_first=harness.run_first, default_file=harness.default_file,
                max_output_chars=harness.max_output_chars)


def check_inputs(config: RunConfig) -> QuerySplit:
    """Everything `preflight` checks that builds nothing slow: the execution timeouts, the sandbox backend,
    the benchmark (the tiny one generated once, cached), a model directory the config names (its tokenizer
    and chat template; a `pkg:` model is converted later, by `preflight`), a warm start's benchmark. `gyre run`
    calls it before any server starts, so bad input is one line and the run directory is never made."""
    execution_timeouts(config)
    check_backend(config.sandbox, config.harness.type)
    split = resolve_queries(config)
    check_scorable([*split.train, *split.eval, *split.generalisation, *split.validation], config)
    if config.model.path is not None and not is_package_ref(config.model.path):
        load_tokenizer(resolve_model_path(config.model.path, config.cache_dir / "models"))
    if config.model.warmstart.steps and config.benchmark.kind != "tiny":
        raise ValueError("model.warmstart needs demonstrations: only the bundled tiny benchmark ships them")
    return split


def preflight(config: RunConfig) -> tuple[Path, QuerySplit]:
    """`check_inputs`, then the model directory resolved (cached ones built: the tiny model, a `pkg:`
    conversion, the warm start)."""
    split = check_inputs(config)
    model_dir = resolve_model_dir(config, split)
    check_answer_budget(config, split, load_tokenizer(model_dir))
    return model_dir, split


def check_answer_budget(config: RunConfig, split: QuerySplit, tokenizer) -> None:
    """When one model call cannot hold a query's reference solution (a benchmark that ships one, `tiny`'s
    `reference/`), every execution of it is cut before its answer ends, whatever the policy learns. The `text`
    harness writes a file as one call's fenced block: there that is a ValueError, before any step. Other
    harnesses get a warning: systems configs run deliberately short budgets (`tiny-cpu-sleepy.yaml`, tests)."""
    budget = config.rollout.max_new_tokens
    for query in [*split.train, *split.eval, *split.generalisation, *split.validation]:
        if not (query.root / "reference").is_dir():
            continue
        name, text = tiny_reference(query)
        needed = len(tokenizer.encode(f"{name}\n```python\n{text}```\n", add_special_tokens=False))
        if needed <= budget:
            continue
        problem = (f"rollout.max_new_tokens {budget} cannot fit the reference solution of {query.query_id} "
                   f"({name} in a fenced block: {needed} tokens with this model's tokenizer)")
        if config.harness.type == "text":
            raise ValueError(problem + "; raise it")
        _warn_once(problem + ": its executions end cut short")
        return


class UnscorableError(ValueError):
    """Queries of a run this machine cannot score: named, each with what it needs, before any model is built."""


def check_scorable(queries: list[Query], config: RunConfig) -> None:
    """Stop a run whose queries this machine cannot score (every evaluation of theirs would be dropped: the run
    would train on what is left, or end Failed having scored nothing), naming each query and what it needs;
    with `evaluator.allow_unscorable` they run, said once as a warning (`warn_unscorable`)."""
    if config.evaluator.allow_unscorable:
        warn_unscorable(queries, config)
        return
    found = unscorable_queries(queries, config)
    if found:
        shown = "; ".join(f"{qid} needs {', '.join(missing)}" for qid, missing in found)
        raise UnscorableError(
            f"{len(found)} of {len(queries)} queries cannot be scored here ({shown}): their evaluations would all "
            "be dropped. Give the evaluation what they need (`gyre benchmark check DIR --control` says it; "
            "`evaluator.network: package-index` offers the index, uv's installer needs the task's own container "
            "too: `sandbox.type: docker`), leave them out, or run anyway with --allow-unscorable (a deployment: "
            "allow_unscorable=true)")


def warn_unscorable(queries: list[Query], config: RunConfig) -> list[tuple[str, list[str]]]:
    """Say, before any execution, which queries this machine cannot score and what they need.

    Where a run allows them (`evaluator.allow_unscorable`) they still run (the agent's part is the same), and
    their evaluations are evaluator failures naming the need, dropped from their groups: never zeros.
    """
    unscorable = unscorable_queries(queries, config)
    if unscorable:
        shown = "; ".join(f"{qid}: needs {', '.join(missing)}" for qid, missing in unscorable[:10])
        _warn_once(f"{len(unscorable)} of {len(queries)} queries cannot be scored here (their evaluations will be "
                   f"dropped, never zeros): {shown}{' ...' if len(unscorable) > 10 else ''}")
    return unscorable


def unscorable_queries(queries: list[Query], config: RunConfig) -> list[tuple[str, list[str]]]:
    """(query id, what it needs that this machine does not offer its evaluation) per query it cannot score."""
    from gyre.benchmarks.registry import task_spec
    from gyre.evaluators.formats.in_container import IN_CONTAINER_FORMATS
    from gyre.evaluators.run_evaluator import tests_in_container

    index = config.evaluator.network == "package-index"
    docker = tests_in_container(config)  # the formats tested in their container, as the run's evaluator does
    built = config.sandbox.type == "docker" and config.sandbox.docker.build_network != "none"  # NL2RepoBench images
    return [(q.query_id, missing) for q in queries if (missing := unmet(task_needs(q, built), available_here(
        package_index=index, in_container=docker and task_spec(q).format in IN_CONTAINER_FORMATS)))]
