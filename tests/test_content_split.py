"""The train/eval split is by content: no held-out query repeats a training query's instruction,
hidden tests or reference solution, and `gyre benchmark check` reports repeated content."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from gyre.benchmarks import generate_tiny, load_benchmark
from gyre.benchmarks.content import content_groups, content_keys, duplicates, kind_of, split_by_content
from gyre.config.run import RunConfig
from gyre.runtime.resolve import resolve_queries

FIXTURES = Path(__file__).parent / "fixtures" / "realformats"


def _keys(queries, kind):
    return {k for q in queries for k in content_keys(q) if k.startswith(kind + ":")}


def test_default_split_shares_no_instruction_tests_or_solution(tmp_path):
    """The default run's set (256 queries, a quarter held out): 0 shared contents across sides."""
    config = RunConfig.model_validate({"cache_dir": str(tmp_path), "benchmark": {
        "num_queries": 256, "eval_fraction": 0.25, "held_out_kinds": ["scale"]}})
    split = resolve_queries(config)
    train, held, general = split.train, split.eval, split.generalisation
    assert len(train) + len(held) + len(general) == 256 and held and general
    for kind in ("instruction", "tests", "solution"):
        assert not _keys(train, kind) & _keys(held, kind), kind
        assert not _keys(train, kind) & _keys(general, kind), kind
        assert not _keys(held, kind) & _keys(general, kind), kind
    assert {kind_of(q) for q in general} == {"scale"} and "scale" not in {kind_of(q) for q in train}
    assert {kind_of(q) for q in held} <= {kind_of(q) for q in train}  # in-distribution: trained templates
    # what the id split did: copies of training queries among the held-out ones
    queries = [*train, *held, *general]
    assert any(d.kind == "solution" for d in duplicates(queries))


def test_every_template_is_on_both_sides_near_the_eval_fraction(tmp_path):
    """In-distribution means new parameters of trained templates: each template is held out in
    about the asked share (whole groups), and none is held out whole."""
    queries = load_benchmark("nl2repo", generate_tiny(tmp_path / "a", 256), "tiny")
    split = split_by_content(queries, 0.25)
    train, held = Counter(kind_of(q) for q in split.train), Counter(kind_of(q) for q in split.eval)
    assert set(held) == set(train) == {kind_of(q) for q in queries}
    for kind, n in held.items():
        assert 0.15 <= n / (n + train[kind]) <= 0.4, (kind, n, train[kind])
    assert split_by_content(queries, 0.25) == split  # deterministic
    # a template that is one content group (all the same solution) trains, whatever the fraction
    one = next(g for g in content_groups(queries) if kind_of(g[0]) == "add" and len(g) > 1)
    assert split_by_content(one, 0.9).train == one


def test_unknown_held_out_kind_and_empty_training_side_are_refused(tmp_path):
    base = {"cache_dir": str(tmp_path), "benchmark": {"num_queries": 14}}
    with pytest.raises(ValueError, match="held_out_kinds"):
        resolve_queries(RunConfig.model_validate({**base, "benchmark": {"num_queries": 14, "held_out_kinds": ["nope"]}}))
    everything = ["add", "greet", "constant", "reverse_words", "divisible", "clamp", "scale"]
    with pytest.raises(ValueError, match="no training queries"):
        resolve_queries(RunConfig.model_validate({**base, "benchmark": {"num_queries": 14, "held_out_kinds": everything}}))


def test_rl_trains_on_queries_the_warm_start_never_demonstrated(tmp_path):
    """`demonstrated_fraction: 0.5`: the training side splits by content into the warm start's
    queries and RL's, every template on both, no shared content; the held-out sets stay as they
    were, and the tokenizer is built on the same training side (same base model)."""
    base = {"cache_dir": str(tmp_path), "benchmark": {"num_queries": 256, "eval_fraction": 0.25},
            "model": {"warmstart": {"steps": 10}}}
    whole = resolve_queries(RunConfig.model_validate(base))
    half = resolve_queries(RunConfig.model_validate(
        {**base, "model": {"warmstart": {"steps": 10, "demonstrated_fraction": 0.5}}}))
    assert whole.demonstrated == [] and whole.warmstart_queries == whole.train
    assert [q.query_id for q in half.eval] == [q.query_id for q in whole.eval]
    assert [q.query_id for q in half.training_side] == [q.query_id for q in whole.train]
    assert len(half.demonstrated) + len(half.train) == len(whole.train)
    assert abs(len(half.train) - len(whole.train) / 2) <= 14, (len(half.demonstrated), len(half.train))
    assert half.warmstart_queries == half.demonstrated
    for kind in ("instruction", "tests", "solution"):
        assert not _keys(half.demonstrated, kind) & _keys(half.train, kind), kind
    templates = {kind_of(q) for q in whole.train}
    assert {kind_of(q) for q in half.demonstrated} == {kind_of(q) for q in half.train} == templates
    with pytest.raises(ValueError, match="leaves RL no training query"):
        resolve_queries(RunConfig.model_validate({**base, "benchmark": {"num_queries": 14},
                                                  "model": {"warmstart": {"steps": 10, "demonstrated_fraction": 0.9}}}))


