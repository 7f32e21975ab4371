"""Sandboxes: where an execution acts (a workspace, limits, commands); local backend by default."""
