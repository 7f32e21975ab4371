"""How much of a 32-session phase the proxy's GIL is held (a diagnostic, not a benchmark).

`gyre bench proxy-echo` says how many cores the proxy used with 32 agent-shaped sessions at once and
its busiest threads; this says whether one interpreter lock bounds it. It serves the benchmark's null
proxy (`gyre.benches.proxy.null_proxy_process`), runs the 32 echoing sessions
(`gyre.benches.proxy_echo.replay`) under py-spy at `RATE_HZ`, alternately sampling every thread that
is not idle (running or runnable: waiting for a core) and only the thread holding the GIL (`--gil`),
one phase of each per round (`--rounds`, a fresh proxy each), and prints each count as a share of the
phase's wall time (samples / (wall x rate)). A GIL share near 1.0 would mean Python work queued behind
one lock; busy threads above the box's cores mean work queued for a core. py-spy slows what it
samples a little (the phase's calls/s under it are printed); it is not a project dependency:

    pip install py-spy  # once
    .venv/bin/python scripts/proxy_gil_share.py [--sessions 32] [--turns 11] [--rounds 2] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RATE_HZ = 200
SPY_START_S = 1.5  # py-spy attaches before the phase starts


def _phase(port: int, keys: list[str], plan, first_key: int) -> float:
    from gyre.benches.proxy_echo import all_at_once

    started = time.perf_counter()
    asyncio.run(all_at_once(port, keys, plan, first_key))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=11, help="calls per session (11 reach ~50k tokens)")
    parser.add_argument("--rounds", type=int, default=2, help="phases of each kind, alternately")
    parser.add_argument("--out", type=Path, help="write the numbers here as JSON")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise SystemExit("py-spy not found: pip install py-spy")
    from gyre.benches.agent_sessions import agent_sessions
    from gyre.benches.proxy import null_proxy_process
    from gyre.benches.proxy_echo import RESULT_CHARS

    result: dict = {"rate_hz": RATE_HZ, "sessions": args.sessions, "turns": args.turns, "cpu_count": os.cpu_count(),
                    "load_avg_1m_before": round(os.getloadavg()[0], 2), "busy_threads": [], "gil_held": []}
    for round_ in range(args.rounds):  # a fresh proxy each round: its keys serve two phases of 32
        with null_proxy_process(0) as (port, keys, pid), tempfile.TemporaryDirectory() as tmp:
            for k, gil in enumerate((False, True)):
                plan = agent_sessions(args.sessions, args.turns, 100 + 2 * round_ + k, api="openai",
                                      result_chars=RESULT_CHARS)
                out = Path(tmp) / f"spy-{k}.txt"
                command = [spy, "record", "-p", str(pid), "-r", str(RATE_HZ), "-f", "raw", "-o", str(out),
                           "--threads"]
                sampler = subprocess.Popen(command + (["--gil"] if gil else []),
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(SPY_START_S)
                wall = _phase(port, keys, plan, args.sessions * k)
                sampler.send_signal(signal.SIGINT)
                sampler.wait(timeout=30)
                samples = sum(int(line.rsplit(" ", 1)[1]) for line in out.read_text().splitlines() if line.strip())
                share = round(samples / (wall * RATE_HZ), 2)
                result["gil_held" if gil else "busy_threads"].append(
                    {"share": share, "samples": samples, "wall_s": round(wall, 2),
                     "calls_per_s": round(args.sessions * args.turns / wall)})
                what = "GIL held" if gil else "threads busy (not idle)"
                print(f"{what:24s} {share:5.2f} of the phase's wall time "
                      f"({samples} samples, {wall:.2f} s, {args.sessions * args.turns / wall:.0f} calls/s)")
    result["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
