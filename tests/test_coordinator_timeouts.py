"""The coordinator applies both timeouts: an execution's status names which one stopped it,
and its evaluation runs under the overall deadline (the real run path, tiny model)."""

from __future__ import annotations

import pytest

from gyre.config.run import RunConfig
from gyre.records import EvalStatus, ExecutionStatus
from gyre.runtime.coordinator import Coordinator


def _coordinator(tmp_path, tiny_model_dir, harness: dict) -> Coordinator:
    config = RunConfig.model_validate({
        "cache_dir": str(tmp_path / "cache"),
        "model": {"path": str(tiny_model_dir)},
        "benchmark": {"num_queries": 4},
        "rollout": {"queries_per_step": 1, "group_size": 2},
        "evaluator": {"timeout_s": 60},
        "harness": harness,
    })
    return Coordinator(config, tmp_path / "run")


@pytest.mark.parametrize(("harness", "status"), [
    ({"harness_timeout_s": 0.001}, ExecutionStatus.harness_timeout),
    ({"harness_timeout_s": 300, "overall_timeout_s": 60.001}, ExecutionStatus.overall_timeout),
])
def test_run_execution_records_which_timeout_stopped_it(tmp_path, tiny_model_dir, harness, status):
    coord = _coordinator(tmp_path, tiny_model_dir, harness)
    try:
        result = coord.run_execution(coord.queries[0], step=0, group_index=0)
        assert result.execution.status is status and result.execution.num_calls == 0
        score = coord.evaluate(result)  # the workspace is scored either way, inside the overall budget
        assert score.status is EvalStatus.ok and score.score == 0.0
        assert (result.overall_deadline_s is None) == ("overall_timeout_s" not in harness)
    finally:
        coord.close()
