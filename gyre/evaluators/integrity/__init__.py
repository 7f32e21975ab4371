"""Reward integrity: how an evaluation tells honest results from forged ones, by detection.

`channel.py` carries results out of the test process over a pipe gyre owns; `canaries.py`
decides which ids count and adds the canaries that expose a tampered runner; `tally.py`
counts what came through; `cases.py` caps parametrized cases at what the pristine source
makes; `control.py` reruns a broken runner on the task's starting files; `pytest_guard.py`
keeps pytest's configuration and shadowing modules out of the workspace's hands;
`monitor.py` (with `monitor_checks.py` and `copied.py`) flags reward hacking in the kept
workspace. The threat model is in DESIGN.md ("Reward integrity") and docs/sandbox.md.
"""
