"""`gyre benchmark ...`: write, check, list and score benchmark directories.

Every command takes `--format` (auto, nl2repo, terminal-bench, harbor, r2e, swe-bench) and `--json`;
`build swe-bench` makes SWE-bench task directories from rows and the repositories' histories.
One malformed task never hides the others: `check` lists each with its reason (and the
tasks this machine cannot score, with what they need), `ls` notes them on stderr, `score`
refuses only a malformed QUERY_ID.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from gyre.benchmarks.swe_build import PACKAGES_BEFORE
from gyre.cli.benchmark_check import benchmark_check
from gyre.cli.common import INPUT_ERRORS, _fail, console, err_console

benchmark_app = typer.Typer(help="Benchmarks.", no_args_is_help=True)
build_app = typer.Typer(help="Build task directories from a benchmark's rows and the repositories' histories.",
                        no_args_is_help=True)
benchmark_app.add_typer(build_app, name="build")


@build_app.command("swe-bench")
def build_swe_bench_command(
    rows: Path = typer.Argument(..., help="SWE-bench rows: a JSON list (SWE-bench's exports) or JSON lines."),
    out: Path = typer.Argument(..., help="Where the task directories go (one per instance)."),
    repos: Path = typer.Option(..., "--repos", help="Directory of git repositories with their history: "
                               "<owner>__<name>, <owner>/<name>, <name> or <owner>+<name>/repo."),
    specs: Path | None = typer.Option(None, "--specs", help="JSON of install specifications to add to gyre's "
                                      "table (repository -> version -> python, install, ...)."),
    objects: Path | None = typer.Option(None, "--objects", help="Files a repository's snapshot lacks (its release "
                                        "unpacked), taken only where their git blob id matches."),
    scoring: str = typer.Option("resolved", "--scoring", help="resolved (SWE-bench's rule) or partial-credit "
                                "(the share of FAIL_TO_PASS and PASS_TO_PASS tests that pass: not SWE-bench's)."),
    instance: list[str] = typer.Option([], "--instance", help="Only these instance ids (repeatable)."),
    packages_before: str = typer.Option(PACKAGES_BEFORE, "--packages-before", help="The environments' distributions "
                                        "as of this date (YYYY-MM-DD; `none`: the newest)."),
    as_json: bool = typer.Option(False, "--json", help="Print the build report as JSON."),
) -> None:
    """Turn SWE-bench rows plus the repositories' histories into task directories (gyre/benchmarks/swe_build.py):
    the repository at base_commit with no later commit, the test patch's files hidden, the install specification
    resolved. Exit code: 0 every row built, 1 some could not be (each with its reason), 2 bad input."""
    import json

    from gyre.benchmarks.swe_build import build_swe_bench
    from gyre.benchmarks.swe_specs import load_extra_specs

    try:
        table = load_extra_specs(specs) if specs is not None else None
        if not repos.is_dir():
            raise FileNotFoundError(f"--repos {repos} is not a directory")
        report = build_swe_bench(rows, repos, out, specs=table, scoring=scoring, only=tuple(instance),
                                 objects=objects, packages_before=None if packages_before == "none" else packages_before)
    except (*INPUT_ERRORS, ValueError) as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        console.print(f"{len(report.built)} built, {len(report.kept)} kept as they were, {len(report.failed)} "
                      f"could not be built, in {escape(report.out)}")
        for row in report.failed:
            console.print(f"[red]not built[/] {escape(row['instance_id'])}: {escape(row['reason'])}")
    if report.failed:
        raise typer.Exit(code=1)


@benchmark_app.command("r2e-bundles")
def benchmark_r2e_bundles(
    bundles: Path = typer.Argument(..., help="R2E grading bundles (RepoHarness's grading_bundles_r2e_v0.jsonl)."),
    repos: Path = typer.Option(..., "--repos", help="Directory of git repositories with their history: "
                               "<owner>__<name>, <owner>/<name>, <name> or <owner>+<name>/repo."),
    manifest: Path | None = typer.Option(None, "--manifest", help="ingest_manifest_v0.json (RepoHarness's "
                                         "revisions of the upstream material)."),
    unreachable: list[str] = typer.Option([], "--unreachable", help="REPO=REASON: why a repository's history is "
                                          "not here (repeatable), said in its bundles' reasons."),
    out: Path | None = typer.Option(None, "--out", help="Write the per-bundle results JSON here."),
    build: Path | None = typer.Option(None, "--build", help="Also write the recoverable bundles' R2E task "
                                      "directories here (gyre's local R2E layout, gold patches under gold/)."),
    score: Path | None = typer.Option(None, "--score", help="Then score each built instance's gold patch and no "
                                      "patch in docker (expected 1.0 / 0.0), its containers' files here; needs "
                                      "--build and the docker engine."),
    index_url: str | None = typer.Option(None, "--index-url", help="The package index the image builds use "
                                         "(through gyre's proxy); default: pip's configured one."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Say for each R2E-Gym grading bundle whether it can be rebuilt here as R2E-Gym graded it (its hidden tests
    found by sha256 in the repository's history, its expected map upstream's, its Python served), else why
    (gyre/benchmarks/r2e_bundles.py, gyre/benches/fidelity_r2e.py). Exit code: 0, or 2 bad input."""
    import json

    from gyre.benches.fidelity_r2e import run

    try:
        if not repos.is_dir():
            raise FileNotFoundError(f"--repos {repos} is not a directory")
        notes = dict(item.split("=", 1) for item in unreachable if "=" in item)
        if len(notes) != len(unreachable):
            raise ValueError(f"--unreachable takes REPO=REASON, got {unreachable}")
        if score is not None and build is None:
            raise ValueError("--score needs --build (the task directories it scores)")
        report = run(bundles, repos, manifest, notes, build)
    except (*INPUT_ERRORS, ValueError) as exc:
        _fail(exc)
    if score is not None:
        from gyre.benches.fidelity_r2e_score import run as score_built

        report["scored"] = score_built(build, score, instances=tuple(report["built"]), index_url=index_url)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if as_json:
        print(json.dumps(report, indent=2))
        return
    console.print(f"{report['recoverable']} of {report['bundles']} bundles recoverable here")
    for row in report.get("scored", {}).get("results", []):
        console.print(f"scored {escape(row['instance_id'])}: gold {row['gold']}, none {row['none']}"
                      + (f" (unscorable: {escape(row['reason'])})" if not row["scorable"] else ""))
    for row in report["results"]:
        mark = "[green]recoverable[/]" if row["recoverable"] else "[red]unscorable[/]"
        console.print(f"{mark} {escape(row['instance_id'])}" + "".join(f"\n  - {escape(r)}" for r in row["reasons"]))


