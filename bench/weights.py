"""`python bench/weights.py [--mb 50] [--repeats 5]`: weight-transport bandwidth, two processes.

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

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gyre.weights.snapshot import from_state_dict  # noqa: E402

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


# -- main -------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip", nargs="*", default=[], help="backends to leave out: shm dist mooncake file")
    args = ap.parse_args(argv)
    state = model_state(args.mb)
    snap = from_state_dict(state, 1)
    nbytes = snap.nbytes
    rows: list[tuple[str, float, float, str]] = []  # name, seconds, bytes/s, note

    copies, verifies = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        dst = torch.empty(nbytes, dtype=torch.uint8)
        dst.copy_(snap.buffer)
        copies.append(time.perf_counter() - t)
        del dst
        t = time.perf_counter()
        snap.verify()
        verifies.append(time.perf_counter() - t)
    memcpy_s = statistics.median(copies)
    rows.append(("memcpy (baseline)", memcpy_s, nbytes / memcpy_s, "in-process, fresh buffer"))
    verify_s = statistics.median(verifies)
    rows.append(("verify (sha256)", verify_s, nbytes / verify_s, "checksum only, in every pull"))

    if "shm" not in args.skip:
        from gyre.weights.shm import ShmTransport, slot_bytes_for

        queue = SPAWN.Queue()
        with ShmTransport.create(f"gyre-bench-{os.getpid()}", slot_bytes_for(snap)) as pub:
            publishes = []
            for _ in range(args.repeats):  # both slots written at least once: steady state
                t = time.perf_counter()
                pub.publish(snap)
                publishes.append(time.perf_counter() - t)
            publish_s = statistics.median(publishes)
            proc = _run(shm_reader, pub.segment, args.repeats, queue)
            records = _get(queue, proc)
            _finish(proc)
        secs, rate = _median_rate(records)
        rows.append(("shm", secs, rate, f"publish {publish_s * 1e3:.0f} ms"))

    if "dist" not in args.skip:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        queues = [SPAWN.Queue(), SPAWN.Queue()]
        procs = [_run(dist_rank, rank, port, args.mb, args.repeats, queues[rank]) for rank in (0, 1)]
        publish, records = (_get(q, *procs) for q in queues)
        _finish(*procs)
        secs, rate = _median_rate(records)
        rows.append(("dist (gloo, 127.0.0.1)", secs, rate, f"publish {statistics.median(publish) * 1e3:.0f} ms"))

    if "mooncake" not in args.skip:
        try:
            import mooncake.engine  # noqa: F401
        except ImportError as err:
            rows.append(("mooncake", float("nan"), float("nan"), f"not installed ({err})"))
        else:
            with tempfile.TemporaryDirectory() as tmp:
                descriptor = str(Path(tmp) / "mooncake.json")
                done, pq, rq = SPAWN.Event(), SPAWN.Queue(), SPAWN.Queue()
                pub = _run(mooncake_publisher, descriptor, args.mb, done, pq)
                publish_s = _get(pq, pub)
                reader = _run(mooncake_reader, descriptor, args.repeats, rq)
                records = _get(rq, reader, pub)
                done.set()
                _finish(reader, pub)
            secs, rate = _median_rate(records)
            rows.append(("mooncake (tcp, 127.0.0.1)", secs, rate, f"publish {publish_s * 1e3:.0f} ms"))

    if "file" not in args.skip:
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "policy.safetensors")
            t = time.perf_counter()
            save_file(state, path)
            publish_s = time.perf_counter() - t
            queue = SPAWN.Queue()
            proc = _run(file_reader, path, args.repeats, queue)
            secs = statistics.median(_get(queue, proc))
            _finish(proc)
        rows.append(("file (safetensors, page cache)", secs, nbytes / secs, f"save {publish_s * 1e3:.0f} ms; load + copy, no checksum"))

    print(f"snapshot: {nbytes / 1e6:.1f} MB, {len(snap.manifest.entries)} tensors; median of {args.repeats}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'backend':32} {'seconds':>9} {'GB/s':>7} {'x memcpy':>9}  note")
    for name, secs, rate, note in rows:
        print(f"{name:32} {secs:9.4f} {rate / 1e9:7.3f} {rate / rows[0][2]:9.3f}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
