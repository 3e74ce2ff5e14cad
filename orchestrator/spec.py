"""The experiment spec: one YAML file, validated once here, passed down as one object.

Every field carries its help text once (``Field(description=...)``). Validation errors come out as
one line per problem, naming the key path and what was expected::

    search_spaces/ead.yaml: rollout.decoding.ead.tau_min: must be <= tau_max (got 1.5 > 1.2)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trainables.config import (
    AlgorithmConfig,
    CheckpointConfig,
    DecodingConfig,
    EADConfig,
    LearnerConfig,
    LoggingConfig,
    ModelConfig,
    RolloutConfig,
    TaskConfig,
    TinyModelConfig,
    TrialConfig,
    ValidationConfig,
)

__all__ = [
    "AlgorithmConfig",
    "CheckpointConfig",
    "DecodingConfig",
    "EADConfig",
    "LearnerConfig",
    "LoggingConfig",
    "ModelConfig",
    "RolloutConfig",
    "SpecError",
    "TaskConfig",
    "TinyModelConfig",
    "TrialConfig",
    "ValidationConfig",
    "apply_overrides",
    "format_validation_error",
    "load_trial_spec",
    "parse_overrides",
]


class SpecError(ValueError):
    """A spec that cannot run; the message is one line per problem, each naming the key."""


def _key_path(loc: tuple[Any, ...]) -> str:
    # pydantic puts the validator's name in the location of model-level errors; keep the field path.
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and p.startswith("function-")))


def format_validation_error(source: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors(include_url=False):
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling against the spec reference in README.md)"
        elif "input" in e and e["type"] not in ("missing",) and not isinstance(e["input"], dict):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"{source}: {_key_path(e['loc']) or '<top>'}: {msg}")
    return "\n".join(lines)


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``["rollout.n=4", "learner.lr=1e-3"]`` -> ``{"rollout.n": 4, "learner.lr": 0.001}``.

    Values are parsed as YAML, so numbers, booleans, null and lists work as they do in the file.
    """
    parsed: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. --set rollout.n=4")
        parsed[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
    return parsed


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys in a nested dict (a copy); unknown keys are caught later by validation."""
    out = _deep_copy(data)
    for dotted, value in overrides.items():
        node = out
        *parents, leaf = dotted.split(".")
        for i, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parents[: i + 1])
                raise SpecError(f"--set {dotted}: {where} is a value, not a section")
            node = child
        node[leaf] = value
    return out


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: no such spec file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise SpecError(f"{path}:{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of sections at the top, got {type(data).__name__}")
    return data


def validate_trial(data: dict[str, Any], source: str) -> TrialConfig:
    try:
        return TrialConfig.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_validation_error(source, e)) from None


def load_trial_spec(path: str | Path, overrides: list[str] | None = None) -> TrialConfig:
    """Read, override and validate a spec file: the one edge where input is checked."""
    data = apply_overrides(read_yaml(path), parse_overrides(overrides))
    data.pop("search", None)  # the sweep's section; a single trial ignores it
    return validate_trial(data, str(path))
