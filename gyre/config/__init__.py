"""The typed run configuration: YAML files under `configs/` loaded into pydantic models.

`run.py` holds `RunConfig` and its sections, `base.py` the strict `Section` base and the
YAML loader, `model.py` the `model` section, `sandbox.py` the `sandbox` section, `evaluator.py` the
`evaluator` and `evaluation` sections, `scheduler.py` the `scheduler` section, `paced.py` the paced engine's
device model. Every
field has a docstring; a bad file ends with an error naming the file and the field. The
bottom floor beside `gyre.records`: it imports nothing of gyre's but itself.
"""
