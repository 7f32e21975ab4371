"""Warm-start demonstrations for the `text` harness: the conversation the harness itself would have."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from safetensors.torch import load_file

from gyre.benchmarks import generate_tiny, load_benchmark
from gyre.benchmarks.tiny import tiny_reference
from gyre.harnesses.fenced_actions import RunCommand, WriteFile, parse
from gyre.harnesses.text_agent import FORMAT_RUN_FIRST, TextHarness
from gyre.proxy.prompt import PromptBuilder
from gyre.runtime.demonstrations import DONE_REPLY, render, script_outputs, text_demonstration
from gyre.runtime.warmstart import WarmstartSpec, spec_digest, warmstart


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    root = generate_tiny(tmp_path_factory.mktemp("p") / "probe", 8, 50505, module="solution", family="probe")
    return load_benchmark("nl2repo", root, "tiny")


def test_a_probe_demonstration_runs_the_script_reads_its_output_and_writes_the_value(probes):
    harness = TextHarness(default_file="solution.py", run_first=True)
    for query in probes:
        name, solution = tiny_reference(query)
        messages = text_demonstration(query, harness, name, solution)
        assert messages[0] == harness.first_turn(query.instruction)[0] and FORMAT_RUN_FIRST in messages[0]["content"]
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        # what the harness would do with each reply: run the probe, write the reference, end
        actions = [parse(r, harness.default_file).actions for r in replies]
        (command,), (write,), done = actions
        assert isinstance(command, RunCommand) and command.command.startswith("python ")
        assert write == WriteFile("solution.py", solution) and done == [] and replies[-1] == DONE_REPLY
        # the observation is the script's real output, and the value written is in it, not in the instruction
        ((_, code, output),) = script_outputs(query)
        observed = messages[2]["content"]
        assert code == 0 and output and output in observed and "<returncode>0</returncode>" in observed
        printed = output.split(":", 1)[-1].split("=", 1)[-1].strip()
        assert printed in solution and printed not in query.instruction


def test_without_run_first_the_file_is_written_at_once(probes):
    harness = TextHarness(default_file="solution.py")
    name, solution = tiny_reference(probes[0])
    messages = text_demonstration(probes[0], harness, name, solution)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert parse(messages[1]["content"], "solution.py").actions == [WriteFile("solution.py", solution)]
    other = TextHarness(default_file="other.py")  # a file the harness does not default to is named first
    assert parse(text_demonstration(probes[0], other, name, solution)[1]["content"], "other.py").actions == [
        WriteFile(name, solution)]


def test_text_targets_are_exactly_the_assistant_turns(probes, tiny_tokenizer):
    builder = PromptBuilder(tiny_tokenizer)
    harness = TextHarness(default_file="solution.py", run_first=True)
    messages = text_demonstration(probes[0], harness, *tiny_reference(probes[0]))
    ids, trainable = render(builder, messages, None)
    assert len(ids) == len(trainable)
    targets = tiny_tokenizer.decode([t for t, keep in zip(ids, trainable) if keep], skip_special_tokens=False)
    assert targets.count("<|im_end|>") == 3
    assert all(m["content"] in targets for m in messages if m["role"] == "assistant")
    assert all(m["content"] not in targets for m in messages if m["role"] == "user")


def test_the_text_style_is_part_of_the_cache_key_and_a_builtin_key_keeps_its_fields(probes, tiny_model_dir):
    builtin = WarmstartSpec(steps=2, lr=1e-3, batch_size=2, seed=0)
    text = WarmstartSpec(steps=2, lr=1e-3, batch_size=2, seed=0, style="text", run_first=True,
                         default_file="solution.py")
    assert set(builtin.digest_fields()) == {"steps", "lr", "batch_size", "seed", "flawed_fraction"}
    assert builtin.digest_fields() == {k: v for k, v in asdict(builtin).items() if k in builtin.digest_fields()}
    keys = {spec_digest(tiny_model_dir, probes, s) for s in
            (builtin, text, WarmstartSpec(**{**asdict(text), "run_first": False}))}
    assert len(keys) == 3


def test_a_text_warm_start_trains(tmp_path, probes, tiny_model_dir):
    spec = WarmstartSpec(steps=2, lr=1e-3, batch_size=2, seed=0, style="text", run_first=True,
                         default_file="solution.py")
    out = warmstart(tiny_model_dir, tmp_path / "w", probes, spec)
    trained, base = (load_file(str(p / "model.safetensors")) for p in (out, tiny_model_dir))
    assert any(not (trained[k] == base[k]).all() for k in trained)
    with pytest.raises(ValueError, match="style"):
        warmstart(tiny_model_dir, tmp_path / "x", probes, WarmstartSpec(steps=1, lr=1e-3, batch_size=2, seed=0,
                                                                        style="chat"))
