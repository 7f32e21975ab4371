"""How a run evaluates its executions, read from its config in one place.

The coordinator scores each execution as it ends; `gyre.runtime.rescore` scores again, later, the
executions whose evaluation failed. Both take their evaluator from here, so a rerun uses the
same evaluator as the run: the same test timeout, isolation, reward-hacking monitor and
package-index access, and the same rule for which tasks are tested inside the agent's own,
still-running sandbox (Terminal-Bench and Harbor with `evaluator.container_tasks: in_place`:
the local session, `in_place`, or the docker container, `in_container`, which also tests R2E-Gym). Those can only be
evaluated while that sandbox lives, so a rerun cannot reproduce them (`tested_live`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from gyre.benchmarks.registry import task_spec
from gyre.benchmarks.spec import NL2REPO, SWE_BENCH
from gyre.config.run import RunConfig
from gyre.evaluators import evaluate_query, index_access
from gyre.evaluators.formats.in_container import IN_CONTAINER_FORMATS
from gyre.evaluators.formats.in_place import IN_PLACE_FORMATS
from gyre.evaluators.formats.nl2repo_image import TaskImage, docker_placement
from gyre.records import Query, Score
from gyre.sandboxes.factory import docker_image
from gyre.sandboxes.local.isolation import Isolation
from gyre.sandboxes.local.session import available as session_available

log = logging.getLogger("gyre.evaluators")


def tests_in_container(config: RunConfig) -> bool:
    """Whether the run tests Terminal-Bench/Harbor/R2E-Gym tasks in the agent's own docker container."""
    return config.evaluator.container_tasks == "in_place" and config.sandbox.type == "docker"


@dataclass(frozen=True)
class RunEvaluator:
    config: RunConfig
    isolation: Isolation
    in_place: bool
    """Terminal-Bench/Harbor tasks are tested in the agent's live local session."""
    in_container: bool
    """Terminal-Bench/Harbor/R2E-Gym tasks are tested in the agent's live docker container."""

    @classmethod
    def from_config(cls, config: RunConfig, isolation: Isolation) -> RunEvaluator:
        in_place = config.evaluator.container_tasks == "in_place" and config.sandbox.type == "local"
        if in_place and not session_available(isolation.bwrap, isolation.user):
            log.warning("evaluator.container_tasks is in_place, but sandbox sessions need bubblewrap, nsenter and "
                        "gyre running as root: Terminal-Bench/Harbor tasks are evaluated in a fresh sandbox instead "
                        "(processes the agent left running are gone by then)")
            in_place = False
        return cls(config, isolation, in_place, tests_in_container(config))

    def tested_live(self, fmt: str) -> bool:
        """Is a task of format `fmt` tested inside the agent's live sandbox (gone once the run closed it)?"""
        return (self.in_place and fmt in IN_PLACE_FORMATS) or (self.in_container and fmt in IN_CONTAINER_FORMATS)

    def evaluate(self, query: Query, workspace: Path, eval_dir: Path, execution_id: str,
                 deadline_s: float | None = None, live=None) -> Score:
        """`gyre.evaluators.evaluate_query` with the run's settings; `eval_dir` must not exist."""
        evaluator = self.config.evaluator
        return evaluate_query(
            query, workspace, eval_dir, execution_id,
            timeout_s=evaluator.timeout_s,
            isolation=self.isolation,
            deadline_s=deadline_s,
            monitor=evaluator.monitor,
            index=index_access(evaluator),
            live=live,
            image=self.task_image(query),
        )

    def task_image(self, query: Query) -> TaskImage | None:
        """Docker runs: the image an NL2RepoBench or SWE-bench execution ran in, where it is evaluated in a fresh
        container (`nl2repo_image`, `swe_bench`); else
        None (scored in the local sandbox)."""
        sandbox = self.config.sandbox
        if sandbox.type != "docker":
            return None
        try:
            spec = task_spec(query)
        except Exception:  # deliberate: `evaluate_query` turns a format it cannot read into its clear error
            return None
        if spec.format not in (NL2REPO, SWE_BENCH):
            return None

        def resolve() -> tuple[str, str]:
            return docker_image(sandbox, query, image=spec.image, dockerfile=spec.dockerfile,
                                **docker_placement(query, spec))

        return TaskImage(resolve, sandbox.docker.cgroup_parent)
