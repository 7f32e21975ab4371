"""The local sandbox: each command confined on this machine, no daemon needed.

`sandbox.py` is the backend (`LocalSandbox`); `isolation.py` decides how a command is
confined and runs it: bubblewrap namespaces (`bwrap.py`), a seccomp filter (`seccomp.py`),
never the host's root (`privileges.py`), cgroup limits (`cgroups.py`, `cgroups_v2.py`,
`cgroups_base.py`), a disk bound (`diskwatch.py`); `session.py` keeps a sandbox alive across
commands (Terminal-Bench and Harbor).
"""
