#!/usr/bin/env python3
"""`scripts/gpu_check.py [--cpu]`: the GPU checks of the torch and Megatron engines in one run.

One prepared script for a lent GPU (one H200, its own python3 with torch 2.11, no registry;
the whole run must stay under 4 minutes): it builds a tiny-Qwen3-architecture model scaled up
(hidden 1024, 8 layers, ~100M parameters), then, each section on its own, and prints one table:

(a) env        torch / CUDA / device, carried wheels installed, the model built;
(b) rollout    the torch rollout engine in bf16 against the same engine in fp32 on the same
               prompts (greedy): identical tokens?, max |behaviour log-prob diff|, and each
               engine's tokens re-scored by the fp32 model (what the trainer sees: TITO);
(c) train      the torch train engine in bf16 against fp32 on one packed micro-batch (plain
               and tree-packed rows, GSPO loss): loss and gradient relative differences;
(d) megatron   the Megatron-core engine (TP=1, fp32) against the torch engine in fp32: loss,
               every gradient in HF names, the weights after one AdamW step;
(e) switch     a rollout->train switch (drain with a call in flight, core snapshot pulled
               through shared memory into a train replica) and a train->rollout switch
               (snapshot saved, `load_weights` into the rollout engine), against the bound
               3 x (snapshot bytes / memcpy bandwidth) + 0.5 s, memcpy measured in the same run;
(f) transports weight transports' GB/s for the same snapshot: shared memory, torch.distributed
               (NCCL with 2 GPUs, else gloo), Mooncake over RDMA where it imports and an RDMA
               device exists (else "skipped: ...").

Each section runs under its own time limit inside a global budget and records
"skipped: reason" or "failed: error" instead of stopping the run: a check script must report
every section. `--cpu` runs the same code on the CPU with tiny sizes (the dry run a CPU box
can do before GPU minutes are spent). The table goes to stdout; with `OUT` set (the device
tool's output folder) the same results go to `$OUT/gpu_check.json`.

Imports: only torch, numpy, safetensors, transformers (and tokenizers, to build the model),
plus megatron-core for (d) and mooncake for (f) where present; gyre's engine modules import
nothing else (no duckdb, prefect, pydantic). A megatron-core wheel in `.whl/` (see
scripts/README.md) is installed with `pip install --no-index` into a temporary folder when
megatron does not import.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing as mp
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SPAWN = mp.get_context("spawn")
# transformers' progress bars and notices on stderr would crowd the table out of a short output tail
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

SECTIONS: tuple[tuple[str, str], ...] = (
    ("env", "(a) environment"),
    ("rollout", "(b) rollout engine bf16 vs fp32"),
    ("train", "(c) torch train engine bf16 vs fp32"),
    ("megatron", "(d) megatron engine vs torch fp32"),
    ("switch", "(e) role switches vs bound"),
    ("transports", "(f) weight transports"),
)

# Section time limits (seconds), each also cut to what is left of the global budget.
SECTION_LIMITS = {"env": 60, "rollout": 45, "train": 40, "megatron": 60, "switch": 50, "transports": 60}
WATCHDOG_GRACE_S = 15.0  # past the budget by this much, the watchdog prints what it has and exits

# Expected gaps (what counts as "ok"); beyond them a row says "CHECK".
TOL_FP32_TITO = 1e-3  # fp32 rollout log-probs vs fp32 full-forward re-scoring (KV cache vs none)
TOL_BF16_LOGPROB = 0.1  # bf16 vs fp32 log-probs of the same tokens (bf16 logits err ~ 2^-8 relative)
TOL_BF16_LOSS_REL = 2e-2
TOL_BF16_GRAD_REL = 0.1
TOL_MEGATRON_REL = 1e-4  # fp32, two implementations of the same model (tests: 1e-4 absolute)
SWITCH_BOUND_CONST_S = 0.5
SWITCH_BOUND_FACTOR = 3.0

NOT_DEVICE_MODULES = ("duckdb", "prefect", "pydantic", "starlette", "fastapi", "uvicorn", "ray", "polars")
"""Top-level modules the device image may lack or that gyre's engine path must not need."""


@dataclass(frozen=True)
class Sizes:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    prompts: int  # rollout prompts, generated as one batch
    prompt_tokens: int
    new_tokens: int
    train_rows: int  # plain rows of the packed micro-batch (plus one tree-packed row)
    train_tokens: int  # tokens of the longest row
    repeats: int  # timed repetitions (median reported)


GPU_SIZES = Sizes(1024, 3072, 8, 16, 8, 64, 512, prompts=8, prompt_tokens=256, new_tokens=32,
                  train_rows=6, train_tokens=512, repeats=3)
CPU_SIZES = Sizes(64, 192, 2, 4, 2, 16, 512, prompts=2, prompt_tokens=12, new_tokens=6,
                  train_rows=2, train_tokens=24, repeats=2)


# -- results ----------------------------------------------------------------------------


@dataclass
class Row:
    check: str
    value: str
    verdict: str = "info"  # "ok", "CHECK", "info", "skipped: ...", "failed: ..."
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Section:
    name: str
    title: str
    status: str = "not run"
    seconds: float = 0.0
    rows: list[Row] = field(default_factory=list)

    def row(self, check: str, value: str, verdict: str = "info", **data: Any) -> None:
        self.rows.append(Row(check, value, verdict, data))


class Skip(Exception):
    """The section (or part) cannot run here: reported as "skipped: <message>"."""


class SectionTimeout(Exception):
    pass


def _alarm(signum, frame):  # noqa: ARG001
    raise SectionTimeout()


