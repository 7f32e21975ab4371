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


NEEDS_MORE_THAN_THIS_BOX = {"terminalbench"}
"""Deployments whose default benchmark this machine cannot score: prefect.yaml says what each needs."""


def test_every_rl_run_deployment_runs_here_or_says_what_it_needs(tmp_path):
    """With its defaults each deployment's queries can be scored here (`check_inputs` passes), or its description
    says what it needs and a run of it stops at its start naming each query and that need."""
    from gyre.flows.rl_run import load_run_config
    from gyre.runtime.resolve import UnscorableError, check_inputs

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    for deployment in spec["deployments"]:
        if not deployment["entrypoint"].endswith("rl_run.py:rl_run"):
            continue
        for step in deployment.get("pull", []):
            (name, args), = step.items()
            if name == "prefect.deployments.steps.run_shell_script":
                subprocess.run([sys.executable, *args["script"].split()[1:]], cwd=tmp_path, check=True,
                               capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        params = deployment["parameters"]
        bench = params.get("benchmark_dir")
        if bench is not None:
            bench = str(tmp_path / bench if (tmp_path / bench).exists() else ROOT / bench)
        config = load_run_config(str(ROOT / params["config_path"]), bench)
        config = config.model_copy(update={"cache_dir": tmp_path / "cache"})
        if deployment["name"] not in NEEDS_MORE_THAN_THIS_BOX:
            check_inputs(config)
            continue
        assert "Needs" in deployment["description"] and "uv's installer" in deployment["description"]
        try:
            check_inputs(config)
        except UnscorableError as exc:
            said = str(exc)
        else:
            raise AssertionError(f"{deployment['name']} is scorable here: take it out of NEEDS_MORE_THAN_THIS_BOX")
        assert "2 of 2 queries cannot be scored here" in said and "csv-rows needs" in said, said
        assert "uv-installer" in said and "--allow-unscorable" in said, said
        allowed = config.model_copy(update={"evaluator": config.evaluator.model_copy(update={"allow_unscorable": True})})
        check_inputs(allowed)


def test_an_unscorable_deployment_run_fails_at_its_start_with_its_reason(tmp_path):
    """The terminalbench deployment as shipped, run as its worker would: the flow run ends Failed before any
    model build, its message naming each task and what it needs; no run directory is made."""
    from gyre.flows.rl_run import rl_run

    (deployment,) = [d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
                     if d["name"] == "terminalbench"]
    config = tmp_path / "terminalbench.yaml"
    config.write_text((ROOT / deployment["parameters"]["config_path"]).read_text()
                      .replace("cache_dir: .gyre-cache", f"cache_dir: {tmp_path / 'cache'}"))
    state = rl_run(config_path=str(config), run_dir=str(tmp_path / "run"),
                   benchmark_dir=str(ROOT / deployment["parameters"]["benchmark_dir"]), return_state=True)
    assert state.is_failed()
    assert "csv-rows needs" in state.message and "kv-server needs" in state.message, state.message
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache" / "models").exists()
