"""Supervised warm start: teach a fresh model the harness's tool-call format before RL.

A randomly initialised model never emits a parseable tool call, so every execution scores
0, every group has zero variance and RL has nothing to learn from. The warm start fixes
that the way real pipelines do (SFT, then RL): it builds demonstrations the project
generates itself (the builtin harness's own conversation for a training query: system
prompt and tools, the instruction, a `write_file` call with the query's reference
solution, the tool result, a `finish` call; or the `text` harness's, fenced blocks, with the starting
scripts run first for a harness that runs commands first: `gyre.runtime.demonstrations`), renders them with
the model's chat template exactly as the proxy renders a live request, and trains on the assistant turns only.

It is deliberately short: the goal is a policy that solves some queries but not all, so
the RL run has variance to learn from. Optionally (`flawed_fraction`) a share of the
demonstrations is drawn in a flawed style, `print(x)` where the solution must `return x`,
as SFT data from sources of uneven quality is: the warm-started policy then hesitates
between the two styles on every function it writes, and RL must learn from reward alone
which one the hidden tests accept. The flaw is one decision shared across task families,
so what RL learns on training queries shows on held-out ones. The result is an ordinary HF
model directory, cached under a name derived from everything that determines it, so
`make run` builds it once.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from gyre.benchmarks.tiny import tiny_reference
from gyre.engines.models.hf import load_causal_lm, load_tokenizer
from gyre.harnesses.builtin import SYSTEM_PROMPT, TOOLS
from gyre.harnesses.text_agent import FORMAT_ONE_FILE, FORMAT_RUN_FIRST, TextHarness
from gyre.proxy.prompt import PromptBuilder
from gyre.runtime.demonstrations import DONE_REPLY, demonstration, render, text_demonstration
from gyre.records import Query
from gyre.runtime.lifecycle import RunStopped, stopping
from gyre.runtime.progress import ProgressEvent, emit
from gyre.trajectories.rows import TrainSequence


@dataclass(frozen=True)
class WarmstartSpec:
    steps: int
    lr: float
    batch_size: int
    seed: int
    flawed_fraction: float = 0.0
    style: str = "builtin"
    """Whose conversations are demonstrated: `builtin` (tool calls) or `text` (fenced blocks;
    `gyre.runtime.demonstrations`)."""
    run_first: bool = False
    """`text`: the harness runs commands first (`harness.text_run_first`): the starting scripts are run."""
    default_file: str | None = None
    """`text`: the file a block that names none writes (`harness.text_default_file`)."""
    max_output_chars: int = 2000
    """`text`: where a command's output is cut in its observation (`harness.max_tool_output_chars`)."""

    def digest_fields(self) -> dict[str, Any]:
        """The fields that decide the model: the `text` fields only for that style (so a builtin warm start
        cached before they existed keeps its name)."""
        fields = asdict(self)
        if self.style == "builtin":
            for name in ("style", "run_first", "default_file", "max_output_chars"):
                fields.pop(name)
        return fields

    def text_harness(self) -> TextHarness:
        return TextHarness(default_file=self.default_file, run_first=self.run_first,
                           max_output_chars=self.max_output_chars)


def print_instead_of_return(solution: str) -> str:
    """The flawed style of a solution: every `return x` line becomes `print(x)`."""
    lines = []
    for line in solution.split("\n"):
        body = line.lstrip()
        if body.startswith("return "):
            line = f"{line[: len(line) - len(body)]}print({body[len('return '):]})"
        lines.append(line)
    return "\n".join(lines)


def render_demonstration(builder: PromptBuilder, text: TextHarness | None, query: Query, solution_file: str,
                         solution: str) -> tuple[list[int], list[bool]]:
    """`render` of the demonstration of `query` solved by `solution`: the `text` harness's conversation when one
    is given, else the builtin harness's."""
    if text is not None:
        return render(builder, text_demonstration(query, text, solution_file, solution), None)
    return render(builder, demonstration(query, solution_file, solution))


def spec_digest(base_model: Path, queries: list[Query], spec: WarmstartSpec) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(spec.digest_fields(), sort_keys=True).encode())
    for weights in sorted(Path(base_model).glob("*.safetensors")):
        h.update(weights.read_bytes())
    for q in queries:
        h.update(q.query_id.encode() + q.instruction.encode())
    h.update((SYSTEM_PROMPT + json.dumps(TOOLS)).encode())
    if spec.style == "text":
        h.update((FORMAT_ONE_FILE + FORMAT_RUN_FIRST + DONE_REPLY).encode())
    return h.hexdigest()[:12]


