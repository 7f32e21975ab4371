"""`gyre bench fidelity`: real NL2RepoBench projects (and, with --terminal-bench, real Terminal-Bench tasks)
scored by gyre beside a stand-in of upstream's own procedure; registered on `gyre bench` by `gyre.cli.bench`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich import box
from rich.table import Table

from gyre.cli.bench_output import JSON, _out_dir, _print_json
from gyre.cli.common import INPUT_ERRORS, _fail, console


def bench_fidelity(
    task: list[str] = typer.Option(None, "--task", "-t", help="Only this project (repeatable); default: all 33."),
    out: Path | None = typer.Option(None, help="Directory for each side's logs (default: runs/fidelity-<time>)."),
    timeout_s: float = typer.Option(900.0, "--timeout-s", min=1.0, help="Bound on each test command."),
    terminal_bench: Path | None = typer.Option(
        None, "--terminal-bench", exists=True, file_okay=False,
        help="Also score the Terminal-Bench tasks under this directory whose reference solution is in the open "
             "(terminal-bench-datasets' aider-polyglot tasks; not shipped: gyre/benches/fidelity_tb.py)."),
    nl2repo: bool = typer.Option(True, "--nl2repo/--no-nl2repo", help="Score the NL2RepoBench projects."),
    swe: Path | None = typer.Option(
        None, "--swe", exists=True, dir_okay=False,
        help="Score these SWE-bench rows instead (gold patch, none, gold with a hunk reverted: expected 1/0/0; "
             "gyre/benches/fidelity_swe.py), built from --swe-repos; needs a Docker engine."),
    swe_repos: Path | None = typer.Option(None, "--swe-repos", help="The repositories' histories (--swe)."),
    swe_objects: Path | None = typer.Option(None, "--swe-objects", help="Files the snapshots lack (--swe)."),
    docker_image: str | None = typer.Option(
        None, "--docker-image",
        help="Score gyre's side as a docker run does (sandbox.type: docker): each project in a fresh container of "
             "its task image, built FROM this image (e.g. the one `make docker-engine` prints) with its start.md "
             "packages through the package index."),
    image_files: str = typer.Option(
        "release", "--image-files",
        help="What upstream's unpublished task image is taken to hold under /workspace besides the hidden tests: "
             "'release' (the release's own package and configuration files, gyre's assumption) or 'none'."),
    results: Path | None = typer.Option(
        None, "--results", dir_okay=False,
        help="Also write the summary JSON here (e.g. docs/results/nl2repo-fidelity-local.json)."),
    as_json: bool = JSON,
) -> None:
    """Real NL2RepoBench projects, their real released sources scored by gyre and by a stand-in of
    upstream's own procedure in the same place, and an empty workspace by gyre (gyre/benches/fidelity.py);
    with --terminal-bench, real Terminal-Bench tasks solved and unsolved (gyre/benches/fidelity_tb.py)."""
    from gyre.benches.fidelity import run

    out = _out_dir(out, "fidelity")
    if swe is not None:
        return _fidelity_swe(swe, swe_repos, swe_objects, task, out, timeout_s, as_json)
    if not nl2repo:
        if terminal_bench is None:
            _fail(ValueError("--no-nl2repo leaves nothing to score without --terminal-bench"))
        result = {"terminal_bench": _fidelity_tb(terminal_bench, out, timeout_s, as_json)}
        _write(result, out, results)
        if as_json:
            _print_json(result)
        return

    def progress(row) -> None:
        if not as_json:
            console.print(f"{row.task}: upstream {row.upstream}, gyre {row.gyre} ({row.gyre_status}), "
                          f"unsolved {row.unsolved} [{row.seconds:.0f} s]"
                          + (f": {row.detail}" if row.gyre_status == "bench error" else ""))

    try:
        result = run(task or None, out, timeout_s=timeout_s, on_result=progress, docker_image=docker_image,
                     image_files=image_files)
    except (*INPUT_ERRORS, ValueError) as exc:  # an unknown --task, a malformed projects file
        _fail(exc)
    if terminal_bench is not None:
        result["terminal_bench"] = _fidelity_tb(terminal_bench, out, timeout_s, as_json)
    _write(result, out, results)
    if as_json:
        _print_json(result)
        return
    table = Table(title=f"gyre bench fidelity ({out})", box=box.SIMPLE)
    for col in ("task", "version", "upstream", "gyre", "status", "unsolved", "match", "pins left out"):
        table.add_column(col, justify="right" if col in ("upstream", "gyre", "unsolved") else "left")
    for r in result["rows"]:
        table.add_row(r["task"], r["version"], _num(r["upstream"]), _num(r["gyre"]), r["gyre_status"],
                      _num(r["unsolved"]), "yes" if r["match"] else "NO" if r["comparable"] else "n/a",
                      str(len(r["skipped_pins"])))
    console.print(table)
    console.print(f"upstream's procedure as at {result['upstream']}; image files: {result['image_files']}")
    console.print(f"{result['matched']} of {result['comparable']} comparable projects ({result['projects']} in all) "
                  f"within {result['tolerance']} of the stand-in; {result['unsolved_above_0']} unsolved above 0; "
                  f"{result['bench_errors']} not set up; not comparable (the stand-in's pytest never ran the tests): "
                  f"{', '.join(result['not_comparable']) or 'none'}")
    console.print(_flag_line(result["flags"]))


def _write(result: dict, out: Path, results: Path | None) -> None:
    """The summary JSON in `out/fidelity.json` and, if asked, at `results`."""
    text = json.dumps(result, indent=2) + "\n"
    (out / "fidelity.json").write_text(text, encoding="utf-8")
    if results is not None:
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(text, encoding="utf-8")


def _fidelity_tb(root: Path, out: Path, timeout_s: float, as_json: bool) -> dict:
    """The Terminal-Bench part of `gyre bench fidelity`, its stand-in's pytest in a cached virtualenv."""
    from gyre.benches.fidelity_sources import pytest_venv
    from gyre.benches.fidelity_tb import run as run_tb
    from gyre.evaluators.observed import IndexAccess

    def progress(row) -> None:
        if not as_json:
            console.print(f"{row.task}: upstream {row.upstream}, gyre {row.gyre} ({row.gyre_status}), "
                          f"unsolved {row.unsolved} ({row.unsolved_status}) [{row.seconds:.0f} s]")

    try:
        result = run_tb(root, out / "terminal-bench", pytest_venv(), timeout_s=min(timeout_s, 600.0),
                        index=IndexAccess(), on_result=progress)
    except (*INPUT_ERRORS, ValueError) as exc:
        _fail(exc)
    if not as_json:
        console.print(f"Terminal-Bench: {result['matched']} of {result['tasks']} tasks scored as upstream scores "
                      f"their reference solution ({result['solved_1']} at 1.0); {result['unsolved_above_0']} "
                      "unsolved above 0")
        console.print(_flag_line(result["flags"]))
    return result


