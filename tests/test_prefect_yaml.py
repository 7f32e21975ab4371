"""prefect.yaml stays in step with the flows it deploys."""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_every_deployment_points_at_a_flow_with_matching_parameters():
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    assert spec["deployments"]
    for deployment in spec["deployments"]:
        path, name = deployment["entrypoint"].split(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, name)
        params = inspect.signature(flow.fn).parameters
        for key in deployment.get("parameters", {}):
            assert key in params, f"{deployment['name']}: unknown parameter {key}"
        required = [p for p, v in params.items() if v.default is inspect.Parameter.empty]
        assert set(required) <= set(deployment.get("parameters", {})), deployment["name"]
        config = deployment.get("parameters", {}).get("config_path")
        if config:
            assert (ROOT / config).is_file()


def test_every_rl_run_deployment_loads_its_default_benchmark_here(tmp_path, caplog):
    """Each benchmark's deployment runs here with its defaults: its pull steps (the deepswe one
    builds the R2E fixture's root) and its config and `benchmark_dir` give training queries, the
    fixtures' deliberately malformed tasks left out with a warning naming each."""
    from gyre.flows.rl_run import load_run_config
    from gyre.runtime.resolve import resolve_queries

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    deployments = [d for d in spec["deployments"] if d["entrypoint"].endswith("rl_run.py:rl_run")]
    assert {d["name"] for d in deployments} >= {"tiny-cpu", "nl2repobench", "deepswe", "terminalbench"}
    for deployment in deployments:
        for step in deployment.get("pull", []):
            (name, args), = step.items()
            if name == "prefect.deployments.steps.run_shell_script":  # run where the worker would, here in tmp
                argv = args["script"].split()
                assert argv[0] == ".venv/bin/python"
                subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, check=True, capture_output=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
        params = deployment["parameters"]
        bench = params.get("benchmark_dir")
        if bench is not None:
            bench = str(tmp_path / bench if (tmp_path / bench).exists() else ROOT / bench)
        config = load_run_config(str(ROOT / params["config_path"]), bench)
        if config.benchmark.kind == "tiny":
            continue  # generated under the cache: test_resolve covers it
        caplog.clear()
        split = resolve_queries(config)
        assert len(split.train) >= config.rollout.queries_per_step, deployment["name"]
        if deployment["name"] != "tiny-cpu":
            assert "malformed task(s)" in caplog.text, deployment["name"]