def part(sec: Section, label: str, fn: Callable[[], None]) -> None:
    """A sub-check inside a section: its skip or failure becomes a row, the section goes on."""
    try:
        fn()
    except Skip as exc:
        sec.row(label, "", f"skipped: {exc}")
    except SectionTimeout:
        raise
    except Exception as exc:  # a check script reports every part, whatever broke
        traceback.print_exc()
        sec.row(label, "", f"failed: {type(exc).__name__}: {_short(exc)}")


def _short(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def verdict(ok: bool) -> str:
    return "ok" if ok else "CHECK"


def fmt(x: float, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return str(x)
    return f"{x:.{digits}g}"


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


# -- context ----------------------------------------------------------------------------


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


_TINY_OVERRIDES = {"prompts": 2, "prompt_tokens": 8, "new_tokens": 4, "train_rows": 1, "train_tokens": 16, "repeats": 1}


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


# -- (a) environment --------------------------------------------------------------------


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

    from gyre.engines.tiny_model import TinyModelSpec, build_tiny_model

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


# -- (b) rollout ------------------------------------------------------------------------


def _prompts(ctx: Ctx, seed: int = 0) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    s = ctx.sizes
    lengths = [max(2, s.prompt_tokens - (i * s.prompt_tokens) // (2 * s.prompts)) for i in range(s.prompts)]
    return [rng.integers(9, ctx.vocab(), n).tolist() for n in lengths]  # 0..8: special tokens


def _generate_all(engine, prompts, params):
    """All prompts at once from threads (the engine batches them); results and seconds."""
    from concurrent.futures import ThreadPoolExecutor

    from gyre.engines.base import GenerationRequest

    t = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: engine.generate(GenerationRequest(list(p), params)), prompts))
    return results, time.perf_counter() - t


def _rescore(model, device, prompts, outputs) -> list[list[float]]:
    """log p(output token | prefix) under `model`, one full forward (no KV cache), temperature 1."""
    import torch

    from gyre.engines.torch_train import token_logprobs

    rows = [list(p) + list(o) for p, o in zip(prompts, outputs)]
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
    with torch.no_grad():
        logp = token_logprobs(model, ids.to(device), attn.to(device), 1.0).float().cpu()
    return [logp[i, len(p): len(p) + len(o)].tolist() for i, (p, o) in enumerate(zip(prompts, outputs))]


def _max_abs(a: list[list[float]], b: list[list[float]]) -> float:
    diffs = [abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return max(diffs) if diffs else 0.0


def sec_rollout(ctx: Ctx, sec: Section) -> None:
    import torch

    from gyre.engines.base import SamplingParams
    from gyre.engines.torch_rollout import TorchRolloutEngine

    model_dir = ctx.need_model()
    prompts = _prompts(ctx)
    params = SamplingParams(temperature=0.0, max_new_tokens=ctx.sizes.new_tokens)
    ref = TorchRolloutEngine(model_dir, "ref-fp32", device=str(ctx.device), prefix_cache_bytes=0)
    try:
        _generate_all(ref, prompts[:1], params)  # warm-up (kernels, allocator)
        ref_out, ref_s = _generate_all(ref, prompts, params)
        low = TorchRolloutEngine(model_dir, "bf16", device=str(ctx.device), prefix_cache_bytes=0)
        try:
            low.model.to(torch.bfloat16)  # the engines take no dtype: the check casts the model
            _generate_all(low, prompts[:1], params)
            low_out, low_s = _generate_all(low, prompts, params)
        finally:
            low.close()
        n_tok = sum(len(r.output_ids) for r in ref_out)
        sec.row("generated", f"{len(prompts)} prompts x {ctx.sizes.new_tokens} tokens (greedy, one batch): "
                f"fp32 {n_tok / ref_s:.0f} tok/s, bf16 {n_tok / low_s:.0f} tok/s", "info",
                fp32_tok_s=n_tok / ref_s, bf16_tok_s=n_tok / low_s)
        same = sum(a.output_ids == b.output_ids for a, b in zip(ref_out, low_out))
        first_div = []
        for a, b in zip(ref_out, low_out):
            k = next((i for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids)) if x != y), None)
            if k is not None:
                first_div.append(k)
        sec.row("greedy tokens bf16 == fp32", f"{same}/{len(prompts)} prompts identical"
                + (f"; earliest divergence at token {min(first_div)} (random weights: near-ties flip)" if first_div else ""),
                "ok" if same == len(prompts) else "info", identical=same, prompts=len(prompts))
        # behaviour log-probs on the tokens both sampled (up to each prompt's first divergence)
        common_a, common_b = [], []
        for a, b in zip(ref_out, low_out):
            k = next((i for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids)) if x != y), len(a.output_ids))
            k = min(k + 1, len(a.output_ids), len(b.output_ids))  # the diverging token's own log-prob still compares
            common_a.append(a.logprobs[:k])
            common_b.append(b.logprobs[:k])
        d = _max_abs(common_a, common_b)
        sec.row("max |behaviour logprob| bf16 vs fp32", fmt(d) + " (same positions, up to first divergence)",
                verdict(d <= TOL_BF16_LOGPROB), max_abs=d, tol=TOL_BF16_LOGPROB)
        # TITO: what the trainer recomputes (fp32 full forward) against each rollout's behaviour log-probs
        ref_rescored = _rescore(ref.model, ctx.device, prompts, [r.output_ids for r in ref_out])
        d32 = _max_abs([r.logprobs for r in ref_out], ref_rescored)
        sec.row("fp32 rollout vs fp32 re-scoring", f"max |diff| {fmt(d32)} (KV-cached decode vs full forward)",
                verdict(d32 <= TOL_FP32_TITO), max_abs=d32, tol=TOL_FP32_TITO)
        low_rescored = _rescore(ref.model, ctx.device, prompts, [r.output_ids for r in low_out])
        d16 = _max_abs([r.logprobs for r in low_out], low_rescored)
        mean16 = statistics.fmean(abs(x - y) for a, b in zip(low_out, low_rescored) for x, y in zip(a.logprobs, b))
        sec.row("bf16 rollout vs fp32 re-scoring", f"max |diff| {fmt(d16)}, mean {fmt(mean16)} (the trainer's gap)",
                verdict(d16 <= TOL_BF16_LOGPROB), max_abs=d16, mean_abs=mean16, tol=TOL_BF16_LOGPROB)
    finally:
        ref.close()
        cleanup()


