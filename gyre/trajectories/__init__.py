"""Recorded calls to trainable, weighted sequences (pure: no Prefect, no I/O)."""
