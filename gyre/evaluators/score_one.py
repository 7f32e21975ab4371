"""Score one workspace for one query of a benchmark directory: `gyre benchmark score`'s function.

For people bringing their own task sets: load the benchmark (any native format), pick the
query, evaluate the workspace exactly as a run would, and answer a plain dict
`{"status": "ok" | "error" | "tampering", "score": float | None, "reason": str, "eval_dir": str}`:
`ok` is a scored result (the score may be 0), `error` an evaluator failure (score None).
Other malformed tasks in the directory do not matter; a missing or malformed query, or a
missing workspace, is bad input and raises a clear error instead.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from gyre.benchmarks import load_benchmark_problems
from gyre.evaluators import evaluate_query
from gyre.evaluators.observed import IndexAccess


def score_workspace(
    root: Path,
    query_id: str,
    workspace: Path,
    kind: str = "auto",
    eval_dir: Path | None = None,
    timeout_s: float = 120,
    *,
    network: str = "none",
    index_url: str | None = None,
    monitor: str = "record",
) -> dict[str, Any]:
    """`network`, `index_url`, `timeout_s` and `monitor` are a run's `evaluator` settings (`EvaluatorConfig`),
    so a workspace a run scored can be scored again by hand the same way."""
    loaded, problems = load_benchmark_problems(kind, Path(root))
    queries = {q.query_id: q for q in loaded}
    broken = [p for p in problems if p.query_id == query_id]
    if broken:
        raise ValueError(f"{root}: query {query_id!r} is malformed: {broken[0].reason}")
    if query_id not in queries:
        known = ", ".join(sorted(queries)[:20])
        raise KeyError(f"{root}: no query {query_id!r}; known: {known}")
    if not Path(workspace).is_dir():
        raise FileNotFoundError(f"workspace {workspace} does not exist or is not a directory")
    if eval_dir is None:
        eval_dir = Path(tempfile.mkdtemp(prefix=f"gyre-score-{query_id}-")) / "eval"
    if network not in ("none", "package-index"):
        raise ValueError(f"network must be none or package-index, got {network!r}")
    index = IndexAccess(upstream=index_url) if network == "package-index" else None
    score = evaluate_query(queries[query_id], Path(workspace), Path(eval_dir), f"score-{query_id}", timeout_s,
                           monitor=monitor, index=index)
    return {"status": score.status.value, "score": score.score, "reason": score.detail, "eval_dir": str(eval_dir)}
