"""The entry: command line, each section under its own time limit, the watchdog, the exit code.

`scripts/gpu_check.py` calls `main`; a section that raises, skips or overruns its limit becomes
its status, and the watchdog prints what there is if native code outlives the whole budget.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
from typing import Callable

import gpucheck
from gpucheck.config import NOT_DEVICE_MODULES, REPO, SECTION_LIMITS, SECTIONS, WATCHDOG_GRACE_S
from gpucheck.context import Ctx, cleanup
from gpucheck.env import sec_env
from gpucheck.megatron_check import sec_megatron
from gpucheck.report import table, third_party_modules, write_json
from gpucheck.results import Section, SectionTimeout, Skip, _alarm, _short
from gpucheck.rollout import sec_rollout
from gpucheck.switch import sec_switch
from gpucheck.train import sec_train
from gpucheck.transports import sec_transports


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


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=gpucheck.__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
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
