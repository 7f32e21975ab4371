"""`gyre report RUN_DIR`: what a run did, read back from its DuckDB file alone.

A run prints its step table as it goes; afterwards (or while another session looks at a
copy) the run directory is all there is. This package turns it into PNG plots and one
self-contained HTML page under `RUN_DIR/report/`, and the headline figures the CLI prints:
`data.py` reads the file read-only into dataclasses, `plots.py` draws, `summary.py` makes
the (label, value) rows, `html.py` writes the page. Nothing outside `report/` is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gyre.report import html
from gyre.report.data import RunData, RunDirError, load_run
from gyre.report.plots import Plot, draw_all
from gyre.report.summary import summary_rows

REPORT_DIR = "report"
HTML_NAME = "index.html"

__all__ = ["Report", "RunDirError", "write_report"]


@dataclass(frozen=True)
class Report:
    data: RunData
    rows: list[tuple[str, str]]
    """The summary's (label, value) rows, as the page and the terminal show them."""
    plots: list[Plot]
    html_path: Path

    @property
    def title(self) -> str:
        run_id = self.data.run_ids[0] if self.data.run_ids else "?"
        return f"gyre report: {self.data.name or 'run'} ({run_id})"


def write_report(run_dir: Path) -> Report:
    """Read `run_dir/gyre.duckdb` (read-only) and write `run_dir/report/` (plots, index.html).

    Raises RunDirError when `run_dir` is missing or holds no gyre.duckdb."""
    run_dir = Path(run_dir)
    data = load_run(run_dir)  # RunDirError before anything is created
    out_dir = run_dir / REPORT_DIR
    plots = draw_all(data, out_dir)
    rows = summary_rows(data)
    report = Report(data=data, rows=rows, plots=plots, html_path=out_dir / HTML_NAME)
    html.write(report.html_path, report.title, rows, plots)
    return report
