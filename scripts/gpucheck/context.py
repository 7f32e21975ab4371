"""The run's shared state (`Ctx`: sizes, budget, device, the built model) and host helpers.

Sections hand each other the device and the model through `Ctx`; the helpers here (free port,
RDMA devices, freeing memory, "does this module import?") are used by more than one section.
"""

from __future__ import annotations

import argparse
import gc
import json
import socket
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from gpucheck.config import _TINY_OVERRIDES, CPU_SIZES, GPU_SIZES, Sizes
from gpucheck.results import Skip


class Ctx:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        chosen = args.sizes if args.sizes != "auto" else ("cpu" if args.cpu else "gpu")
        self.sizes = {"cpu": CPU_SIZES, "gpu": GPU_SIZES}[chosen]
        if args.tiny:
            self.sizes = Sizes(**{**asdict(CPU_SIZES), **_TINY_OVERRIDES})
        self.started = time.monotonic()
        self.deadline = self.started + args.budget
        self.tmp = Path(tempfile.mkdtemp(prefix="gyre-gpu-check-"))
        self.device = None  # torch.device, set by the env section
        self.model_dir: Path | None = None
        self.nbytes_fp32 = 0

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def need_model(self) -> Path:
        if self.model_dir is None:
            raise Skip("no model (the env section did not build it)")
        return self.model_dir

    def sync(self) -> None:
        import torch

        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def vocab(self) -> int:
        return int(json.loads((self.need_model() / "config.json").read_text())["vocab_size"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rdma_devices() -> list[str]:
    root = Path("/sys/class/infiniband")
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def cleanup() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _imports(module: str) -> bool:
    import importlib

    try:
        with _quiet_warnings():
            importlib.import_module(module)
        return True
    except Exception:  # ImportError, OSError (a missing shared library), anything at import time
        return False


class _quiet_warnings:
    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)