# -- (c) train --------------------------------------------------------------------------


BIG_MICRO_BATCH = 1 << 22  # tokens: every row in one micro-batch


def _train_batch(ctx: Ctx, ref) -> list:
    """Plain rows of different lengths (padding) and one tree-packed row (two trajectories
    sharing a prefix); behaviour log-probs = the fp32 reference's + N(0, 1e-3), so GSPO's
    ratios stay near 1 and the tokens pass gradient."""
    import numpy as np
    import torch

    from gyre.engines.base import TrainSequence, TreeLayout
    from gyre.engines.torch_train import _collate, token_logprobs

    rng = np.random.default_rng(7)
    s = ctx.sizes
    vocab = ctx.vocab()
    rows = []
    for i in range(s.train_rows):
        n = max(6, s.train_tokens - i * s.train_tokens // (2 * s.train_rows))
        tr = np.zeros(n, np.bool_)
        tr[n // 3:] = True
        rows.append(TrainSequence(tokens=rng.integers(9, vocab, n), trainable=tr, behaviour_logprobs=np.zeros(n),
                                  weights=tr / tr.sum() / (s.train_rows + 1), advantage=(1.0, -0.5, 0.75)[i % 3],
                                  execution_id=f"e{i}"))
    n = max(9, s.train_tokens)
    a, b = n // 2, n // 2 + n // 4  # spans: root [0, a), child [a, b), child [b, n)
    tr = np.zeros(n, np.bool_)
    tr[a:] = True
    seg = np.where(tr, np.r_[np.full(b, 0), np.full(n - b, 1)], -1)
    rows.append(TrainSequence(
        tokens=rng.integers(9, vocab, n), trainable=tr, behaviour_logprobs=np.zeros(n),
        weights=tr / tr.sum() / (s.train_rows + 1), advantage=0.0, execution_id="tree",
        tree=TreeLayout(np.array([0, a, b]), np.array([-1, 0, 0]), np.r_[np.arange(b), np.arange(a, a + n - b)]),
        segment_ids=seg, segment_advantages=[0.8, -1.2],
    ))
    with torch.no_grad():
        for seq in rows:
            cols = _collate([seq], ref.pad_id, "mask")
            logp = token_logprobs(ref.model, cols["input_ids"].to(ctx.device), cols["attention"].to(ctx.device), 1.0,
                                  *(cols[k].to(ctx.device) if k in cols else None for k in ("position_ids", "prev")))
            logp = logp[0].float().cpu().numpy()
            seq.behaviour_logprobs = np.where(seq.trainable, logp + rng.normal(0, 1e-3, len(logp)), 0.0)
    return rows


def _grads(model) -> dict:
    return {n: (p.grad.detach().float().clone() if p.grad is not None else None) for n, p in model.named_parameters()}


def _grad_compare(ours: dict, ref: dict) -> tuple[float, float, float, float]:
    """(relative L2 of the difference, max |diff|, our norm, reference norm) over the
    reference's tensors (names must match; a missing gradient counts as zeros)."""
    import torch

    diff_sq = ref_sq = our_sq = 0.0
    max_abs = 0.0
    for name, g_ref in ref.items():
        if g_ref is None:
            continue
        g = ours.get(name)
        g = torch.zeros_like(g_ref) if g is None else g.to(g_ref.device, torch.float32)
        d = (g - g_ref).double()
        diff_sq += float(d.pow(2).sum())
        ref_sq += float(g_ref.double().pow(2).sum())
        our_sq += float(g.double().pow(2).sum())
        max_abs = max(max_abs, float(d.abs().max()))
    ref_norm = math.sqrt(ref_sq)
    return math.sqrt(diff_sq) / max(ref_norm, 1e-30), max_abs, math.sqrt(our_sq), ref_norm


def sec_train(ctx: Ctx, sec: Section) -> None:
    import torch

    from gyre.algo.gspo import GSPO
    from gyre.engines.torch_train import TorchTrainEngine

    model_dir = ctx.need_model()
    loss_fn = GSPO().loss
    ref = TorchTrainEngine(model_dir, lr=1e-5, device=str(ctx.device), micro_batch_tokens=BIG_MICRO_BATCH)
    seqs = _train_batch(ctx, ref)
    ref.forward_backward(seqs, loss_fn)  # warm-up
    ctx.sync()
    t = time.perf_counter()
    ref_stats = ref.forward_backward(seqs, loss_fn)
    ctx.sync()
    ref_s = time.perf_counter() - t
    ref_grads = _grads(ref.model)
    del ref
    cleanup()
    low = TorchTrainEngine(model_dir, lr=1e-5, device=str(ctx.device), micro_batch_tokens=BIG_MICRO_BATCH)
    low.model.to(torch.bfloat16)  # the engines take no dtype: the check casts the model
    low.forward_backward(seqs, loss_fn)
    ctx.sync()
    t = time.perf_counter()
    low_stats = low.forward_backward(seqs, loss_fn)
    ctx.sync()
    low_s = time.perf_counter() - t
    low_grads = _grads(low.model)
    del low
    cleanup()
    tokens = sum(len(q.tokens) for q in seqs)
    sec.row("micro-batch", f"{len(seqs) - 1} plain + 1 tree row, {tokens} tokens ({ref_stats.tokens_trained} trained); "
            f"fwd-bwd fp32 {ref_s * 1e3:.0f} ms, bf16 {low_s * 1e3:.0f} ms",
            "info", fp32_s=ref_s, bf16_s=low_s, tokens=tokens)
    loss_rel = abs(low_stats.loss - ref_stats.loss) / max(abs(ref_stats.loss), 1e-12)
    sec.row("GSPO loss rel diff", f"{fmt(loss_rel)} (fp32 {ref_stats.loss:.6g}, bf16 {low_stats.loss:.6g})",
            verdict(loss_rel <= TOL_BF16_LOSS_REL), rel=loss_rel, fp32=ref_stats.loss, bf16=low_stats.loss)
    nll_ref, nll_low = ref_stats.extra.get("nll_sum", 0.0), low_stats.extra.get("nll_sum", 0.0)
    nll_rel = abs(nll_low - nll_ref) / max(abs(nll_ref), 1e-12)
    sec.row("sum -logp rel diff", f"{fmt(nll_rel)} (logprob_abs_diff fp32 {fmt(ref_stats.logprob_abs_diff)}, "
            f"bf16 {fmt(low_stats.logprob_abs_diff)})", verdict(nll_rel <= TOL_BF16_LOSS_REL),
            rel=nll_rel, lp_diff_fp32=ref_stats.logprob_abs_diff, lp_diff_bf16=low_stats.logprob_abs_diff)
    rel, max_abs, norm_low, norm_ref = _grad_compare(low_grads, ref_grads)
    norm_rel = abs(norm_low - norm_ref) / max(norm_ref, 1e-30)
    sec.row("grad norm rel diff", f"{fmt(norm_rel)} (fp32 {fmt(norm_ref)}, bf16 {fmt(norm_low)})",
            verdict(norm_rel <= TOL_BF16_GRAD_REL), rel=norm_rel, fp32=norm_ref, bf16=norm_low)
    sec.row("grad rel L2 diff", f"{fmt(rel)} (max |diff| {fmt(max_abs)}; seq clip frac fp32 "
            f"{fmt(ref_stats.extra.get('seq_clip_frac', 0.0))}, bf16 {fmt(low_stats.extra.get('seq_clip_frac', 0.0))})",
            verdict(rel <= TOL_BF16_GRAD_REL), rel=rel, max_abs=max_abs)


# -- (d) megatron -----------------------------------------------------------------------


def sec_megatron(ctx: Ctx, sec: Section) -> None:
    model_dir = ctx.need_model()
    if not _imports("megatron.core"):
        raise Skip("megatron-core does not import (carry its wheel in .whl/, scripts/README.md)")
    from gyre.algo.gspo import GSPO
    from gyre.engines.megatron_train import MegatronTrainEngine
    from gyre.engines.torch_train import TorchTrainEngine

    lr = 1e-4
    loss_fn = GSPO().loss
    ref = TorchTrainEngine(model_dir, lr=lr, device=str(ctx.device), micro_batch_tokens=BIG_MICRO_BATCH,
                           tree_attention="mask")
    seqs = _train_batch(ctx, ref)
    ref_stats = ref.forward_backward(seqs, loss_fn)
    ref_grads = {n: g.cpu() for n, g in _grads(ref.model).items() if g is not None}
    ref_norm = ref.apply_gradients()
    ref_weights = {n: p.detach().float().cpu() for n, p in ref.model.named_parameters()}
    del ref
    cleanup()
    with _quiet_warnings():
        t = time.perf_counter()
        meg = MegatronTrainEngine(model_dir, lr=lr, device=str(ctx.device), micro_batch_tokens=BIG_MICRO_BATCH)
        build_s = time.perf_counter() - t
    try:
        sec.row("engine", f"MegatronTrainEngine TP=1 fp32 on {ctx.device}, built in {build_s:.1f} s "
                f"(CPU patches applied: {_megatron_patched()})", "info", build_s=build_s)
        meg.forward_backward(seqs, loss_fn)  # warm-up
        ctx.sync()
        t = time.perf_counter()
        stats = meg.forward_backward(seqs, loss_fn)
        ctx.sync()
        fb_s = time.perf_counter() - t
        grads = meg.hf_gradients()
        loss_rel = abs(stats.loss - ref_stats.loss) / max(abs(ref_stats.loss), 1e-12)
        sec.row("GSPO loss rel diff", f"{fmt(loss_rel)} (torch {ref_stats.loss:.8g}, megatron {stats.loss:.8g}); "
                f"forward-backward {fb_s * 1e3:.0f} ms", verdict(loss_rel <= TOL_MEGATRON_REL),
                rel=loss_rel, torch=ref_stats.loss, megatron=stats.loss, fb_s=fb_s)
        rel, max_abs, norm_meg, norm_ref = _grad_compare(grads, ref_grads)
        missing = sorted(set(ref_grads) - set(grads))
        sec.row("grad rel L2 diff", f"{fmt(rel)} (max |diff| {fmt(max_abs)}, norms {fmt(norm_ref)} / {fmt(norm_meg)}"
                + (f"; {len(missing)} HF tensors missing, e.g. {missing[0]}" if missing else "") + ")",
                verdict(rel <= TOL_MEGATRON_REL and not missing), rel=rel, max_abs=max_abs)
        norm = meg.apply_gradients()
        weights = meg.hf_state_dict()
        w_rel, w_max, _, _ = _grad_compare(weights, ref_weights)
        sec.row("after one AdamW step", f"grad norm {fmt(norm)} vs {fmt(ref_norm)}; weights max |diff| {fmt(w_max)}",
                verdict(w_max <= TOL_MEGATRON_REL and abs(norm - ref_norm) <= TOL_MEGATRON_REL * max(ref_norm, 1.0)),
                max_abs=w_max, norm=norm, ref_norm=ref_norm)
    finally:
        meg.close()
        del meg
        cleanup()


def _megatron_patched() -> bool:
    for name in ("gyre.engines.megatron_setup", "gyre.engines.megatron_train"):  # where the flag lives
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "_patched"):
            return bool(mod._patched)
    return False


# -- (e) switches -----------------------------------------------------------------------


def memcpy_seconds(ctx: Ctx, nbytes: int, kind: str) -> float:
    """Best seconds of one copy of `nbytes`: "device" (on ctx.device), "d2h"/"h2d" (pinned)."""
    import torch

    dev = ctx.device
    cuda = dev.type == "cuda"
    if kind == "device":
        src = torch.empty(nbytes, dtype=torch.uint8, device=dev).random_(0, 255)
        dst = torch.empty_like(src)
    elif kind == "d2h":
        src = torch.empty(nbytes, dtype=torch.uint8, device=dev).random_(0, 255)
        dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    else:
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda).random_(0, 255)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    times = []
    for i in range(3 + max(5, ctx.sizes.repeats)):
        ctx.sync()
        t = time.perf_counter()
        dst.copy_(src, non_blocking=cuda)
        ctx.sync()
        if i >= 3:  # 3 warm-ups
            times.append(time.perf_counter() - t)
    del src, dst
    return min(times)  # a ceiling: the best copy (a loaded host only ever makes copies slower)


