"""`scripts/gpu_check.py [--cpu]`: the GPU checks of the torch and Megatron engines in one run.

One prepared script for a lent GPU (one H200, its own python3 with torch 2.11, no registry;
the whole run must stay under 4 minutes): it builds a tiny-Qwen3-architecture model scaled up
(hidden 1024, 8 layers, ~100M parameters), then, each section on its own, and prints one table:

(a) env        torch / CUDA / device, carried wheels installed, the model built;
(b) rollout    the torch rollout engine in bf16 against the same engine in fp32 on the same
               prompts (greedy): identical tokens?, max |behaviour log-prob diff|, and each
               engine's tokens re-scored by the fp32 model (what the trainer sees: TITO);
(c) train      the torch train engine in bf16 against fp32 on one packed micro-batch (plain
               and tree-packed rows, GSPO loss): loss and gradient relative differences;
(d) megatron   the Megatron-core engine (TP=1, fp32) against the torch engine in fp32: loss,
               every gradient in HF names, the weights after one AdamW step;
(e) switch     a rollout->train switch (drain with a call in flight, core snapshot pulled
               through shared memory into a train replica) and a train->rollout switch
               (snapshot saved, `load_weights` into the rollout engine), against the bound
               3 x (snapshot bytes / memcpy bandwidth) + 0.5 s, memcpy measured in the same run;
(f) transports weight transports' GB/s for the same snapshot: shared memory, torch.distributed
               (NCCL with 2 GPUs, else gloo), Mooncake over RDMA where it imports and an RDMA
               device exists (else "skipped: ...").

Each section runs under its own time limit inside a global budget and records
"skipped: reason" or "failed: error" instead of stopping the run: a check script must report
every section. `--cpu` runs the same code on the CPU with tiny sizes (the dry run a CPU box
can do before GPU minutes are spent). The table goes to stdout; with `OUT` set (the device
tool's output folder) the same results go to `$OUT/gpu_check.json`.

Imports: only torch, numpy, safetensors, transformers (and tokenizers, to build the model),
plus megatron-core for (d) and mooncake for (f) where present; gyre's engine modules import
nothing else (no duckdb, prefect, pydantic). A megatron-core wheel in `.whl/` (see
scripts/README.md) is installed with `pip install --no-index` into a temporary folder when
megatron does not import.

Layout, one module a concept: `config` (sections, limits, tolerances, sizes), `results` (rows,
verdicts, skips), `context` (the run's shared state, host helpers), one module per section
(`env`, `rollout`, `train`, `megatron_check`, `switch`, `transports`), `report` (table, JSON)
and `cli` (command line, time limits, watchdog). The first paragraph above is `--help`'s.
"""

import os

# transformers' progress bars and notices on stderr would crowd the table out of a short output tail
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
