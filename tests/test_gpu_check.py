"""scripts/gpu_check.py's dry run (--cpu): every section reports, nothing the device lacks is imported.

The script is what a session with a lent GPU runs (scripts/README.md); this runs it here, on the
CPU with the smallest sizes, as a subprocess, so a broken section is found before GPU minutes
are spent on it. On a CPU box the CUDA-only checks must say "skipped: no CUDA", Mooncake
"skipped: ..." (no RDMA device), and every other section must pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.py"
SECTIONS = ["env", "rollout", "train", "megatron", "switch", "transports"]
NOT_ON_DEVICE = {"duckdb", "prefect", "pydantic", "starlette", "fastapi", "uvicorn", "ray", "polars"}


@pytest.mark.slow
def test_cpu_dry_run_reports_every_section(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu", "--tiny", "--budget", "100", "--limit-scale", "2",
         "--wheels", str(tmp_path / "no-wheels"), "--json", str(out)],
        capture_output=True, text=True, timeout=150, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["mode"] == "cpu"
    sections = {s["name"]: s for s in doc["sections"]}
    assert list(sections) == SECTIONS
    has_megatron = any(r["check"] == "megatron-core" and r["verdict"] == "info" for r in sections["env"]["rows"])
    for name, sec in sections.items():
        if name == "megatron" and not has_megatron:
            assert sec["status"].startswith("skipped: megatron-core does not import"), sec
            continue
        assert sec["status"] == "ok", (name, sec["status"], sec["rows"])
        assert sec["rows"], name
        assert not [r for r in sec["rows"] if r["verdict"] == "CHECK" or r["verdict"].startswith("failed")], sec
    rows = {(name, r["check"]): r for name, sec in sections.items() for r in sec["rows"]}
    for key in [("env", "CUDA device, bf16 support"), ("switch", "memcpy host<->device (pinned)"),
                ("transports", "torch.distributed nccl")]:
        assert rows[key]["verdict"] == "skipped: no CUDA (--cpu)", rows[key]
    assert rows[("transports", "mooncake")]["verdict"].startswith("skipped: "), rows[("transports", "mooncake")]
    for direction in ("rollout->train switch", "train->rollout switch"):
        row = rows[("switch", direction)]
        assert row["data"]["total_s"] <= row["data"]["bound_s"], row
    assert rows[("rollout", "fp32 rollout vs fp32 re-scoring")]["data"]["max_abs"] < 1e-3
    assert not NOT_ON_DEVICE & set(doc["modules"]), sorted(NOT_ON_DEVICE & set(doc["modules"]))
    # one table on stdout, every section in it
    for title in ("(a) environment", "(b) rollout", "(c) torch train", "(d) megatron", "(e) role switches",
                  "(f) weight transports"):
        assert title in proc.stdout, proc.stdout
