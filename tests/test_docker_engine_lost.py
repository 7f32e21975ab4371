"""An engine that dies mid-run (the docker SDK faked at its edge, `tests.docker_fake`: its calls then raise what the
SDK raises, the connection to the engine's socket refused): the execution it hit is recorded with the reason and
dropped, never scored or trained on as a 0, no slot directory is left, no exception leaves the coordinator, and
the next execution runs once the engine answers again."""

from __future__ import annotations

import sys
from pathlib import Path

from gyre.records import EvalStatus, ExecutionStatus
from gyre.runtime.execution_sandbox import LOST
from tests.docker_fake import fake_sdk, run_script
from tests.test_in_container import _terminal_bench


def _coordinator(tmp_path: Path, tiny_model_dir, monkeypatch, handler, harness: dict):
    from gyre.config.run import RunConfig
    from gyre.runtime.coordinator import Coordinator

    query = _terminal_bench(tmp_path)
    sdk, made = fake_sdk(handler)
    monkeypatch.setitem(sys.modules, "docker", sdk)
    monkeypatch.setattr("gyre.sandboxes.docker_container.engine_problem", lambda: None)
    config = RunConfig.model_validate({
        "cache_dir": str(tmp_path / "cache"), "model": {"path": str(tiny_model_dir)},
        "benchmark": {"kind": "terminal-bench", "path": str(query.root.parent)},
        "rollout": {"queries_per_step": 1, "group_size": 2}, "sandbox": {"type": "docker"}, "harness": harness,
    })
    return Coordinator(config, tmp_path / "run"), sdk, made


def _slots_left(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "run" / "workspaces").glob(".*.docker"))


def test_an_engine_that_dies_under_the_agent_drops_that_execution_and_the_next_runs(tmp_path, tiny_model_dir,
                                                                                     monkeypatch):
    killed = []

    def handle(container, cmd, kw):
        if "user" in kw:  # the evaluation's command, run for real against the workspace
            return run_script(container, cmd, kw) if not cmd[2].startswith("kill ") else (0, b"", b"")
        if "gyre-kill" in cmd:
            return 0, b"", b""
        if not killed:  # the agent's first command: the engine dies while it runs
            killed.append(cmd)
            container.engine.down = True
            container.engine.answer()
        return 0, b"", b""

    coord, sdk, made = _coordinator(tmp_path, tiny_model_dir, monkeypatch, handle,
                                    {"type": "command", "command": ["python3", "-c", "print(1)"]})
    try:
        lost = coord.run_execution(coord.queries[0], step=0, group_index=0)
        execution = lost.execution
        assert execution.status is ExecutionStatus.sandbox_error, execution
        assert execution.error.startswith(LOST) and "docker engine stopped answering" in execution.error
        score = coord.evaluate(lost)  # nothing to score: dropped from its group, never a 0
        assert (score.status, score.score) == (EvalStatus.error, None) and "nothing to score" in score.detail
        assert not made[0].removed and _slots_left(tmp_path) == []  # the engine keeps it; gyre's slots are gone
        sdk.engine.down = False  # the engine answers again: the run goes on
        after = coord.run_execution(coord.queries[0], step=0, group_index=1)
        assert after.execution.status is ExecutionStatus.completed, after.execution
        scored = coord.evaluate(after)
        assert (scored.status, scored.score) == (EvalStatus.ok, 0.0), scored.detail  # no answer.txt: unsolved
        assert made[1].removed and _slots_left(tmp_path) == []
    finally:
        coord.close()


def test_an_engine_that_is_gone_at_the_start_or_before_the_evaluation_is_no_zero(tmp_path, tiny_model_dir,
                                                                                  monkeypatch):
    coord, sdk, made = _coordinator(tmp_path, tiny_model_dir, monkeypatch, None,
                                    {"harness_timeout_s": 0.001})  # no model call: the agent runs nothing
    try:
        sdk.engine.down = True
        unstarted = coord.run_execution(coord.queries[0], step=0, group_index=0)
        assert unstarted.execution.status is ExecutionStatus.sandbox_error
        assert "the container did not start: the docker engine stopped answering" in unstarted.execution.error
        score = coord.evaluate(unstarted)
        assert score.status is EvalStatus.error and "no sandbox started" in score.detail
        assert made == [] and _slots_left(tmp_path) == []
        # the engine answers for the agent, then dies before the evaluation in its container
        sdk.engine.down = False
        result = coord.run_execution(coord.queries[0], step=0, group_index=1)
        assert result.execution.status is not ExecutionStatus.sandbox_error, result.execution
        sdk.engine.down = True
        score = coord.evaluate(result)
        assert (score.status, score.score) == (EvalStatus.error, None), score.detail  # the evaluator's failure
        assert "docker engine stopped answering" in score.detail, score.detail
        assert _slots_left(tmp_path) == []
    finally:
        coord.close()