class _InFlight:
    """One generation running on `engine` until its stop event is set (a call the drain moves)."""

    def __init__(self, engine, prompt: list[int]) -> None:
        from gyre.engines.base import GenerationRequest, SamplingParams

        self.stop = threading.Event()
        self.started = threading.Event()
        self.result = None
        req = GenerationRequest(list(prompt), SamplingParams(temperature=1.0, max_new_tokens=1 << 20),
                                stop=self.stop, on_token=lambda tok, lp: self.started.set())
        self.thread = threading.Thread(target=self._run, args=(engine, req), daemon=True)
        self.thread.start()
        if not self.started.wait(60):
            raise TimeoutError("the in-flight generation sampled no token in 60 s")

    def _run(self, engine, req) -> None:
        self.result = engine.generate(req)


def sec_switch(ctx: Ctx, sec: Section) -> None:
    import torch

    from gyre.engines.torch_rollout import TorchRolloutEngine
    from gyre.engines.torch_train import TorchTrainEngine
    from gyre.weights.shm import ShmTransport, slot_bytes_for
    from gyre.weights.snapshot import from_module, load_into

    model_dir = ctx.need_model()
    dev = str(ctx.device)
    core = TorchTrainEngine(model_dir, lr=1e-5, device=dev)
    replica = TorchTrainEngine(model_dir, lr=1e-5, device=dev)
    engine = TorchRolloutEngine(model_dir, "switch", device=dev)
    engine.model.to(torch.bfloat16)
    segment = f"gyre-gpu-check-{os.getpid()}"
    pub = reader = None
    try:
        with torch.no_grad():  # the core has trained: its weights are not the replica's or the engine's
            gen = torch.Generator(device="cpu").manual_seed(3)
            for p in core.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen).to(p.device, p.dtype), alpha=1e-3)
        probe = from_module(core.model, 0)
        nbytes = probe.nbytes
        try:
            pub = ShmTransport.create(segment, slot_bytes_for(probe))
            reader = ShmTransport.attach(segment)
        except OSError as exc:  # /dev/shm too small: the pull still times snapshot, verify and load
            sec.row("pull through shared memory", "", f"skipped: {_short(exc)}; pulled without a transport")
        del probe
        copy_s = memcpy_seconds(ctx, nbytes, "device")
        bw = nbytes / copy_s
        where = "cuda device-to-device" if ctx.device.type == "cuda" else "cpu"
        sec.row("snapshot bytes", f"{nbytes / 1e6:.1f} MB (fp32 core weights, tied stored once)", "info", nbytes=nbytes)
        sec.row(f"memcpy ({where})", f"{fmt(bw / 1e9)} GB/s ({copy_s * 1e3:.2f} ms for the snapshot's bytes)", "info",
                bytes_per_s=bw, seconds=copy_s)
        if ctx.device.type == "cuda":
            d2h, h2d = memcpy_seconds(ctx, nbytes, "d2h"), memcpy_seconds(ctx, nbytes, "h2d")
            sec.row("memcpy host<->device (pinned)", f"D2H {fmt(gbps(nbytes, d2h))} GB/s, H2D {fmt(gbps(nbytes, h2d))} GB/s",
                    "info", d2h_bytes_per_s=nbytes / d2h, h2d_bytes_per_s=nbytes / h2d)
        else:
            sec.row("memcpy host<->device (pinned)", "", "skipped: no CUDA (--cpu)")
        bound = SWITCH_BOUND_FACTOR * nbytes / bw + SWITCH_BOUND_CONST_S
        prompt = _prompts(ctx, seed=1)[0]
        path = ctx.tmp / "switch" / "snapshot.safetensors"

        def rollout_to_train(version: int) -> dict[str, float]:
            engine.resume()
            flight = _InFlight(engine, prompt)
            phases: dict[str, float] = {}
            t0 = t = time.perf_counter()
            flight.stop.set()  # the router's drain: calls in flight leave at the next token boundary
            if not engine.drain(timeout_s=30):
                raise TimeoutError("drain did not finish in 30 s")
            phases["drain"], t = time.perf_counter() - t, time.perf_counter()
            snap = from_module(core.model, version)  # device -> host, checksummed
            phases["snapshot"], t = time.perf_counter() - t, time.perf_counter()
            if pub is not None:
                pub.publish(snap)
                phases["publish"], t = time.perf_counter() - t, time.perf_counter()
                snap = reader.pull(min_version=version, timeout_s=30).snapshot  # copy out + verify
            else:
                snap.verify()
            phases["pull"], t = time.perf_counter() - t, time.perf_counter()
            load_into(replica.model, snap, verify=False)  # verified by the pull
            ctx.sync()
            phases["load"] = time.perf_counter() - t
            phases["total"] = time.perf_counter() - t0
            flight.thread.join(10)
            return phases

        def train_to_rollout(version: int) -> dict[str, float]:
            phases: dict[str, float] = {}
            t0 = t = time.perf_counter()
            core.save_snapshot(path)
            phases["save"], t = time.perf_counter() - t, time.perf_counter()
            engine.load_weights(path, version)
            ctx.sync()
            phases["load_weights"] = time.perf_counter() - t
            engine.resume()
            phases["total"] = time.perf_counter() - t0
            return phases

        def copy_pull() -> float:
            t = time.perf_counter()
            replica.copy_weights_from(core)
            ctx.sync()
            return time.perf_counter() - t

        reps = max(2, ctx.sizes.repeats)
        r2t = [rollout_to_train(v) for v in range(1, reps + 2)][1:]  # the first is a warm-up
        t2r = [train_to_rollout(v) for v in range(reps + 2, 2 * reps + 3)][1:]
        copies = [copy_pull() for _ in range(reps + 1)][1:]

        def med(runs: list[dict[str, float]], key: str) -> float:
            return statistics.median(r[key] for r in runs)

        for name, runs in (("rollout->train", r2t), ("train->rollout", t2r)):
            total = med(runs, "total")
            detail = ", ".join(f"{k} {med(runs, k) * 1e3:.0f} ms" for k in runs[0] if k != "total")
            sec.row(f"{name} switch", f"{total * 1e3:.0f} ms ({detail}); bound {bound * 1e3:.0f} ms",
                    verdict(total <= bound), total_s=total, bound_s=bound,
                    phases={k: med(runs, k) for k in runs[0]}, runs=len(runs))
        sec.row("pull as live cells do it (copy_weights_from)", f"{statistics.median(copies) * 1e3:.1f} ms "
                "(in-process, no snapshot)", "info", seconds=statistics.median(copies))
        state = dict(replica.model.named_parameters())
        same = all(torch.equal(state[n], p) for n, p in core.model.named_parameters())
        served = dict(engine.model.named_parameters())
        cast = all(torch.equal(served[n], p.to(torch.bfloat16)) for n, p in core.model.named_parameters())
        sec.row("weights after the switches", f"replica == core: {same}; rollout engine == core in bf16: {cast}",
                verdict(same and cast))
    finally:
        engine.close()
        for end in (reader, pub):
            if end is not None:
                end.close()