def warmstart(base_model: Path, out: Path, queries: list[Query], spec: WarmstartSpec) -> Path:
    """Fine-tune `base_model` on demonstrations for `queries`; write an HF model dir to `out`."""
    if spec.steps < 1:
        raise ValueError("warm start needs steps >= 1")
    if not 0.0 <= spec.flawed_fraction <= 1.0:
        raise ValueError(f"flawed_fraction must be in [0, 1], got {spec.flawed_fraction}")
    tokenizer = load_tokenizer(base_model)
    builder = PromptBuilder(tokenizer)
    if spec.style not in ("builtin", "text"):
        raise ValueError(f"warm start style must be builtin or text, got {spec.style!r}")
    harness = spec.text_harness() if spec.style == "text" else None

    def row(query: Query, solution_file: str, text: str) -> TrainSequence:
        ids, trainable = render_demonstration(builder, harness, query, solution_file, text)
        return TrainSequence(ids, trainable, [0.0] * len(ids), [1.0] * len(ids), 0.0, query.query_id)

    solutions = [(query, *tiny_reference(query)) for query in queries]
    rows = [row(q, name, text) for q, name, text in solutions]
    flawed = [row(q, name, print_instead_of_return(text)) for q, name, text in solutions] if spec.flawed_fraction else []
    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)
    started = time.monotonic()
    emit(ProgressEvent("warmstart_started", None, {"steps": spec.steps, "cache": str(out)}))
    model = load_causal_lm(base_model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / spec.steps))
    for step in range(spec.steps):
        if stopping():  # a stop signal, or the flow run cancelled: nothing is cached, the next run starts over
            raise RunStopped(f"warm start stopped at step {step} of {spec.steps}")
        picks = rng.sample(range(len(rows)), min(spec.batch_size, len(rows)))
        if spec.flawed_fraction > 0.0:
            batch = [(flawed if rng.random() < spec.flawed_fraction else rows)[i] for i in picks]
        else:
            batch = [rows[i] for i in picks]
        loss = _sft_loss(model, batch, int(model.config.pad_token_id or 0))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        emit(ProgressEvent("warmstart", step, {"steps": spec.steps, "loss": float(loss.detach()),
                                               "elapsed_s": time.monotonic() - started}))
    model.eval()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "gyre_warmstart.json").write_text(
            json.dumps({"base": str(base_model), "queries": len(queries), **asdict(spec),
                        "base_identity": base_identity(base_model)}, indent=2) + "\n"
        )
        os.replace(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not out.exists():
            raise
        check_cached(out, base_model)  # another process built the same warm start first: theirs is used
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    emit(ProgressEvent("warmstart_finished", None, {"steps": spec.steps, "cache": str(out),
                                                    "seconds": time.monotonic() - started}))
    return out


def _sft_loss(model, batch: list[TrainSequence], pad_id: int) -> torch.Tensor:
    width = max(len(r.tokens) for r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for i, r in enumerate(batch):
        n = len(r.tokens)
        ids[i, :n] = torch.tensor(r.tokens)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(r.trainable)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
    target = ids[:, 1:]
    tmask = mask[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")
    return (nll.view_as(target) * tmask).sum() / tmask.sum().clamp(min=1)


# What a warm-started directory must share with its base: the tokenizer, the chat template, the shape.
_TOKENIZER_FILES = ("tokenizer.json", "chat_template.jinja")
_SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")
_SHAPE_FIELDS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "intermediate_size", "max_position_embeddings", "rope_theta")


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def base_identity(model_dir: Path) -> dict[str, Any]:
    """A digest of `model_dir`'s vocabulary, chat template and special tokens; its config's shape."""
    h = hashlib.sha256()
    for name in _TOKENIZER_FILES:
        f = Path(model_dir) / name
        h.update(name.encode() + (f.read_bytes() if f.exists() else b"<absent>"))
    specials = _json(Path(model_dir) / "tokenizer_config.json")
    h.update(json.dumps({k: specials.get(k) for k in _SPECIAL_TOKENS}, sort_keys=True).encode())
    config = _json(Path(model_dir) / "config.json")
    return {"tokenizer": h.hexdigest()[:16], "shape": {k: config.get(k) for k in _SHAPE_FIELDS}}


def check_cached(path: Path, base_model: Path) -> None:
    """Refuse a cached warm start built for another tokenizer or model shape than `base_model`'s.

    The base's identity recorded when the warm start was built is compared when there is one
    (saving may re-serialise files); an older cache is compared by its own files."""
    recorded = _json(Path(path) / "gyre_warmstart.json").get("base_identity") or base_identity(path)
    base = base_identity(base_model)
    wrong = [what for what in ("tokenizer", "shape") if recorded[what] != base[what]]
    if wrong:
        detail = {k: (recorded["shape"].get(k), base["shape"][k]) for k in _SHAPE_FIELDS
                  if recorded["shape"].get(k) != base["shape"][k]}
        raise ValueError(
            f"the cached warm start {path} was built for another {' and '.join(wrong)} than the base model "
            f"{base_model}" + (f" (cached vs base: {detail})" if detail else "")
            + "; delete it (it is rebuilt on the next run) or point cache_dir elsewhere")


_announced: set[str] = set()
"""Warm starts this process built or said it reused (each is said once)."""


def cached_warmstart(base_model: Path, cache_dir: Path, queries: list[Query], spec: WarmstartSpec) -> Path:
    """The warm start for (base, queries, spec), built once under `cache_dir`; a cache hit is checked."""
    path = Path(cache_dir) / f"{Path(base_model).name}-warm-{spec_digest(base_model, queries, spec)}"
    if path.exists():
        check_cached(path, base_model)
        if str(path) not in _announced:  # once a process: the model task and the coordinator both resolve it
            _announced.add(str(path))
            emit(ProgressEvent("warmstart_cached", None, {"steps": spec.steps, "cache": str(path)}))
        return path
    _announced.add(str(path))
    return warmstart(base_model, path, queries, spec)
