"""The output: the table on stdout and the JSON document, the same results in both.

Also the list of third-party modules the run imported, which shows whether gyre's engine path
needs anything the device image lacks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from gpucheck.context import Ctx
from gpucheck.results import Section

PACKAGE = __name__.split(".")[0]  # this package: the check itself, not a third-party module


def third_party_modules() -> list[str]:
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    names = {name.split(".")[0] for name in list(sys.modules)}
    ours = ("gyre", PACKAGE, "__main__", "__mp_main__")
    return sorted(n for n in names if n and not n.startswith("_") and n not in stdlib and n not in ours)


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
