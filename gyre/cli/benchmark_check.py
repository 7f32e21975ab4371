"""`gyre benchmark check`: load every task of a benchmark directory and say what is wrong with each.

Its own file because it is the longest command: the report (malformed tasks with their reasons, tasks this machine
cannot score and what they need, repeated content with the split side each copy lands on), the optional control
run on each task's starting files, and the text rendering of that report.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gyre.cli.common import INPUT_ERRORS, _fail, console, err_console


def benchmark_check(
    root: Path = typer.Argument(..., help="Benchmark directory."),
    fmt: str = typer.Option("auto", "--format", help="Format: auto, nl2repo, terminal-bench, harbor, r2e, swe-bench."),
    kind: str | None = typer.Option(None, "--kind", hidden=True, help="Deprecated alias of --format."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of text."),
    eval_fraction: float = typer.Option(0.25, min=0.0, max=0.99, help="Held-out share for the split shown."),
    held_out_kind: list[str] = typer.Option([], "--held-out-kind", help="A tiny template held out entirely."),
    network: str = typer.Option("none", "--network", help="The evaluations' network: none or package-index."),
    sandbox: str = typer.Option("local", "--sandbox", help="The run's sandbox.type: local, or docker (Terminal-Bench, "
                                "Harbor and R2E tasks evaluated in their own container, where uv's installer is "
                                "stood in for from the package index)."),
    control: bool = typer.Option(False, "--control", help="Also score each task's starting files, as a run's "
                                 "control run does: an evaluator failure there is unscorable (slow: one "
                                 "evaluation per task)."),
    index_url: str | None = typer.Option(None, "--index-url", help="The index proxied (evaluator.index_url)."),
    timeout_s: float = typer.Option(120.0, "--timeout", min=0.001, help="Seconds per test command (--control)."),
    control_dir: Path | None = typer.Option(None, "--control-dir", help="Where --control keeps each evaluation "
                                            "(default: a new temporary directory)."),
) -> None:
    """Load every task; list each malformed one with its reason, the tasks unscorable here (with the
    evaluations' `--network`, as a run's `evaluator.network` gives them; with `--control`, also those whose
    starting files the evaluator cannot score), and
    queries whose instruction, hidden tests or reference solution repeat (with the side of the
    content split each lands on: copies always share a side).

    Exit code: 0 all tasks load, 1 some are malformed (the rest still load), 2 ROOT is unusable.
    """
    import json

    from gyre.benchmarks import load_benchmark_report, resolve_kind

    if kind is not None:
        if fmt not in ("auto", kind):
            _fail(ValueError(f"--kind {kind!r} contradicts --format {fmt!r}; --kind is a deprecated alias of --format"))
        err_console.print("[yellow]note:[/] --kind is deprecated; use --format")
        fmt = kind
    if network not in ("none", "package-index"):
        _fail(ValueError(f"--network must be none or package-index, got {network!r}"))
    if sandbox not in ("local", "docker"):
        _fail(ValueError(f"--sandbox must be local or docker, got {sandbox!r}"))
    try:
        resolved = resolve_kind(fmt, root)
        queries, malformed = load_benchmark_report(resolved, root)
    except (*INPUT_ERRORS, ValueError) as exc:
        _fail(exc)
    report = _check_report(root, resolved, queries, malformed, eval_fraction, held_out_kind,
                           package_index=network == "package-index", docker=sandbox == "docker")
    if control:
        _add_control(report, queries, network, index_url, timeout_s, control_dir, docker=sandbox == "docker")
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print_check(report, eval_fraction)
    if malformed:
        raise typer.Exit(code=1)


def _check_report(root: Path, resolved: str, queries, malformed, eval_fraction: float,
                  held_out_kind: list[str], package_index: bool = False, docker: bool = False) -> dict:
    """What `check` says of a loaded benchmark: good and malformed tasks, the tasks this machine
    cannot score (with what they need), the content split and the contents that repeat."""
    from gyre.benchmarks.content import duplicates, split_by_content
    from gyre.benchmarks.registry import task_spec
    from gyre.evaluators.environments.needs import available_here, task_needs, unmet
    from gyre.evaluators.formats.in_container import IN_CONTAINER_FORMATS

    unscorable = []
    for query in queries:
        try:
            in_container = docker and task_spec(query).format in IN_CONTAINER_FORMATS
            missing = unmet(task_needs(query, image_holds_packages=docker and package_index),  # its image's build
                            available_here(package_index=package_index, in_container=in_container))
        except OSError as exc:  # a script it runs cannot be read: say so, do not hide the task
            missing = [f"unreadable script ({exc})"]
        if missing:
            unscorable.append({"id": query.query_id, "needs": missing})
    split = split_by_content(queries, eval_fraction, held_out_kind)
    sides = (("train", split.train), ("eval", split.eval), ("generalisation", split.generalisation))
    side = {q.query_id: name for name, qs in sides for q in qs}
    repeats = duplicates(queries, lambda q: side[q.query_id])
    return {
        "root": str(root), "format": resolved, "ok": [q.query_id for q in queries],
        "malformed": [{"task": task, "reason": reason} for task, reason in malformed],
        "unscorable_here": unscorable,
        "split": {name: len(qs) for name, qs in sides},
        "duplicates": [{"kind": d.kind, "ids": d.query_ids, "sides": d.sides} for d in repeats],
        "duplicates_across_split": sum(d.crosses for d in repeats),
    }


def _add_control(report: dict, queries, network: str, index_url: str | None, timeout_s: float,
                 control_dir: Path | None, docker: bool = False) -> None:
    """Score the starting files of each task not already unscorable (`evaluators.control_check`); an evaluator
    failure there joins `unscorable_here` with the evaluator's reason. `docker`: SWE-bench and NL2RepoBench tasks
    are evaluated in a fresh container of their image, built as a docker run builds it (its build steps through
    the package index with `--network package-index`); a SWE-bench verdict says how many of its PASS_TO_PASS
    tests pass at base_commit (`pass_to_pass_at_base`)."""
    import tempfile

    from gyre.evaluators.control_check import docker_task_images
    from gyre.evaluators.formats.swe_log import pass_to_pass_counts

    from gyre.evaluators.control_check import control_verdicts
    from gyre.evaluators.observed import IndexAccess

    named = {row["id"] for row in report["unscorable_here"]}
    todo = [q for q in queries if q.query_id not in named]
    out = control_dir if control_dir is not None else Path(tempfile.mkdtemp(prefix="gyre-check-")) / "control"

    def said(verdict) -> None:
        err_console.print(f"control {escape(verdict.query_id)}: {verdict.status} {verdict.score} "
                          f"{escape(verdict.reason[:160])}")

    if out.exists():
        _fail(ValueError(f"--control-dir {out} already exists; name a new directory"))
    verdicts = control_verdicts(todo, out, index=IndexAccess(upstream=index_url) if network == "package-index"
                                else None, timeout_s=timeout_s, on_done=said,
                                image_for=docker_task_images(network, index_url) if docker else None)
    rows = [v.as_dict() for v in verdicts]
    for row in rows:
        counts = pass_to_pass_counts(row["reason"])
        if counts is not None:
            row["pass_to_pass_at_base"] = {"passed": counts[0], "total": counts[1]}
    report["control"] = {"dir": str(out), "verdicts": rows}
    report["unscorable_here"] += [{"id": v.query_id, "needs": [f"an evaluation its starting files do not break "
                                                               f"(control run: {v.reason})"]}
                                  for v in verdicts if v.unscorable]


def _print_check(report: dict, eval_fraction: float) -> None:
    malformed, split, repeats = report["malformed"], report["split"], report["duplicates"]
    console.print(f"{len(report['ok'])} queries OK in {escape(report['root'])} ({report['format']})"
                  + (f", {len(malformed)} malformed" if malformed else ""))
    for row in malformed:
        console.print(f"[red]malformed[/] {escape(row['task'])}: {escape(row['reason'])}")
    for row in report["unscorable_here"]:
        console.print(f"[yellow]unscorable here[/] {escape(row['id'])}: needs {escape(', '.join(row['needs']))}")
    if "control" in report:
        verdicts = report["control"]["verdicts"]
        console.print(f"control runs on the starting files: {sum(v['status'] != 'error' for v in verdicts)} of "
                      f"{len(verdicts)} scorable (kept in {escape(report['control']['dir'])})")
    console.print(f"content split (eval_fraction {eval_fraction:g}): {split['train']} train, {split['eval']} "
                  f"eval, {split['generalisation']} generalisation; {len(repeats)} repeated contents, "
                  f"{report['duplicates_across_split']} across the split")
    for d in repeats:
        console.print(f"[yellow]duplicate {d['kind']}[/] {escape(', '.join(d['ids']))} "
                      f"({escape(', '.join(sorted(set(d['sides']))))})")
