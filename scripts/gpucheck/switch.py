"""(e) switch: rollout->train and train->rollout role switches, per phase, against the bound.

The bound is 3 x (snapshot bytes / memcpy bandwidth) + 0.5 s with the memcpy measured in the
same run, so a switch is judged against what this machine can copy, not a fixed number.
"""

from __future__ import annotations

import os
import statistics
import threading
import time

from gpucheck.config import SWITCH_BOUND_CONST_S, SWITCH_BOUND_FACTOR
from gpucheck.context import Ctx
from gpucheck.results import Section, _short, fmt, gbps, verdict
from gpucheck.rollout import _prompts


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

    from gyre.engines.torch.rollout import TorchRolloutEngine
    from gyre.engines.torch.train import TorchTrainEngine
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
