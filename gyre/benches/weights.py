"""`gyre bench weights [--mb 50] [--repeats 5] [--json]`: weight-transport bandwidth, two processes.

One snapshot of about `--mb` MB (a model-shaped state dict of random float32 tensors) is
moved from a publisher process to a reader process by each backend of `gyre/weights/`, and,
for reference, by the existing safetensors file path (`FileSnapshotTransport`: save, then
load in the reader). Each row is the median over `--repeats` pulls of a reader's
`PullRecord` (copy or transfer plus checksum verification; waiting excluded). The baseline,
measured in the same run, is a plain in-process memcpy of the same bytes into a buffer
allocated for it (a pull allocates its buffer too); `verify` is the checksum alone, the part
of every pull that is not moving bytes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch

from gyre.weights.snapshot import Snapshot, from_state_dict

SPAWN = mp.get_context("spawn")
WAIT_S = 180.0


def model_state(mb: float) -> dict[str, torch.Tensor]:
    """Layers of a transformer's shapes (attention, MLP, norms) until about `mb` MB."""
    gen = torch.Generator().manual_seed(0)
    hidden, state, total, layer = 256, {}, 0, 0
    while total < mb * 1e6:
        for name, shape in (
            ("q", (hidden, hidden)), ("k", (hidden // 4, hidden)), ("v", (hidden // 4, hidden)),
            ("o", (hidden, hidden)), ("up", (4 * hidden, hidden)), ("gate", (4 * hidden, hidden)),
            ("down", (hidden, 4 * hidden)), ("norm", (hidden,)),
        ):
            t = torch.randn(shape, generator=gen)
            state[f"layers.{layer}.{name}"] = t
            total += t.numel() * 4
        layer += 1
    return state


def _median_rate(records) -> tuple[float, float]:
    secs = statistics.median(r.seconds - r.wait_seconds for r in records)
    return secs, records[0].nbytes / secs


# -- reader processes -------------------------------------------------------------------


def shm_reader(segment: str, repeats: int, queue) -> None:
    from gyre.weights.shm import ShmTransport

    with ShmTransport.attach(segment) as reader:
        queue.put([reader.pull(min_version=1, timeout_s=WAIT_S).record for _ in range(repeats)])


def mooncake_publisher(descriptor: str, mb: float, done, queue) -> None:
    from gyre.weights.mooncake import MooncakeTransport

    snap = from_state_dict(model_state(mb), 1)
    with MooncakeTransport.create(descriptor, slot_capacity=snap.nbytes) as pub:
        t = time.perf_counter()
        pub.publish(snap)
        queue.put(time.perf_counter() - t)
        done.wait(WAIT_S)


def mooncake_reader(descriptor: str, repeats: int, queue) -> None:
    from gyre.weights.mooncake import MooncakeTransport

    reader = MooncakeTransport.attach(descriptor)
    queue.put([reader.pull(min_version=1, timeout_s=WAIT_S).record for _ in range(repeats)])
    reader.close()


def dist_rank(rank: int, port: int, mb: float, repeats: int, queue) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch.distributed as dist

    from gyre.weights.dist import DistTransport, init_group

    init_group(rank, 2, port, timeout_s=WAIT_S)
    transport = DistTransport(src=0)
    snap = from_state_dict(model_state(mb), 1) if rank == 0 else None
    out = []
    for _ in range(repeats):
        dist.barrier()
        t = time.perf_counter()
        if rank == 0:
            transport.publish(snap)
            out.append(time.perf_counter() - t)
        else:
            out.append(transport.pull().record)
    queue.put(out)
    dist.destroy_process_group()


def file_reader(path: str, repeats: int, queue) -> None:
    from safetensors.torch import load_file

    secs = []
    for _ in range(repeats):
        t = time.perf_counter()
        state = {name: t.clone() for name, t in load_file(path).items()}  # memory-mapped until touched
        secs.append(time.perf_counter() - t)
        del state
    queue.put(secs)


def _run(target, *args):
    proc = SPAWN.Process(target=target, args=args)
    proc.start()
    return proc


def _get(queue, *procs):
    """The next result, or an error as soon as a process it could come from has died."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            return queue.get(timeout=1.0)
        except Exception:  # queue.Empty
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"bench process {dead[0].name} exited with {dead[0].exitcode}") from None
    raise TimeoutError(f"no result within {WAIT_S:g} s")


def _finish(*procs) -> None:
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join()


# -- the measurement -------------------------------------------------------------------

BACKENDS = ("shm", "dist", "mooncake", "file")


def _row(backend: str, seconds: float, bytes_per_s: float, note: str) -> dict:
    return {"backend": backend, "seconds": seconds, "bytes_per_s": bytes_per_s, "note": note}


def _baselines(snap: Snapshot, repeats: int) -> list[dict]:
    """An in-process memcpy into a fresh buffer (the baseline) and the checksum alone."""
    copies, verifies = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        dst = torch.empty(snap.nbytes, dtype=torch.uint8)
        dst.copy_(snap.buffer)
        copies.append(time.perf_counter() - t)
        del dst
        t = time.perf_counter()
        snap.verify()
        verifies.append(time.perf_counter() - t)
    memcpy_s, verify_s = statistics.median(copies), statistics.median(verifies)
    return [_row("memcpy (baseline)", memcpy_s, snap.nbytes / memcpy_s, "in-process, fresh buffer"),
            _row("verify (sha256)", verify_s, snap.nbytes / verify_s, "checksum only, in every pull")]


def _shm(snap: Snapshot, repeats: int) -> dict:
    from gyre.weights.shm import ShmTransport, slot_bytes_for

    queue = SPAWN.Queue()
    with ShmTransport.create(f"gyre-bench-{os.getpid()}", slot_bytes_for(snap)) as pub:
        publishes = []
        for _ in range(repeats):  # both slots written at least once: steady state
            t = time.perf_counter()
            pub.publish(snap)
            publishes.append(time.perf_counter() - t)
        proc = _run(shm_reader, pub.segment, repeats, queue)
        records = _get(queue, proc)
        _finish(proc)
    secs, rate = _median_rate(records)
    return _row("shm", secs, rate, f"publish {statistics.median(publishes) * 1e3:.0f} ms")


def _dist(mb: float, repeats: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queues = [SPAWN.Queue(), SPAWN.Queue()]
    procs = [_run(dist_rank, rank, port, mb, repeats, queues[rank]) for rank in (0, 1)]
    publish, records = (_get(q, *procs) for q in queues)
    _finish(*procs)
    secs, rate = _median_rate(records)
    return _row("dist (gloo, 127.0.0.1)", secs, rate, f"publish {statistics.median(publish) * 1e3:.0f} ms")


def _mooncake(mb: float, repeats: int) -> dict:
    try:
        import mooncake.engine  # noqa: F401
    except ImportError as err:
        return _row("mooncake", float("nan"), float("nan"), f"not installed ({err})")
    with tempfile.TemporaryDirectory() as tmp:
        descriptor = str(Path(tmp) / "mooncake.json")
        done, pq, rq = SPAWN.Event(), SPAWN.Queue(), SPAWN.Queue()
        pub = _run(mooncake_publisher, descriptor, mb, done, pq)
        publish_s = _get(pq, pub)
        reader = _run(mooncake_reader, descriptor, repeats, rq)
        records = _get(rq, reader, pub)
        done.set()
        _finish(reader, pub)
    secs, rate = _median_rate(records)
    return _row("mooncake (tcp, 127.0.0.1)", secs, rate, f"publish {publish_s * 1e3:.0f} ms")


def _file(state: dict[str, torch.Tensor], nbytes: int, repeats: int) -> dict:
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "policy.safetensors")
        t = time.perf_counter()
        save_file(state, path)
        save_s = time.perf_counter() - t
        queue = SPAWN.Queue()
        proc = _run(file_reader, path, repeats, queue)
        secs = statistics.median(_get(queue, proc))
        _finish(proc)
    return _row("file (safetensors, page cache)", secs, nbytes / secs,
                f"save {save_s * 1e3:.0f} ms; load + copy, no checksum")


def run(mb: float = 50.0, repeats: int = 5, skip: tuple[str, ...] = ()) -> dict:
    """Every backend not in `skip` moves the same snapshot between two processes; each row's
    `x_memcpy` is its bytes/s over the memcpy baseline of this run."""
    unknown = set(skip) - set(BACKENDS)
    if unknown:
        raise ValueError(f"--skip: unknown backend(s) {', '.join(sorted(unknown))}; known: {', '.join(BACKENDS)}")
    state = model_state(mb)
    snap = from_state_dict(state, 1)
    rows = _baselines(snap, repeats)
    measure = {"shm": lambda: _shm(snap, repeats), "dist": lambda: _dist(mb, repeats),
               "mooncake": lambda: _mooncake(mb, repeats), "file": lambda: _file(state, snap.nbytes, repeats)}
    rows += [measure[name]() for name in BACKENDS if name not in skip]
    for row in rows:
        row["x_memcpy"] = row["bytes_per_s"] / rows[0]["bytes_per_s"]
    return {"snapshot_bytes": snap.nbytes, "tensors": len(snap.manifest.entries), "repeats": repeats,
            "load_average": os.getloadavg()[0], "cpus": os.cpu_count(), "rows": rows}
