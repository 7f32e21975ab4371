"""The `probe` family: the answer is what a script in the workspace prints, so one turn cannot solve it.

Generated queries are checked with the real evaluator: the reference solves each; a solution that fetches
the answer at test time (runs the script) or guesses it does not. The text harness runs the two turns
(the command, then the file from what it printed) with a scripted model through the real proxy: the
observation carries the probe's output in mini-swe-agent's shape, and the trajectory tree holds every
turn as one exact-token chain.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from gyre.benchmarks import generate_tiny, load_benchmark
from gyre.benchmarks.content import duplicates, kind_of, split_by_content
from gyre.benchmarks.probe_tasks import TEMPLATES, probe_task
from gyre.engines.models.hf import stop_token_ids
from gyre.evaluators.formats.nl2repo import evaluate
from gyre.harnesses.base import ModelEndpoint
from gyre.harnesses.text_agent import FORMAT_RUN_FIRST, TextHarness
from gyre.net.server_thread import ServerThread
from gyre.proxy.app import create_app
from gyre.proxy.router import EngineRouter
from gyre.proxy.sessions import SessionRegistry
from gyre.records import EvalStatus, ExecutionStatus
from gyre.sandboxes.local.sandbox import LocalSandbox
from gyre.trajectories.chains import build_trajectories
from tests.fakes import ScriptedEngine

SEED = 50505  # the seed docs/learning.md's protocol wrote down for this family


def _set(tmp_path, n=4):
    return load_benchmark("nl2repo", generate_tiny(tmp_path / "probe", num_queries=n, seed=SEED, module="solution",
                                                   family="probe"), "tiny")


def _score(query, tmp_path, solution: str | None, name: str) -> float:
    sandbox = LocalSandbox.create(query, tmp_path / f"ws-{name}", env={})
    try:
        if solution is not None:
            sandbox.write_file("solution.py", solution)
        result = evaluate(query, sandbox.workspace, tmp_path / f"eval-{name}", name)
    finally:
        sandbox.close()
    assert result.status is EvalStatus.ok, result
    return result.score


def test_the_value_is_only_in_what_the_script_prints_and_every_template_is_used():
    for index in range(16):
        task = probe_task(SEED, index)
        ((script, source),) = task.start_files
        printed = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, check=True).stdout
        value = printed.split()[-1]
        assert value in task.reference and value not in task.instruction and value not in source
        assert f"`python {script}`" in task.instruction
    assert {probe_task(SEED, i).kind for i in range(8)} == {t.__name__.removeprefix("_") for t in TEMPLATES}


def _printed(query) -> str:
    """The value the query's probe script prints (its last word)."""
    (script,) = query.start_dir.iterdir()
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout.split()[-1]


@pytest.mark.slow
def test_the_reference_solves_it_and_fetching_or_guessing_does_not(tmp_path):
    for query in _set(tmp_path, n=4):  # one query of each template
        reference = (query.root / "reference" / "solution.py").read_text()
        (script,) = [p.name for p in query.start_dir.iterdir()]
        value = _printed(query)
        assert _score(query, tmp_path, reference, f"ref-{query.query_id}") == 1.0
        assert _score(query, tmp_path, None, f"empty-{query.query_id}") == 0.0
        # one turn: run the probe when the tests import the module -- every value test passes, the last does not
        fetched = (reference.replace(value, "int(_v)") if value.isdigit() else
                   reference.replace(repr(value), "_v") if repr(value) in reference else reference.replace(value, "{_v}"))
        assert fetched != reference
        fetch = ("import pathlib, subprocess, sys\n_v = subprocess.run([sys.executable, str(pathlib.Path(__file__)"
                 f".parent / {script!r})], capture_output=True, text=True).stdout.split()[-1]\n" + fetched)
        assert 0.0 < _score(query, tmp_path, fetch, f"fetch-{query.query_id}") < 1.0
        guess = reference.replace(value, "42" if value.isdigit() else "Hello")
        assert _score(query, tmp_path, guess, f"guess-{query.query_id}") < 1.0


