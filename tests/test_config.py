"""Run configuration: the shipped YAML loads; bad input names the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.config.run import ConfigError, RunConfig, Section, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_configs_load():
    """Run configs load as RunConfig; proxy-*.yaml configure `gyre proxy serve` instead."""
    from gyre.proxy.config import ProxyServeConfig, load_proxy_config

    for path in (ROOT / "configs").glob("*.yaml"):
        if path.name.startswith("proxy-"):
            assert isinstance(load_proxy_config(path), ProxyServeConfig)
        else:
            assert isinstance(load_config(path), RunConfig)


def test_every_field_is_documented():
    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, Section):
                walk(ann)

    walk(RunConfig)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("rollout:\n  group_size: many\n", "field 'rollout.group_size'"),
        ("rollout:\n  gruop_size: 4\n", "field 'rollout.gruop_size'"),
        ("bogus: 1\n", "field 'bogus'"),
        ("algo:\n  name: ppo\n", "field 'algo.name'"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("a: [\n", "not valid YAML"),
        ("scheduler:\n  policy: elastic\n  runtime: ray\ntrain:\n  engine: megatron\n", "train.engine: megatron runs"),
        ("scheduler:\n  policy: elastic\n  runtime: ray\nrollout:\n  engine: sglang\n  sglang_urls: [http://127.0.0.1:1]\n",
         "rollout.engine: sglang"),
    ],
)
def test_bad_config_names_file_and_field(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and needle in str(info.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_scheduler_policies_in_the_config_are_the_registered_ones():
    from typing import get_args

    from gyre.cells.registry import POLICIES
    from gyre.config.run import SchedulerConfig

    literal = next(a for a in get_args(SchedulerConfig.model_fields["policy"].annotation) if a is not type(None))
    assert set(get_args(literal)) == set(POLICIES)


def test_model_tool_parser_names_the_family_or_is_refused(tmp_path):
    from gyre.config.run import ConfigError, load_config

    good = tmp_path / "llama.yaml"
    good.write_text("model:\n  tool_parser: llama3\n")
    assert load_config(good).model.tool_parser == "llama3"
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  tool_parser: mistral\n")
    with pytest.raises(ConfigError, match="model.tool_parser"):
        load_config(bad)
