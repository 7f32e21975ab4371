"""(f) transports: GB/s of one weight snapshot over shm, torch.distributed and Mooncake.

The two-process transports run in spawned processes whose targets live here (module-level, so
`spawn` can import them by name); each reports through a queue and `_collect` turns a silent or
dead process into an error instead of a hang.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

from gpucheck.context import Ctx, _imports, free_port, rdma_devices
from gpucheck.results import Section, Skip, fmt, part

SPAWN = mp.get_context("spawn")


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
