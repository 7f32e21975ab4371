"""The code gyre runs inside an evaluation's test processes: modules of their own, shipped as files.

Each evaluation gets a read-only copy of these modules in its plugin directory
(`channel.PluginInstall.write`), under names drawn for it:

- `plugin.py` -> `gyre_results_<hex>.py`: gyre's pytest plugin, loaded by name with `-p` (plugin
  autoloading off). It sends every result over a pipe gyre owns (`channel`'s docstring has the
  messages), seals the runner (`seal.py`'s checks) and reports what only pytest knows;
- `monitor.py` -> `gyre_results_<hex>_monitor.py`: the runtime monitor, a PEP 578 audit hook that
  records what the workspace's code does (`gyre.evaluators.integrity.runtime` reads its records);
- `explain.py` -> `gyre_results_<hex>_explain.py`: a failing assertion's reprs and comparison explained in a
  forked child, so that what a repr does never reaches the tests after it (a canary's failure included);
- `sitecustomize.py`: imports the monitor in every Python process started with the plugin's
  directory on `PYTHONPATH`, then runs the environment's own `sitecustomize`, if any.

They import only the standard library (and pytest, the plugin), never gyre: gyre's site-packages is
not on the evaluation's path. Loaded as gyre's own modules (`gyre.evaluators.integrity.inprocess.monitor`,
for tests, linters and coverage) they do nothing at import: what a copy does when it loads is guarded by
`if not __package__`, true only for the top-level module an evaluation imports.
"""