@benchmark_app.command("tiny")
def benchmark_tiny(
    out: Path = typer.Argument(..., help="Directory to create."),
    num_queries: int = typer.Option(64, min=1),
    seed: int = typer.Option(0),
) -> None:
    """Write the bundled tiny benchmark (NL2RepoBench layout) to OUT."""
    from gyre.benchmarks import generate_tiny

    try:
        path = generate_tiny(out, num_queries, seed)
    except INPUT_ERRORS as exc:
        _fail(exc)
    console.print(f"wrote {num_queries} queries to {path}")


benchmark_app.command("check")(benchmark_check)


@benchmark_app.command("ls")
def benchmark_ls(
    root: Path = typer.Argument(..., help="Benchmark directory."),
    fmt: str = typer.Option("auto", "--format", help="Format: auto, nl2repo, terminal-bench, harbor, r2e, swe-bench."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list of rows instead of a table."),
) -> None:
    """List a benchmark's queries: id, format, timeouts, scoring rule (malformed tasks: a note on stderr)."""
    import json

    from gyre.benchmarks import describe_queries, load_benchmark_report

    try:
        queries, malformed = load_benchmark_report(fmt, root)
        rows = describe_queries(queries)
    except (*INPUT_ERRORS, ValueError) as exc:
        _fail(exc)
    if malformed:
        err_console.print(f"[yellow]note:[/] {len(malformed)} malformed task(s) skipped: "
                          f"{escape(', '.join(task for task, _ in malformed))} (see gyre benchmark check)")
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    table = Table(title=f"{root}: {len(rows)} queries")
    for col in rows[0] if rows else ():
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)


