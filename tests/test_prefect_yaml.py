"""prefect.yaml stays in step with the flows it deploys."""

from __future__ import annotations

import importlib
import inspect
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