def _fidelity_swe(rows: Path, repos: Path | None, objects: Path | None, task: list[str] | None, out: Path,
                  timeout_s: float, as_json: bool) -> None:
    """The SWE-bench part of `gyre bench fidelity` (`--swe ROWS`): its logic is `gyre.benches.fidelity_swe`."""
    from gyre.benches.fidelity_swe import run as run_swe

    def progress(r) -> None:
        if not as_json:
            console.print(f"{r.instance_id}: " + (f"gold {r.gold}, none {r.none}, reverted {r.reverted} "
                                                  f"[{r.seconds:.0f} s]" if r.scorable else f"unscorable: {r.reason}"))

    if repos is None:
        _fail(ValueError("--swe needs --swe-repos: the directory of the repositories' histories"))
    try:
        result = run_swe(rows, repos, out, objects=objects, instances=tuple(task or ()), timeout_s=timeout_s,
                         on_result=progress)
    except (*INPUT_ERRORS, ValueError) as exc:
        _fail(exc)
    (out / "fidelity-swe.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if as_json:
        _print_json(result)
        return
    console.print(f"SWE-bench: {result['scorable']} of {result['instances']} instances scorable here; "
                  f"{result['matched']} of them gold 1 / none 0 / reverted 0 ({result['gold_1']} gold 1, "
                  f"{result['none_0']} none 0, {result['reverted_0']} reverted 0)")
    for row in result["unscorable"]:
        console.print(f"  unscorable {row['instance_id']}: {row['reason'][:300]}")
    console.print(_flag_line(result["flags"]))


def _flag_line(flags: dict) -> str:
    """The monitors' flags on real solved sources (false positives): kind, projects, whether `zero` acts."""
    return "monitor flags on the real solutions: " + (", ".join(
        f"{kind} {len(e['projects'])} ({'zero acts' if e['zero_acts'] else 'recorded'})"
        for kind, e in flags.items()) or "none")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
