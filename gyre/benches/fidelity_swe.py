"""`gyre bench fidelity --swe ROWS`: real SWE-bench instances, their gold patch, no patch and the gold patch with a
hunk reverted, scored as SWE-bench's harness scores them.

For each row the bench builds the task directory (`benchmarks.swe_build`, from `--swe-repos`: the repositories'
own histories), the instance's images (`sandboxes.swe_image`, their build steps through the package index) and
scores three workspaces, each the repository at `base_commit`:

- gold: with the row's `patch` applied (`git apply`, as upstream applies a prediction); SWE-bench validated every
  instance on it: expected 1.0;
- none: untouched: the FAIL_TO_PASS tests fail there by construction: expected 0.0;
- reverted: the gold patch with one of its hunks reverse-applied again, for each hunk in turn; the arm is the
  lowest score (expected 0.0: some hunk of the fix is what the tests need). A patch of one hunk reverted is no
  patch: the arm is the none arm's score, said so in the row (`reverted_is_none`).

An instance is unscorable here when its directory cannot be built (its repository's history is not here, a file
of its base commit is missing from the snapshot), its image cannot be had (no Debian suite ships its Python, a
build step fails), or an arm's evaluation is an evaluator failure: each with the reason, never a 0. The gold and
none arms also carry what the console log, read by the repository's own parser (upstream's reading), says
(`swe_log.parse_log`): gyre scores from its result channel, and a disagreement is named in the score's detail.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gyre.benches.fidelity import flag_counts
from gyre.benchmarks.registry import task_spec
from gyre.benchmarks.spec import SWE_BENCH
from gyre.benchmarks.swe_bench import INSTANCE_FILE, load_swe_bench_report
from gyre.benchmarks.swe_build import build_swe_bench
from gyre.config.run import SandboxConfig
from gyre.evaluators import evaluate_query
from gyre.evaluators.formats.nl2repo_image import TaskImage, docker_placement
from gyre.evaluators.observed import IndexAccess
from gyre.records import EvalStatus
from gyre.sandboxes.factory import docker_image

EXPECTED = {"gold": 1.0, "none": 0.0, "reverted": 0.0}
LOG_PARSE_DISAGREES = "log parse:"
"""What a score's detail says when the console log read by the repository's parser disagrees (`swe_bench`)."""


@dataclass
class InstanceResult:
    """One instance's row."""

    instance_id: str
    repo: str = ""
    version: str = ""
    python: str = ""
    scorable: bool = False
    reason: str = ""
    """Why it is unscorable here (empty when scorable)."""
    gold: float | None = None
    none: float | None = None
    reverted: float | None = None
    reverted_hunks: list[dict] = field(default_factory=list)
    """`{"hunk": "<file> @@ ...", "score": s}` for each hunk of the gold patch reverted in turn."""
    reverted_is_none: bool = False
    match: bool = False
    """Scorable and gold 1.0, none 0.0, reverted 0.0."""
    log_parse_disagrees: list[str] = field(default_factory=list)
    """Arms whose console log, read by the repository's parser, says otherwise than gyre's channel."""
    details: dict[str, str] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    """The monitors' flags on the gold patch: each a false positive."""
    image: str = ""
    seconds: float = 0.0


def run(rows: Path, repos: Path, out: Path, *, objects: Path | None = None, instances: tuple[str, ...] = (),
        timeout_s: float = 900.0, build_network: str = "package-index", index_url: str | None = None,
        on_result: Callable[[InstanceResult], None] | None = None) -> dict:
    """Every row of `rows` (or `instances`) built under `out/tasks` and scored in its three arms; see the module
    docstring."""
    out = Path(out)
    report = build_swe_bench(rows, repos, out / "tasks", objects=objects, only=instances)
    wanted = {*report.built, *report.kept}
    queries, problems = load_swe_bench_report(out / "tasks")
    config = SandboxConfig(type="docker", docker={"build_network": build_network, "index_url": index_url})
    results = [InstanceResult(f["instance_id"], reason=f"not built: {f['reason']}") for f in report.failed]
    results += [InstanceResult(p.query_id or p.task, reason=f"malformed: {p.reason}") for p in problems
                if (p.query_id or p.task) in wanted]
    for result in results:
        _said(result, on_result)
    for query in (q for q in queries if q.query_id in wanted):
        result = _instance(query, config, out / "arms" / query.query_id, timeout_s, index_url)
        results.append(result)
        _said(result, on_result)
    results.sort(key=lambda r: r.instance_id)
    scorable = [r for r in results if r.scorable]
    return {
        "rows": str(rows), "instances": len(results), "scorable": len(scorable),
        "matched": sum(r.match for r in scorable), "expected": EXPECTED,
        "gold_1": sum(r.gold == 1.0 for r in scorable), "none_0": sum(r.none == 0.0 for r in scorable),
        "reverted_0": sum(r.reverted == 0.0 for r in scorable),
        "log_parse_disagrees": sorted(r.instance_id for r in results if r.log_parse_disagrees),
        "unscorable": [{"instance_id": r.instance_id, "reason": r.reason} for r in results if not r.scorable],
        "flags": flag_counts([{"task": r.instance_id, "flags": r.flags} for r in scorable], SWE_BENCH),
        "results": [asdict(r) for r in results],
    }


