"""The typed run configuration: YAML files under `configs/` loaded into pydantic models.

`run.py` holds `RunConfig` and its sections, `base.py` the strict `Section` base and the
YAML loader, `model.py` the `model` section, `scheduler.py` the `scheduler` section. Every
field has a docstring; a bad file ends with an error naming the file and the field. The
bottom floor beside `gyre.records`: it imports nothing of gyre's but itself.
"""
