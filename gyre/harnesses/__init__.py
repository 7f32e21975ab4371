"""Harnesses: agents that drive the model through the proxy (builtin; Claude Code and others later)."""
