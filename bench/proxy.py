"""`python bench/proxy.py [--json]`: the proxy's overhead over a null engine.

The measurement lives in `gyre/proxy/bench.py` (so `gyre bench proxy` can import it from
the installed package); this script prints it as a table, or as JSON with `--json`.
"""

from __future__ import annotations

import json
import sys

from gyre.proxy.bench import TARGETS, run


def main(argv: list[str]) -> None:
    result = run()
    if "--json" in argv:
        print(json.dumps(result, indent=2))
        return
    print(f"{'metric':<28}{'measured':>12}{'target':>10}")
    for key, value in result.items():
        if key == "targets":
            continue
        target = TARGETS.get(key.removeprefix("anthropic_"), "")
        print(f"{key:<28}{value!s:>12}{target!s:>10}")


if __name__ == "__main__":
    main(sys.argv[1:])