def test_a_malformed_task_stops_the_run_unless_skip_malformed_is_set(tmp_path, caplog):
    """By default the first malformed task is the run's error (its file and field); with
    `benchmark.skip_malformed` the rest run and one warning names each one left out."""
    from gyre.benchmarks.errors import BenchmarkFormatError

    bench = {"kind": "nl2repo", "path": str(FIXTURES / "nl2repo")}
    with pytest.raises(BenchmarkFormatError, match="broken-missing-tests.*field 'test_files\\[0\\]'"):
        resolve_queries(RunConfig.model_validate({"cache_dir": str(tmp_path), "benchmark": bench,
                                                  "rollout": {"queries_per_step": 1}}))
    skipping = RunConfig.model_validate({"cache_dir": str(tmp_path), "benchmark": {
        **bench, "skip_malformed": True}, "rollout": {"queries_per_step": 1}})
    split = resolve_queries(skipping)
    assert sorted(q.query_id for q in split.train) == ["mathkit", "textkit"]
    resolve_queries(skipping)  # the CLI, the model task and the coordinator each resolve: one warning
    assert caplog.text.count("1 malformed task(s)") == 1 and "broken-missing-tests" in caplog.text


def test_benchmark_check_flags_a_seeded_duplicate(tmp_path):
    bench = tmp_path / "bench"
    shutil.copytree(FIXTURES / "nl2repo", bench)
    good = "mathkit"
    shutil.copytree(bench / good, bench / f"{good}-copy")  # the same project under another name
    done = subprocess.run([sys.executable, "-m", "gyre.cli.main", "benchmark", "check", str(bench), "--format", "nl2repo",
                           "--json"], capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout)
    repeated = [d for d in report["duplicates"] if set(d["ids"]) == {good, f"{good}-copy"}]
    assert {d["kind"] for d in repeated} >= {"instruction", "tests"}, report["duplicates"]
    assert report["duplicates_across_split"] == 0  # the split keeps the copies together
    assert all(len(set(d["sides"])) == 1 for d in repeated)
    text = subprocess.run([sys.executable, "-m", "gyre.cli.main", "benchmark", "check", str(bench), "--format", "nl2repo"],
                          capture_output=True, text=True, timeout=300).stdout
    assert "duplicate instruction" in text and f"{good}-copy" in text


def test_a_validation_set_is_carved_from_training_by_content_and_never_trained_on(tmp_path):
    """The knobs' set: disjoint in content from both training and held out; the final run trains on the same
    queries whether its eval rounds read validation or held out."""
    bench = {"num_queries": 256, "eval_fraction": 0.25, "validation_fraction": 0.2}
    base = {"cache_dir": str(tmp_path), "benchmark": bench}
    tuned = resolve_queries(RunConfig.model_validate({**base, "evaluation": {"set": "validation"}}))
    final = resolve_queries(RunConfig.model_validate(base))
    assert [q.query_id for q in tuned.train] == [q.query_id for q in final.train]
    assert [q.query_id for q in tuned.validation] == [q.query_id for q in final.validation]
    train, val, held = final.train, final.validation, final.eval
    assert len(train) + len(val) + len(held) == 256 and len(val) >= 30
    for kind in ("instruction", "tests", "solution"):
        assert not _keys(train, kind) & _keys(val, kind), kind
        assert not _keys(val, kind) & _keys(held, kind), kind
        assert not _keys(train, kind) & _keys(held, kind), kind
    assert {kind_of(q) for q in val} == {kind_of(q) for q in train}  # every template on every side
    with pytest.raises(ValueError, match="benchmark.eval_fraction leaves no eval queries"):  # held out: none there
        resolve_queries(RunConfig.model_validate({"cache_dir": str(tmp_path), "benchmark": {
            "num_queries": 64, "validation_fraction": 0.25}, "evaluation": {"every_steps": 1}}))
    with pytest.raises(ValueError, match="evaluation.set is 'validation' but benchmark.validation_fraction"):
        resolve_queries(RunConfig.model_validate({"cache_dir": str(tmp_path), "benchmark": {
            "num_queries": 64, "eval_fraction": 0.25}, "evaluation": {"set": "validation"}}))