# -- (f) transports ---------------------------------------------------------------------


def _model_snapshot(model_dir: str, version: int):
    from safetensors.torch import load_file

    from gyre.weights.snapshot import from_state_dict

    return from_state_dict(load_file(str(Path(model_dir) / "model.safetensors")), version)


def _dist_rank(rank: int, port: int, backend: str, model_dir: str, repeats: int, wait_s: float, queue) -> None:
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch
        import torch.distributed as dist

        from gyre.weights.dist import DistTransport, init_group

        if backend == "nccl":
            torch.cuda.set_device(rank)
        init_group(rank, 2, port, backend=backend, timeout_s=wait_s)
        transport = DistTransport(src=0)
        snap = _model_snapshot(model_dir, 1) if rank == 0 else None
        out = []
        for _ in range(repeats + 1):  # the first is a warm-up
            dist.barrier()
            if rank == 0:
                transport.publish(snap)
            else:
                out.append(transport.pull().record)
        dist.barrier()
        queue.put((rank, out[1:]))
        dist.destroy_process_group()
    except BaseException as exc:
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
        raise


def _mooncake_publisher(descriptor: str, model_dir: str, protocol: str, device: str, wait_s: float, done, queue) -> None:
    try:
        from gyre.weights.mooncake import MooncakeTransport

        snap = _model_snapshot(model_dir, 1)
        with MooncakeTransport.create(descriptor, slot_capacity=snap.nbytes, protocol=protocol, device=device) as pub:
            pub.publish(snap)
            queue.put(("publisher", "published"))
            done.wait(wait_s)
    except BaseException as exc:
        queue.put(("publisher", f"{type(exc).__name__}: {exc}"))
        raise


