"""The base of gyre's typed YAML configs: strict, self-documenting sections and their loader.

Split from `gyre.config.run` (the run's schema, which re-exports these) so that every config
module builds on one `Section`: unknown keys are errors, and each field's docstring is its
description (`model_json_schema()`). `load_yaml_model` reads any such model from a YAML file;
every problem it reports names the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config file is unreadable or invalid; the message names the file and field."""


def load_yaml_model(path: Path | str, model: type[M]) -> M:
    """Read a YAML mapping from `path` into `model`; every problem names the file and field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: config file not found") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"field '{'.'.join(str(p) for p in err['loc'])}': {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"{path}: {problems}") from exc
