"""The metrics fan-out: every sink gets every scalar; a failing sink warns once and never stops training."""

from __future__ import annotations

import logging

import pytest

from gyre.config.run import ConfigError, load_config
from gyre.metrics import MetricsFanout, make_sinks


class ListSink:
    name = "list"

    def __init__(self) -> None:
        self.logged: list[tuple[dict[str, float], int]] = []
        self.closed = False

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.logged.append((scalars, step))

    def close(self) -> None:
        self.closed = True


class BrokenSink:
    """A sink whose backend is gone (disk full, server down): every call raises."""

    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.calls += 1
        raise OSError("no space left on device")

    def close(self) -> None:
        raise OSError("no space left on device")


def test_a_raising_sink_warns_once_and_the_others_keep_logging(caplog):
    good, broken = ListSink(), BrokenSink()
    fanout = MetricsFanout([broken, good])
    with caplog.at_level(logging.WARNING, logger="gyre.metrics"):
        for step in range(3):
            fanout.log({"train/reward_mean": 0.5 + step, "train/skipped_reason": None, "train/tokens": 7}, step)
        fanout.close()
    assert broken.calls == 1  # dropped after its first failure
    assert [step for _, step in good.logged] == [0, 1, 2]
    assert good.logged[2][0] == {"train/reward_mean": 2.5, "train/tokens": 7.0}  # non-numbers left out
    assert good.closed
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "broken" in warnings[0].getMessage()
    assert "no space left" in fanout.failed["broken"]


def test_a_configured_sink_whose_package_is_missing_is_left_out_with_a_warning(tmp_path, caplog):
    missing = [name for name in ("tensorboard", "wandb") if not _installed(name)]
    if not missing:
        pytest.skip("tensorboard and wandb are both installed here")
    with caplog.at_level(logging.WARNING, logger="gyre.metrics"):
        sinks = make_sinks(missing, tmp_path, "gyre", "run")
    assert sinks == []
    assert len(caplog.records) == len(missing) and all("not installed" in r.getMessage() for r in caplog.records)


def test_the_run_config_names_its_sinks_and_rejects_unknown_ones(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("metrics:\n  sinks: [tensorboard, wandb]\n  project: mine\n")
    assert load_config(good).metrics.sinks == ["tensorboard", "wandb"]
    assert load_config(tmp_path / "good.yaml").metrics.project == "mine"
    bad = tmp_path / "bad.yaml"
    bad.write_text("metrics:\n  sinks: [mlflow]\n")
    with pytest.raises(ConfigError, match="metrics.sinks"):
        load_config(bad)


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
