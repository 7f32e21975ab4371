"""One metrics interface that fans out to optional sinks; a failing sink never stops training.

DuckDB is the always-on sink: the coordinator writes every step and evaluation row to the run's
`gyre.duckdb` itself, and a failure there stops the run (it is the record of truth). The sinks
here are the optional mirrors a user watches live (`metrics.sinks` in the run config):
TensorBoard (`torch.utils.tensorboard`, when the `tensorboard` package is installed) and wandb
(offline mode, when `wandb` is installed). Each is imported inside its backend. `MetricsFanout`
hands every scalar dict to each sink; a sink that raises is logged once, as a warning, and
dropped for the rest of the run.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol, Sequence

log = logging.getLogger(__name__)


class MetricsSink(Protocol):
    name: str

    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """Scalars as TensorBoard events under `log_dir` (`tensorboard --logdir RUN_DIR/tensorboard`)."""

    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """Scalars into an offline wandb run under `run_dir` (`wandb sync` uploads it later)."""

    name = "wandb"

    def __init__(self, run_dir: Path, project: str, run_name: str) -> None:
        import wandb

        os.environ.setdefault("WANDB_MODE", "offline")
        self._run = wandb.init(project=project, name=run_name, dir=str(run_dir), mode="offline")

    def log(self, scalars: dict[str, float], step: int) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


class MetricsFanout:
    """Every scalar dict to every live sink; a sink's first failure is warned about and drops it."""

    def __init__(self, sinks: Sequence[MetricsSink]) -> None:
        self.sinks = list(sinks)
        self.failed: dict[str, str] = {}
        """Sinks dropped after a failure, by name: the failure's text."""

    def log(self, scalars: dict[str, float | int | None], step: int) -> None:
        values = {k: float(v) for k, v in scalars.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for sink in list(self.sinks):
            try:
                sink.log(values, step)
            except Exception as exc:  # deliberate: an optional sink must never stop training
                self._drop(sink, exc)

    def close(self) -> None:
        for sink in list(self.sinks):
            try:
                sink.close()
            except Exception as exc:  # deliberate: as in log
                self._drop(sink, exc)
        self.sinks = []

    def _drop(self, sink: MetricsSink, exc: Exception) -> None:
        self.sinks.remove(sink)
        self.failed[sink.name] = f"{type(exc).__name__}: {exc}"
        log.warning("metrics sink %s failed (%s); it is off for the rest of the run, training goes on",
                    sink.name, self.failed[sink.name])


def make_sinks(names: Sequence[str], run_dir: Path, project: str, run_name: str) -> list[MetricsSink]:
    """The configured optional sinks; one whose package is missing (or whose setup fails) is warned
    about once and left out."""
    sinks: list[MetricsSink] = []
    for name in names:
        try:
            if name == "tensorboard":
                sinks.append(TensorBoardSink(Path(run_dir) / "tensorboard"))
            elif name == "wandb":
                sinks.append(WandbSink(Path(run_dir), project, run_name))
            else:
                raise ValueError(f"unknown metrics sink {name!r} (tensorboard | wandb)")
        except ImportError as exc:
            log.warning("metrics sink %s is configured but not installed (%s); running without it", name, exc)
    return sinks
