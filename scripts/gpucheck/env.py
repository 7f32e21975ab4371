"""(a) env: what the run found (python, torch, device, carried wheels) and the model it builds.

Every later section needs the device and the model this section sets on `Ctx`; its rows are
the first thing to read when a GPU run looks wrong.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from gpucheck.context import Ctx, _imports, rdma_devices
from gpucheck.results import Section, _short, verdict


def install_wheels(ctx: Ctx, sec: Section) -> None:
    """Install carried wheels (`--wheels`, default .whl/) with pip --no-index into a temporary
    folder added to sys.path, but only when megatron (or mooncake) does not import already."""
    wheel_dir = Path(ctx.args.wheels)
    wheels = sorted(wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []
    missing = [m for m in ("megatron.core", "mooncake.engine") if not _imports(m)]
    if not wheels:
        sec.row("carried wheels", f"none in {wheel_dir}", "info")
        return
    if not missing:
        sec.row("carried wheels", f"{len(wheels)} in {wheel_dir}, not needed (megatron, mooncake import)", "info")
        return
    target = ctx.tmp / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--disable-pip-version-check", "--target", str(target), *map(str, wheels)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(5.0, min(60.0, ctx.remaining())))
    if proc.returncode != 0:
        sec.row("carried wheels", f"pip install of {len(wheels)} wheel(s) failed", f"failed: {_short(proc.stderr or proc.stdout)}")
        return
    sys.path.insert(0, str(target))
    import importlib

    importlib.invalidate_caches()
    sec.row("carried wheels", ", ".join(w.name.split("-")[0] + "-" + w.name.split("-")[1] for w in wheels)
            + f" installed into {target}", "ok")


def sec_env(ctx: Ctx, sec: Section) -> None:
    import numpy
    import safetensors
    import torch
    import transformers

    try:
        transformers.utils.logging.disable_progress_bar()
    except Exception:
        pass
    sec.row("python", f"{platform.python_version()} ({sys.executable})")
    sec.row("versions", f"torch {torch.__version__}, transformers {transformers.__version__}, "
            f"numpy {numpy.__version__}, safetensors {safetensors.__version__}")
    cuda = torch.cuda.is_available()
    if ctx.args.cpu:
        ctx.device = torch.device("cpu")
        sec.row("device", f"cpu (--cpu dry run; CUDA {'available' if cuda else 'not available'})",
                "info", cpus=os.cpu_count())
        sec.row("CUDA device, bf16 support", "", "skipped: no CUDA (--cpu)")
    else:
        if not cuda:
            raise RuntimeError("CUDA is not available (run with --cpu for the dry run)")
        ctx.device = torch.device("cuda", 0)
        props = torch.cuda.get_device_properties(0)
        cap = torch.cuda.get_device_capability(0)
        sec.row("device", f"{props.name}, capability {cap[0]}.{cap[1]}, {props.total_memory / 2**30:.0f} GiB, "
                f"{props.multi_processor_count} SMs, {torch.cuda.device_count()} GPU(s), CUDA {torch.version.cuda}",
                "ok", name=props.name, capability=list(cap), gpus=torch.cuda.device_count())
        sec.row("bf16 supported", str(torch.cuda.is_bf16_supported()), verdict(torch.cuda.is_bf16_supported()))
    # fp32 references must be IEEE fp32, not TF32
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
    except Exception:  # older torch: the flag
        torch.backends.cuda.matmul.allow_tf32 = False
    sec.row("cpu", f"{os.cpu_count()} cores, load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    install_wheels(ctx, sec)
    meg = _imports("megatron.core")
    sec.row("megatron-core", _version("megatron.core") if meg else "not importable", "info" if meg else "skipped: not importable")
    rdma = rdma_devices()
    moon = _imports("mooncake.engine")
    sec.row("mooncake / RDMA", f"mooncake {'imports' if moon else 'does not import'}; RDMA devices: "
            f"{', '.join(rdma) if rdma else 'none (/sys/class/infiniband)'}")

    from gyre.engines.models.tiny import TinyModelSpec, build_tiny_model

    s = ctx.sizes
    spec = TinyModelSpec(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
                         num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                         head_dim=s.head_dim, max_position_embeddings=4096)
    t = time.perf_counter()
    model_dir = build_tiny_model(ctx.tmp / "model", spec)
    build_s = time.perf_counter() - t
    from safetensors import safe_open

    params = 0
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        for key in f.keys():
            params += math.prod(f.get_slice(key).get_shape())
    ctx.model_dir = model_dir
    ctx.nbytes_fp32 = params * 4
    sec.row("model", f"tiny Qwen3 hidden {s.hidden}, {s.layers} layers, vocab {ctx.vocab()}: {params / 1e6:.1f}M params, "
            f"{ctx.nbytes_fp32 / 1e6:.0f} MB fp32, built in {build_s:.1f} s", "ok", params=params, build_s=build_s)


def _version(module: str) -> str:
    mod = sys.modules.get(module)
    return str(getattr(mod, "__version__", "?"))