def _mooncake_reader(descriptor: str, protocol: str, device: str, repeats: int, wait_s: float, queue) -> None:
    try:
        from gyre.weights.mooncake import MooncakeTransport

        reader = MooncakeTransport.attach(descriptor, protocol=protocol, device=device)
        records = [reader.pull(min_version=1, timeout_s=wait_s).record for _ in range(repeats + 1)]
        reader.close()
        queue.put(("reader", records[1:]))
    except BaseException as exc:
        queue.put(("reader", f"{type(exc).__name__}: {exc}"))
        raise


def _collect(queue, procs, wanted: set[str] | set[int], wait_s: float) -> dict:
    """Messages keyed by sender until every wanted sender answered; an error string or a dead
    process fails it."""
    import queue as queue_mod

    got: dict = {}
    deadline = time.monotonic() + wait_s
    while set(got) < set(wanted):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no answer from {sorted(set(wanted) - set(got), key=str)} within {wait_s:.0f} s")
        try:
            key, value = queue.get(timeout=0.5)
        except queue_mod.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"process {dead[0].name} exited with {dead[0].exitcode}") from None
            continue
        if isinstance(value, str) and key in wanted and value != "published":
            raise RuntimeError(f"{key}: {value}")
        got[key] = value
    return got


def _finish(procs) -> None:
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join(5)


