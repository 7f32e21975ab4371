#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py) as one command for the device machine: the machine's own
# python3 (torch there; no venv, no registry), unbuffered output, a hard cap of 4 minutes, the
# table on stdout and, with OUT set, $OUT/gpu_check.{json,txt} and $OUT/gpu_check.log (stderr).
# Carried wheels (megatron-core) in .whl/ are installed by the script itself when needed.
# Extra arguments go to the script (e.g. --cpu for the dry run here).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  timeout -k 5 235 "$PY" scripts/gpu_check.py "$@" 2> >(tee "$OUT/gpu_check.log" >&2)
else
  timeout -k 5 235 "$PY" scripts/gpu_check.py "$@"
fi
