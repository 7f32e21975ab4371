"""Warm start and run resolution: demonstrations, the train/eval split, cached models."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from gyre.benchmarks import generate_tiny, load_benchmark
from gyre.benchmarks.tiny import tiny_reference
from gyre.config.run import RunConfig
from gyre.engines.models.hf import load_tokenizer
from gyre.proxy.prompt import PromptBuilder
from gyre.proxy.toolcalls import QwenToolCallParser
from gyre.runtime.resolve import preflight
from gyre.runtime.warmstart import WarmstartSpec, demonstration, render, warmstart


@pytest.fixture(scope="module")
def queries(tmp_path_factory):
    return load_benchmark("nl2repo", generate_tiny(tmp_path_factory.mktemp("b") / "tiny", 8, 0), "tiny")


def test_demonstration_targets_are_exactly_the_assistant_turns(queries, tiny_tokenizer):
    builder = PromptBuilder(tiny_tokenizer)
    name, solution = tiny_reference(queries[0])
    messages = demonstration(queries[0], name, solution)
    ids, trainable = render(builder, messages)
    full = builder.render(messages, None, False)
    assert len(ids) == len(trainable)
    targets = tiny_tokenizer.decode([t for t, keep in zip(ids, trainable) if keep], skip_special_tokens=False)
    assert targets.count("<|im_end|>") == 2  # two assistant turns, each ending its turn
    first_turn = targets.split("<|im_end|>")[0]
    _, calls = QwenToolCallParser().parse(first_turn)
    assert calls[0].name == "write_file"
    assert calls[0].arguments == {"path": name, "content": solution}
    assert "You are a coding agent" not in targets and queries[0].instruction not in targets
    assert tiny_tokenizer.decode(ids, skip_special_tokens=False).startswith(full[:40])


def test_warmstart_writes_a_loadable_model_and_is_deterministic(tmp_path, queries, tiny_model_dir):
    spec = WarmstartSpec(steps=3, lr=1e-3, batch_size=2, seed=0)
    a = warmstart(tiny_model_dir, tmp_path / "a", queries, spec)
    b = warmstart(tiny_model_dir, tmp_path / "b", queries, spec)
    assert load_tokenizer(a).chat_template
    wa, wb, w0 = (load_file(str(p / "model.safetensors")) for p in (a, b, tiny_model_dir))
    assert all((wa[k] == wb[k]).all() for k in wa)
    assert any(not (wa[k] == w0[k]).all() for k in wa)  # it trained
    assert json.loads((a / "gyre_warmstart.json").read_text())["steps"] == 3
    with pytest.raises(ValueError):
        warmstart(tiny_model_dir, tmp_path / "c", queries, WarmstartSpec(steps=0, lr=1e-3, batch_size=2, seed=0))


def test_preflight_builds_the_warm_started_model_once(tmp_path):
    config = RunConfig.model_validate({
        "cache_dir": str(tmp_path / "cache"),
        "model": {"warmstart": {"steps": 2, "batch_size": 2}},
        "benchmark": {"num_queries": 12, "eval_fraction": 0.3},
        "rollout": {"queries_per_step": 2},
        "evaluation": {"every_steps": 1},
    })
    model_dir, split = preflight(config)
    assert split.eval and split.train and not {q.query_id for q in split.eval} & {q.query_id for q in split.train}
    assert "-warm-" in model_dir.name
    stamp = (model_dir / "model.safetensors").stat().st_mtime_ns
    again, _ = preflight(config)
    assert again == model_dir and (again / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_warm_start_cached_for_another_tokenizer_or_shape_is_refused(tmp_path):
    config = RunConfig.model_validate({
        "cache_dir": str(tmp_path / "cache"),
        "model": {"warmstart": {"steps": 2, "batch_size": 2}},
        "benchmark": {"num_queries": 12, "eval_fraction": 0.3},
        "rollout": {"queries_per_step": 2},
    })
    model_dir, _ = preflight(config)
    record = model_dir / "gyre_warmstart.json"
    built = json.loads(record.read_text())
    assert built["base_identity"]["shape"]["vocab_size"]
    # Built for another vocabulary (a cache copied from elsewhere, a tokenizer changed since).
    record.write_text(json.dumps({**built, "base_identity": {**built["base_identity"], "tokenizer": "0" * 16}}))
    with pytest.raises(ValueError, match="another tokenizer than the base model"):
        preflight(config)
    shape = {**built["base_identity"]["shape"], "hidden_size": 7}
    record.write_text(json.dumps({**built, "base_identity": {**built["base_identity"], "shape": shape}}))
    with pytest.raises(ValueError, match=r"another shape .*hidden_size"):
        preflight(config)
    # An older cache without the record is compared by its own files.
    record.write_text(json.dumps({k: v for k, v in built.items() if k != "base_identity"}))
    assert preflight(config)[0] == model_dir
    (model_dir / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(ValueError, match="another tokenizer"):
        preflight(config)


def test_bad_split_and_warmstart_settings_are_refused(tmp_path):
    base = {"cache_dir": str(tmp_path / "cache"), "benchmark": {"num_queries": 4}}
    with pytest.raises(ValueError, match="no eval queries"):
        preflight(RunConfig.model_validate({**base, "evaluation": {"every_steps": 1}, "rollout": {"queries_per_step": 1}}))
    with pytest.raises(ValueError, match="exceeds"):
        preflight(RunConfig.model_validate({**base, "rollout": {"queries_per_step": 9}}))


def test_flawed_style_prints_instead_of_returning():
    from gyre.runtime.warmstart import print_instead_of_return

    assert print_instead_of_return("def f(a, b):\n    return a + b\n") == "def f(a, b):\n    print(a + b)\n"
    assert print_instead_of_return("X = 3\n") == "X = 3\n"  # nothing to return: unchanged


def test_flawed_fraction_mixes_styles_and_is_part_of_the_cache_key(tmp_path, queries, tiny_model_dir):
    from gyre.runtime.warmstart import spec_digest

    clean = WarmstartSpec(steps=2, lr=1e-3, batch_size=2, seed=0)
    mixed = WarmstartSpec(steps=2, lr=1e-3, batch_size=2, seed=0, flawed_fraction=0.5)
    assert spec_digest(tiny_model_dir, queries, clean) != spec_digest(tiny_model_dir, queries, mixed)
    a = warmstart(tiny_model_dir, tmp_path / "a", queries, clean)
    b = warmstart(tiny_model_dir, tmp_path / "b", queries, mixed)
    wa, wb = (load_file(str(p / "model.safetensors")) for p in (a, b))
    assert any(not (wa[k] == wb[k]).all() for k in wa)  # different demonstrations, different weights
    with pytest.raises(ValueError, match="flawed_fraction"):
        warmstart(tiny_model_dir, tmp_path / "c", queries, WarmstartSpec(steps=1, lr=1e-3, batch_size=2, seed=0, flawed_fraction=1.5))