def _said(result: InstanceResult, on_result) -> None:
    if on_result is not None:
        on_result(result)


def _instance(query, config: SandboxConfig, out: Path, timeout_s: float, index_url: str | None) -> InstanceResult:
    started = time.monotonic()
    spec = task_spec(query)
    row = json.loads((Path(query.root) / INSTANCE_FILE).read_text(encoding="utf-8"))
    result = InstanceResult(query.query_id, spec.swe.repo, spec.swe.version, spec.swe.python)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    try:
        tag, note = docker_image(config, query, **docker_placement(query, spec))
    except Exception as exc:  # deliberate: an image that cannot be had here is the instance's reason, said
        result.reason = f"no image: {type(exc).__name__}: {str(exc)[-600:]}"
        result.seconds = time.monotonic() - started
        return result
    result.image = note
    image = TaskImage(lambda: (tag, note), config.docker.cgroup_parent)
    index = IndexAccess(upstream=index_url) if config.docker.build_network == "package-index" else None

    def score(arm: str, patches: list[tuple[str, bool]]):
        workspace = out / f"ws-{arm}"
        shutil.copytree(query.start_dir, workspace, symlinks=True)
        for patch, reverse in patches:
            _apply(workspace, patch, reverse)
        scored = evaluate_query(query, workspace, out / f"eval-{arm}", f"{query.query_id}-{arm}", timeout_s,
                                monitor="record", index=index, image=image)
        shutil.rmtree(workspace)
        for copy in [p for p in (out / f"eval-{arm}").rglob("repo") if p.is_dir() and not p.is_symlink()]:
            shutil.rmtree(copy, ignore_errors=True)  # the evaluation's copy of the repository: its reports stay
        result.details[arm] = scored.detail[:1500]
        if LOG_PARSE_DISAGREES in scored.detail:
            result.log_parse_disagrees.append(arm)
        return scored

    try:
        gold = score("gold", [(row["patch"], False)])
    except PatchError as exc:
        result.reason, result.seconds = str(exc), time.monotonic() - started
        return result
    none = score("none", [])
    hunks = split_hunks(row["patch"])
    failures = [(arm, s) for arm, s in (("gold", gold), ("none", none)) if s.status is EvalStatus.error]
    reverted = []
    if not failures and len(hunks) > 1:
        for number, (name, hunk) in enumerate(hunks):
            scored = score(f"reverted-{number}", [(row["patch"], False), (hunk, True)])
            if scored.status is EvalStatus.error:
                failures.append((f"reverted-{number}", scored))
            reverted.append({"hunk": name, "score": scored.score})
    result.seconds = time.monotonic() - started
    if failures:
        arm, failed = failures[0]
        result.reason = f"evaluator failure on the {arm} arm: {failed.detail[:600]}"
        return result
    result.scorable, result.gold, result.none, result.flags = True, gold.score, none.score, list(gold.flags)
    result.reverted_hunks = reverted or [{"hunk": hunks[0][0] if hunks else "", "score": none.score}]
    result.reverted_is_none = not reverted
    result.reverted = min(h["score"] for h in result.reverted_hunks)
    result.match = (result.gold, result.none, result.reverted) == (1.0, 0.0, 0.0)
    return result


def split_hunks(patch: str) -> list[tuple[str, str]]:
    """Each hunk of a unified git diff as a patch of its own (its file's header + the hunk), named
    `<file> <hunk header>`."""
    hunks: list[tuple[str, str]] = []
    header: list[str] = []
    current: list[str] | None = None
    name = ""

    def close() -> None:
        if current:
            hunks.append((f"{name} {current[0].split(' @@')[0]} @@", "".join(header + current)))

    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git "):
            close()
            header, current = [line], None
            name = line.rstrip("\n").split(" b/", 1)[-1]
        elif line.startswith("@@"):
            close()
            current = [line]
        elif current is not None:
            current.append(line)
        else:
            header.append(line)
    close()
    return hunks


class PatchError(RuntimeError):
    """A patch did not apply to the base commit: the instance is unscorable here (upstream's would not apply)."""


def _apply(workspace: Path, patch: str, reverse: bool) -> None:
    args = ["git", "-C", str(workspace), "apply", *(["-R"] if reverse else []), "-"]
    done = subprocess.run(args, input=patch, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise PatchError(f"git apply{' -R' if reverse else ''} failed in {workspace}: {done.stderr.strip()[-400:]}")

