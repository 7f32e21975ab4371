"""`python bench/proxy.py [--json] [--sessions N [--turns K] [--concurrency C]]`: the proxy's overhead.

Without `--sessions`: over a null engine, one short single-turn request again and again
(`gyre/proxy/bench.py`). With `--sessions N`: N agent-shaped sessions (tool calls, tool
results, a context growing by thousands of tokens a call) through the proxy to the tiny
model, against the same engine called directly, and the k-th call with and without the
prefix cache (`gyre/proxy/session_bench.py`). The measurements live in the package (so
`gyre bench proxy` can import them); this script prints them as a table, or as JSON with `--json`.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--sessions", type=int, default=0)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=None)
    args = parser.parse_args(argv)
    if args.sessions > 0:
        sessions(args)
        return
    from gyre.proxy.bench import TARGETS, run

    result = run()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{'metric':<28}{'measured':>12}{'target':>10}")
    for key, value in result.items():
        if key == "targets":
            continue
        target = TARGETS.get(key.removeprefix("anthropic_"), "")
        print(f"{key:<28}{value!s:>12}{target!s:>10}")


def sessions(args: argparse.Namespace) -> None:
    from gyre.proxy.session_bench import DEFAULT_CONCURRENCY, PER_CALL_COLUMNS, run, summary_rows

    result = run(args.sessions, args.turns, args.concurrency or DEFAULT_CONCURRENCY)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print("the k-th call of a session (medians over sessions)")
    print("".join(f"{heading:>20}" for _, heading in PER_CALL_COLUMNS))
    for row in result["per_call"]:
        print("".join(f"{row[key]!s:>20}" for key, _ in PER_CALL_COLUMNS))
    print()
    for figure, value in summary_rows(result):
        print(f"{figure:<52}{value:>24}")


if __name__ == "__main__":
    main(sys.argv[1:])