def _rate_row(sec: Section, label: str, records, host_bw: float, note: str = "") -> None:
    secs = statistics.median(r.seconds - r.wait_seconds for r in records)
    rate = records[0].nbytes / secs
    sec.row(label, f"{fmt(rate / 1e9)} GB/s ({secs * 1e3:.0f} ms per pull incl. checksum; "
            f"{rate / host_bw:.2f} x host memcpy){note}", "ok", bytes_per_s=rate, seconds=secs, pulls=len(records))


def sec_transports(ctx: Ctx, sec: Section) -> None:
    import torch

    model_dir = ctx.need_model()
    snap = _model_snapshot(str(model_dir), 1)
    nbytes = snap.nbytes
    src = snap.buffer
    times = []
    for i in range(2 + max(3, ctx.sizes.repeats)):  # a fresh buffer each time, as a pull allocates one
        t = time.perf_counter()
        dst = torch.empty(nbytes, dtype=torch.uint8)
        dst.copy_(src)
        if i >= 2:
            times.append(time.perf_counter() - t)
        del dst
    host_bw = nbytes / min(times)  # a ceiling, as in the switch section
    t = time.perf_counter()
    snap.verify()
    verify_s = time.perf_counter() - t
    sec.row("snapshot / host memcpy", f"{nbytes / 1e6:.1f} MB; host memcpy into a fresh buffer (as a pull) {fmt(host_bw / 1e9)} GB/s; "
            f"checksum verify {verify_s * 1e3:.0f} ms", "info", nbytes=nbytes, host_bytes_per_s=host_bw, verify_s=verify_s)
    repeats = max(2, ctx.sizes.repeats)
    wait_s = max(10.0, min(60.0, ctx.remaining() - 10))

    def shm() -> None:
        from gyre.weights.shm import ShmTransport, slot_bytes_for

        segment = f"gyre-gpu-check-t-{os.getpid()}"
        with ShmTransport.create(segment, slot_bytes_for(snap)) as pub, ShmTransport.attach(segment) as reader:
            pub.publish(snap)
            records = [reader.pull(min_version=1, timeout_s=10).record for _ in range(repeats + 1)][1:]
        _rate_row(sec, "shm (one process)", records, host_bw)

    def dist() -> None:
        backend = "nccl" if ctx.device.type == "cuda" and torch.cuda.device_count() >= 2 else "gloo"
        queue = SPAWN.Queue()
        port = free_port()
        procs = [SPAWN.Process(target=_dist_rank, name=f"dist-rank{r}",
                               args=(r, port, backend, str(model_dir), repeats, wait_s, queue)) for r in (0, 1)]
        for p in procs:
            p.start()
        try:
            got = _collect(queue, procs, {0, 1}, wait_s)
        finally:
            _finish(procs)
        _rate_row(sec, f"torch.distributed {backend} (2 processes)", got[1], host_bw)
        if backend != "nccl":
            sec.row("torch.distributed nccl", "", "skipped: no CUDA (--cpu)" if ctx.device.type != "cuda"
                    else f"skipped: {torch.cuda.device_count()} GPU (NCCL between two ranks needs 2)")

    def mooncake() -> None:
        if not _imports("mooncake.engine"):
            raise Skip("mooncake does not import (not on the device image; carry its wheel and libibverbs)")
        rdma = rdma_devices()
        if rdma:
            protocol, device = "rdma", rdma[0]
        elif ctx.args.mooncake_tcp:
            protocol, device = "tcp", ""
        else:
            raise Skip("no RDMA device (/sys/class/infiniband is empty or absent)")
        queue, done = SPAWN.Queue(), SPAWN.Event()
        descriptor = str(ctx.tmp / "mooncake" / "descriptor.json")
        procs = [
            SPAWN.Process(target=_mooncake_publisher, name="mooncake-publisher",
                          args=(descriptor, str(model_dir), protocol, device, wait_s, done, queue)),
            SPAWN.Process(target=_mooncake_reader, name="mooncake-reader",
                          args=(descriptor, protocol, device, repeats, wait_s, queue)),
        ]
        for p in procs:
            p.start()
        try:
            got = _collect(queue, procs, {"publisher", "reader"}, wait_s)
        finally:
            done.set()
            _finish(procs)
        _rate_row(sec, f"mooncake {protocol}" + (f" ({device})" if device else ""), got["reader"], host_bw,
                  "" if protocol == "rdma" else " (TCP: --mooncake-tcp, not the RDMA path)")

    part(sec, "shm (one process)", shm)
    part(sec, "torch.distributed (2 processes)", dist)
    part(sec, "mooncake", mooncake)


# -- running and reporting --------------------------------------------------------------


RUNNERS: dict[str, Callable[[Ctx, Section], None]] = {
    "env": sec_env, "rollout": sec_rollout, "train": sec_train, "megatron": sec_megatron,
    "switch": sec_switch, "transports": sec_transports,
}