def test_a_held_out_set_from_the_written_down_seed_shares_no_content_with_training(tmp_path):
    queries = _set(tmp_path, n=96)
    split = split_by_content(queries, 0.25)
    held = {q.query_id for q in split.eval}
    crossing = [d for d in duplicates(queries, lambda q: "eval" if q.query_id in held else "train") if d.crosses]
    assert split.eval and not crossing
    assert {kind_of(q) for q in split.eval} == {kind_of(q) for q in split.train} == \
        {"probe_constant", "probe_scale", "probe_word", "probe_greet"}


def _run(tmp_path, tokenizer, query, replies, max_turns=3):
    engine = ScriptedEngine(tokenizer, replies)
    sessions = SessionRegistry()
    server = ServerThread(create_app(EngineRouter([engine]), sessions, tokenizer, model_name="tiny",
                                     stop_token_ids=stop_token_ids(tokenizer))).start()
    key = sessions.mint("exec")
    sandbox = LocalSandbox.create(query, tmp_path / "ws", env={})
    try:
        outcome = TextHarness(max_turns=max_turns, default_file="solution.py", run_first=True).run(
            query, sandbox, ModelEndpoint(server.base_url, key, "tiny"), time.monotonic() + 60)
        score = evaluate(query, sandbox.workspace, tmp_path / "eval", "exec")
    finally:
        sandbox.close()
        server.stop()
    return outcome, sessions.close("exec"), score


def test_two_turns_solve_it_through_the_text_harness_and_the_tree_holds_every_turn(tmp_path, tiny_tokenizer):
    query = _set(tmp_path)[0]
    assert kind_of(query) == "probe_scale"
    (script,) = [p.name for p in query.start_dir.iterdir()]
    # the answer without its value: the second turn fills it in from what the first turn's command printed
    blank = (query.root / "reference" / "solution.py").read_text().replace(_printed(query), "{value}")

    def second_turn(prompt: str) -> str:
        printed = re.findall(r"<output>\n(.*?)</output>", prompt, re.S)[-1].split()[-1]
        return "```python\n" + blank.format(value=printed) + "```"

    replies = [f"Let me run it first.\n```bash\npython {script}\n```", second_turn, "Done."]
    outcome, session, score = _run(tmp_path, tiny_tokenizer, query, replies)
    assert outcome.status is ExecutionStatus.completed and outcome.turns == 3
    prompts = [tiny_tokenizer.decode(c.prompt_ids) for c in session.calls]
    assert FORMAT_RUN_FIRST in prompts[0] and prompts[0].index(query.instruction) < prompts[0].index(FORMAT_RUN_FIRST)
    assert f"ran: python {script}\n<returncode>0</returncode>\n<output>\nfactor: " in prompts[1]  # mini-swe-agent's
    assert "wrote solution.py\n<returncode>0</returncode>" in prompts[2]
    (traj,) = build_trajectories(session.calls)  # the three turns, one chain: each reply spliced back as sampled
    assert sum(traj.trainable) == sum(len(c.output_ids) for c in session.calls)
    assert score.score == 1.0


@pytest.mark.parametrize("first", ["```python\nANSWER = 1234\n```", "I cannot know the value."])
def test_one_turn_does_not_solve_it(tmp_path, tiny_tokenizer, first):
    outcome, session, score = _run(tmp_path, tiny_tokenizer, _set(tmp_path)[0], [first, "Done."], max_turns=1)
    assert outcome.turns == 1 and score.score < 1.0


def test_the_family_is_recorded_and_a_set_of_another_family_is_refused(tmp_path):
    import json

    root = generate_tiny(tmp_path / "p", num_queries=4, seed=1, module="solution", family="probe")
    assert json.loads((root / "tiny.json").read_text())["family"] == "probe"
    assert all((q.start_dir / next(q.start_dir.iterdir()).name).is_file() for q in load_benchmark("nl2repo", root))
    with pytest.raises(FileExistsError):  # the tiny family asked for where the probe set is
        generate_tiny(root, num_queries=4, seed=1, module="solution")
    with pytest.raises(ValueError, match="unknown task family 'nope'"):
        generate_tiny(tmp_path / "x", num_queries=4, seed=1, family="nope")
