"""The evaluator's verdict on each task's starting files, before any run (`gyre benchmark check --control`).

Reading a task's scripts (`environments.needs`) finds what it asks for by name; it cannot see a
package list that resolves to a pytest plugin the evaluation's pytest cannot load (NL2RepoBench's
schedule-master lists `pytest-flake8`), an image list that does not install, or an R2E instance
whose tests expected to pass before the fix fail here. The evaluator itself can: scoring the
task's starting files (its `start_dir`, or nothing) is the control run every execution of the task
would meet. An evaluator failure there (status `error`) is a task this machine cannot score, named
with the evaluator's reason; a 0 or a partial score is normal (the work is the agent's to do).

Each task is scored as a run would score it (`evaluate_query`, with the run's `evaluator` settings:
the package-index proxy, the per-command timeout), into its own directory under `out_dir`, kept but
for the evaluation's environment (`eval/env`, ~100 MB a task, rebuilt by any rerun): the verdict,
its reports and logs stay, so that a benchmark of hundreds of tasks fits a disk.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from gyre.evaluators.observed import IndexAccess
from gyre.records import EvalStatus, Query


@dataclass(frozen=True)
class ControlVerdict:
    """The evaluator's verdict on one task's starting files."""

    query_id: str
    status: str
    """`ok` or `tampering` (the evaluator ran), or `error` (it could not: unscorable here)."""
    score: float | None
    reason: str
    eval_dir: str

    @property
    def unscorable(self) -> bool:
        return self.status == EvalStatus.error.value

    def as_dict(self) -> dict:
        return asdict(self)


def control_verdicts(queries: Iterable[Query], out_dir: Path, *, index: IndexAccess | None = None,
                     timeout_s: float = 120.0,
                     on_done: Callable[[ControlVerdict], None] | None = None,
                     image_for: Callable[[Query], object] | None = None) -> list[ControlVerdict]:
    """Score each query's starting files under `out_dir` (which must not exist); `on_done` sees each verdict.
    `image_for(query)`: the task image a docker run evaluates it in (`RunEvaluator.task_image`; SWE-bench and
    NL2RepoBench), None for the local evaluation."""
    from gyre.evaluators import evaluate_query

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True)
    verdicts = []
    for number, query in enumerate(queries):
        where = out_dir / f"{number:04d}"  # query ids may hold '/' or names a file system refuses
        workspace = where / "start"
        if query.start_dir is not None and Path(query.start_dir).is_dir():
            shutil.copytree(query.start_dir, workspace, symlinks=True)
        else:
            workspace.mkdir(parents=True)
        score = evaluate_query(query, workspace, where / "eval", f"control-{number:04d}", timeout_s, index=index,
                               image=image_for(query) if image_for is not None else None)
        if (where / "eval" / "env").is_dir():  # gyre built it; the verdict and its logs do not need it
            shutil.rmtree(where / "eval" / "env")
        verdict = ControlVerdict(query.query_id, score.status.value, score.score, score.detail, str(where / "eval"))
        verdicts.append(verdict)
        if on_done is not None:
            on_done(verdict)
    return verdicts


def docker_task_images(network: str, index_url: str | None) -> Callable[[Query], object]:
    """`query -> TaskImage | None` as a docker run with this evaluator network builds task images (its build steps
    through the package index with `package-index`): `control_verdicts`' `image_for` for `check --sandbox docker`."""
    from gyre.config.run import RunConfig
    from gyre.evaluators.run_evaluator import RunEvaluator
    from gyre.sandboxes.local.isolation import Isolation

    config = RunConfig.model_validate({"sandbox": {"type": "docker", "docker": {
        "build_network": network, "index_url": index_url}}, "evaluator": {"network": network}})
    return RunEvaluator.from_config(config, Isolation.detect()).task_image