@benchmark_app.command("score")
def benchmark_score(
    root: Path = typer.Argument(..., help="Benchmark directory."),
    query_id: str = typer.Argument(..., help="The query to score against."),
    workspace: Path = typer.Argument(..., help="A workspace (for example a kept one under runs/)."),
    fmt: str = typer.Option("auto", "--format", help="Format: auto, nl2repo, terminal-bench, harbor, r2e, swe-bench."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
    network: str = typer.Option("none", "--network", help="none, or package-index (a run's evaluator.network)."),
    index_url: str | None = typer.Option(None, "--index-url", help="The index proxied (evaluator.index_url)."),
    timeout_s: float = typer.Option(120.0, "--timeout", min=0.001, help="Seconds per test command (evaluator.timeout_s)."),
    monitor: str = typer.Option("record", "--monitor", help="record, zero or off (evaluator.monitor)."),
) -> None:
    """Score one workspace against a query's hidden tests (rerun an evaluation by hand, with the
    evaluator settings the run had).

    Other malformed tasks in ROOT do not matter; a malformed QUERY_ID is refused with its reason.
    """
    import json

    from gyre.evaluators.score_one import score_workspace

    try:
        result = score_workspace(root, query_id, workspace, fmt, timeout_s=timeout_s, network=network,
                                 index_url=index_url, monitor=monitor)
    except (*INPUT_ERRORS, ValueError, KeyError) as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        console.print(f"{escape(query_id)}: score {result['score']} ({result['status']}) {escape(result['reason'])}")
        console.print(f"evaluation kept in {escape(result['eval_dir'])}")


@benchmark_app.command("oracle")
def benchmark_oracle(
    root: Path = typer.Argument(..., help="Benchmark directory (Terminal-Bench or Harbor tasks)."),
    config: Path | None = typer.Option(None, "--config", help="A run config: its sandbox and evaluator settings "
                                       "(e.g. configs/terminal-bench-docker.yaml); default: RunConfig's defaults."),
    task: list[str] = typer.Option([], "--task", help="Only these tasks (repeatable)."),
    out: Path = typer.Option(Path("oracle"), "--out", help="Where the workspaces and evaluations are kept."),
    fmt: str = typer.Option("auto", "--format", help="Format: auto, terminal-bench, harbor."),
    network: str | None = typer.Option(None, "--network", help="none or package-index: overrides the config's "
                                       "evaluator.network (real runners install their test tools)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
) -> None:
    """Upstream's oracle check: each task's reference solution, and its untouched start, run and scored as a
    run would (gyre/runtime/oracle.py). Solved should score as upstream does, untouched 0; a task that cannot
    be built or scored here says why."""
    import json
    from dataclasses import asdict

    from gyre.benchmarks import load_benchmark_report, resolve_kind
    from gyre.config.run import RunConfig, load_config
    from gyre.runtime.oracle import REPRODUCED, oracle_rows, task_verdicts

    try:
        run_config = load_config(config) if config is not None else RunConfig()
        if network is not None:
            run_config = run_config.model_copy(update={"evaluator": run_config.evaluator.model_validate(
                {**run_config.evaluator.model_dump(), "network": network})})
        queries, malformed = load_benchmark_report(resolve_kind(fmt, root), root)
    except (*INPUT_ERRORS, ValueError) as exc:
        _fail(exc)
    unknown = sorted(set(task) - {q.query_id for q in queries})
    if unknown:
        _fail(ValueError(f"no such task in {root}: {', '.join(unknown)}"))
    if out.exists() and any(out.iterdir()):
        _fail(ValueError(f"--out {out} is not empty: each oracle run keeps its workspaces in a directory of its own"))
    try:  # no engine: said once (`SandboxBackendError`, a ValueError), not as a row per task
        rows = oracle_rows([q for q in queries if not task or q.query_id in task], run_config, out)
    except ValueError as exc:
        _fail(exc)
    verdicts = task_verdicts(rows)
    if as_json:
        print(json.dumps({"rows": [asdict(r) for r in rows], "tasks": verdicts}, indent=2))
        return
    table = Table("task", "arm", "status", "score", "detail")
    for r in rows:
        table.add_row(escape(r.task), r.arm, r.status, "" if r.score is None else f"{r.score:g}",
                      escape(r.detail[:160]))
    console.print(table)
    reproduced = sum(v == REPRODUCED for v in verdicts.values())
    console.print(f"{reproduced} of {len(verdicts)} tasks reproduced (solution 1, untouched 0); the others:")
    for name, verdict in verdicts.items():
        if verdict != REPRODUCED:
            console.print(f"  {escape(name)}: {escape(verdict)}")
    console.print(f"workspaces and evaluations kept in {escape(str(out))}")
