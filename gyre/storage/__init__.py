"""DuckDB persistence for a run: one writer, batched appends."""
