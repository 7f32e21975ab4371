"""Train-engine checkpoints: weights, optimizer state, step and RNG, never half-written.

A multi-hour run must survive a crash and resume exactly where it stopped, so a checkpoint
holds everything the next optimizer step depends on: the weights (safetensors), the AdamW
state, the engine's step counter, the torch RNG state, and (when a rollout engine is passed)
the rollout engine's sampling-generator state. It is written to a temporary
directory beside its final place and renamed into place last, so a crash mid-write leaves
the previous checkpoint intact and no directory that looks complete but is not.

Resuming from `load_checkpoint` and taking the same step on the same data gives
bit-identical weights to never having stopped (tests/test_checkpoint.py).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.pt"
STATE = "state.json"
RNG = "rng.pt"
ROLLOUT_RNG = "rollout_rng.pt"


def save_checkpoint(engine, directory: Path, step: int, rollout=None) -> Path:
    """Write `directory/step-NNNNNN/` for `engine` (a TorchTrainEngine, or a single-process
    MegatronTrainEngine: weights in HF names) and return it;
    `rollout` (an engine with `rng_state()`) adds its sampling RNG."""
    from safetensors.torch import save_model

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step:06d}"
    if final.exists():
        raise FileExistsError(f"{final}: a checkpoint for step {step} already exists")
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=directory))
    try:
        if hasattr(engine, "hf_state_dict"):  # the Megatron engine: its weights in HF names
            from safetensors.torch import save_file

            save_file(engine.hf_state_dict(), str(tmp / WEIGHTS))
        else:
            save_model(engine.model, str(tmp / WEIGHTS))
        torch.save(engine.optimizer.state_dict(), tmp / OPTIMIZER)
        torch.save(torch.get_rng_state(), tmp / RNG)
        if rollout is not None:
            torch.save(rollout.rng_state(), tmp / ROLLOUT_RNG)
        (tmp / STATE).write_text(json.dumps({"step": step, "steps_taken": engine.steps_taken}, indent=2) + "\n")
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint under `directory` (temporary directories are ignored)."""
    found = sorted(p for p in Path(directory).glob("step-*") if (p / STATE).is_file())
    return found[-1] if found else None


def prune_checkpoints(directory: Path, keep: int) -> list[Path]:
    """Remove all but the newest `keep` complete checkpoints under `directory` (`keep` 0: none
    removed); returns the removed paths. Each is renamed away first, so a stop mid-removal
    never leaves a half checkpoint that looks complete."""
    if keep <= 0:
        return []
    found = sorted(p for p in Path(directory).glob("step-*") if (p / STATE).is_file())
    removed = found[:-keep]
    for old in removed:
        doomed = old.with_name(f".{old.name}.removing")
        os.replace(old, doomed)
        shutil.rmtree(doomed)
    return removed


def load_checkpoint(engine, path: Path, rollout=None) -> int:
    """Restore `engine` (and `rollout`'s sampling RNG, when saved) from `path`; returns the step."""
    from safetensors.torch import load_model

    path = Path(path)
    missing = [name for name in (WEIGHTS, OPTIMIZER, STATE, RNG) if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{path}: not a complete checkpoint, missing {missing}")
    if hasattr(engine, "load_snapshot"):  # the Megatron engine (checks every name and shape)
        engine.load_snapshot(path / WEIGHTS)
    else:
        load_model(engine.model, str(path / WEIGHTS), strict=True)
    engine.optimizer.load_state_dict(torch.load(path / OPTIMIZER, weights_only=True))
    torch.set_rng_state(torch.load(path / RNG, weights_only=True))
    if rollout is not None and (path / ROLLOUT_RNG).is_file():
        rollout.set_rng_state(torch.load(path / ROLLOUT_RNG, weights_only=True))
    state = json.loads((path / STATE).read_text())
    engine.steps_taken = int(state["steps_taken"])
    return int(state["step"])
