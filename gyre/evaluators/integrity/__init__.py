"""Reward integrity: how an evaluation tells honest results from forged ones, by detection.

`channel.py` carries results out of the test process over a pipe gyre owns, from gyre's plugin and
runtime monitor (`inprocess/`, the code that runs inside the test process); `pristine.py` decides
which ids count; `mutants.py` plans the canaries (the real tests with one assertion changed, each run
in one of an evaluation's two runs, indistinguishable from the original); `tally.py` counts what came
through; `cases.py` caps parametrized cases at what the pristine source
makes; `control.py` reruns a broken runner on the task's starting files; `pytest_guard.py`
keeps pytest's configuration and shadowing modules out of the workspace's hands;
`monitor.py` (with `monitor_checks.py` and `copied.py`) flags reward hacking in the kept
workspace. The threat model is in DESIGN.md ("Reward integrity") and docs/sandbox.md.
"""
