"""A saved policy's pass rate on a held-out split of the config's benchmark, as a Prefect flow.

Thin: start a coordinator on the config (with a model directory as its model), load the
policy (`gyre.runtime.policy_eval`), then run the RL run's own evaluation round (`rl_run.eval_round`:
an execute and an evaluate task run per held-out query and sample, then `record-eval`) on the
chosen split. The executions, their calls and the pass rate land in a run directory of their
own (`evals`, `executions`), like a run's.

    from gyre.flows.evaluate import evaluate
    record = evaluate("configs/tiny-cpu.yaml", "runs/x/checkpoints/step-000020", "in_distribution")
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NONE
from prefect.task_runners import ThreadPoolTaskRunner

from gyre.config.run import load_config
from gyre.flows.rl_run import MAX_CONCURRENT_TASKS, eval_round
from gyre.flows.ui import run_name
from gyre.records import EvalRecord
from gyre.runtime.coordinator import Coordinator
from gyre.runtime.policy_eval import check_split, config_for_policy, load_policy

LOAD_RETRIES = 2
LOAD_RETRY_DELAY_S = 5.0


@task(name="load-policy", task_run_name="load-policy-{policy}", retries=LOAD_RETRIES,
      retry_delay_seconds=LOAD_RETRY_DELAY_S, cache_policy=NONE)
def load(coord: Coordinator, policy: str) -> int:
    return load_policy(coord, Path(policy))


@flow(name="evaluate", flow_run_name=run_name, task_runner=ThreadPoolTaskRunner(max_workers=MAX_CONCURRENT_TASKS))
def evaluate(config_path: str, checkpoint_or_model: str, split: str = "in_distribution",
             run_dir: str | None = None) -> EvalRecord:
    """Evaluate a checkpoint (or model directory) on `split` (in_distribution or generalisation)
    into `run_dir` (default: runs/<name>-eval-<time>); returns the round's record."""
    config = config_for_policy(load_config(config_path), Path(checkpoint_or_model))
    run_dir = run_dir or str(Path("runs") / f"{config.name}-eval-{datetime.now():%Y%m%d-%H%M%S}")
    coord = Coordinator(config, Path(run_dir))
    try:
        check_split(coord, split)
        version = load(coord, checkpoint_or_model)
        return eval_round(coord, version, (split,))
    finally:
        coord.close()
