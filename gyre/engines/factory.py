"""The engines a run's config asks for: the rollout engine (the torch reference engine or an
SGLang server) and the train engine (`train.engine`: torch, or Megatron-core).

The coordinator, the live cells and the evaluation engine all get their rollout engines
here, so `rollout.engine` switches every one of them, and the rest of gyre sees only the
`RolloutEngine` interface. Engine `index` 0 serves the run (and is the core cell's), 1.. are
the other cells' and then the evaluation engine's: with SGLang, `rollout.sglang_urls[index]`.
"""

from __future__ import annotations

from pathlib import Path

from gyre.config.run import RunConfig
from gyre.device.model import DeviceModel, Pacing
from gyre.engines.base import RolloutEngine
from gyre.engines.torch.rollout import TorchRolloutEngine


def train_engine(config: RunConfig, model_dir: Path, *, seed: int):
    """The run's train engine (`train.engine`) on `model_dir`; the Megatron one is imported only
    when asked for, with the install command when the extra is missing."""
    train = config.train
    kwargs = dict(lr=train.lr, weight_decay=train.weight_decay, grad_clip=train.grad_clip,
                  micro_batch_tokens=train.micro_batch_tokens, temperature=config.rollout.temperature, seed=seed,
                  device=check_device(train.device, "train.device"))
    if train.engine == "torch":
        from gyre.engines.torch.train import TorchTrainEngine

        return TorchTrainEngine(model_dir, trainable_layers=train.trainable_layers, **kwargs)
    if train.trainable_layers is not None:
        raise EngineConfigError("train.trainable_layers is a torch train engine setting; the megatron engine trains "
                                "every layer")
    from importlib.util import find_spec

    if find_spec("megatron") is None or find_spec("megatron.core") is None:  # imported only in its backend module
        raise EngineConfigError(
            "train.engine is megatron but megatron-core is not installed: pip install 'gyre-rl[megatron]'")
    from gyre.engines.megatron.train import MegatronParallel, MegatronTrainEngine

    parallel = MegatronParallel(tp=train.megatron.tp, pp=train.megatron.pp)
    return MegatronTrainEngine(model_dir, parallel=parallel, **kwargs)


def check_devices(config: RunConfig) -> None:
    """The run's torch devices, checked in this process before any engine is built."""
    if config.rollout.engine in ("torch", "paced"):
        check_device(config.rollout.device, "rollout.device")
    check_device(config.train.device, "train.device")


class EngineConfigError(ValueError):
    """The rollout section cannot give the engine asked for (e.g. too few SGLang servers)."""


def check_device(device: str, field: str) -> str:
    """`device` when this process can use it; a clear error naming `field` when it cannot (a CUDA
    device asked for where torch sees none, or fewer than its index)."""
    if device == "cpu":
        return device
    import torch

    if not torch.cuda.is_available():
        raise EngineConfigError(f"{field}: {device}, but torch sees no CUDA device here (torch {torch.__version__}, "
                                f"CUDA build: {torch.version.cuda}); use cpu, or run where a GPU is visible")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise EngineConfigError(f"{field}: {device}, but torch sees {torch.cuda.device_count()} CUDA device(s) here")
    return device


def rollout_engine(config: RunConfig, model_dir: Path, index: int, engine_id: str, *, seed: int,
                   policy_version: int = 0, snapshot: Path | None = None,
                   paced: tuple[DeviceModel, Pacing] | None = None) -> RolloutEngine:
    """Engine `index` of the run on `model_dir` (the run's start weights), serving `policy_version`.

    `snapshot`: the weights of `policy_version` when it is not 0 (a cell joining later); a new
    torch engine loads it, an SGLang server is told to load it. `paced`: the modelled cell a
    `rollout.engine: paced` engine runs on (the runtime builds it from the simulator's workload,
    `gyre.runtime.pacing`)."""
    rollout = config.rollout
    if rollout.engine in ("torch", "paced"):
        engine: RolloutEngine = TorchRolloutEngine(
            model_dir, engine_id, max_batch_size=rollout.max_batch_size, seed=seed,
            prefix_cache_bytes=rollout.prefix_cache_bytes, device=check_device(rollout.device, "rollout.device"),
        )  # fmt: skip
        if rollout.engine == "paced":
            engine = paced_engine(engine, paced)
    else:
        engine = _sglang(config, model_dir, index, engine_id)
    if policy_version:
        if snapshot is None:
            raise ValueError(f"engine {engine_id}: policy version {policy_version} needs its snapshot")
        engine.load_weights(snapshot, policy_version)
    return engine


def paced_engine(engine, paced: tuple[DeviceModel, Pacing] | None) -> RolloutEngine:
    """`engine` released on the modelled cell `paced` (`gyre.engines.paced`)."""
    if paced is None:
        raise EngineConfigError("rollout.engine: paced needs its cells' device model (the runtime builds it from "
                                "rollout.paced: gyre.runtime.pacing.paced_cells); none was given")
    from gyre.engines.paced import PacedRolloutEngine

    return PacedRolloutEngine(engine, *paced)


def _sglang(config: RunConfig, model_dir: Path, index: int, engine_id: str) -> RolloutEngine:
    from gyre.engines.sglang.adapter import SGLangRolloutEngine

    urls = config.rollout.sglang_urls
    if index >= len(urls):
        raise EngineConfigError(
            f"rollout.engine is sglang and the run needs rollout engine {index} ({engine_id}), but "
            f"rollout.sglang_urls names {len(urls)} server(s): give one URL per rollout engine "
            "(the run's, one per further cell under scheduler.policy, and one for evaluation)")
    engine = SGLangRolloutEngine(urls[index], engine_id, base_model_dir=model_dir)
    try:
        engine.wait_healthy(config.rollout.sglang_healthy_timeout_s)
        # the server was launched on some model directory; the run starts from gyre's own
        # (a warm start, a converted GGUF): load it, so version 0 is the same weights everywhere
        engine.load_weights(model_dir, 0)
    except BaseException:
        engine.close()
        raise
    return engine
