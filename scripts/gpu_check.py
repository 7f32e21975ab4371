#!/usr/bin/env python3
"""`scripts/gpu_check.py [--cpu]`: the entry of the GPU check (the checks live in scripts/gpucheck/).

What `scripts/gpu_check.sh` and tests/test_gpu_check.py run, with the device machine's own
python3 and no install: it puts the repository (for `gyre`) and scripts/ (for `gpucheck`) on
sys.path and calls `gpucheck.cli.main`. The spawned processes of the transports section find
both through the sys.path they inherit. What each section checks: scripts/gpucheck/__init__.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from gpucheck.cli import main  # noqa: E402  (after the sys.path set-up above)

if __name__ == "__main__":
    sys.exit(main())