def run_section(ctx: Ctx, sec: Section) -> None:
    if sec.name not in ctx.args.only:
        sec.status = "skipped: not selected (--only)"
        return
    remaining = ctx.remaining()
    if remaining < 5:
        sec.status = f"skipped: global budget of {ctx.args.budget:.0f} s spent"
        return
    limit = min(SECTION_LIMITS[sec.name] * ctx.args.limit_scale, remaining)
    print(f"[gpu_check] {sec.title}: up to {limit:.0f} s", file=sys.stderr, flush=True)
    t = time.monotonic()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        RUNNERS[sec.name](ctx, sec)
        failed = [r for r in sec.rows if r.verdict.startswith("failed")]
        checks = [r for r in sec.rows if r.verdict == "CHECK"]
        sec.status = ("failed: " + failed[0].check) if failed else ("ok, with CHECK rows" if checks else "ok")
    except Skip as exc:
        sec.status = f"skipped: {exc}"
    except SectionTimeout:
        sec.status = f"failed: timed out after {limit:.0f} s"
    except Exception as exc:  # every section reports, whatever broke in it
        traceback.print_exc()
        sec.status = f"failed: {type(exc).__name__}: {_short(exc)}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sec.seconds = time.monotonic() - t
    try:
        cleanup()
    except Exception:  # freeing memory must not stop the next section from reporting
        traceback.print_exc()


def third_party_modules() -> list[str]:
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    names = {name.split(".")[0] for name in list(sys.modules)}
    return sorted(n for n in names if n and not n.startswith("_") and n not in stdlib and n not in ("gyre", "__main__", "__mp_main__"))


def table(ctx: Ctx, sections: list[Section], note: str = "") -> str:
    lines = []
    rows: list[tuple[str, str, str]] = []
    for sec in sections:
        status = sec.status if len(sec.status) <= 100 else sec.status[:97] + "..."  # the JSON has it whole
        rows.append((sec.title, status, f"{sec.seconds:.1f} s"))
        for r in sec.rows:
            value = r.value if len(r.value) <= 100 else r.value[:97] + "..."
            rows.append(("  " + r.check, value, r.verdict))
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    mode = "--cpu dry run" if ctx.args.cpu else "GPU"
    total = time.monotonic() - ctx.started
    header = f"gyre gpu_check ({mode}; {total:.1f} s of a {ctx.args.budget:.0f} s budget){note}"
    lines.append(header)
    for a, b, c in rows:
        if not a.startswith("  "):
            lines.append("-" * (w0 + w1 + 20))
        lines.append(f"{a:<{w0}}  {b:<{w1}}  {c}")
    lines.append("-" * (w0 + w1 + 20))
    return "\n".join(lines)


def write_json(ctx: Ctx, sections: list[Section], extra: dict | None = None) -> Path | None:
    out = os.environ.get("OUT") if ctx.args.json is None else ctx.args.json
    if not out:
        return None
    path = Path(out) / "gpu_check.json" if ctx.args.json is None else Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": 1,
        "mode": "cpu" if ctx.args.cpu else "cuda",
        "total_s": time.monotonic() - ctx.started,
        "budget_s": ctx.args.budget,
        "sizes": asdict(ctx.sizes),
        "sections": [{"name": s.name, "title": s.title, "status": s.status, "seconds": s.seconds,
                      "rows": [asdict(r) for r in s.rows]} for s in sections],
        "modules": third_party_modules(),
        **(extra or {}),
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="dry run on the CPU with tiny sizes")
    p.add_argument("--tiny", action="store_true", help="the smallest sizes (the test's)")
    p.add_argument("--sizes", choices=("auto", "cpu", "gpu"), default="auto",
                   help="model and batch sizes (auto: gpu, or cpu with --cpu); --sizes gpu --cpu dry-runs the GPU sizes")
    p.add_argument("--budget", type=float, default=None, help="global time budget, s (GPU 210, --cpu 170)")
    p.add_argument("--limit-scale", type=float, default=1.0, help="multiply every section's time limit")
    p.add_argument("--only", default=",".join(n for n, _ in SECTIONS), help="comma-separated sections to run")
    p.add_argument("--wheels", default=str(REPO / ".whl"), help="folder of carried wheels (megatron-core)")
    p.add_argument("--mooncake-tcp", action="store_true", help="without an RDMA device, measure Mooncake over TCP")
    p.add_argument("--json", default=None, help="write the JSON here (default: $OUT/gpu_check.json when OUT is set)")
    args = p.parse_args(argv)
    if args.budget is None:
        args.budget = 170.0 if args.cpu else 210.0
    args.only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = args.only - {n for n, _ in SECTIONS}
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; choose from {[n for n, _ in SECTIONS]}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    ctx = Ctx(args)
    sections = [Section(name, title) for name, title in SECTIONS]
    printed = threading.Event()

    def watchdog() -> None:  # a section stuck in native code past every limit: report what there is
        if printed.is_set():
            return
        printed.set()
        print(table(ctx, sections, note="; WATCHDOG: budget exceeded, run cut short"), flush=True)
        try:
            write_json(ctx, sections, {"watchdog": True})
        finally:
            os._exit(124)

    timer = threading.Timer(args.budget + WATCHDOG_GRACE_S, watchdog)
    timer.daemon = True
    timer.start()
    try:
        for sec in sections:
            run_section(ctx, sec)
    finally:
        timer.cancel()
    if printed.is_set():
        return 124
    printed.set()
    path = write_json(ctx, sections)
    mods = third_party_modules()
    lacking = sorted(set(NOT_DEVICE_MODULES) & set(mods))
    text = (table(ctx, sections) + f"\nthird-party modules imported: {', '.join(mods)}"
            + f"\nmodules the device image lacks, imported: {', '.join(lacking) or 'none'}")
    print(text)
    if path is not None:
        path.with_suffix(".txt").write_text(text + "\n")
    if path is not None:
        print(f"json: {path}")
    import shutil

    shutil.rmtree(ctx.tmp, ignore_errors=True)
    return 1 if any(s.status.startswith("failed") for s in sections) else 0


if __name__ == "__main__":
    sys.exit(main())
